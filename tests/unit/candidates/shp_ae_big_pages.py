"""WRONG only for page sizes of 32 and more: the rest of a request's old page (part 1 of SPEC
section 1) is copied through a 16-slot tile, once, so slots 17 and on of it are never written.
A page of 16 or fewer has at most 15 such slots, so the bug never shows there."""

import torch

TILE = 16


def alloc_extend(pre_lens_ptr, seq_lens_ptr, last_loc_ptr, free_page_ptr, out_indices,
                 bs_upper, page_size, max_num_extend_tokens):
    ps, at, first = page_size, 0, 0
    for pre, seq, last in zip(pre_lens_ptr.tolist(), seq_lens_ptr.tolist(), last_loc_ptr.tolist()):
        old_end = -(-pre // ps) * ps
        n1 = min(seq, old_end) - pre
        done = min(n1, TILE)  # the bug: one tile of part 1
        out_indices[at : at + done] = torch.arange(last + 1, last + 1 + done)
        for pos in range(max(pre, old_end), seq):
            page = int(free_page_ptr[first + pos // ps - old_end // ps])
            out_indices[at + pos - pre] = page * ps + pos % ps
        at += seq - pre
        first += -(-seq // ps) - old_end // ps
