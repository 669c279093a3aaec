"""Exact comparison of integer tensors: dtype, shape and device first, then ``torch.equal``.
Never a tolerance: one wrong KV slot is one wrong token."""

from __future__ import annotations

import torch

from kvparity.judge.differ import index_text, tensor_cells


def mismatch(actual: torch.Tensor, expected: torch.Tensor, what: str = "tensor", limit: int = 8) -> str | None:
    """``None`` when equal; otherwise one readable paragraph naming the first differing cells."""
    if not isinstance(actual, torch.Tensor):
        return f"{what}: expected a tensor, got {type(actual).__name__}"
    for attr in ("dtype", "shape", "device"):
        if getattr(actual, attr) != getattr(expected, attr):
            return f"{what}: {attr} {getattr(actual, attr)} != expected {getattr(expected, attr)}"
    if torch.equal(actual, expected):
        return None
    cells = tensor_cells(actual, expected)
    shown = ", ".join(index_text(c, actual[c].item(), expected[c].item()) for c in cells[:limit])
    more = f" (and {len(cells) - limit} more)" if len(cells) > limit else ""
    return f"{what}: {len(cells)} cells differ: {shown}{more}"


def assert_exact(actual: torch.Tensor, expected: torch.Tensor, what: str = "tensor") -> None:
    problem = mismatch(actual, expected, what)
    if problem is not None:
        raise AssertionError(problem)
