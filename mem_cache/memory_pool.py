"""``ReqToTokenPool``: the table mapping (request row, token position) to a KV slot (SPEC section 1)."""

from __future__ import annotations

from typing import Any

import torch


class ReqToTokenPool:
    """``req_to_token`` is ``int32 [size, max_context_len]``. Free rows are a FIFO list; freeing a
    row never clears it, so stale contents stay (which is what makes SPEC section 7's aliasing
    case possible)."""

    def __init__(self, size: int, max_context_len: int, device: torch.device | str) -> None:
        if size <= 0 or max_context_len <= 0:
            raise ValueError(f"ReqToTokenPool: size={size} and max_context_len={max_context_len} must be > 0")
        self.size = size
        self.max_context_len = max_context_len
        self.device = torch.device(device)
        self.req_to_token = torch.zeros((size, max_context_len), dtype=torch.int32, device=self.device)
        self.free_slots: list[int] = list(range(size))

    def available_size(self) -> int:
        return len(self.free_slots)

    def alloc(self, need_size: int) -> list[int] | None:
        """The first ``need_size`` free rows, or ``None`` when fewer are free."""
        if need_size > len(self.free_slots):
            return None
        taken = self.free_slots[:need_size]
        self.free_slots = self.free_slots[need_size:]
        return taken

    def free(self, free_index: int | list[int]) -> None:
        rows = [free_index] if isinstance(free_index, int) else list(free_index)
        for row in rows:
            if not 0 <= row < self.size:
                raise ValueError(f"ReqToTokenPool.free: row {row} is outside [0, {self.size})")
            if row in self.free_slots:
                raise ValueError(f"ReqToTokenPool.free: row {row} is already free")
        self.free_slots.extend(rows)

    def write(self, index: Any, values: Any) -> None:
        """Plain indexed assignment; any integer dtype and device of ``values`` is cast to int32."""
        if isinstance(values, torch.Tensor):
            values = values.to(device=self.device, dtype=torch.int32)
        self.req_to_token[index] = values

    def clear(self) -> None:
        self.free_slots = list(range(self.size))
