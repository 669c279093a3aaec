"""WRONG when a prefix's pages are not adjacent: a prefix whose first two slots are consecutive is
taken for one run and written as first slot + column. Within a page that holds (a paged allocator
hands out runs of page_size slots), across pages only when the pages happen to be adjacent. A
prefix of scattered single slots, or of one run, never shows it."""

import torch


def write_cache_indices(out_cache_loc, req_pool_indices_tensor, req_pool_indices_cpu, prefix_lens_tensor,
                        prefix_lens_cpu, seq_lens_tensor, seq_lens_cpu, extend_lens_tensor, extend_lens_cpu,
                        prefix_tensors, req_to_token_pool):
    table = req_to_token_pool.req_to_token
    start = 0
    for i, row in enumerate(req_pool_indices_cpu.tolist()):
        pre, seq = int(prefix_lens_cpu[i]), int(seq_lens_cpu[i])
        prefix = prefix_tensors[i]
        if pre >= 2 and int(prefix[1]) == int(prefix[0]) + 1:  # the bug: two slots taken for the whole prefix
            first = int(prefix[0])
            table[row, :pre] = torch.arange(first, first + pre, dtype=table.dtype, device=table.device)
        elif pre:
            table[row, :pre] = prefix.to(table.dtype)
        table[row, pre:seq] = out_cache_loc[start : start + seq - pre].to(table.dtype)
        start += seq - pre
