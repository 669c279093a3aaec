"""What both versions' ``ScheduleBatch`` share: the batch's per-request lists and tensors, the
per-request bookkeeping after an extend, and the decode step. ``prepare_for_extend`` itself, whose
order the refactor changed, lives in ``legacy/`` and ``refactored/``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kvparity.kernels import runtime
from kvparity.mem_cache.chunk_cache import ChunkCacheBase
from kvparity.mem_cache.common import (
    alloc_for_decode,
    alloc_paged_token_slots_extend,
    alloc_token_slots,
    evict_from_tree_cache,
)

# SGLang's global_config.retract_decode_steps: after a retract, the tree evicts enough for the
# remaining requests to decode this many more steps.
RETRACT_DECODE_STEPS = 20


@dataclass
class ExtendLens:
    """Per-request lengths of an extend batch, as lists, device tensors and CPU copies."""

    input_ids: list[list[int]]
    seq_lens: list[int]
    prefix_lens: list[int]
    extend_lens: list[int]
    seq_lens_tensor: torch.Tensor
    seq_lens_cpu: torch.Tensor
    prefix_lens_tensor: torch.Tensor
    prefix_lens_cpu: torch.Tensor
    extend_lens_tensor: torch.Tensor
    extend_lens_cpu: torch.Tensor

    @property
    def extend_num_tokens(self) -> int:
        return sum(self.extend_lens)


def _int64(values: Sequence[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(list(values), dtype=torch.int64, device=device)


def check_extend_request(req: Any, index: int, row_width: int) -> None:
    """Reject a request whose lengths cannot be an extend (names the request)."""
    seq_len, pre_len = len(req.fill_ids), len(req.prefix_indices)
    if seq_len - pre_len != req.extend_input_len:
        raise ValueError(
            f"request {index} ({req.rid!r}): len(fill_ids)={seq_len} - len(prefix_indices)={pre_len} "
            f"!= extend_input_len={req.extend_input_len}; call init_next_round_input first"
        )
    if seq_len > row_width:
        raise ValueError(f"request {index} ({req.rid!r}): {seq_len} tokens exceed max_context_len={row_width}")


def extend_lens_of(reqs: Sequence[Any], device: torch.device) -> ExtendLens:
    seq_lens = [len(r.fill_ids) for r in reqs]
    prefix_lens = [len(r.prefix_indices) for r in reqs]
    extend_lens = [r.extend_input_len for r in reqs]
    cpu = torch.device("cpu")
    return ExtendLens(
        input_ids=[r.fill_ids[len(r.prefix_indices) :] for r in reqs],
        seq_lens=seq_lens,
        prefix_lens=prefix_lens,
        extend_lens=extend_lens,
        seq_lens_tensor=_int64(seq_lens, device),
        seq_lens_cpu=_int64(seq_lens, cpu),
        prefix_lens_tensor=_int64(prefix_lens, device),
        prefix_lens_cpu=_int64(prefix_lens, cpu),
        extend_lens_tensor=_int64(extend_lens, device),
        extend_lens_cpu=_int64(extend_lens, cpu),
    )


def account_extend(req: Any, seq_len: int, pre_len: int) -> None:
    """Per-request bookkeeping after an extend is scheduled (SPEC section 3, step 3)."""
    req.cached_tokens += pre_len - req.already_computed
    req.already_computed = seq_len
    req.is_retracted = False
    if req.logprob_start_len >= pre_len:
        req.extend_logprob_start_len = min(
            req.logprob_start_len - pre_len, req.extend_input_len, req.seqlen - 1
        )
    else:
        req.extend_logprob_start_len = 0


class ScheduleBatchBase:
    """A batch of requests plus the pools it draws from. ``backend`` picks Triton or torch for
    every kernel this batch runs."""

    def __init__(
        self,
        reqs: list[Any],
        req_to_token_pool: Any,
        token_to_kv_pool_allocator: Any,
        tree_cache: Any,
        *,
        backend: str,
    ) -> None:
        self.reqs = reqs
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        self.tree_cache = tree_cache
        self.backend = runtime.check_backend(backend)
        self.device = req_to_token_pool.device
        self.page_size = token_to_kv_pool_allocator.page_size
        self.req_pool_indices: torch.Tensor | None = None
        self.seq_lens: torch.Tensor | None = None
        self.out_cache_loc: torch.Tensor | None = None
        self.last_loc: torch.Tensor | None = None
        self.extend_num_tokens = 0

    @classmethod
    def init_new(cls, reqs, req_to_token_pool, token_to_kv_pool_allocator, tree_cache, *, backend: str):
        return cls(reqs, req_to_token_pool, token_to_kv_pool_allocator, tree_cache, backend=backend)

    def batch_size(self) -> int:
        return len(self.reqs)

    def _check_requests(self) -> None:
        if not self.reqs:
            raise ValueError("prepare_for_extend: empty batch")
        row_width = self.req_to_token_pool.req_to_token.shape[1]
        for i, req in enumerate(self.reqs):
            check_extend_request(req, i, row_width)

    def _alloc_extend_slots(self, lens: ExtendLens, last_loc: torch.Tensor | None) -> torch.Tensor:
        """The batch's new KV slots (evicting first when short); ``last_loc`` is used, and kept on
        the batch, only when pages are larger than one slot."""
        if self.page_size == 1:
            return alloc_token_slots(self.tree_cache, self.token_to_kv_pool_allocator, lens.extend_num_tokens)
        assert last_loc is not None  # callers compute it whenever pages are larger than one slot
        self.last_loc = last_loc
        return alloc_paged_token_slots_extend(
            self.tree_cache,
            self.token_to_kv_pool_allocator,
            lens.prefix_lens_tensor,
            lens.prefix_lens_cpu,
            lens.seq_lens_tensor,
            lens.seq_lens_cpu,
            last_loc,
            lens.extend_num_tokens,
        )

    def _keep_extend_fields(self, lens: ExtendLens, rows: list[int], out_cache_loc: torch.Tensor) -> None:
        self.req_pool_indices = _int64(rows, self.device)
        self.seq_lens = lens.seq_lens_tensor
        self.seq_lens_cpu = lens.seq_lens_cpu
        self.prefix_lens = lens.prefix_lens
        self.extend_lens = lens.extend_lens
        self.extend_num_tokens = lens.extend_num_tokens
        self.input_ids = _int64([t for ids in lens.input_ids for t in ids], self.device)
        self.out_cache_loc = out_cache_loc
        self.extend_logprob_start_lens = [r.extend_logprob_start_len for r in self.reqs]

    # ---- decode memory and retraction (SPEC section 6) ------------------------------------------
    def new_page_count_next_decode(self, selected_indices: list[int] | None = None) -> int:
        """Pages the next decode step needs: one per request whose slotted length (``seqlen - 1``)
        is a multiple of the page size; with page size 1, one slot per request."""
        reqs = self.reqs if selected_indices is None else [self.reqs[i] for i in selected_indices]
        if self.page_size == 1:
            return len(reqs)
        return sum(1 for r in reqs if (r.seqlen - 1) % self.page_size == 0)

    def check_decode_mem(self, selected_indices: list[int] | None = None) -> bool:
        """Evict from the tree if short, then: is there room for the next decode step?"""
        num_tokens = self.new_page_count_next_decode(selected_indices) * self.page_size
        evict_from_tree_cache(self.tree_cache, self.token_to_kv_pool_allocator, num_tokens)
        return self.token_to_kv_pool_allocator.available_size() >= num_tokens

    def release_req(self, idx: int, remaining_req_count: int) -> None:
        """Retract request ``idx`` (SGLang's ``release_req``): free the slots it owns and its row,
        unlock its tree node, let the tree make room for the others, reset it for the queue.

        With the chunk cache it owns its whole row; with the radix cache everything from its
        prefix's last whole page on (the aligned prefix is the tree's)."""
        req = self.reqs[idx]
        slotted = req.seqlen - 1  # the newest sampled token has no slot yet
        pool, allocator = self.req_to_token_pool, self.token_to_kv_pool_allocator
        if isinstance(self.tree_cache, ChunkCacheBase):
            allocator.free(pool.req_to_token[req.req_pool_idx, :slotted].to(torch.int64))
            pool.free(req.req_pool_idx)
        else:
            first_own = len(req.prefix_indices) // self.page_size * self.page_size
            allocator.free(pool.req_to_token[req.req_pool_idx, first_own:slotted].to(torch.int64))
            pool.free(req.req_pool_idx)
            self.tree_cache.dec_lock_ref(req.last_node)
            evict_from_tree_cache(self.tree_cache, allocator, remaining_req_count * RETRACT_DECODE_STEPS)
        req.reset_for_retract()

    def prepare_for_decode(self) -> torch.Tensor:
        """One decode step: a new slot for each request's newest token, written in column
        ``seq_len`` of its row (SPEC section 6). The caller appends the sampled token."""
        rows = _int64([r.req_pool_idx for r in self.reqs], self.device)
        slotted = _int64([r.seqlen - 1 for r in self.reqs], self.device)
        self.out_cache_loc = alloc_for_decode(
            self.req_to_token_pool, self.token_to_kv_pool_allocator, self.tree_cache, rows, slotted
        )
        self.req_pool_indices = rows
        self.seq_lens = slotted + 1
        return self.out_cache_loc
