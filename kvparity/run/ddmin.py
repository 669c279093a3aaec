"""Delta debugging (Zeller and Hildebrandt's ``ddmin``) over a list of changes, with a test that has
three outcomes: the difference is reproduced (``FAIL``), it is not (``PASS``), or the test could not
say (``UNRESOLVED``: a hybrid that does not import, a worker that dies). It returns a 1-minimal
subset that reproduces: removing any one change of it no longer does (or cannot be told)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

FAIL, PASS, UNRESOLVED = "fail", "pass", "unresolved"
T = TypeVar("T")


def ddmin(changes: Sequence[T], test: Callable[[tuple[T, ...]], str]) -> tuple[T, ...]:
    """The smallest subset of ``changes`` (kept in their order) ``ddmin`` finds for which ``test``
    is ``FAIL``; ``test(tuple(changes))`` must be ``FAIL``. Each subset is tested once."""
    seen: dict[tuple[T, ...], str] = {}

    def outcome(subset: tuple[T, ...]) -> str:
        if subset not in seen:
            seen[subset] = test(subset)
        return seen[subset]

    current, n = tuple(changes), 2
    while len(current) >= 2:
        parts = _split(current, n)
        reduced = next((p for p in parts if outcome(p) == FAIL), None)
        if reduced is not None:
            current, n = reduced, 2
            continue
        complements = [tuple(c for c in current if c not in set(p)) for p in parts] if n > 2 else []
        reduced = next((c for c in complements if outcome(c) == FAIL), None)
        if reduced is not None:
            current, n = reduced, max(n - 1, 2)
            continue
        if n >= len(current):
            break
        n = min(2 * n, len(current))
    return current


def _split(changes: tuple[T, ...], n: int) -> list[tuple[T, ...]]:
    """``changes`` in ``n`` nearly equal consecutive parts."""
    size, extra = divmod(len(changes), n)
    parts, start = [], 0
    for i in range(n):
        end = start + size + (1 if i < extra else 0)
        parts.append(changes[start:end])
        start = end
    return [p for p in parts if p]
