"""WRONG: a Triton store far outside any buffer (a segfault under the interpreter, an illegal
address on a GPU, which leaves that process's CUDA context unusable)."""

import triton
import triton.language as tl


@triton.jit
def _wild(table, offset):
    tl.store(table + offset, 1)


def write_cache_indices(out_cache_loc, req_pool_indices_tensor, req_pool_indices_cpu, prefix_lens_tensor,
                        prefix_lens_cpu, seq_lens_tensor, seq_lens_cpu, extend_lens_tensor, extend_lens_cpu,
                        prefix_tensors, req_to_token_pool):
    table = req_to_token_pool.req_to_token
    _wild[(1,)](table, -table.data_ptr() // 4 + 16)  # about address 64: never mapped
