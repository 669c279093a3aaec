"""SANDBOX: correct rows (plain torch), plus one Triton store out of bounds (no bounds check under
the interpreter), farther than target_inputs' guard margins:

- ``write_cache_indices``: 300 elements past the end of ``out_cache_loc`` (beyond its 64-element
  margin, inside one 512-element block);
- ``table_row_past_margin``: into ``req_to_token``, one whole row past the end of its guard margin;
- ``past_every_guard``: 2**20 elements (8 MiB) past the end of ``out_cache_loc``."""

import triton
import triton.language as tl


@triton.jit
def _poke(base, offset, value):
    tl.store(base + offset, value)


def _write(out_cache_loc, req_pool_indices_cpu, prefix_lens_cpu, seq_lens_cpu, prefix_tensors, pool):
    start = 0
    for i, row in enumerate(req_pool_indices_cpu.tolist()):
        pre, seq = int(prefix_lens_cpu[i]), int(seq_lens_cpu[i])
        if pre > 0:
            pool.write((row, slice(0, pre)), prefix_tensors[i])
        pool.write((row, slice(pre, seq)), out_cache_loc[start : start + seq - pre])
        start += seq - pre


def write_cache_indices(out_cache_loc, req_pool_indices_tensor, req_pool_indices_cpu, prefix_lens_tensor,
                        prefix_lens_cpu, seq_lens_tensor, seq_lens_cpu, extend_lens_tensor, extend_lens_cpu,
                        prefix_tensors, req_to_token_pool):
    _write(out_cache_loc, req_pool_indices_cpu, prefix_lens_cpu, seq_lens_cpu, prefix_tensors, req_to_token_pool)
    _poke[(1,)](out_cache_loc, out_cache_loc.numel() + 300, 7)


def table_row_past_margin(out_cache_loc, req_pool_indices_tensor, req_pool_indices_cpu, prefix_lens_tensor,
                          prefix_lens_cpu, seq_lens_tensor, seq_lens_cpu, extend_lens_tensor, extend_lens_cpu,
                          prefix_tensors, req_to_token_pool):
    _write(out_cache_loc, req_pool_indices_cpu, prefix_lens_cpu, seq_lens_cpu, prefix_tensors, req_to_token_pool)
    table = req_to_token_pool.req_to_token
    rows, width = table.shape
    _poke[(1,)](table, (rows + 3) * width + 64, 7)  # the margin is 2 rows + 64 elements


def past_every_guard(out_cache_loc, req_pool_indices_tensor, req_pool_indices_cpu, prefix_lens_tensor,
                     prefix_lens_cpu, seq_lens_tensor, seq_lens_cpu, extend_lens_tensor, extend_lens_cpu,
                     prefix_tensors, req_to_token_pool):
    _write(out_cache_loc, req_pool_indices_cpu, prefix_lens_cpu, seq_lens_cpu, prefix_tensors, req_to_token_pool)
    _poke[(1,)](out_cache_loc, out_cache_loc.numel() + 2**20, 7)
