"""``ChunkCache``: the cache used when the radix cache is off and prefill is chunked (SPEC 1).

Everything but ``cache_unfinished_req``'s prefix is shared; the two versions differ only in what
``_prefix_from_row`` returns (legacy: an ``int32`` view of the row; refactored: an ``int64`` copy).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch


class ChunkMatch(NamedTuple):
    device_indices: torch.Tensor
    last_device_node: Any


class ChunkCacheBase:
    page_size: int

    def __init__(self, req_to_token_pool: Any, token_to_kv_pool_allocator: Any, page_size: int) -> None:
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        self.page_size = page_size

    def reset(self) -> None:
        pass

    def match_prefix(self, key: Any = None) -> ChunkMatch:
        """Never a hit: an empty ``int64`` tensor on the CPU and no node."""
        return ChunkMatch(torch.empty((0,), dtype=torch.int64), None)

    def _prefix_from_row(self, row_slots: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def cache_unfinished_req(self, req: Any, chunked: bool = False) -> None:
        row_slots = self.req_to_token_pool.req_to_token[req.req_pool_idx, : len(req.fill_ids)]
        req.prefix_indices = self._prefix_from_row(row_slots)

    def cache_finished_req(self, req: Any) -> None:
        # The last generated token has no KV slot yet.
        num_slots = len(req.origin_input_ids) + max(len(req.output_ids) - 1, 0)
        slots = self.req_to_token_pool.req_to_token[req.req_pool_idx, :num_slots]
        self.req_to_token_pool.free(req.req_pool_idx)
        self.token_to_kv_pool_allocator.free(slots.to(torch.int64))

    # The chunk cache holds nothing, so there is nothing to lock, evict or compare.
    def evict(self, num_tokens: int) -> None:
        pass

    def inc_lock_ref(self, node: Any) -> int:
        return 0

    def dec_lock_ref(self, node: Any) -> int:
        return 0

    def evictable_size(self) -> int:
        return 0

    def protected_size(self) -> int:
        return 0

    def total_size(self) -> int:
        return 0

    def contents(self) -> list:
        return []
