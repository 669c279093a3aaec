"""A plug-in ``get_last_loc`` written from SPEC section 5, independently of SGLang's kernel.

For each request, the slot in column ``prefix_len - 1`` of its row of ``req_to_token``, as
``int64``; ``-1`` for a request without a prefix. Where SGLang's kernel takes requests in blocks
of 256 and lets a masked load supply the ``-1``, this version:

- takes requests in blocks of 1,024 (so a batch of 8,192 is eight programs);
- computes each cell's flat offset ``row * row_stride + prefix_len - 1`` in ``int64``, so a table
  of more than 2**31 cells is still addressed right;
- reads only the cells of requests that have a prefix (the others read nothing) and chooses
  ``-1`` for the rest with ``tl.where``.

Check it with ``kvparity check --target get_last_loc --candidate examples/last_loc_blocks.py:get_last_loc``.
"""

from __future__ import annotations

try:  # inside kvparity this fixes the Triton mode (interpreter on CPU) before triton is imported
    from kvparity.kernels import runtime  # noqa: F401
except ImportError:  # used elsewhere: the caller decides TRITON_INTERPRET
    pass

import torch
import triton
import triton.language as tl

BLOCK = 1024


@triton.jit
def _last_slot_kernel(req_to_token, row_stride, req_pool_indices, prefix_lens, result, num_reqs, BLOCK: tl.constexpr):
    reqs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = reqs < num_reqs
    rows = tl.load(req_pool_indices + reqs, mask=live, other=0).to(tl.int64)
    lens = tl.load(prefix_lens + reqs, mask=live, other=0).to(tl.int64)
    cached = live & (lens > 0)
    slots = tl.load(req_to_token + rows * row_stride + lens - 1, mask=cached, other=0)
    tl.store(result + reqs, tl.where(cached, slots.to(tl.int64), -1), mask=live)


def get_last_loc(req_to_token: torch.Tensor, req_pool_indices_tensor: torch.Tensor,
                 prefix_lens_tensor: torch.Tensor) -> torch.Tensor:
    """``int64`` [bs]: the slot of each request's last cached token, or -1 (SPEC section 5)."""
    num_reqs = req_pool_indices_tensor.numel()
    result = torch.empty(num_reqs, dtype=torch.int64, device=req_to_token.device)
    if num_reqs:
        _last_slot_kernel[(triton.cdiv(num_reqs, BLOCK),)](
            req_to_token, req_to_token.stride(0), req_pool_indices_tensor, prefix_lens_tensor, result, num_reqs,
            BLOCK=BLOCK)
    return result
