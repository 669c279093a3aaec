"""Legacy write kernel (SGLang 0.5.3): copy each request's new slots into its row.

SPEC section 5. One program per request. A program finds where its share of ``out_cache_loc``
starts by summing ``extend_lens`` of the requests before it (serially, as SGLang does), then copies
``seq_len - prefix_len`` values, in blocks of 512, into row columns ``prefix_len ..``. The prefix
part of the row is NOT written here: legacy writes it earlier, request by request, with torch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvparity.kernels import runtime
from kvparity.kernels.launches import launch

WRITE_BLOCK = 512


@triton.jit
def write_req_to_token_pool_triton(
    req_to_token,
    req_pool_indices,
    prefix_lens,
    seq_lens,
    extend_lens,
    out_cache_loc,
    row_stride: tl.constexpr,
):
    BLOCK: tl.constexpr = 512
    pid = tl.program_id(0)
    row = tl.load(req_pool_indices + pid)
    prefix_len = tl.load(prefix_lens + pid)
    seq_len = tl.load(seq_lens + pid)

    out_start = tl.cast(0, tl.int64)  # int64: the compiler rejects a loop-carried int32 -> int64
    for earlier in range(pid):
        out_start += tl.load(extend_lens + earlier)

    new_len = seq_len - prefix_len
    row_base = req_to_token + row * row_stride + prefix_len
    for block in range(tl.cdiv(new_len, BLOCK)):
        offsets = block * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < new_len
        slots = tl.load(out_cache_loc + out_start + offsets, mask=mask)
        tl.store(row_base + offsets, slots.to(tl.int32), mask=mask)


def _write_extend_torch(req_to_token, req_pool_indices, prefix_lens, seq_lens, extend_lens, out_cache_loc):
    start = 0
    for row, pre, seq, ext in zip(
        req_pool_indices.tolist(), prefix_lens.tolist(), seq_lens.tolist(), extend_lens.tolist()
    ):
        req_to_token[row, pre:seq] = out_cache_loc[start : start + seq - pre].to(torch.int32)
        start += ext


def write_extend_slots(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    out_cache_loc: torch.Tensor,
    *,
    backend: str,
) -> None:
    """Write row columns ``[prefix_len, seq_len)`` of every request from ``out_cache_loc``."""
    runtime.check_backend(backend)
    bs = req_pool_indices.numel()
    if bs == 0:
        return
    if backend == "torch":
        _write_extend_torch(req_to_token, req_pool_indices, prefix_lens, seq_lens, extend_lens, out_cache_loc)
        return
    launch(
        write_req_to_token_pool_triton,
        (bs,),
        req_to_token,
        req_pool_indices,
        prefix_lens,
        seq_lens,
        extend_lens,
        out_cache_loc,
        req_to_token.stride(0),
    )
