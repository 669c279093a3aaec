"""WRONG only in batches of more than 512 requests: the running offset into out_cache_loc restarts
at 0 in every block of 512 requests (a per-block cumsum), so request 513 on (index 512 on) reads
the first requests' slots."""

import torch

BLOCK = 512


def write_cache_indices(out_cache_loc, req_pool_indices_tensor, req_pool_indices_cpu, prefix_lens_tensor,
                        prefix_lens_cpu, seq_lens_tensor, seq_lens_cpu, extend_lens_tensor, extend_lens_cpu,
                        prefix_tensors, req_to_token_pool):
    table = req_to_token_pool.req_to_token
    lens = extend_lens_cpu.to(torch.int64)
    starts = torch.cat([torch.cumsum(lens[b : b + BLOCK], 0) - lens[b : b + BLOCK]  # the bug: per block
                        for b in range(0, lens.numel(), BLOCK)])
    for i, row in enumerate(req_pool_indices_cpu.tolist()):
        pre, ext, start = int(prefix_lens_cpu[i]), int(lens[i]), int(starts[i])
        table[row, :pre] = prefix_tensors[i].to(torch.int32)
        table[row, pre : pre + ext] = out_cache_loc[start : start + ext].to(torch.int32)
