"""WRONG: correct rows, plus one Triton store into the row just past the table (no bounds check)."""

import triton
import triton.language as tl

from examples.offset_write import write_cache_indices as _correct


@triton.jit
def _poke(table, offset, value):
    tl.store(table + offset, value)


def write_cache_indices(out_cache_loc, req_pool_indices_tensor, req_pool_indices_cpu, prefix_lens_tensor,
                        prefix_lens_cpu, seq_lens_tensor, seq_lens_cpu, extend_lens_tensor, extend_lens_cpu,
                        prefix_tensors, req_to_token_pool):
    _correct(out_cache_loc, req_pool_indices_tensor, req_pool_indices_cpu, prefix_lens_tensor, prefix_lens_cpu,
             seq_lens_tensor, seq_lens_cpu, extend_lens_tensor, extend_lens_cpu, prefix_tensors, req_to_token_pool)
    table = req_to_token_pool.req_to_token
    _poke[(1,)](table, table.shape[0] * table.stride(0), 7)  # row `rows`, column 0
