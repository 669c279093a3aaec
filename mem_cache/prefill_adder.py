"""``PrefillAdder`` as SGLang 0.5.3 builds a prefill batch from the waiting queue: the budget that
decides which requests get in, which one is cut into a chunk, and when admission stops.

Both versions share it: pull request #11200 did not change the adder, only the key the waiting
queue is ranked with (``schedule_policy.calc_priority`` / ``Req.ranking_key``).

Three budgets, all in tokens:

- ``rem_total_tokens``: free plus evictable KV slots, less what the running batch is expected to
  still generate (each running request's remaining outputs × ``new_token_ratio``) and less what the
  requests admitted so far take (their input, whole pages, plus all their outputs). A request is
  refused (``NO_TOKEN``) when its input plus its outputs do not fit *strictly* below it;
- ``rem_input_tokens``: ``--max-prefill-tokens``, the tokens one prefill batch may compute; the
  first request always gets in, a later one that reaches it stops admission (``OTHER``);
- ``rem_chunk_tokens``: ``--chunked-prefill-size`` (None: off); a request larger than what is left
  is cut to whole pages of it and becomes the chunked request.

Not modelled (off in every traffic world): the ``ignore_eos`` estimate, the hierarchical cache's
host hits, hybrid (SWA) pools, mixed chunks, priority preemption, truncation alignment.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from enum import Enum, auto
from typing import Any

# SGLang's SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION default: a request's outputs are budgeted at most
# this many (it may still generate up to its own max_new_tokens).
CLIP_MAX_NEW_TOKENS = 4096


class AddReqResult(Enum):
    CONTINUE = auto()  # room is left: try the next waiting request
    NO_TOKEN = auto()  # KV memory is short: the scheduler marks the running batch full
    OTHER = auto()  # the prefill or chunk budget is spent: stop for this batch only


def ceil_paged_tokens(tokens: int, page_size: int) -> int:
    return -(-tokens // page_size) * page_size


def clipped_max_new_tokens(req: Any) -> int:
    return min(req.max_new_tokens, CLIP_MAX_NEW_TOKENS)


class PrefillAdder:
    """One prefill batch's admission: ``add_chunked_req`` first (the chunked request continues),
    then ``add_one_req`` per waiting request, in the ranked order, until a result is not
    ``CONTINUE``. ``can_run_list`` is the batch; ``new_chunked_req`` the request cut this time.

    ``tree_cache`` is a RadixCache or a ChunkCache (whose locks and eviction are no-ops); the
    requests are a version's ``Req`` after ``init_next_round_input``."""

    def __init__(
        self,
        page_size: int,
        tree_cache: Any,
        allocator: Any,
        running_reqs: Sequence[Any],
        new_token_ratio: float,
        rem_input_tokens: int,
        rem_chunk_tokens: int | None,
    ) -> None:
        self.page_size = page_size
        self.tree_cache = tree_cache
        self.allocator = allocator
        self.new_token_ratio = new_token_ratio
        self.rem_input_tokens = rem_input_tokens
        self.rem_chunk_tokens = rem_chunk_tokens
        # Floats from here on (the ratio): kept as SGLang sums them, so that a comparison at the
        # edge of the budget goes the same way.
        self.rem_total_token_offset: float = 0
        self.cur_rem_token_offset: float = 0
        self.can_run_list: list[Any] = []
        self.new_chunked_req: Any = None
        # The running batch keeps generating: reserve its expected remaining outputs.
        self.rem_total_token_offset += sum([self._running_reservation(r) for r in running_reqs])

    def _running_reservation(self, req: Any) -> float:
        return min(req.max_new_tokens - len(req.output_ids), CLIP_MAX_NEW_TOKENS) * self.new_token_ratio

    # ---- the budgets ---------------------------------------------------------------------------
    def _available_and_evictable(self) -> int:
        return self.allocator.available_size() + self.tree_cache.evictable_size()

    @property
    def rem_total_tokens(self) -> float:
        """Room for admitted inputs AND every admitted or running request's future outputs."""
        return self._available_and_evictable() - self.rem_total_token_offset

    @property
    def cur_rem_tokens(self) -> float:
        """Room for this batch's inputs alone."""
        return self._available_and_evictable() - self.cur_rem_token_offset

    def ceil_paged_tokens(self, tokens: int) -> int:
        return ceil_paged_tokens(tokens, self.page_size)

    def budget_state(self) -> AddReqResult:
        if self.rem_total_tokens <= 0 or self.cur_rem_tokens <= 0:
            return AddReqResult.NO_TOKEN
        if self.rem_input_tokens <= 0 or (self.rem_chunk_tokens is not None and self.rem_chunk_tokens <= 0):
            return AddReqResult.OTHER
        return AddReqResult.CONTINUE

    def _update_prefill_budget(self, extend_input_len: int, max_new_tokens: int) -> None:
        # Whole pages: a request's last page is taken whole, however little of it is used.
        extend_input_len = self.ceil_paged_tokens(extend_input_len)
        self.rem_total_token_offset += extend_input_len + max_new_tokens
        self.cur_rem_token_offset += extend_input_len
        self.rem_input_tokens -= extend_input_len
        if self.rem_chunk_tokens is not None:
            self.rem_chunk_tokens -= extend_input_len

    # ---- admission -----------------------------------------------------------------------------
    def add_chunked_req(self, req: Any) -> Any:
        """The chunked request's next chunk, first in the batch, whatever the other budgets: cut
        to the chunk budget and to the total budget (NOT to whole pages). Returns the request
        while it still has prompt left after this chunk, else None (this is its last chunk, and
        only then are its outputs reserved)."""
        assert self.rem_chunk_tokens is not None, "a chunked request exists only with chunked prefill on"
        rem_tokens = min(self.rem_chunk_tokens, int(self.rem_total_tokens))
        truncated = req.extend_input_len > rem_tokens
        req.extend_input_len = min(req.extend_input_len, rem_tokens)
        req.fill_ids = req.fill_ids[: len(req.prefix_indices) + req.extend_input_len]
        self.can_run_list.append(req)
        self._update_prefill_budget(req.extend_input_len, 0 if truncated else clipped_max_new_tokens(req))
        return req if truncated else None

    @contextmanager
    def _lock_node(self, last_node: Any) -> Iterator[None]:
        """Lock the request's matched prefix while it is weighed: a locked node is no longer
        evictable, so the total budget shrinks by whatever of it was evictable."""
        self.tree_cache.inc_lock_ref(last_node)
        try:
            yield None
        finally:
            self.tree_cache.dec_lock_ref(last_node)

    def add_one_req(self, req: Any) -> AddReqResult:
        """A waiting request (matched by ``init_next_round_input``): refused, admitted whole, or
        admitted as the new chunked request; then what is left of the budget says whether to go on.
        An admitted request keeps a lock on its matched node (released when it is cached)."""
        total_tokens = req.extend_input_len + clipped_max_new_tokens(req)
        if total_tokens >= self.rem_total_tokens:
            return AddReqResult.NO_TOKEN
        # The first request of a batch gets in whatever its size; a later one must fit below.
        if self.ceil_paged_tokens(req.extend_input_len) >= self.rem_input_tokens and self.can_run_list:
            return AddReqResult.OTHER
        with self._lock_node(req.last_node):
            # Locking may have taken evictable slots out of the budget: weigh again.
            if total_tokens >= self.rem_total_tokens:
                return AddReqResult.NO_TOKEN
            input_tokens = self.ceil_paged_tokens(req.extend_input_len)
            if input_tokens >= self.rem_input_tokens and self.can_run_list:
                return AddReqResult.OTHER
            if self.rem_chunk_tokens is None or input_tokens <= self.rem_chunk_tokens:
                self.can_run_list.append(req)
                self.tree_cache.inc_lock_ref(req.last_node)
                self._update_prefill_budget(input_tokens, clipped_max_new_tokens(req))
            else:
                if not self._cut_into_chunk(req):
                    return AddReqResult.OTHER
        return self.budget_state()

    def _cut_into_chunk(self, req: Any) -> bool:
        """Admit the first whole pages of what the chunk budget leaves (False: not one page);
        its outputs are not reserved until its last chunk."""
        assert self.rem_chunk_tokens is not None
        trunc_len = self.rem_chunk_tokens // self.page_size * self.page_size
        if trunc_len <= 0:
            return False
        req.extend_input_len = trunc_len
        req.fill_ids = req.fill_ids[: len(req.prefix_indices) + trunc_len]
        self.can_run_list.append(req)
        self.new_chunked_req = req
        self.tree_cache.inc_lock_ref(req.last_node)
        self._update_prefill_budget(trunc_len, 0)
        return True
