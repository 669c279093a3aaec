"""Refactored write kernel (SGLang 0.5.3.post1): prefix and new slots of every row in one launch.

SPEC section 5. Each program reads its request's prefix through ``prefix_pointers``, a tensor of
raw addresses (``prefix_indices[i].data_ptr()``), turned into a pointer to ``int64``. So a prefix
that is not contiguous ``int64`` is misread: an ``int32`` one yields its elements 0, 2, 4, ...
(each int64 load packs two int32s and the store keeps the low half) and reads past its end. That is
faithful to SGLang and is exactly what SPEC section 8's input contract exists to prevent.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from kvparity.kernels import runtime
from kvparity.kernels.launches import launch


@triton.jit
def write_req_to_token_pool_with_prefix_triton(
    req_to_token,
    req_pool_indices,
    prefix_pointers,
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
    row_base = req_to_token + row * row_stride

    # Prefix: columns [0, prefix_len), read through the request's raw int64 pointer. An empty
    # prefix may have address 0; with prefix_len == 0 the loop body never runs, so it is not read.
    prefix = tl.load(prefix_pointers + pid).to(tl.pointer_type(tl.int64))
    for block in range(tl.cdiv(prefix_len, BLOCK)):
        offsets = block * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < prefix_len
        slots = tl.load(prefix + offsets, mask=mask)
        tl.store(row_base + offsets, slots.to(tl.int32), mask=mask)

    # New slots: exactly the legacy kernel's work.
    out_start = tl.cast(0, tl.int64)  # int64: the compiler rejects a loop-carried int32 -> int64
    for earlier in range(pid):
        out_start += tl.load(extend_lens + earlier)
    new_len = seq_len - prefix_len
    for block in range(tl.cdiv(new_len, BLOCK)):
        offsets = block * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < new_len
        slots = tl.load(out_cache_loc + out_start + offsets, mask=mask)
        tl.store(row_base + prefix_len + offsets, slots.to(tl.int32), mask=mask)


def prefix_pointer_table(prefix_tensors: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    """The ``int64`` table of ``data_ptr()`` of each prefix, as SGLang 0.5.3.post1 builds it."""
    return torch.tensor([t.data_ptr() for t in prefix_tensors], dtype=torch.int64, device=device)


def _write_prefix_and_extend_torch(
    req_to_token, req_pool_indices, prefix_tensors, prefix_lens, seq_lens, extend_lens, out_cache_loc
):
    start = 0
    rows, pres, seqs, exts = (t.tolist() for t in (req_pool_indices, prefix_lens, seq_lens, extend_lens))
    for row, prefix, pre, seq, ext in zip(rows, prefix_tensors, pres, seqs, exts):
        if pre > 0:
            req_to_token[row, :pre] = prefix[:pre].to(device=req_to_token.device, dtype=torch.int32)
        req_to_token[row, pre:seq] = out_cache_loc[start : start + seq - pre].to(torch.int32)
        start += ext


def write_prefix_and_extend_slots(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_tensors: Sequence[torch.Tensor],
    prefix_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    out_cache_loc: torch.Tensor,
    *,
    backend: str,
) -> None:
    """Write row columns ``[0, prefix_len)`` from each prefix and ``[prefix_len, seq_len)`` from
    ``out_cache_loc``. The torch twin does two writes per request, by value, so it reads any dtype
    correctly; the Triton kernel reads raw ``int64`` through the pointer table."""
    runtime.check_backend(backend)
    bs = req_pool_indices.numel()
    if bs == 0:
        return
    if backend == "torch":
        _write_prefix_and_extend_torch(
            req_to_token, req_pool_indices, prefix_tensors, prefix_lens, seq_lens, extend_lens, out_cache_loc
        )
        return
    pointers = prefix_pointer_table(prefix_tensors, req_to_token.device)
    launch(
        write_req_to_token_pool_with_prefix_triton,
        (bs,),
        req_to_token,
        req_pool_indices,
        pointers,
        prefix_lens,
        seq_lens,
        extend_lens,
        out_cache_loc,
        req_to_token.stride(0),
    )
