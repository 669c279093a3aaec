"""``Req`` as of SGLang 0.5.3: ``prefix_indices`` defaults to ``[]`` and the match key comes from
``adjust_max_prefix_ids`` (SPEC section 2)."""

from __future__ import annotations

from typing import Any

from kvparity.mem_cache.radix_cache import RadixKey
from kvparity.mem_cache.req_state import ReqState


class Req(ReqState):
    def _default_prefix_indices(self) -> list:
        return []

    def adjust_max_prefix_ids(self) -> list[int]:
        """Reset ``fill_ids`` and return the longest token list the cache may supply: at least one
        token is left to compute, and with logprobs nothing at or after the logprob start."""
        self.fill_ids = self.origin_input_ids + self.output_ids
        input_len = len(self.fill_ids)
        max_prefix_len = input_len - 1
        if self.max_new_tokens > 0:
            # Redundant in 0.5.3 as well: kept so the method reads like the version it models.
            max_prefix_len = min(max_prefix_len, input_len - 1)
        if self.return_logprob:
            max_prefix_len = min(max_prefix_len, self.logprob_start_len)
        max_prefix_len = max(max_prefix_len, 0)
        return self.fill_ids[:max_prefix_len]

    def ranking_key(self) -> list[int]:
        """What ``SchedulePolicy`` matches a waiting request with: 0.5.3's match key, capped. (Named
        by its class: another version's request ranked with this key, pull request #11200 undone in
        a replay, has no method of that name.)"""
        return Req.adjust_max_prefix_ids(self)

    def init_next_round_input(self, tree_cache: Any = None) -> None:
        self.fill_ids = self.origin_input_ids + self.output_ids
        if tree_cache is not None:
            max_prefix_ids = self.adjust_max_prefix_ids()
            self.prefix_indices, self.last_node = tree_cache.match_prefix(RadixKey(max_prefix_ids, self.extra_key))
            self.last_matched_prefix_len = len(self.prefix_indices)
        self.extend_input_len = len(self.fill_ids) - len(self.prefix_indices)
