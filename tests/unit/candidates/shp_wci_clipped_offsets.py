"""WRONG only after a long request: each request's start in out_cache_loc sums the extend lengths
before it clipped to one block of 512, so a request after one of more than 512 new tokens reads
the wrong slots. The smallest batch showing it has two requests: a long one, then another."""

import torch


def write_cache_indices(out_cache_loc, req_pool_indices_tensor, req_pool_indices_cpu, prefix_lens_tensor,
                        prefix_lens_cpu, seq_lens_tensor, seq_lens_cpu, extend_lens_tensor, extend_lens_cpu,
                        prefix_tensors, req_to_token_pool):
    table = req_to_token_pool.req_to_token
    start = 0
    for i, row in enumerate(req_pool_indices_cpu.tolist()):
        pre, ext = int(prefix_lens_cpu[i]), int(extend_lens_cpu[i])
        table[row, :pre] = prefix_tensors[i].to(torch.int32)
        table[row, pre : pre + ext] = out_cache_loc[start : start + ext].to(torch.int32)
        start += min(ext, 512)  # the bug
