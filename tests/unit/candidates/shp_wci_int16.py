"""WRONG only for slots above 32,767: the new slots are staged through an int16 buffer (as a
candidate tested only on small pools might), which wraps them."""

import torch


def write_cache_indices(out_cache_loc, req_pool_indices_tensor, req_pool_indices_cpu, prefix_lens_tensor,
                        prefix_lens_cpu, seq_lens_tensor, seq_lens_cpu, extend_lens_tensor, extend_lens_cpu,
                        prefix_tensors, req_to_token_pool):
    table = req_to_token_pool.req_to_token
    staged = out_cache_loc.to(torch.int16)  # the bug
    start = 0
    for i, row in enumerate(req_pool_indices_cpu.tolist()):
        pre, ext = int(prefix_lens_cpu[i]), int(extend_lens_cpu[i])
        table[row, :pre] = prefix_tensors[i].to(torch.int32)
        table[row, pre : pre + ext] = staged[start : start + ext].to(torch.int32)
        start += ext
