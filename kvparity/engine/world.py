"""A world: one version (legacy or refactored) on one backend (triton or torch) with its own pools,
allocator and cache. The harness plays the same scenario in several worlds and compares them."""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from kvparity.caches.pool import PoolRecord
from kvparity.kernels import runtime
from kvparity.mem_cache.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
from kvparity.mem_cache.errors import Exhausted, OutOfMemory
from kvparity.mem_cache.memory_pool import ReqToTokenPool
from kvparity.mem_cache.radix_cache import RadixCache
from kvparity.model.poison import POISON
from kvparity.model.worlds import Geometry, WorldId, check_cache_kind, family

# Imported on first use: a world of one version does not import the others.
_MODULES = {"legacy": "kvparity.legacy", "refactored": "kvparity.refactored", "refactored-linear": "kvparity.engine.linear_version"}


def _version_module(version: str) -> Any:
    family(version)  # names the known versions when ``version`` is not one
    return importlib.import_module(_MODULES[version])


def _allocator(geometry: Geometry, device: torch.device, backend: str) -> TokenToKVPoolAllocator:
    if geometry.page_size == 1:
        return TokenToKVPoolAllocator(geometry.kv_slots, device, need_sort=geometry.need_sort, backend=backend)
    return PagedTokenToKVPoolAllocator(
        geometry.kv_slots, geometry.page_size, device, need_sort=geometry.need_sort, backend=backend
    )


@dataclass
class World:
    version: str
    backend: str
    req_to_token_pool: ReqToTokenPool
    allocator: TokenToKVPoolAllocator
    tree_cache: Any
    module: Any

    @property
    def family(self) -> str:
        return family(self.version)

    @property
    def id(self) -> WorldId:
        return WorldId.modelled(self.version, self.backend)

    @property
    def name(self) -> str:
        return str(self.id)

    def new_req(self, rid: str, tokens: list[int], **kwargs: Any) -> Any:
        return self.module.Req(rid, tokens, **kwargs)

    def batch(self, reqs: list[Any]) -> Any:
        return self.module.ScheduleBatch.init_new(
            reqs, self.req_to_token_pool, self.allocator, self.tree_cache, backend=self.backend
        )

    # The scheduler loop calls SGLang's request and cache methods through the world, so that a
    # world backed by real SGLang (``kvparity.engine.real.adapter.RealWorld``) can do what its version needs
    # first (set its globals) and answer in its own words (its out-of-memory errors).
    def init_next_round_input(self, req: Any, use_tree_cache: bool = True) -> None:
        req.init_next_round_input(self.tree_cache if use_tree_cache else None)

    def cache_unfinished_req(self, req: Any, chunked: bool = False) -> None:
        self.tree_cache.cache_unfinished_req(req, chunked=chunked)

    def cache_finished_req(self, req: Any) -> None:
        self.tree_cache.cache_finished_req(req)

    # A request joins the batch (``continuing``: the chunked request's next chunk), cut to
    # ``tokens`` new tokens or, with None, whole. SGLang 0.5.3's PrefillAdder cuts by assigning
    # both fields and leaves a whole request as init_next_round_input made it; later releases
    # changed how (RealWorld.admit follows each release).
    def admit(self, req: Any, tokens: int | None, *, continuing: bool) -> None:
        if tokens is not None:
            req.fill_ids = req.fill_ids[: len(req.prefix_indices) + tokens]
            req.extend_input_len = tokens

    def lock(self, req: Any) -> None:
        """The PrefillAdder's admission lock on the matched node (radix cache only)."""
        if isinstance(self.tree_cache, RadixCache):
            self.tree_cache.inc_lock_ref(req.last_node)

    # SGLang 0.5.3's scheduler frees the chunked request's row after caching it (it takes a new
    # row with its next chunk); from 0.5.9 the request keeps its row (RealWorld says which).
    stash_frees_row = True

    def out_of_memory(self, exc: BaseException) -> Exhausted | None:
        """What ran out, when ``exc`` is this model's out-of-memory error (``mem_cache.errors``,
        raised by ``mem_cache.common``), else None."""
        return exc.exhausted if isinstance(exc, OutOfMemory) else None

    def evict(self, num_tokens: int) -> None:
        """Evict ``num_tokens`` from the tree (RealWorld: in the form the release's evict takes)."""
        self.tree_cache.evict(num_tokens)

    def refuse(self, req: Any) -> None:
        """Nothing: kvparity's worlds serve full attention, whose match takes nothing."""

    def host_events(self) -> None:
        """Nothing: kvparity's worlds have no host tier."""

    def load_back(self, req: Any) -> None:
        """Nothing: kvparity's worlds have no host tier."""

    def release_pages(self) -> torch.Tensor:
        """Freed pages waiting for the next sort (RealWorld reads each release's own store)."""
        return self.allocator.release_pages

    def tree_contents(self) -> list[tuple]:
        return self.tree_cache.contents()

    def all_tree_slots(self) -> list[int]:
        return self.tree_cache.all_values_flatten().tolist() if isinstance(self.tree_cache, RadixCache) else []

    def pool_records(self, radix: bool, reqs: Iterable[Any]) -> dict[str, PoolRecord]:
        """None: kvparity's worlds serve full attention, with no pool beside the device's KV."""
        return {}


def build_world(
    version: str,
    backend: str,
    geometry: Geometry,
    cache_kind: str,
    *,
    device: torch.device | None = None,
    poison: int | None = POISON,
) -> World:
    """A fresh world; ``req_to_token`` is filled with ``poison`` so unwritten cells show."""
    module = _version_module(version)
    runtime.check_backend(backend)
    device = runtime.DEVICE if device is None else device
    pool = ReqToTokenPool(geometry.pool_rows, geometry.max_context_len, device)
    if poison is not None:
        pool.req_to_token.fill_(poison)
    allocator = _allocator(geometry, device, backend)
    if check_cache_kind(cache_kind) == "radix":
        cache: Any = RadixCache(pool, allocator, geometry.page_size)
    else:
        cache = module.ChunkCache(pool, allocator, geometry.page_size)
    return World(version, backend, pool, allocator, cache, module)
