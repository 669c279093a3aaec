"""Allocation helpers both versions call unchanged (SGLang 0.5.3.post2 moved them to
``mem_cache/common.py``): request rows, KV slots with eviction, and the decode step.

Out of memory raises ``RowsExhausted`` or ``KVOutOfMemory`` (``mem_cache.errors``: both are
``RuntimeError``s, as SGLang's are) with the numbers that explain it.
"""

from __future__ import annotations

from typing import Any

import torch

from kvparity.mem_cache.errors import KVOutOfMemory, RowsExhausted


def alloc_req_slots(req_to_token_pool: Any, num_reqs: int) -> list[int]:
    rows = req_to_token_pool.alloc(num_reqs)
    if rows is None:
        raise RowsExhausted(
            f"alloc_req_slots: out of request rows: {num_reqs} needed, "
            f"{req_to_token_pool.available_size()} free of {req_to_token_pool.size}"
        )
    return rows


def evict_from_tree_cache(tree_cache: Any, allocator: Any, num_tokens: int) -> None:
    """Ask the tree cache to evict ``num_tokens`` slots when the allocator has fewer free."""
    if tree_cache is not None and allocator.available_size() < num_tokens:
        tree_cache.evict(num_tokens)


def _out_of_memory(what: str, num_tokens: int, allocator: Any, tree_cache: Any) -> KVOutOfMemory:
    evictable = tree_cache.evictable_size() if tree_cache is not None else 0
    return KVOutOfMemory(
        f"{what}: out of KV memory: {num_tokens} slots needed, "
        f"available_size={allocator.available_size()}, evictable_size={evictable}"
    )


def alloc_token_slots(tree_cache: Any, allocator: Any, num_tokens: int) -> torch.Tensor:
    """``num_tokens`` slots from a page-size-1 allocator, evicting first when short."""
    evict_from_tree_cache(tree_cache, allocator, num_tokens)
    out = allocator.alloc(num_tokens)
    if out is None:
        raise _out_of_memory("alloc_token_slots", num_tokens, allocator, tree_cache)
    return out


def alloc_paged_token_slots_extend(
    tree_cache: Any,
    allocator: Any,
    prefix_lens: torch.Tensor,
    prefix_lens_cpu: torch.Tensor,
    seq_lens: torch.Tensor,
    seq_lens_cpu: torch.Tensor,
    last_loc: torch.Tensor,
    extend_num_tokens: int,
) -> torch.Tensor:
    """Paged extend allocation. Eviction asks for ``extend_num_tokens + bs * page_size``: each
    request may open one partly used page beyond its tokens."""
    wanted = extend_num_tokens + len(seq_lens_cpu) * allocator.page_size
    evict_from_tree_cache(tree_cache, allocator, wanted)
    out = allocator.alloc_extend(prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc, extend_num_tokens)
    if out is None:
        raise _out_of_memory("alloc_paged_token_slots_extend", extend_num_tokens, allocator, tree_cache)
    return out


def alloc_for_decode(
    req_to_token_pool: Any, allocator: Any, tree_cache: Any, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor
) -> torch.Tensor:
    """One new slot per running request, for column ``seq_len``; the slot is written there.
    ``seq_lens`` is how many tokens of each request already have a slot."""
    bs = len(seq_lens)
    if allocator.page_size == 1:
        out = alloc_token_slots(tree_cache, allocator, bs)
    else:
        last_loc = req_to_token_pool.req_to_token[req_pool_indices, seq_lens - 1].to(torch.int64)
        evict_from_tree_cache(tree_cache, allocator, bs * allocator.page_size)
        new_lens = seq_lens + 1
        out = allocator.alloc_decode(new_lens, new_lens.cpu(), last_loc)
        if out is None:
            raise _out_of_memory("alloc_for_decode", bs, allocator, tree_cache)
    req_to_token_pool.write((req_pool_indices, seq_lens), out)
    return out
