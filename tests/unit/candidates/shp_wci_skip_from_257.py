"""WRONG only in batches of more than 257 requests: requests with index >= 257 are skipped (as if
the candidate was written for at most 257 of them). Otherwise a plain torch write."""

import torch


def write_cache_indices(out_cache_loc, req_pool_indices_tensor, req_pool_indices_cpu, prefix_lens_tensor,
                        prefix_lens_cpu, seq_lens_tensor, seq_lens_cpu, extend_lens_tensor, extend_lens_cpu,
                        prefix_tensors, req_to_token_pool):
    table = req_to_token_pool.req_to_token
    start = 0
    for i, row in enumerate(req_pool_indices_cpu.tolist()):
        pre, ext = int(prefix_lens_cpu[i]), int(extend_lens_cpu[i])
        if i < 257:  # the bug
            table[row, :pre] = prefix_tensors[i].to(torch.int32)
            table[row, pre : pre + ext] = out_cache_loc[start : start + ext].to(torch.int32)
        start += ext
