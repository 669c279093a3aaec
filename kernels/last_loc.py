"""``get_last_loc``: the KV slot of each request's last cached token (SPEC section 5).

Legacy uses it for paged allocation, reading column ``prefix_len - 1`` of the row it has just
written; ``-1`` when the request has no prefix. Refactored takes the same value from the prefix
tensors instead and never reads the pool.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvparity.kernels import runtime
from kvparity.kernels.launches import launch

LAST_LOC_BLOCK = 256


@triton.jit
def get_last_loc_kernel(
    req_to_token,
    req_pool_indices,
    prefix_lens,
    result,
    num_reqs,
    row_stride,
    BLOCK: tl.constexpr,
):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    in_batch = offsets < num_reqs
    prefix_len = tl.load(prefix_lens + offsets, mask=in_batch, other=0)
    row = tl.load(req_pool_indices + offsets, mask=in_batch, other=0)
    has_prefix = prefix_len > 0
    last = tl.load(
        req_to_token + row * row_stride + prefix_len - 1, mask=in_batch & has_prefix, other=-1
    )
    tl.store(result + offsets, last.to(tl.int64), mask=in_batch)


def _get_last_loc_torch(req_to_token, req_pool_indices, prefix_lens):
    # Column -1 for an empty prefix is read but discarded by the where.
    read = req_to_token[req_pool_indices, prefix_lens - 1].to(torch.int64)
    return torch.where(prefix_lens > 0, read, torch.full_like(read, -1))


def get_last_loc(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    *,
    backend: str,
) -> torch.Tensor:
    """``int64`` tensor: slot in column ``prefix_len - 1`` of each request's row, or ``-1``."""
    runtime.check_backend(backend)
    if backend == "torch":
        return _get_last_loc_torch(req_to_token, req_pool_indices, prefix_lens)
    num_reqs = req_pool_indices.numel()
    result = torch.empty(num_reqs, dtype=torch.int64, device=req_to_token.device)
    if num_reqs == 0:
        return result
    grid = (triton.cdiv(num_reqs, LAST_LOC_BLOCK),)
    launch(
        get_last_loc_kernel,
        grid,
        req_to_token,
        req_pool_indices,
        prefix_lens,
        result,
        num_reqs,
        req_to_token.stride(0),
        BLOCK=LAST_LOC_BLOCK,
    )
    return result
