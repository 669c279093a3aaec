"""A HiCache world's host tier (issue 35): ``--enable-hierarchical-cache`` keeps KV the device
evicts in a host pool, and loads it back on a prefix hit. Driven as a server of the release builds
it (``VersionEntry.host_tier``): ``HiRadixCache``, a radix tree with its own host tier (0.5.3 to
0.5.18, ``hiradix_cache``), or ``UnifiedRadixCache.init_hicache`` (0.5.19+, ``attach``; a Mamba
model's from 0.5.18, whose states a host pool of their own backs up, ``state_host_pool``).

What a CPU lacks, and what stands in for it (all kvparity's, installed on the release's modules):

- the device-host copies: SGLang's ``sgl_kernel.kvcacheio.transfer_kv_direct`` (the copy of io
  backend "direct", layer-first layout), bound in the host pool's module on CUDA only: a torch
  gather/scatter doing the same copy, ``_transfer_kv_direct``; and for a Mamba model's tier, whose
  state host pool takes only a page-first layout, the page-first direct copies
  (``_transfer_kv_per_layer_direct_pf_lf``, ``_transfer_kv_all_layer_direct_lf_pf``);
- the host buffer: the default allocator of device "cpu" registers it with ``cudaHostRegister``:
  the host pool's own allocator, unpinned;
- streams and events need nothing: on a CPU SGLang takes ``torch.cpu``'s, whose events are done
  when recorded;
- HiRadixCache asks ``torch.distributed`` for its tensor-parallel group's size when it is built:
  one rank, answered in that call's scope (``_one_rank``), so no process group exists.

Deterministic transfers. Nothing runs on a thread: a copy happens inside the call that starts it,
at the point of the loop a server's stream order implies. HiRadixCache's controller starts a
backup (device to host) as the tree asks for it, at an insert after the forward that wrote the KV
(or a hit under a selective policy). UnifiedRadixCache's queues it then and copies it when the
scheduler flushes the queue (``check_hicache_events`` at the start of an iteration, the flush after
a batch's result): a server's write stream starts it then, after the forward that wrote the KV. A
load-back is queued at admission (``init_load_back``) and copied in ``ready_to_load_host_cache``,
before the batch's forward reads it (a server's forward waits on the load stream layer by layer).
Acknowledgements are read at the next ``check_hicache_events``, as a server's events would report
them done by then; a slow transfer (``ack_delay``, the fault mode) is acknowledged that many calls
later instead (its event reports it unfinished until then, as a copy still running would), so
what a transfer lists stays listed, locked and pinned across iterations.

The storage tier (``storage``: SGLang's own file backend, in a fresh folder per world). Its
controller runs four threads (the storage hit query, the page transfer, the rank sync of a
prefetch's result, the backup to storage), each a loop over a queue. None is started: each
queue's ``put`` runs the real loop on the caller's thread until the queue is empty (the stop event
reads "set" once it is), so a prefetch's query happens when the scheduler asks for it, its pages
arrive when the scheduler hands it host slots, and a backup reaches storage when the host's copy
is acknowledged. Storage keys are SGLang's SHA-256 page chain, computed by ``_page_hashes`` in
place of the C++ extension SGLang builds at run time.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import importlib.util
import inspect
import os
import queue
import random
import shutil
import struct
import sys
import tempfile
import threading
import types
import weakref
from collections.abc import Callable
from typing import Any

import torch

from kvparity.engine.real import RealSGLangError
from kvparity.engine.real.faulty_storage import FaultyStorage
from kvparity.engine.real.names import lookup
from kvparity.engine.real.pool_readers import (
    BACKUPS_REFUSED,
    FETCHED_TOKENS,
    LOADS_REFUSED,
    PREFETCHES_CUT,
    STATE_POOL,
    STORAGE_FAULTS,
)
from kvparity.engine.real.versions import VersionEntry
from kvparity.model.cache_configs import HostTier

# A HiCache world's KV: float32, head_dim KV_LANES (the canary's lanes, ``LaneStore``, need 7).
KV_LANES = 8
# Where the host pool's allocation table and its full-attention pool (whose module binds the copies)
# live: ``pool_host`` from 0.5.14 and 0.5.16, ``memory_pool_host`` before.
_ALLOC_TABLES = ("sglang.srt.mem_cache.pool_host.common", "sglang.srt.mem_cache.memory_pool_host")
_MHA_POOLS = ("sglang.srt.mem_cache.pool_host.mha", "sglang.srt.mem_cache.memory_pool_host")
# Where a Mamba model's state host pool lives: ``memory_pool_host`` in 0.5.16 and 0.5.17, ``pool_host.mamba`` after.
_MAMBA_POOLS = ("sglang.srt.mem_cache.pool_host.mamba", "sglang.srt.mem_cache.memory_pool_host")
_HIRADIX = "sglang.srt.mem_cache.hiradix_cache:HiRadixCache"
_CONTROLLER = "sglang.srt.managers.cache_controller"
_NATIVE_HASH = "sglang.srt.mem_cache.cpp_utils.native_hash"
# Where SGLang's file backend keeps its pages (its own environment variable, read when it is built).
STORAGE_DIR_ENV = "SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"
# A prefix is fetched from storage once this many of its tokens are there (SGLang's default is 256,
# past every prompt drawn here).
STORAGE_PREFETCH_THRESHOLD = 4


def server_fields(tier: HostTier, states: bool = False) -> dict[str, Any]:
    """The server arguments that attach ``tier`` (what a CPU can copy with: io backend "direct",
    layer-first layout, or, with a Mamba model's ``states`` backed up too, the page-first layout
    its state host pool takes; a prefetch from storage waits until it completes)."""
    storage = dict(hicache_storage_backend="file", hicache_storage_prefetch_policy=tier.prefetch_policy,
                   hicache_storage_backend_extra_config=f'{{"prefetch_threshold": {STORAGE_PREFETCH_THRESHOLD}}}')
    return dict(
        enable_hierarchical_cache=True, hicache_ratio=tier.ratio, hicache_size=0,
        hicache_write_policy=tier.write_policy, hicache_io_backend="direct",
        hicache_mem_layout="page_first_direct" if states else "layer_first",
        **(storage if tier.storage else {"hicache_storage_backend": None}),
    )


def _transfer_kv_direct(src_layers: list[torch.Tensor], dst_layers: list[torch.Tensor], src_indices: torch.Tensor,
                        dst_indices: torch.Tensor, page_size: int) -> None:
    """``transfer_kv_direct``: for each layer, the KV of ``src_indices`` copied to ``dst_indices``
    (token slots; the page size only tells the CUDA kernel how to batch its copies)."""
    if len(src_layers) != len(dst_layers) or src_indices.numel() != dst_indices.numel():
        raise RealSGLangError(f"transfer_kv_direct: {len(src_layers)} layers to {len(dst_layers)}, "
                              f"{src_indices.numel()} slots to {dst_indices.numel()}")
    src, dst = src_indices.to(torch.int64).cpu(), dst_indices.to(torch.int64).cpu()
    for s, d in zip(src_layers, dst_layers):
        d[dst.to(d.device)] = s[src.to(s.device)].to(d.dtype)


def _page_first(host: torch.Tensor, page_size: int) -> torch.Tensor:
    """A page-first host buffer (pages, layers, ... ) as (pages, layers, page_size, rest): a view,
    so that a write lands in the buffer (a Mamba state pool's page is one slot)."""
    return host.view(host.shape[0], host.shape[1], page_size, -1)


def _transfer_kv_per_layer_direct_pf_lf(src_ptrs: list[torch.Tensor], dst_ptrs: list[torch.Tensor],
                                        src_indices: torch.Tensor, dst_indices: torch.Tensor, layer_id: int,
                                        page_size: int) -> None:
    """``transfer_kv_per_layer_direct_pf_lf``: layer ``layer_id`` of the host's page-first buffers
    (K and V, or one state) at token slots ``src_indices`` copied to the device layer's
    ``dst_indices``."""
    src, dst = src_indices.to(torch.int64).cpu(), dst_indices.to(torch.int64).cpu()
    for host, device in zip(src_ptrs, dst_ptrs, strict=True):
        rows = _page_first(host, page_size)[src // page_size, layer_id, src % page_size]
        device.view(device.shape[0], -1)[dst.to(device.device)] = rows.to(device.device, device.dtype)


def _transfer_kv_all_layer_direct_lf_pf(src_ptrs: list[torch.Tensor], dst_ptrs: list[torch.Tensor],
                                        src_indices: torch.Tensor, dst_indices: torch.Tensor, page_size: int) -> None:
    """``transfer_kv_all_layer_direct_lf_pf``: every device layer's slots ``src_indices`` copied
    to the host's page-first buffers at ``dst_indices``; ``src_ptrs`` lists each host buffer's
    layers in turn (K's layers, then V's)."""
    layers = len(src_ptrs) // len(dst_ptrs)
    if layers * len(dst_ptrs) != len(src_ptrs) or src_indices.numel() != dst_indices.numel():
        raise RealSGLangError(f"transfer_kv_all_layer_direct_lf_pf: {len(src_ptrs)} layers to {len(dst_ptrs)} "
                              f"buffers, {src_indices.numel()} slots to {dst_indices.numel()}")
    src, dst = src_indices.to(torch.int64).cpu(), dst_indices.to(torch.int64).cpu()
    for k, host in enumerate(dst_ptrs):
        view = _page_first(host, page_size)
        for layer, device in enumerate(src_ptrs[k * layers:(k + 1) * layers]):
            rows = device.reshape(device.shape[0], -1)[src.to(device.device)]
            view[dst // page_size, layer, dst % page_size] = rows.to(host.device, host.dtype)


def _unpinned(dims: Any, dtype: Any, device: Any, pin_memory: Any, allocator: Any = None, *args: Any,
              **kwargs: Any) -> Any:
    """The host buffer from the host pool's own allocator (0.5.7+; before, a plain tensor), never
    registered with CUDA."""
    if allocator is None:
        return torch.empty(dims, dtype=dtype, device=device)
    return allocator.allocate(dims, dtype=dtype, device=device)


def install_cpu_copies() -> None:
    """Put the stand-ins into the imported release (idempotent; before its tree builds a host pool)."""
    pools = _first_with(_MHA_POOLS, "MHATokenToKVPoolHost")
    table = _find(_ALLOC_TABLES, "ALLOC_MEMORY_FUNCS")
    if table is not None:
        table.ALLOC_MEMORY_FUNCS["cpu"] = _unpinned
    elif "SUPPORT_PIN_MEMORY" in vars(pools):
        pools.SUPPORT_PIN_MEMORY = False  # 0.5.6 registers a pinned buffer with CUDA itself: none
    else:  # 0.5.3 to 0.5.5.post3 ask torch for a pinned buffer, which a CPU build has none of
        _unpinned_by_default(pools.MHATokenToKVPoolHost)
    # The direct copies are bound in the modules defining the pools, on CUDA only (the page-first
    # ones serve a Mamba model's tier: its state pool's layout and the KV pool's beside it).
    for module in (pools, *(importlib.import_module(m) for m in _MAMBA_POOLS if _exists(m))):
        for name, copy in _DIRECT_COPIES.items():
            setattr(module, name, copy)


_DIRECT_COPIES = {"transfer_kv_direct": _transfer_kv_direct,
                  "transfer_kv_per_layer_direct_pf_lf": _transfer_kv_per_layer_direct_pf_lf,
                  "transfer_kv_all_layer_direct_lf_pf": _transfer_kv_all_layer_direct_lf_pf}


# What 0.5.3 to 0.5.12's host pool module imports from ``sgl_kernel.kvcacheio`` whatever the device.
_KVCACHEIO_NAMES = (
    "transfer_kv_all_layer", "transfer_kv_all_layer_direct_lf_pf", "transfer_kv_all_layer_lf_pf",
    "transfer_kv_all_layer_lf_ph", "transfer_kv_all_layer_mla", "transfer_kv_all_layer_mla_lf_pf",
    "transfer_kv_direct", "transfer_kv_per_layer", "transfer_kv_per_layer_direct_pf_lf",
    "transfer_kv_per_layer_mla", "transfer_kv_per_layer_mla_pf_lf", "transfer_kv_per_layer_pf_lf",
    "transfer_kv_per_layer_ph_lf",
)
# What that module imports besides it (imported first, so that none of them sees the stand-in).
_HOST_POOL_DEPENDENCIES = ("sglang.jit_kernel.hicache", "sglang.srt.mem_cache.memory_pool", "sglang.srt.utils")
HOST_POOL = "sglang.srt.mem_cache.memory_pool_host"


def import_host_pool_with_copies() -> None:
    """Import a host pool module that imports ``sgl_kernel.kvcacheio`` unconditionally (0.5.3 to
    0.5.12), with a stand-in ``sgl_kernel.kvcacheio`` present for that one import only: its copy
    is ``_transfer_kv_direct``, every other name raises when called. ``sgl_kernel`` stays absent
    for every other module (SGLang chooses its CPU fallbacks by its absence)."""
    for module in _HOST_POOL_DEPENDENCIES:
        if _exists(module):  # sglang.jit_kernel from 0.5.6
            importlib.import_module(module)
    if "sgl_kernel" in sys.modules:
        raise RealSGLangError("sgl_kernel is imported: the host pool's copies would not be kvparity's")
    package, copies = types.ModuleType("sgl_kernel"), types.ModuleType("sgl_kernel.kvcacheio")
    package.__path__ = []
    for name in _KVCACHEIO_NAMES:
        setattr(copies, name, _transfer_kv_direct if name == "transfer_kv_direct" else _unused_copy(name))
    sys.modules.update({"sgl_kernel": package, "sgl_kernel.kvcacheio": copies})
    try:
        importlib.import_module(HOST_POOL)
    finally:
        del sys.modules["sgl_kernel"], sys.modules["sgl_kernel.kvcacheio"]


class _CpuStreams:
    """``torch.cuda`` as 0.5.3 to 0.5.5.post2's cache controller uses it (its events and streams,
    made directly): ``torch.cpu``'s, whose events are done when recorded; nothing else of it."""

    Event, Stream = torch.cpu.Event, torch.cpu.Stream
    stream, current_stream = staticmethod(torch.cpu.stream), staticmethod(torch.cpu.current_stream)

    def __getattr__(self, name: str) -> Any:
        raise RealSGLangError(f"torch.cuda.{name}: the cache controller's stand-in has events and streams only")


class _TorchWithCpuStreams:
    """The controller module's ``torch``: torch itself, but for ``torch.cuda``."""

    cuda = _CpuStreams()

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


def cpu_streams_for_controller() -> None:
    """Before a controller of 0.5.3 to 0.5.5.post2 is built: its ``torch.cuda`` events and
    streams are ``torch.cpu``'s (a CPU build's ``torch.cuda.Event`` is a dummy that refuses to be made)."""
    setattr(importlib.import_module(_CONTROLLER), "torch", _TorchWithCpuStreams())  # noqa: B010 (SGLang's module)


def _exists(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # its package is absent
        return False


def _unused_copy(name: str) -> Any:
    def copy(*args: Any, **kwargs: Any) -> None:
        raise RealSGLangError(f"sgl_kernel.kvcacheio.{name}: kvparity copies with io backend 'direct' only")

    return copy


def _unpinned_by_default(pool_class: Any) -> None:
    """The pool's ``pin_memory`` argument defaulting to False (HiRadixCache passes none)."""
    init = pool_class.__init__
    names = [p.name for p in inspect.signature(init).parameters.values() if p.default is not inspect.Parameter.empty]
    defaults = list(init.__defaults__)
    defaults[names.index("pin_memory")] = False
    init.__defaults__ = tuple(defaults)


def _find(modules: tuple[str, ...], name: str) -> Any:
    """The first of ``modules`` this release has that defines ``name`` (None: none does)."""
    for module in modules:
        try:
            found = importlib.import_module(module)
        except ImportError:
            continue
        if name in vars(found):
            return found
    return None


def _first_with(modules: tuple[str, ...], name: str) -> Any:
    """``_find``, where a release must have it."""
    found = _find(modules, name)
    if found is None:
        raise RealSGLangError(f"this SGLang defines {name} in none of {list(modules)}")
    return found


def attach(tree: Any, server_args: Any, params: Any, tier: HostTier, entry: VersionEntry) -> Any:
    """Attach ``tier`` (as ``server_args`` name it) to a UnifiedRadixCache as ``entry``'s release's
    factory does (``init_hicache``); returns the host pool."""
    install_cpu_copies()
    with _storage(tier, entry) as folder:
        tree.init_hicache(server_args, params)
    return _driven(tree, tier, folder, entry, unified=True)


def hiradix_cache(fields: dict[str, Any], params_class: Any, server_args: Any, tier: HostTier,
                  entry: VersionEntry) -> Any:
    """The HiRadixCache a server of 0.5.3 to 0.5.18 builds for ``tier`` (as ``server_args`` name
    it), of the tree's ``fields``: from a ``params_class`` (0.5.6+) or, before, keyword by keyword
    as the scheduler passes them (one rank: no process group)."""
    install_cpu_copies()
    cls = lookup(_HIRADIX)
    with _one_rank(), _storage(tier, entry) as folder:
        if params_class is not None:
            tree = cls(params=params_class(disable=False, **fields), server_args=server_args)
        else:
            offered = dict(fields, tp_cache_group=None, enable_metrics=False, is_eagle=False,
                           **{name: getattr(server_args, name) for name in _SERVER_FIELDS},
                           model_name=server_args.served_model_name,
                           storage_backend_extra_config=server_args.hicache_storage_backend_extra_config)
            declared = inspect.signature(cls).parameters
            tree = cls(**{k: v for k, v in offered.items() if k in declared})
    _driven(tree, tier, folder, entry, unified=False)
    return tree


# The server arguments 0.5.3 to 0.5.5.post3's scheduler hands HiRadixCache under their own names.
_SERVER_FIELDS = ("hicache_ratio", "hicache_size", "hicache_write_policy", "hicache_io_backend", "hicache_mem_layout",
                  "hicache_storage_backend", "hicache_storage_prefetch_policy")


@contextlib.contextmanager
def _one_rank() -> Any:
    """``torch.distributed.get_world_size`` of the default group answers 1 (a server of one rank)."""
    dist, real = torch.distributed, torch.distributed.get_world_size

    def one(group: Any = None) -> int:
        if group is not None:
            raise RealSGLangError(f"HiRadixCache asked for the size of process group {group!r}: one rank only")
        return 1

    dist.get_world_size = one
    try:
        yield
    finally:
        dist.get_world_size = real


@contextlib.contextmanager
def _storage(tier: HostTier, entry: VersionEntry) -> Any:
    """The scope a tier's controller is built in: its storage folder and ranks (with storage).
    Yields the folder (None without storage)."""
    _publish_storage_failure(tier.storage_failure)
    if not tier.storage:
        yield None
        return
    folder = tempfile.mkdtemp(prefix="kvparity-hicache-")
    os.environ[STORAGE_DIR_ENV] = folder
    try:
        with _storage_stand_ins(entry):
            yield folder
    except BaseException:
        shutil.rmtree(folder, True)
        raise


def _driven(tree: Any, tier: HostTier, folder: str | None, entry: VersionEntry, unified: bool) -> Any:
    """The stand-ins a built tier runs under (storage inline, seeded faults, late acks); its host pool.
    ``unified``: the tree is a UnifiedRadixCache (else a HiRadixCache)."""
    host = host_pool(tree)
    # Its storage path asks torch for pinned scratch pages otherwise (each pool of a group: a Mamba
    # model's state host pool too).
    for pool in [group.host_pool for group in getattr(tree.cache_controller.mem_pool_host, "entries", ())] or [host]:
        pool.pin_memory = False
    _count_refusals(tree, entry.unified_tree_core if unified else None)
    if folder is not None:
        weakref.finalize(tree, shutil.rmtree, folder, True)
        _run_storage_inline(tree.cache_controller, entry)
        _count_prefetches_cut(tree.cache_controller)
    if tier.storage_failure:
        _seed_storage_failures(tier, tree.cache_controller)
    if tier.ack_delay:
        _delay_acks(tree, tier.ack_delay)
    return host


def host_pool(tree: Any) -> Any:
    """The tree's host KV pool: the anchor of the controller's pool group where it holds one
    (UnifiedRadixCache's host tier), else the controller's own pool (HiRadixCache's)."""
    host = tree.cache_controller.mem_pool_host
    anchor = getattr(host, "anchor_entry", None)
    return anchor.host_pool if anchor is not None else host


def state_host_pool(tree: Any) -> Any:
    """A Mamba model's state host pool: its host pool group's entry of that name."""
    return tree.cache_controller.mem_pool_host.entry_map[STATE_POOL].host_pool


# --------------------------------------------------------------------------- slow transfers

class _Clock:
    """Calls of the tree's ``check_hicache_events`` (once per pass of the scheduler's loop)."""

    def __init__(self) -> None:
        self.now = 0


class _Late:
    """A transfer's finish event, done ``delay`` ticks after it was recorded (or once waited on)."""

    def __init__(self, event: Any, clock: _Clock, delay: int) -> None:
        self.event, self.clock, self.due = event, clock, clock.now + delay

    def query(self) -> bool:
        return self.clock.now >= self.due

    def synchronize(self) -> None:
        self.due = self.clock.now  # a wait blocks until the copy is done

    def __getattr__(self, name: str) -> Any:
        return getattr(self.event, name)


class _LateAcks(list):
    """An acknowledgement queue whose new entries report their transfer done ``delay`` ticks late."""

    def __init__(self, acks: list[Any], clock: _Clock, delay: int) -> None:
        super().__init__(acks)
        self.clock, self.delay = clock, delay

    def append(self, ack: Any) -> None:
        super().append(ack._replace(finish_event=_Late(ack.finish_event, self.clock, self.delay)))


def _delay_acks(tree: Any, delay: int) -> None:
    """Every device-host transfer of ``tree`` acknowledged ``delay`` passes late."""
    clock, controller, check = _Clock(), tree.cache_controller, tree.check_hicache_events

    def ticking() -> None:
        clock.now += 1
        check()

    tree.check_hicache_events = ticking
    for name in ("ack_write_queue", "ack_load_queue"):
        setattr(controller, name, _LateAcks(getattr(controller, name), clock, delay))


# --------------------------------------------------------------------------- the storage tier

class _NotStarted:
    """The controller's ``threading.Thread``: keeps its target; never runs on its own."""

    def __init__(self, target: Any = None, **kwargs: Any) -> None:
        self.target = target

    def start(self) -> None:
        pass

    def join(self, timeout: float | None = None) -> None:
        pass

    def is_alive(self) -> bool:
        return False


class _Threading:
    """The controller module's ``threading``: its Thread never started, the rest the real one."""

    Thread = _NotStarted

    def __getattr__(self, name: str) -> Any:
        return getattr(threading, name)


class _UntilEmpty:
    """The controller's storage stop event: "set" once the queue the running loop serves is empty
    (so a thread's loop returns instead of waiting for more), or once really set."""

    def __init__(self) -> None:
        self.flag = False
        self.serving: list[queue.Queue[Any]] = []  # the loops running, innermost last

    def is_set(self) -> bool:
        return self.flag or (bool(self.serving) and self.serving[-1].empty())

    def set(self) -> None:
        self.flag = True

    def clear(self) -> None:
        self.flag = False

    def wait(self, timeout: float | None = None) -> bool:
        return self.is_set()


class _Pumped(queue.Queue):
    """A thread's queue: each ``put`` runs the thread's loop on the caller until it is empty."""

    def __init__(self, loop: Any, stop: _UntilEmpty) -> None:
        super().__init__()
        self.loop, self.stop = loop, stop

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        super().put(item)
        self.stop.serving.append(self)
        try:
            self.loop()
        finally:
            self.stop.serving.pop()


# The controller's thread and the queue its loop serves.
_STORAGE_THREADS = (("prefetch_thread", "prefetch_queue"), ("prefetch_io_aux_thread", "prefetch_buffer"),
                    ("prefetch_sync_thread", "prefetch_sync_queue"), ("backup_thread", "backup_queue"))
# Those the storage starts with before 0.5.19 (the entry's ``prefetch_acks``): the prefetch loop
# starts its io thread itself, and there is no sync thread.
_STARTED_BEFORE_ACKS = ("prefetch_thread", "backup_thread")


# The parallel-state functions the controller module imports up to 0.5.15 (the pipeline's from 0.5.15).
_RANK_FUNCTIONS = ("get_tensor_model_parallel_rank", "get_tensor_model_parallel_world_size",
                   "get_pipeline_model_parallel_rank", "get_pipeline_model_parallel_world_size")


def _storage_stand_ins(entry: VersionEntry) -> Any:
    """Before the controller is built: its threads are never started, its storage keys are
    computed in Python (where a native hash exists, 0.5.15+); returns the scope in which its
    storage configuration reads one process's ranks: the controller module's own rank functions
    up to 0.5.15, the parallel context after (kept for good from 0.5.21, a scoped override before)."""
    controller = importlib.import_module(_CONTROLLER)
    setattr(controller, "threading", _Threading())  # noqa: B010 (SGLang's module)
    if _exists(_NATIVE_HASH):
        setattr(importlib.import_module(_NATIVE_HASH), "_load_native_hash_module", _PageHashes)  # noqa: B010
    if entry.controller_rank_functions:
        return _module_answers(controller, **{name: (lambda: 0) if name.endswith("_rank") else (lambda: 1)
                                              for name in _RANK_FUNCTIONS if hasattr(controller, name)})
    parallel = importlib.import_module("sglang.srt.runtime_context").get_parallel()
    if entry.permanent_parallel_override:
        parallel.override_permanently(tp_rank=0, pp_rank=0)
        return parallel.override(tp_rank=0, pp_rank=0)
    return parallel.override(tp_rank=0, pp_rank=0, tp_size=1, pp_size=1)


@contextlib.contextmanager
def _module_answers(module: Any, **functions: Any) -> Any:
    """``module``'s functions of these names answered by these, in this scope only."""
    real = {name: getattr(module, name) for name in functions}
    for name, function in functions.items():
        setattr(module, name, function)
    try:
        yield
    finally:
        for name, function in real.items():
            setattr(module, name, function)


def _run_storage_inline(controller: Any, entry: VersionEntry) -> None:
    """Each storage thread's queue replaced by one that runs the thread's loop at ``put``. The
    storage loops' stop event is ``storage_stop_event`` from 0.5.9, the controller's one
    ``stop_event`` before (which its transfer buffers keep their own reference to)."""
    stop = _UntilEmpty()
    setattr(controller, "storage_stop_event" if entry.storage_stop_event else "stop_event", stop)
    _count_fetches(controller, entry)
    for thread, served in _STORAGE_THREADS:
        if entry.prefetch_acks or thread in _STARTED_BEFORE_ACKS:
            setattr(controller, served, _Pumped(_adopting(controller, getattr(controller, thread).target, stop), stop))


def _count_fetches(controller: Any, entry: VersionEntry) -> None:
    """The controller's page transfers (storage to host), counting the tokens they bring: from
    0.5.19 each batch's transfer returns its pages (the operation learns its count later, from
    acknowledgements); before, the transfer raises the operation's completed tokens itself."""
    setattr(controller, FETCHED_TOKENS, 0)

    def count(tokens: int) -> None:
        _bump(controller, FETCHED_TOKENS, tokens)

    if entry.batched_page_transfer:
        batch = controller._page_transfer_kv_batch

        def counted_batch(*args: Any, **kwargs: Any) -> Any:
            pages = batch(*args, **kwargs)
            count(int(pages) * controller.page_size)
            return pages
        controller._page_transfer_kv_batch = counted_batch
        return
    transfer = controller._page_transfer

    def counted(operation: Any, *args: Any, **kwargs: Any) -> Any:
        before = operation.completed_tokens
        try:
            return transfer(operation, *args, **kwargs)
        finally:
            count(operation.completed_tokens - before)
    controller._page_transfer = counted


def _adopting(controller: Any, loop: Any, stop: _UntilEmpty) -> Any:
    """``loop``, then the page-transfer queue it made: up to 0.5.18 the prefetch loop makes that
    queue (``prefetch_buffer``) and its thread itself, each time it runs. The queue made is
    replaced by one served at ``put`` like the others, and what the loop left in it is served now
    (the transfers its thread would make next); from 0.5.16 the scheduler's thread feeds it later."""
    def run() -> None:
        loop()
        made = getattr(controller, "prefetch_buffer", None)
        if made is None or isinstance(made, _Pumped):
            return
        pumped = _Pumped(controller.prefetch_io_aux_func, stop)
        controller.prefetch_buffer = pumped
        while not made.empty():
            pumped.put(made.get_nowait())
    return run


class _PageHashes:
    """SGLang's storage keys (``hash_binding.cpp``'s ``get_hash``): SHA-256 chained page by page
    over each page's token ids as little-endian uint32, hex; plain token ids only."""

    def get_hash(self, raw: Any, logical_len: int, unit_width: int, is_bigram: bool, prior: bytes | None,
                 page_size: int | None = None) -> str | list[str]:
        if is_bigram or unit_width != 1:
            raise RealSGLangError("kvparity's storage keys take plain token ids only")
        tokens = list(raw[:logical_len])
        if page_size is None:
            return _chain(prior, tokens).hex()
        out = []
        for start in range(0, len(tokens), page_size):
            prior = _chain(prior, tokens[start:start + page_size])
            out.append(prior.hex())
        return out


def _chain(prior: bytes | None, tokens: list[int]) -> bytes:
    digest = hashlib.sha256()
    if prior is not None:
        digest.update(prior)
    digest.update(struct.pack(f"<{len(tokens)}I", *tokens))
    return digest.digest()


# --------------------------------------------------------------------------- storage faults

# SGLang's failure injector's setting (read when the storage backend is built; 0.5.23+).
STORAGE_FAILURE_ENV = "SGLANG_TEST_HICACHE_BACKEND_RANDOM_FAILURE"
_INJECTOR = "sglang.srt.mem_cache.hicache_storage:HiCacheStorageFailureInjector"


def _publish_storage_failure(probability: float) -> None:
    """The process's environment as this world's server has it (a worker builds many worlds)."""
    if probability:
        os.environ[STORAGE_FAILURE_ENV] = str(probability)
    else:
        os.environ.pop(STORAGE_FAILURE_ENV, None)


def _count_prefetches_cut(controller: Any) -> None:
    """The controller's ``terminate_prefetch`` (the release's own policy ending a prefetch) also
    counts the prefetches it ends before every page it asked for came (``PREFETCHES_CUT``)."""
    terminate = controller.terminate_prefetch
    setattr(controller, PREFETCHES_CUT, 0)

    def terminate_prefetch(operation: Any, *args: Any, **kwargs: Any) -> Any:
        out = terminate(operation, *args, **kwargs)
        if operation.completed_tokens < len(operation.hash_value) * controller.page_size:
            _bump(controller, PREFETCHES_CUT)
        return out

    controller.terminate_prefetch = terminate_prefetch


def _count_refusals(tree: Any, tree_core: bool | None) -> None:
    """A backup (device to host) and a load-back (host to device) also count, on the tree's cache
    controller, the calls that found no room and returned None (``BACKUPS_REFUSED``,
    ``LOADS_REFUSED``): the host too full for a backup, the device for a load-back. A backup is the
    controller's ``write`` (None: no room), but UnifiedRadixCache looks for host room itself
    (evicting the host) and gives up before asking its controller: from 0.5.17 in
    ``_execute_kv_backup`` (None), in 0.5.16 in ``write_backup`` (0 tokens backed up: a node always
    holds some, so 0 is a refusal, its parent's included). Its load-back likewise
    (``_count_unified_load_refusals``)."""
    controller = tree.cache_controller
    if tree_core is None:  # HiRadixCache: its controller says no
        counted = [((controller, "write"), BACKUPS_REFUSED, _is_none)]
    elif tree_core:
        counted = [((tree, "_execute_kv_backup"), BACKUPS_REFUSED, _is_none)]
    else:
        counted = [((tree, "write_backup"), BACKUPS_REFUSED, _is_zero)]
    if tree_core:
        _count_unified_load_refusals(tree)
    else:
        counted.append(((controller, "load"), LOADS_REFUSED, _is_none))
    setattr(controller, BACKUPS_REFUSED, 0)
    setattr(controller, LOADS_REFUSED, 0)
    for (owner, method), counter, refused in counted:
        setattr(owner, method, _counting(controller, getattr(owner, method), counter, refused))


def _count_unified_load_refusals(tree: Any) -> None:
    """UnifiedRadixCache's ``load_back`` checks the request's quota and the device's room (after
    evicting) itself and returns False before asking its controller, as it does for a load too
    small to be worth it (under ``load_back_threshold``) or one another load-back pins (an empty
    spec). Only a load its tree core's spec wanted counts as refused, whichever check said no (its
    controller's ``load`` finding no room included)."""
    core, wanted = tree.tree_core, [False]
    build = core.build_load_back_spec

    def spec(*args: Any, **kwargs: Any) -> Any:
        kv, components = out = build(*args, **kwargs)
        wanted[0] = len(kv.host_indices) >= max(1, getattr(tree, "load_back_threshold", 1)) or bool(components)
        return out

    core.build_load_back_spec = spec
    load_back = tree.load_back

    def counted(*args: Any, **kwargs: Any) -> Any:
        wanted[0] = False
        loaded = load_back(*args, **kwargs)
        if not loaded and wanted[0]:
            _bump(tree.cache_controller, LOADS_REFUSED)
        return loaded

    tree.load_back = counted


def count_refused_load(tree: Any) -> None:
    """A request whose prefix waits on the host that the PrefillAdder leaves waiting for want of
    device room (``NO_TOKEN``), its load-back never started: counted with the tree's refused loads
    (``LOADS_REFUSED``). From 0.5.21 the adder's budget counts the host hit before any load starts,
    so the tree's own checks never fail there and this is SGLang's only refusal of a load-back.
    Nothing for a tree without a host tier."""
    controller = getattr(tree, "cache_controller", None)
    if controller is not None and hasattr(controller, LOADS_REFUSED):
        _bump(controller, LOADS_REFUSED)


def _counting(controller: Any, call: Any, counter: str, refused: Callable[[Any], bool]) -> Any:
    def counted(*args: Any, **kwargs: Any) -> Any:
        out = call(*args, **kwargs)
        if refused(out):
            _bump(controller, counter)
        return out

    return counted


def _is_none(out: Any) -> bool:
    return out is None


def _is_zero(out: Any) -> bool:
    return out == 0


def _bump(controller: Any, counter: str, by: int = 1) -> None:
    """One of kvparity's counts kept on a cache controller (``pool_readers.controller_counts`` reads them)."""
    setattr(controller, counter, getattr(controller, counter) + by)


def _seed_storage_failures(tier: HostTier, controller: Any) -> None:
    """SGLang's injector (0.5.23+) draws from an unseeded generator per thread: seeded here (every
    storage call runs on the scheduler's thread), so that a run replays its failures exactly; it
    draws for the calls the tier's ``storage_failing`` names only, and the storage calls it fails
    are listed by name on the world's controller (``STORAGE_FAULTS``). A release without it gets
    kvparity's faulty backend (``faulty_storage``), drawing from the same generator alike."""
    module, _, name = _INJECTOR.partition(":")
    injector = getattr(importlib.import_module(module), name, None)
    setattr(controller, STORAGE_FAULTS, [])
    generator = _FaultGenerator(tier.storage_seed, tier.storage_failing, getattr(controller, STORAGE_FAULTS))
    if injector is None:
        controller.storage_backend = FaultyStorage(controller.storage_backend,
                                                   functools.partial(_fails, generator, tier.storage_failure))
        return
    injector._thread_local.random = generator
    _list_injected_failures(injector)


def _fails(generator: _FaultGenerator, probability: float, name: str) -> bool:
    """A call of ``name`` fails, as the injector draws: one draw for a call the world may fail, and
    each failure listed by name."""
    if not name.startswith(generator.calls) or not generator.random() < probability:
        return False
    generator.failed.append(name)
    return True


class _FaultGenerator(random.Random):
    """The injector's generator for one world: seeded, the calls it may fail (by the start of their
    names), and the list its failed calls go to."""

    def __init__(self, seed: int, calls: str, failed: list[str]) -> None:
        super().__init__(seed)
        self.calls, self.failed = calls, failed


def _list_injected_failures(injector: type) -> None:
    """The injector's ``_inject_failure`` (once per process), where the thread's generator is a
    world's (``_FaultGenerator``): a call that world does not fail passes without a draw, and each
    call it fails is listed by name."""
    inject = injector.__dict__["_inject_failure"]
    if getattr(inject, "kvparity_lists", False):
        return

    def _inject_failure(self: Any, func_name: str) -> bool:
        generator = getattr(self._thread_local, "random", None)
        if not isinstance(generator, _FaultGenerator):
            return bool(inject(self, func_name))
        if not func_name.startswith(generator.calls):
            return False
        failed = bool(inject(self, func_name))
        if failed:
            generator.failed.append(func_name)
        return failed

    _inject_failure.kvparity_lists = True  # type: ignore[attr-defined]
    injector._inject_failure = _inject_failure  # type: ignore[attr-defined]
