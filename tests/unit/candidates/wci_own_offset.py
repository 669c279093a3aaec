"""WRONG: each request's start in out_cache_loc includes its OWN extend length (inclusive cumsum)."""

import torch

from examples.offset_write import BLOCK, _offset_write_kernel


def write_cache_indices(out_cache_loc, req_pool_indices_tensor, req_pool_indices_cpu, prefix_lens_tensor,
                        prefix_lens_cpu, seq_lens_tensor, seq_lens_cpu, extend_lens_tensor, extend_lens_cpu,
                        prefix_tensors, req_to_token_pool):
    table = req_to_token_pool.req_to_token
    pieces = [p.to(torch.int64) for p in prefix_tensors] + [torch.zeros(1, dtype=torch.int64, device=table.device)]
    _offset_write_kernel[(req_pool_indices_tensor.numel(),)](
        table, table.stride(0), req_pool_indices_tensor, torch.cat(pieces),
        torch.cumsum(prefix_lens_tensor, 0) - prefix_lens_tensor, prefix_lens_tensor,
        torch.cumsum(extend_lens_tensor, 0),  # the bug: inclusive
        extend_lens_tensor, out_cache_loc, BLOCK=BLOCK)
