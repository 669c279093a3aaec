"""Refactored ``ChunkCache``: the chunked request's prefix is a fresh contiguous ``int64`` copy of
its row, which is what the refactored write kernel's ``int64`` pointer read requires (SPEC 8)."""

from __future__ import annotations

import torch

from kvparity.mem_cache.chunk_cache import ChunkCacheBase


class ChunkCache(ChunkCacheBase):
    def _prefix_from_row(self, row_slots: torch.Tensor) -> torch.Tensor:
        return row_slots.to(dtype=torch.int64, copy=True)
