"""The pools and tree of a hybrid model's world (issue 34), and the tree a server of the release
builds for it: its own tree up to 0.5.15, ``UnifiedRadixCache`` with the model's components from
0.5.16 (``VersionEntry.hybrid_tree``).

- A sliding-window model: a full pool and a window pool joined by SGLang's slot mapping
  (``SWAKVPool``, ``SWATokenToKVPoolAllocator``); its tree ``SWARadixCache``, or FULL and SWA.
- A hybrid linear (Mamba) model: a request pool that also hands each request a recurrent-state slot
  (``HybridReqToTokenPool`` with its ``MambaPool``), a full pool for the attention layer
  (``HybridLinearKVPool``); its tree ``MambaRadixCache`` (0.5.3.post2 .. 0.5.20), or FULL and MAMBA.

The model has one full-attention layer and one window or Mamba layer, each of one head of width
one: the pools only store KV and state, kvparity's forward stamps them (a Mamba state slot holds the
KV canary of the last token it has seen, ``write_state``). Constructors are called with the keywords
each release's signature takes (they gained ``page_size`` in 0.5.8, lost ``enable_kvcache_transpose``
in 0.5.15, gained ``enable_memory_saver`` in 0.5.22).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from kvparity.engine.canary import StateView, float_lanes, int_lanes
from kvparity.engine.real import RealSGLangError
from kvparity.engine.real.names import lookup
from kvparity.engine.real.versions import VersionEntry

FULL_LAYER, WINDOW_LAYER = 1, 0  # the model's layer ids (SGLang's layers_mapping keys)
MAMBA_LAYER = 0  # a hybrid linear model's Mamba layer (beside FULL_LAYER)
# Where the Mamba classes live (the same module in every release that has them).
_MEMORY_POOL = "sglang.srt.mem_cache.memory_pool"
_MAMBA_UTILS = "sglang.srt.configs.mamba_utils"
# A state slot's temporal state: one head of width one, STATE_SIZE values (a canary takes six:
# token, position and the hash in four 16-bit parts, each exact in float32).
STATE_SIZE = 8
# The chunk size a Mamba tree caches states at (SGLang's mamba_cache_chunk_size, which a server
# reads from the model's config; preset on the server arguments so that none is loaded).
MAMBA_CACHE_CHUNK_SIZE = 64


# SGLang reads the eviction interval from the environment each time it evicts (0.5.16+).
EVICTION_INTERVAL_ENV = "SGLANG_SWA_EVICTION_INTERVAL"


@dataclass(frozen=True)
class Window:
    """A sliding-window model: its window, its window pool's slots and how many tokens slide out
    of a window before they are freed (None: SGLang's default)."""

    size: int
    slots: int
    eviction_interval: int | None = None

    @staticmethod
    def publish(window: Window | None) -> None:
        """The process's environment as a server of this model has it (a worker plays many
        scenarios: a window's setting must not outlive its world)."""
        if window is None or window.eviction_interval is None:
            os.environ.pop(EVICTION_INTERVAL_ENV, None)
        else:
            os.environ[EVICTION_INTERVAL_ENV] = str(window.eviction_interval)


@dataclass(frozen=True)
class Mamba:
    """A hybrid linear model: its recurrent-state pool's slots (SGLang's --max-mamba-cache-size)
    and how its tree caches states (``no_buffer``: only a request's own slot, page size 1, the
    normal loop)."""

    slots: int
    strategy: str = "no_buffer"


def called_with(cls: Any, declared: dict[str, Any], forwarded: dict[str, Any] | None = None) -> Any:
    """``cls`` built with the ``declared`` keywords its ``__init__`` takes (what a release added or
    dropped is left out, not an error), and the ``forwarded`` ones it takes or, where it takes
    ``**kwargs``, hands on to the pool it builds (0.5.3's SWAKVPool names neither dtype nor heads)."""
    params = inspect.signature(cls.__init__).parameters
    open_ended = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    given = {name: value for name, value in declared.items() if name in params}
    given |= {name: value for name, value in (forwarded or {}).items() if name in params or open_ended}
    return cls(**given)


def window_pools(entry: VersionEntry, window: Window, kv_slots: int, page_size: int, dtype: Any,
                 device: str, need_sort: bool) -> tuple[Any, Any]:
    """The KV pool and the allocator of a sliding-window model (full pool ``kv_slots``, window pool
    ``window.slots``)."""
    allocator_cls = lookup(entry.swa_allocator)
    if page_size > 1 and not entry.paged_swa:
        raise RealSGLangError(f"SGLang {entry.version}'s SWATokenToKVPoolAllocator has no page size: its "
                              f"sliding-window pools are page size 1 only (asked for {page_size})")
    kv_pool = called_with(
        lookup(entry.swa_kv_pool),
        dict(size=kv_slots, size_swa=window.slots, swa_attention_layer_ids=[WINDOW_LAYER],
             full_attention_layer_ids=[FULL_LAYER], enable_kvcache_transpose=False),
        dict(page_size=page_size, dtype=dtype, head_num=1, head_dim=1, device=device, enable_memory_saver=False))
    allocator = called_with(allocator_cls, dict(size=kv_slots, size_swa=window.slots, page_size=page_size,
                                                dtype=dtype, device=device, kvcache=kv_pool, need_sort=need_sort))
    return kv_pool, allocator


def mamba_pools(entry: VersionEntry, mamba: Mamba, rows: int, max_context_len: int, kv_slots: int,
                kv_form: tuple[Any, int], device: str, need_sort: bool) -> tuple[Any, Any, Any]:
    """The request pool (with the state pool), the KV pool and the allocator of a hybrid linear
    model: ``rows`` request rows, ``mamba.slots`` state slots (slot 0 is SGLang's dummy), a full
    pool of ``kv_slots`` at page size 1 of ``kv_form`` (its dtype and head width)."""
    dtype, width = kv_form
    if entry.mamba_tree is None and entry.hybrid_tree != "unified":
        raise RealSGLangError(f"SGLang {entry.version} has no Mamba tree (MambaRadixCache from 0.5.3.post2)")
    utils = lookup(f"{_MAMBA_UTILS}:Mamba2StateShape"), lookup(f"{_MAMBA_UTILS}:Mamba2StateDType")
    shape = utils[0].create(tp_world_size=1, intermediate_size=1, n_groups=1, num_heads=1, head_dim=1,
                            state_size=STATE_SIZE, conv_kernel=2)
    params = called_with(lookup(f"{_MAMBA_UTILS}:Mamba2CacheParams"), dict(
        shape=shape, layers=[MAMBA_LAYER], dtype=utils[1](conv=torch.float32, temporal=torch.float32)))
    rtp = called_with(lookup(f"{_MEMORY_POOL}:HybridReqToTokenPool"), dict(
        size=rows, mamba_size=mamba.slots, mamba_spec_state_size=mamba.slots, max_context_len=max_context_len,
        device=device, enable_memory_saver=False, cache_params=params, mamba_layer_ids=[MAMBA_LAYER],
        enable_mamba_extra_buffer=False, enable_mamba_extra_buffer_lazy=False, enable_overlap_schedule=False))
    kv_pool = called_with(lookup(f"{_MEMORY_POOL}:HybridLinearKVPool"), dict(
        size=kv_slots, dtype=dtype, page_size=1, head_num=1, head_dim=width, full_attention_layer_ids=[FULL_LAYER],
        enable_kvcache_transpose=False, device=device, mamba_pool=rtp.mamba_pool, enable_memory_saver=False))
    allocator = lookup("sglang.srt.mem_cache.allocator:TokenToKVPoolAllocator")(kv_slots, dtype, device, kv_pool,
                                                                                 need_sort)
    return rtp, kv_pool, allocator


def window_tree(entry: VersionEntry, window: Window, fields: dict[str, Any], cache_init_params: Any,
                unified: Callable[[dict[str, Any]], Any] | None) -> Any:
    """The tree of a sliding-window model: ``fields`` are the pools and page size every cache
    takes; ``unified(params)`` (None: the release's SWARadixCache) builds a UnifiedRadixCache on the
    world's tree core from a dict of CacheInitParams fields (the world's own, as for full attention)."""
    if unified is not None:
        types = lookup(entry.component_types or "")
        return unified(dict(fields, sliding_window_size=window.size, tree_components=(types.FULL, types.SWA)))
    return _own_tree(entry, entry.swa_tree, "sliding-window", fields, cache_init_params,
                     {"sliding_window_size": window.size})


def mamba_tree(entry: VersionEntry, fields: dict[str, Any], cache_init_params: Any,
               unified: Callable[[dict[str, Any]], Any] | None) -> Any:
    """The tree of a hybrid linear model (as ``window_tree``): MambaRadixCache, or FULL and MAMBA."""
    if unified is not None:
        types = lookup(entry.component_types or "")
        return unified(dict(fields, tree_components=(types.FULL, types.MAMBA), enable_mamba_extra_buffer=False))
    return _own_tree(entry, entry.mamba_tree, "Mamba", fields, cache_init_params, {})


def _own_tree(entry: VersionEntry, path: str | None, kind: str, fields: dict[str, Any], cache_init_params: Any,
              model: dict[str, Any]) -> Any:
    """A hybrid tree of its own, built as the release's constructor takes it; ``model``: the
    model's own settings (a window)."""
    if path is None:
        raise RealSGLangError(f"SGLang {entry.version} has no {kind} tree")
    tree = lookup(path)
    takes = inspect.signature(tree.__init__).parameters
    if cache_init_params is None:  # up to 0.5.5: keyword arguments
        return called_with(tree, dict(fields, **model, disable=False))
    beside = {k: v for k, v in model.items() if k in takes}  # 0.5.6, 0.5.7: the window beside the parameters
    inside = {k: v for k, v in model.items() if k not in takes}
    return tree(cache_init_params(disable=False, **fields, **inside), **beside)


# --------------------------------------------------------------------------- a Mamba model's states

_STATE_LANES = 6  # token, position, then the hash in four 16-bit parts


def state_view(req_to_token_pool: Any, rows: dict[str, int]) -> StateView:
    """The states of the requests on ``rows`` (request id -> row), through the slots the pool's
    row-to-slot mapping names now (what a model's Mamba layer reads), as canaries: each state slot's
    temporal state holds the canary's lanes, exact in float32."""
    mapping = req_to_token_pool.req_index_to_mamba_index_mapping
    temporal = req_to_token_pool.mamba_pool.mamba_cache.temporal  # [layers, slots, heads, head_dim, STATE_SIZE]
    flat = temporal[0].view(temporal.shape[1], -1)

    def read(slots: np.ndarray) -> np.ndarray:
        return int_lanes(flat[torch.as_tensor(slots, dtype=torch.int64)][:, :_STATE_LANES].numpy(force=True), 3)

    def write(slots: np.ndarray, canaries: np.ndarray) -> None:
        flat[torch.as_tensor(slots, dtype=torch.int64), :_STATE_LANES] = torch.as_tensor(float_lanes(canaries), dtype=flat.dtype, device=flat.device)

    return StateView({rid: int(mapping[row]) for rid, row in rows.items()}, read, write)


def run_deferred_state_work(entry: VersionEntry, req_to_token_pool: Any, batch: Any) -> None:
    """What the forward does before an extend's Mamba layers read the pool (0.5.13+, the entry's
    ``deferred_mamba_state_work``: the hybrid linear attention backend in 0.5.13 and 0.5.14, the
    model runner's ``_maybe_execute_deferred_mamba_cow_and_clear`` from 0.5.15): zero the slots the
    batch lists as new, then copy the states the tree matched into the requests' own slots (copy on
    write). Earlier releases copy at match time and zero at allocation, and list none."""
    if not entry.deferred_mamba_state_work:
        return
    clear = batch.mamba_clear_indices
    if clear is not None and len(clear):
        req_to_token_pool.mamba_pool.clear_slots(clear)
    src = batch.mamba_cow_src_indices
    if src is not None and len(src):
        req_to_token_pool.mamba_pool.copy_from(src, batch.mamba_cow_dst_indices)
