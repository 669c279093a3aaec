"""``ScheduleBatch.prepare_for_extend`` in SGLang 0.5.3's order (SPEC section 3):
rows, per-request loop WITH the prefix write, then allocation (``get_last_loc`` reads the rows
just written), then the legacy kernel writes only the new slots."""

from __future__ import annotations

import torch

from kvparity.kernels.last_loc import get_last_loc
from kvparity.kernels.legacy_write import write_extend_slots
from kvparity.mem_cache.common import alloc_req_slots
from kvparity.mem_cache.schedule_batch import ScheduleBatchBase, account_extend, extend_lens_of


class ScheduleBatch(ScheduleBatchBase):
    def prepare_for_extend(self) -> None:
        self._check_requests()
        # 1. Request rows.
        rows = alloc_req_slots(self.req_to_token_pool, len(self.reqs))
        # 2. Per-request lists and tensors.
        lens = extend_lens_of(self.reqs, self.device)
        # 3. Per request: its row, its cached prefix written into the row, bookkeeping.
        for req, row, seq_len, pre_len in zip(self.reqs, rows, lens.seq_lens, lens.prefix_lens):
            req.req_pool_idx = row
            if pre_len > 0:
                self.req_to_token_pool.write((row, slice(0, pre_len)), req.prefix_indices)
            account_extend(req, seq_len, pre_len)
        req_pool_indices = torch.tensor(rows, dtype=torch.int64, device=self.device)
        # 4. KV slots; paged allocation reads last_loc back from the rows written in step 3.
        last_loc = None
        if self.page_size > 1:
            last_loc = get_last_loc(
                self.req_to_token_pool.req_to_token, req_pool_indices, lens.prefix_lens_tensor, backend=self.backend
            )
        out_cache_loc = self._alloc_extend_slots(lens, last_loc)
        # 5. The new slots, into columns [prefix_len, seq_len) of each row.
        write_extend_slots(
            self.req_to_token_pool.req_to_token,
            req_pool_indices,
            lens.prefix_lens_tensor,
            lens.seq_lens_tensor,
            lens.extend_lens_tensor,
            out_cache_loc,
            backend=self.backend,
        )
        self._keep_extend_fields(lens, rows, out_cache_loc)
