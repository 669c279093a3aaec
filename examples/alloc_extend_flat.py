"""A plug-in ``alloc_extend`` written from SPEC section 1, independently of SGLang's kernel.

SGLang launches one Triton program per request, and each program sums the lengths and new-page
counts of every request before it. This version is a plain function (kvparity calls it with the
kernel's positional arguments, SPEC section 9) that works on the whole batch at once, in torch:

- each request's start in ``out_indices`` and its first page in ``free_page_ptr`` are EXCLUSIVE
  running sums (``cumsum - own``), computed once;
- every output slot is one token position ``pos`` of one request (``repeat_interleave``); the
  three parts of SPEC section 1 become one rule per position: a position before the end of the
  request's old page, ``ceil(pre/ps) * ps``, continues the old page (``last_loc + 1 + pos - pre``);
  any later one lies in the request's new page number ``pos // ps - ceil(pre/ps)``, at offset
  ``pos % ps`` (whole pages and a trailing partial page alike).

The constexprs ``bs_upper`` and ``max_num_extend_tokens`` size SGLang's tiles; nothing here
needs them. Check it with
``kvparity check --target alloc_extend --candidate examples/alloc_extend_flat.py:alloc_extend``.
"""

from __future__ import annotations

import torch


def _exclusive_cumsum(values: torch.Tensor) -> torch.Tensor:
    return torch.cumsum(values, 0) - values


def alloc_extend(pre_lens_ptr: torch.Tensor, seq_lens_ptr: torch.Tensor, last_loc_ptr: torch.Tensor,
                 free_page_ptr: torch.Tensor, out_indices: torch.Tensor, bs_upper: int, page_size: int,
                 max_num_extend_tokens: int) -> None:
    """Write the new slots of every request, request after request, into ``out_indices``."""
    total = out_indices.numel()
    if total == 0:
        return
    ps = int(page_size)
    pre, seq, last = (t.to(torch.int64) for t in (pre_lens_ptr, seq_lens_ptr, last_loc_ptr))
    extend = seq - pre
    old_pages = (pre + ps - 1) // ps  # pages the prefix already occupies
    new_pages = (seq + ps - 1) // ps - old_pages
    first_page = _exclusive_cumsum(new_pages)
    out_start = _exclusive_cumsum(extend)

    request = torch.repeat_interleave(torch.arange(pre.numel(), device=pre.device), extend)
    pos = torch.arange(total, device=pre.device) - out_start[request] + pre[request]
    in_old_page = pos < old_pages[request] * ps
    continued = last[request] + 1 + pos - pre[request]
    if free_page_ptr.numel():
        which = (first_page[request] + pos // ps - old_pages[request]).clamp(0, free_page_ptr.numel() - 1)
        fresh = free_page_ptr.to(torch.int64)[which] * ps + pos % ps
    else:  # no free page: every new slot continues an old page
        fresh = torch.zeros_like(pos)
    out_indices.copy_(torch.where(in_old_page, continued, fresh))
