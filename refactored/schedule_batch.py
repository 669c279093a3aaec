"""``ScheduleBatch.prepare_for_extend`` in SGLang 0.5.3.post1's order (SPEC section 4):
lists, rows, allocation (``last_loc`` from the prefix tensors, the pool is not read), then
``write_cache_indices`` writes prefix and new slots in one step, then the per-request loop
WITHOUT a prefix write. An allocation failure therefore leaves requests and rows untouched."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from kvparity.kernels.refactored_write import write_prefix_and_extend_slots
from kvparity.mem_cache.common import alloc_req_slots
from kvparity.mem_cache.schedule_batch import ScheduleBatchBase, account_extend, extend_lens_of


def write_cache_indices(
    out_cache_loc: torch.Tensor,
    req_pool_indices_tensor: torch.Tensor,
    req_pool_indices_cpu: torch.Tensor,
    prefix_lens_tensor: torch.Tensor,
    prefix_lens_cpu: torch.Tensor,
    seq_lens_tensor: torch.Tensor,
    seq_lens_cpu: torch.Tensor,
    extend_lens_tensor: torch.Tensor,
    extend_lens_cpu: torch.Tensor,
    prefix_tensors: Sequence[torch.Tensor],
    req_to_token_pool: Any,
    *,
    backend: str,
) -> None:
    """Row ``i`` gets ``prefix_tensors[i]`` in ``[0, prefix_len)`` and its share of
    ``out_cache_loc`` in ``[prefix_len, seq_len)``. SGLang's signature plus ``backend``."""
    write_prefix_and_extend_slots(
        req_to_token_pool.req_to_token,
        req_pool_indices_tensor,
        prefix_tensors,
        prefix_lens_tensor,
        seq_lens_tensor,
        extend_lens_tensor,
        out_cache_loc,
        backend=backend,
    )


def last_loc_from_prefixes(prefix_tensors: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    """The last element of each prefix, or -1 when it is empty (``torch.cat`` of one-element
    pieces on the device)."""
    pieces = [
        p[-1:].to(device) if len(p) > 0 else torch.tensor([-1], dtype=torch.int64, device=device)
        for p in prefix_tensors
    ]
    return torch.cat(pieces)


class ScheduleBatch(ScheduleBatchBase):
    # A class attribute, so a variant with the same signature can be swapped in (kvparity's
    # extra world ``refactored-linear`` does, with the linear-time kernel); SGLang calls the
    # module function directly.
    write_cache_indices = staticmethod(write_cache_indices)

    def prepare_for_extend(self) -> None:
        self._check_requests()
        # 1. Per-request lists and tensors.
        lens = extend_lens_of(self.reqs, self.device)
        prefix_tensors = [r.prefix_indices for r in self.reqs]
        # 2. Request rows.
        rows = alloc_req_slots(self.req_to_token_pool, len(self.reqs))
        req_pool_indices = torch.tensor(rows, dtype=torch.int64, device=self.device)
        # 3. KV slots; last_loc comes from the prefixes, not from the pool.
        last_loc = last_loc_from_prefixes(prefix_tensors, self.device) if self.page_size > 1 else None
        out_cache_loc = self._alloc_extend_slots(lens, last_loc)
        # 4. Prefix and new slots of every row in one step.
        self.write_cache_indices(
            out_cache_loc,
            req_pool_indices,
            torch.tensor(rows, dtype=torch.int64),
            lens.prefix_lens_tensor,
            lens.prefix_lens_cpu,
            lens.seq_lens_tensor,
            lens.seq_lens_cpu,
            lens.extend_lens_tensor,
            lens.extend_lens_cpu,
            prefix_tensors,
            self.req_to_token_pool,
            backend=self.backend,
        )
        # 5. Bookkeeping, as legacy step 3 without the prefix write.
        for req, row, seq_len, pre_len in zip(self.reqs, rows, lens.seq_lens, lens.prefix_lens):
            req.req_pool_idx = row
            account_extend(req, seq_len, pre_len)
        self._keep_extend_fields(lens, rows, out_cache_loc)
