"""Legacy ``ChunkCache``: the chunked request's prefix is an ``int32`` VIEW of its row, so it
aliases ``req_to_token`` (the defect of SPEC section 7 when that row is freed and re-taken)."""

from __future__ import annotations

import torch

from kvparity.mem_cache.chunk_cache import ChunkCacheBase


class ChunkCache(ChunkCacheBase):
    def _prefix_from_row(self, row_slots: torch.Tensor) -> torch.Tensor:
        return row_slots
