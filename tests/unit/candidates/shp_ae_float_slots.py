"""WRONG only for slots above 2**24: the new pages' slots are computed in float32, which holds
every integer only up to 16,777,216."""

import torch


def alloc_extend(pre_lens_ptr, seq_lens_ptr, last_loc_ptr, free_page_ptr, out_indices,
                 bs_upper, page_size, max_num_extend_tokens):
    ps, at, first = page_size, 0, 0
    for pre, seq, last in zip(pre_lens_ptr.tolist(), seq_lens_ptr.tolist(), last_loc_ptr.tolist()):
        old_end = -(-pre // ps) * ps
        n1 = min(seq, old_end) - pre
        out_indices[at : at + n1] = torch.arange(last + 1, last + 1 + n1)
        for pos in range(max(pre, old_end), seq):
            page = free_page_ptr[first + pos // ps - old_end // ps].to(torch.float32)  # the bug
            out_indices[at + pos - pre] = (page * ps + pos % ps).to(torch.int64)
        at += seq - pre
        first += -(-seq // ps) - old_end // ps
