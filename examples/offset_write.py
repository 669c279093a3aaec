"""A plug-in ``write_cache_indices`` written independently of SGLang's kernel.

Where SGLang's kernel has every program sum the extend lengths of the requests before it (a serial
loop per program) and reads each prefix through a table of raw pointers, this version:

- precomputes each request's start in ``out_cache_loc`` as an EXCLUSIVE running sum
  (``torch.cumsum(extend_lens) - extend_lens``), once, on the device;
- concatenates the prefixes into one flat ``int64`` tensor with their exclusive offsets too, so no
  raw pointer is ever formed;
- launches one Triton program per request, which copies its prefix into columns
  ``[0, prefix_len)`` and its new slots into ``[prefix_len, seq_len)``, in blocks.

Check it with ``kvparity check --target write_cache_indices --candidate examples/offset_write.py:write_cache_indices``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

try:  # inside kvparity this fixes the Triton mode (interpreter on CPU) before triton is imported
    from kvparity.kernels import runtime  # noqa: F401
except ImportError:  # used elsewhere: the caller decides TRITON_INTERPRET
    pass

import torch
import triton
import triton.language as tl

BLOCK = 512


@triton.jit
def _offset_write_kernel(
    req_to_token,
    row_stride,
    req_pool_indices,
    prefix_flat,
    prefix_starts,
    prefix_lens,
    extend_starts,
    extend_lens,
    out_cache_loc,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    row_base = req_to_token + tl.load(req_pool_indices + pid) * row_stride
    prefix_len = tl.load(prefix_lens + pid)
    prefix_start = tl.load(prefix_starts + pid)
    for block in range(tl.cdiv(prefix_len, BLOCK)):
        cols = block * BLOCK + tl.arange(0, BLOCK)
        keep = cols < prefix_len
        slots = tl.load(prefix_flat + prefix_start + cols, mask=keep)
        tl.store(row_base + cols, slots.to(tl.int32), mask=keep)
    extend_len = tl.load(extend_lens + pid)
    extend_start = tl.load(extend_starts + pid)
    for block in range(tl.cdiv(extend_len, BLOCK)):
        cols = block * BLOCK + tl.arange(0, BLOCK)
        keep = cols < extend_len
        slots = tl.load(out_cache_loc + extend_start + cols, mask=keep)
        tl.store(row_base + prefix_len + cols, slots.to(tl.int32), mask=keep)


def _exclusive_cumsum(lengths: torch.Tensor) -> torch.Tensor:
    return torch.cumsum(lengths, dim=0) - lengths


def write_cache_indices(
    out_cache_loc: torch.Tensor,
    req_pool_indices_tensor: torch.Tensor,
    req_pool_indices_cpu: torch.Tensor,
    prefix_lens_tensor: torch.Tensor,
    prefix_lens_cpu: torch.Tensor,
    seq_lens_tensor: torch.Tensor,
    seq_lens_cpu: torch.Tensor,
    extend_lens_tensor: torch.Tensor,
    extend_lens_cpu: torch.Tensor,
    prefix_tensors: Sequence[torch.Tensor],
    req_to_token_pool: Any,
) -> None:
    """Row ``i`` gets ``prefix_tensors[i]`` then its share of ``out_cache_loc`` (SPEC section 4)."""
    req_to_token = req_to_token_pool.req_to_token
    bs = req_pool_indices_tensor.numel()
    if bs == 0:
        return
    device = req_to_token.device
    pieces = [p.to(device=device, dtype=torch.int64).reshape(-1) for p in prefix_tensors]
    if any(p.numel() for p in pieces):
        prefix_flat = torch.cat(pieces)
    else:  # nothing to copy; the kernel still needs a valid pointer
        prefix_flat = torch.zeros(1, dtype=torch.int64, device=device)
    _offset_write_kernel[(bs,)](
        req_to_token,
        req_to_token.stride(0),
        req_pool_indices_tensor,
        prefix_flat,
        _exclusive_cumsum(prefix_lens_tensor),
        prefix_lens_tensor,
        _exclusive_cumsum(extend_lens_tensor),
        extend_lens_tensor,
        out_cache_loc,
        BLOCK=BLOCK,
    )
