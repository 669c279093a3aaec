"""Paged ``alloc_extend``: the new KV slots of every request of an extend batch (SPEC section 1).

Request ``i`` with prefix length ``pre`` and new length ``seq`` gets the slots of positions
``pre .. seq-1``, in three parts:
1. the rest of its last partially-filled page: ``last_loc + 1 ..``;
2. whole new pages, taken from ``free_pages`` after the pages of requests ``0 .. i-1``;
3. a trailing partial page: the start of its last new page.
The Triton kernel keeps SGLang's signature (SPEC section 9) so that a plug-in candidate can replace
it; each program finds its output offset and first new page by summing the earlier requests.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvparity.kernels import runtime
from kvparity.kernels.launches import launch


@triton.jit
def alloc_extend_kernel(
    pre_lens_ptr,
    seq_lens_ptr,
    last_loc_ptr,
    free_page_ptr,
    out_indices,
    bs_upper: tl.constexpr,
    page_size: tl.constexpr,
    max_num_extend_tokens: tl.constexpr,
):
    pid = tl.program_id(0)

    # Requests 0..pid (inclusive): their extend lengths and new-page counts, summed.
    upto = tl.arange(0, bs_upper)
    upto_mask = upto <= pid
    seqs = tl.load(seq_lens_ptr + upto, mask=upto_mask, other=0)
    pres = tl.load(pre_lens_ptr + upto, mask=upto_mask, other=0)
    pages_through_me = tl.sum((seqs + page_size - 1) // page_size - (pres + page_size - 1) // page_size)
    tokens_through_me = tl.sum(seqs - pres)

    seq = tl.load(seq_lens_ptr + pid)
    pre = tl.load(pre_lens_ptr + pid)
    my_pages = (seq + page_size - 1) // page_size - (pre + page_size - 1) // page_size
    first_page = pages_through_me - my_pages
    out_start = tokens_through_me - (seq - pre)

    # Part 1: the rest of the old page.
    old_page_end = (pre + page_size - 1) // page_size * page_size
    n1 = tl.minimum(seq, old_page_end) - pre
    in_page = tl.arange(0, page_size)
    last_loc = tl.load(last_loc_ptr + pid)
    tl.store(out_indices + out_start + in_page, last_loc + 1 + in_page, mask=in_page < n1)

    # Part 2: whole new pages (n2 may be negative when seq stays inside the old page).
    full_end = seq // page_size * page_size
    n2 = full_end - old_page_end
    k = tl.arange(0, max_num_extend_tokens)
    part2 = k < n2
    page = tl.load(free_page_ptr + first_page + k // page_size, mask=part2, other=0)
    tl.store(out_indices + out_start + n1 + k, page * page_size + k % page_size, mask=part2)

    # Part 3: a trailing partial page, only when it lies beyond the old page.
    n3 = tl.where(full_end >= old_page_end, seq - full_end, 0)
    n2_pos = tl.maximum(n2, 0)
    last_page = tl.load(free_page_ptr + first_page + my_pages - 1, mask=n3 > 0, other=0)
    tl.store(out_indices + out_start + n1 + n2_pos + in_page, last_page * page_size + in_page, mask=in_page < n3)


def next_power_of_2(n: int) -> int:
    """The smallest power of two ``>= n`` (1 for ``n <= 1``), as SGLang sizes its tiles."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def new_pages_needed(prefix_lens_cpu: torch.Tensor, seq_lens_cpu: torch.Tensor, page_size: int) -> int:
    """Total new pages an extend batch needs: ``sum(ceil(seq/ps) - ceil(pre/ps))``."""
    after = (seq_lens_cpu + page_size - 1) // page_size
    before = (prefix_lens_cpu + page_size - 1) // page_size
    return int((after - before).sum().item())


def _alloc_extend_torch(prefix_lens, seq_lens, last_loc, free_pages, page_size, out):
    out_start = 0
    next_page = 0
    for pre, seq, last in zip(prefix_lens.tolist(), seq_lens.tolist(), last_loc.tolist()):
        old_page_end = -(-pre // page_size) * page_size
        full_end = seq // page_size * page_size
        n1 = min(seq, old_page_end) - pre
        my_pages = -(-seq // page_size) - -(-pre // page_size)
        pages = free_pages[next_page : next_page + my_pages]
        slots = [torch.arange(last + 1, last + 1 + n1, dtype=torch.int64, device=out.device)]
        n2 = max(full_end - old_page_end, 0)
        k = torch.arange(n2, dtype=torch.int64, device=out.device)
        slots.append(pages[k // page_size] * page_size + k % page_size)
        if full_end >= old_page_end and seq > full_end:
            slots.append(pages[-1] * page_size + torch.arange(seq - full_end, device=out.device))
        new = torch.cat(slots)
        out[out_start : out_start + new.numel()] = new
        out_start += seq - pre
        next_page += my_pages


def alloc_extend(
    prefix_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    last_loc: torch.Tensor,
    free_pages: torch.Tensor,
    page_size: int,
    extend_num_tokens: int,
    *,
    backend: str,
    out: torch.Tensor | None = None,
    max_num_extend_tokens: int | None = None,
) -> torch.Tensor:
    """New slots of the batch, ``int64``, length ``extend_num_tokens``. Does not change
    ``free_pages``; the caller checks there are enough pages and removes the used ones.
    ``out`` may be given pre-poisoned so that a cell the kernel forgets shows.
    ``max_num_extend_tokens`` is the kernel's tile (a power of two ``>= extend_num_tokens``; the
    allocator passes its running maximum, as SGLang does); by default the batch's own."""
    runtime.check_backend(backend)
    if out is None:
        out = torch.empty(extend_num_tokens, dtype=torch.int64, device=prefix_lens.device)
    bs = prefix_lens.numel()
    if bs == 0:
        if extend_num_tokens != 0:
            raise ValueError(f"alloc_extend: extend_num_tokens={extend_num_tokens} for an empty batch")
        return out
    if backend == "torch":
        _alloc_extend_torch(prefix_lens, seq_lens, last_loc, free_pages, page_size, out)
        return out
    tile = next_power_of_2(extend_num_tokens) if max_num_extend_tokens is None else max_num_extend_tokens
    if tile < extend_num_tokens or tile & (tile - 1):
        raise ValueError(f"alloc_extend: max_num_extend_tokens={tile} must be a power of two >= {extend_num_tokens}")
    # Positionally, as SGLang launches it (a plug-in candidate may name its parameters differently).
    launch(alloc_extend_kernel, (bs,), prefix_lens, seq_lens, last_loc, free_pages, out, next_power_of_2(bs), page_size, tile)
    return out
