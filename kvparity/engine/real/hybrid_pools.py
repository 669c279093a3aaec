"""The pools and tree of a hybrid sliding-window model's world (issue 34): a full pool and a window
pool joined by SGLang's slot mapping (``SWAKVPool``, ``SWATokenToKVPoolAllocator``), and the tree a
server of the release builds for such a model: ``SWARadixCache`` up to 0.5.15, ``UnifiedRadixCache``
with the FULL and SWA components from 0.5.16 (``VersionEntry.hybrid_tree``).

The model has one full-attention layer and one window layer, each of one head of width one: the
pools only store KV, kvparity's forward stamps them. Constructors are called with the keywords
each release's signature takes (they gained ``page_size`` in 0.5.8, lost ``enable_kvcache_transpose``
in 0.5.15, gained ``enable_memory_saver`` in 0.5.22).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvparity.engine.real import RealSGLangError
from kvparity.engine.real.names import lookup
from kvparity.engine.real.versions import VersionEntry

FULL_LAYER, WINDOW_LAYER = 1, 0  # the model's layer ids (SGLang's layers_mapping keys)


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


def window_tree(entry: VersionEntry, window: Window, fields: dict[str, Any], cache_init_params: Any,
                unified: Callable[[dict[str, Any]], Any] | None) -> Any:
    """The tree of a sliding-window model: ``fields`` are the pools and page size every cache
    takes; ``unified(params)`` (None: the release's SWARadixCache) builds a UnifiedRadixCache on the
    world's tree core from a dict of CacheInitParams fields (the world's own, as for full attention)."""
    if unified is not None:
        types = lookup(entry.component_types or "")
        return unified(dict(fields, sliding_window_size=window.size, tree_components=(types.FULL, types.SWA)))
    if entry.swa_tree is None:
        raise RealSGLangError(f"SGLang {entry.version} has no sliding-window tree")
    tree = lookup(entry.swa_tree)
    takes = inspect.signature(tree.__init__).parameters
    if cache_init_params is None:  # up to 0.5.5: keyword arguments
        return called_with(tree, dict(fields, sliding_window_size=window.size, disable=False))
    if "sliding_window_size" in takes:  # 0.5.6, 0.5.7: the window beside the parameters
        return tree(cache_init_params(disable=False, **fields), sliding_window_size=window.size)
    return tree(cache_init_params(disable=False, sliding_window_size=window.size, **fields))

