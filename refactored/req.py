"""``Req`` as of SGLang 0.5.3.post1: ``prefix_indices`` defaults to an empty ``int64`` tensor and
the match key is computed inline; there is no ``adjust_max_prefix_ids`` (SPEC section 2)."""

from __future__ import annotations

from typing import Any

import torch

from kvparity.mem_cache.radix_cache import RadixKey
from kvparity.mem_cache.req_state import ReqState


class Req(ReqState):
    def _default_prefix_indices(self) -> torch.Tensor:
        return torch.empty((0,), dtype=torch.int64)

    def ranking_key(self) -> list[int]:
        """What ``SchedulePolicy`` matches a waiting request with since pull request #11200: the
        whole input, uncapped (admission still matches with the capped key)."""
        return self.origin_input_ids + self.output_ids

    def init_next_round_input(self, tree_cache: Any = None) -> None:
        self.fill_ids = self.origin_input_ids + self.output_ids
        input_len = len(self.fill_ids)
        # At least one token is left to compute; with logprobs, nothing from the logprob start on
        # may come from the cache.
        max_prefix_len = input_len - 1
        if self.return_logprob:
            max_prefix_len = min(max_prefix_len, self.logprob_start_len)
        max_prefix_len = max(max_prefix_len, 0)
        if tree_cache is not None:
            key = RadixKey(self.fill_ids[:max_prefix_len], self.extra_key)
            self.prefix_indices, self.last_node = tree_cache.match_prefix(key)
            self.last_matched_prefix_len = len(self.prefix_indices)
        self.extend_input_len = len(self.fill_ids) - len(self.prefix_indices)
