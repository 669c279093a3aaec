"""SANDBOX: correct rows (plain torch), plus a Triton store of 7 at the address of every EMPTY
prefix tensor (one element past its end, i.e. where its data would begin)."""

import triton
import triton.language as tl


@triton.jit
def _poke(base, value):
    tl.store(base, value)


def write_cache_indices(out_cache_loc, req_pool_indices_tensor, req_pool_indices_cpu, prefix_lens_tensor,
                        prefix_lens_cpu, seq_lens_tensor, seq_lens_cpu, extend_lens_tensor, extend_lens_cpu,
                        prefix_tensors, req_to_token_pool):
    start = 0
    for i, row in enumerate(req_pool_indices_cpu.tolist()):
        pre, seq = int(prefix_lens_cpu[i]), int(seq_lens_cpu[i])
        if pre > 0:
            req_to_token_pool.write((row, slice(0, pre)), prefix_tensors[i])
        req_to_token_pool.write((row, slice(pre, seq)), out_cache_loc[start : start + seq - pre])
        start += seq - pre
    for prefix in prefix_tensors:
        if prefix.numel() == 0:
            _poke[(1,)](prefix, 7)
