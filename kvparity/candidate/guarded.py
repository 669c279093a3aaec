"""Guarded tensors: every tensor a plug-in candidate gets lies INSIDE a larger buffer whose
margins hold ``GUARD``. The Triton interpreter does no bounds checking, so a candidate writing a
row, a column or an element out of bounds lands in a margin, where ``kvparity.candidate.inputs``'s
``compare_effect`` finds it. Which tensors a target gets is its record's ``materialise``
(``kvparity.candidate.targets``); this module only knows buffers, views and margins.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:  # for the annotation only: target_inputs imports this module
    from kvparity.candidate.inputs import KernelBatch

GUARD = -31337  # margin sentinel; distinct from POISON and from every slot (slots are >= 1)
MARGIN = 64  # guard elements on each side of a 1-D buffer
TABLE_GUARD_ROWS = 2  # whole guard rows before and after the table (plus MARGIN elements)


@dataclass
class Guarded:
    """A view handed to a candidate, inside ``buffer`` whose first ``lo`` and elements from ``hi``
    on are guard. ``role`` is "input" (must not change) or "output" (compared with the reference).
    ``width`` > 0 marks a 2-D table view (row-major inside the flat buffer)."""

    name: str
    buffer: torch.Tensor
    view: torch.Tensor
    lo: int
    hi: int
    role: str
    width: int = 0


def guarded_vector(name: str, values: list[int], device: torch.device, role: str = "input",
                   fill: int | None = None, length: int | None = None) -> Guarded:
    """``int64`` 1-D view of ``values`` (or ``length`` cells of ``fill``), MARGIN guard each side."""
    n = len(values) if fill is None else int(length or 0)
    buffer = torch.full((n + 2 * MARGIN,), GUARD, dtype=torch.int64, device=device)
    if fill is None:
        buffer[MARGIN : MARGIN + n] = torch.tensor(values, dtype=torch.int64)
    else:
        buffer[MARGIN : MARGIN + n] = fill
    return Guarded(name, buffer, buffer[MARGIN : MARGIN + n], MARGIN, MARGIN + n, role)


def guarded_table(batch: KernelBatch, device: torch.device, contents: list[int], role: str) -> Guarded:
    """Contiguous ``int32 [pool_rows, width]`` view; TABLE_GUARD_ROWS rows + MARGIN of guard around."""
    margin = TABLE_GUARD_ROWS * batch.width + MARGIN
    n = batch.pool_rows * batch.width
    buffer = torch.full((n + 2 * margin,), GUARD, dtype=torch.int32, device=device)
    buffer[margin : margin + n] = torch.tensor(contents, dtype=torch.int32)
    view = buffer[margin : margin + n].view(batch.pool_rows, batch.width)
    return Guarded("req_to_token", buffer, view, margin, margin + n, role, batch.width)


class GuardedPool:
    """The ``req_to_token_pool`` a write_cache_indices candidate gets (SPEC section 9)."""

    def __init__(self, req_to_token: torch.Tensor) -> None:
        self.req_to_token = req_to_token
        self.device = req_to_token.device

    def write(self, index: Any, values: Any) -> None:
        if isinstance(values, torch.Tensor):
            values = values.to(device=self.device, dtype=torch.int32)
        self.req_to_token[index] = values


@dataclass
class Materialised:
    """The guarded tensors of one batch, and the arguments a candidate is called with."""

    batch: KernelBatch
    guarded: list[Guarded] = field(default_factory=list)

    def add(self, g: Guarded) -> torch.Tensor:
        self.guarded.append(g)
        return g.view

    def view(self, name: str) -> torch.Tensor:
        return next(g.view for g in self.guarded if g.name == name)

    def snapshot(self) -> dict[str, list[int]]:
        """Every buffer, guard included, as plain lists (what the sandbox child sends back)."""
        return {g.name: g.buffer.cpu().tolist() for g in self.guarded}


def where(g: Guarded, k: int) -> str:
    """Where flat position ``k`` of ``g``'s buffer lies, in words (one wording for every guard report)."""
    offset = k - g.lo
    if g.width:
        row, col = divmod(offset, g.width)
        side = "before the table" if offset < 0 else "after the table"
        return f"at row {row}, col {col} ({side})"
    return f"at index {offset} ({'before' if offset < 0 else 'after'} the tensor of {g.hi - g.lo})"
