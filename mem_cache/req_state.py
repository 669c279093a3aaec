"""The per-request state both versions share (SPEC section 2).

The refactor changed only the default of ``prefix_indices`` and how ``init_next_round_input``
computes the match key; the fields, the server's ``logprob_start_len`` rule and
``reset_for_retract`` are the same code in both versions, so they live here once.
``legacy.Req`` and ``refactored.Req`` add what differs.
"""

from __future__ import annotations

from typing import Any


def server_logprob_start_len(requested: int, return_logprob: bool, input_len: int) -> int:
    """``logprob_start_len`` as the server sets it: ``input_len - 1`` when logprobs are off or the
    request asked for -1; otherwise the requested value clamped to ``input_len - 1``."""
    if not return_logprob or requested == -1:
        return input_len - 1
    if requested < -1:
        raise ValueError(f"logprob_start_len={requested}: must be -1 or >= 0")
    return min(requested, input_len - 1)


class ReqState:
    """Fields of SGLang's ``Req`` used by the KV-index path."""

    def __init__(
        self,
        rid: str,
        origin_input_ids: list[int],
        *,
        return_logprob: bool = False,
        logprob_start_len: int = -1,
        max_new_tokens: int = 16,
        extra_key: str | None = None,
    ) -> None:
        self.rid = rid
        self.origin_input_ids = list(origin_input_ids)
        self.output_ids: list[int] = []
        self.fill_ids: list[int] = []
        self.max_new_tokens = max_new_tokens
        self.extra_key = extra_key
        self.return_logprob = return_logprob
        self.logprob_start_len = server_logprob_start_len(
            logprob_start_len, return_logprob, len(self.origin_input_ids)
        )
        self.prefix_indices: Any = self._default_prefix_indices()
        self.extend_input_len = 0
        self.last_node: Any = None
        self.last_matched_prefix_len = 0
        self.extend_logprob_start_len = 0
        self.req_pool_idx: int | None = None
        self.cached_tokens = 0
        self.already_computed = 0
        self.is_retracted = False

    def _default_prefix_indices(self) -> Any:
        raise NotImplementedError

    @property
    def seqlen(self) -> int:
        return len(self.origin_input_ids) + len(self.output_ids)

    def reset_for_retract(self) -> None:
        """Back to the waiting queue: the version's default prefix and no row, node or progress."""
        self.prefix_indices = self._default_prefix_indices()
        self.last_node = None
        self.extend_input_len = 0
        self.is_retracted = True
        self.req_pool_idx = None
        self.already_computed = 0
        self.extend_logprob_start_len = 0

    def __repr__(self) -> str:
        return (
            f"{type(self).__module__}.Req(rid={self.rid!r}, inputs={len(self.origin_input_ids)}, "
            f"outputs={len(self.output_ids)}, prefix={len(self.prefix_indices)}, row={self.req_pool_idx})"
        )
