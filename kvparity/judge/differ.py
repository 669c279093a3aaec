"""Differing cells, found and rendered in one place for every report.

A cell is ``(row, column, expected, got)``. Each report words its cells its own way (the failure
table, a golden's lines, a kernel's fault, an exact-comparison error), and each of those wordings
is read by tests or users, so each stays as it was; what they share lives here once: which
positions differ, how consecutive ones group into runs, and how a run or a cell is named.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import groupby
from typing import Any, TypeVar

import torch

Cell = tuple[int, int, int, int]  # (row, column, expected, got)
RowRun = tuple[int, str, list[int], list[int]]  # (row, columns as "c" or "c-d", expected, got)
T = TypeVar("T")


# ---- finding differences -------------------------------------------------------------------------
def consecutive(items: Iterable[T], position: Callable[[T], int]) -> list[list[T]]:
    """``items`` (in order) split wherever ``position`` does not step by exactly one."""
    parts: list[list[T]] = []
    for item in items:
        if parts and position(item) == position(parts[-1][-1]) + 1:
            parts[-1].append(item)
        else:
            parts.append([item])
    return parts


def span(first: int, last: int) -> str:
    """A run of positions as a reader writes it: ``3`` or ``3-5``."""
    return f"{first}" if first == last else f"{first}-{last}"


def differing_positions(expected: Sequence[Any], got: Sequence[Any]) -> list[int]:
    """Positions where two lists differ; a position only one of them has differs."""
    return [
        i for i in range(max(len(expected), len(got)))
        if i >= len(expected) or i >= len(got) or expected[i] != got[i]
    ]


def runs(expected: Sequence[Any], got: Sequence[Any]) -> list[tuple[int, int]]:
    """Runs ``(first, last)`` of consecutive positions where two lists differ."""
    return [(part[0], part[-1]) for part in consecutive(differing_positions(expected, got), int)]


def row_runs(cells: Iterable[Cell]) -> list[RowRun]:
    """Cells grouped by row, then into runs of consecutive columns, in (row, column) order."""
    out: list[RowRun] = []
    for row, row_cells in groupby(sorted(cells), key=lambda c: c[0]):
        for part in consecutive(row_cells, lambda c: c[1]):
            out.append((row, span(part[0][1], part[-1][1]), [c[2] for c in part], [c[3] for c in part]))
    return out


def tensor_cells(actual: torch.Tensor, expected: torch.Tensor) -> list[tuple[int, ...]]:
    """The indices where two tensors of one shape differ, in row-major order."""
    return [tuple(index) for index in (actual != expected).nonzero().tolist()]


# ---- rendering -----------------------------------------------------------------------------------
def short(values: Sequence[int], limit: int = 8) -> str:
    """Values separated by spaces, the first ``limit`` of them and the count when there are more."""
    text = " ".join(str(v) for v in values[:limit])
    return text + (f" ... ({len(values)})" if len(values) > limit else "")


def list_diff(what: str, unit: str, expected: Sequence[Any], got: Sequence[Any], limit: int = 3) -> list[str]:
    """One line per run of differing positions (the first ``limit``), then one for a length change:
    ``row 0: columns 2-3 expected [5, 6] got [7, 8]``."""
    out = []
    for first, last in runs(expected, got)[:limit]:
        where = f"{unit} {first}" if first == last else f"{unit}s {span(first, last)}"
        out.append(f"{what}: {where} expected {list(expected[first:last + 1])} got {list(got[first:last + 1])}")
    if len(expected) != len(got):
        out.append(f"{what}: expected {len(expected)} values, got {len(got)}")
    return out


def cell_text(cell: Cell, *, table: bool, notes: Mapping[int, str] | None = None) -> str:
    """``row 1, col 2: expected 5, got 7`` (``index 2: ...`` for a flat tensor), with the note
    ``notes`` gives for the value got, if any (a sentinel: what reading it means)."""
    row, col, want, got = cell
    where = f"row {row}, col {col}" if table else f"index {col}"
    note = (notes or {}).get(got)
    return f"{where}: expected {want}, got {got}" + (f" ({note})" if note else "")


def index_text(index: tuple[int, ...], got: Any, expected: Any) -> str:
    """``(0, 3): got 7 expected 5``: one cell of an n-dimensional tensor."""
    return f"{index}: got {got} expected {expected}"
