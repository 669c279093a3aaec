"""Count Triton kernel launches, so a test can prove the Triton backend really ran Triton.

Without this, "the Triton and torch backends agree" could silently be torch compared with itself.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

LAUNCHES: Counter[str] = Counter()


def launch(kernel: Any, grid: tuple[int, ...], *args: Any, **kwargs: Any) -> None:
    """Launch ``kernel[grid](*args, **kwargs)`` and count it under the kernel's name."""
    kernel[grid](*args, **kwargs)
    LAUNCHES[kernel.fn.__name__] += 1


def launch_count(name: str) -> int:
    return LAUNCHES[name]
