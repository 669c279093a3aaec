"""Real SGLang objects behind kvparity's world interface. Imported ONLY inside the worker process
(``kvparity.engine.real.worker``), after the stand-ins are installed and the real ``sglang`` is importable.

``build_real_world(entry, backend, geometry, cache_kind, device)`` returns a ``RealWorld`` with the
attributes of ``kvparity.engine.world.World`` (``version``, ``backend``, ``family``, ``name``,
``req_to_token_pool``, ``allocator``, ``tree_cache``), ``new_req`` and ``batch``; a ``RealBatch``
wraps a real ``ScheduleBatch`` and adds the decode / retract steps. Everything SGLang computes is
SGLang's own code; this module only builds the objects, sets SGLang's globals the way its
ModelRunner does, and gives a decode batch the fields a real running batch has.

Several worlds may live in one worker (one SGLang version, different backends, page sizes and
caches): each world re-applies its own globals before it calls into SGLang.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
from array import array
from collections.abc import Callable, Iterable
from typing import Any

import torch

from kvparity.caches.host_pool import HostNode, in_tree_order
from kvparity.caches.pool import PoolRecord
from kvparity.engine.canary import LaneStore, StateView
from kvparity.engine.real import RealSGLangError
from kvparity.engine.real.host_tier import KV_LANES, hiradix_cache, host_pool, state_host_pool
from kvparity.engine.real.host_tier import attach as attach_host_tier
from kvparity.engine.real.host_tier import server_fields as host_server_fields
from kvparity.engine.real.hybrid_pools import (
    MAMBA_CACHE_CHUNK_SIZE,
    Mamba,
    Window,
    mamba_pools,
    mamba_tree,
    run_deferred_state_work,
    state_view,
    window_pools,
    window_tree,
)
from kvparity.engine.real.names import lookup as _lookup
from kvparity.engine.real.names import optional as _optional
from kvparity.engine.real.pool_readers import pool_records, state_allocator, state_fields
from kvparity.engine.real.unified_tree import host_nodes, state_host_nodes, unified_tree_nodes
from kvparity.engine.real.versions import VersionEntry
from kvparity.engine.releases import UNIFIED_RADIX_CACHE
from kvparity.engine.snapshot import (
    _alias_row,  # one rule for which row a view prefix points into
    full_allocator,
    full_sizes,
    released_pages,
)
from kvparity.mem_cache.errors import Exhausted
from kvparity.model.cache_configs import (
    CacheConfig,
    HostTier,
    MambaStates,
    SlidingWindow,
    cache_parts,
    flat_owner,
    part_of,
    window_slots,
)
from kvparity.model.worlds import WorldId

POISON = -12345  # kvparity.model.poison.POISON (kvparity's sentinel for cells nobody wrote)
BACKENDS = {"triton": "triton", "torch": "torch_native"}  # kvparity backend -> SGLang attention_backend
CACHE_KINDS = ("radix", "chunk")
TREE_CLASSES = ("radix", "unified")  # RadixCache (and ChunkCache), or UnifiedRadixCache (0.5.19+)
VOCAB_SIZE = 32000
KV_DTYPE = torch.float16


def call_declared(fn: Callable[..., Any], *args: Any, **offered: Any) -> Any:
    """``fn(*args, **the offered keywords fn declares)``. SGLang adds and drops trailing parameters
    between releases: ``retract_decode(server_args)`` and ``release_req(..., server_args)`` take no
    server_args from 0.5.19, and new ones keep their defaults, as its scheduler passes them. The
    entry's signature check says which parameters a release has."""
    declared = inspect.signature(fn).parameters
    return fn(*args, **{k: v for k, v in offered.items() if k in declared})


def _dotted(obj: Any, path: str) -> Any:
    """``obj.a.b`` for ``path`` "a.b"."""
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def _set_dotted(obj: Any, path: str, value: Any) -> None:
    """``obj.a.b = value`` for ``path`` "a.b"."""
    *parents, name = path.split(".")
    setattr(_dotted(obj, ".".join(parents)) if parents else obj, name, value)


def _fill_ids(req: Any) -> Any:
    """0.5.13+: the sequence up to the fill boundary (the whole one before admission, 0.5.16+)."""
    if getattr(req, "extend_range", False) is None:
        return req.full_untruncated_fill_ids
    return req.get_fill_ids()


def _extend_len(req: Any) -> int:
    """0.5.16+: the extend length is ``extend_range.length``; before admission, what
    init_next_round_input computed in earlier releases (the whole unmatched rest)."""
    if req.extend_range is not None:
        return int(req.extend_range.length)
    return len(req.full_untruncated_fill_ids) - len(req.prefix_indices)


def _note_extend_logprob_start_len(req: Any) -> None:
    """0.5.15+ compute ``extend_logprob_start_len`` in the batch, from the request's state at
    admission; earlier releases store it on the request at init_next_round_input and at a cut.
    kvparity keeps the value as of those two moments, so that both compare alike."""
    req._kvparity_extend_logprob_start_len = _extend_logprob_start_len_now(req)


def _extend_logprob_start_len(req: Any) -> int:
    noted = getattr(req, "_kvparity_extend_logprob_start_len", None)
    return _extend_logprob_start_len_now(req) if noted is None else noted


def _extend_logprob_start_len_now(req: Any) -> int:
    return extend_logprob_start_len_of(req, len(req.prefix_indices), _extend_len(req))


def extend_logprob_start_len_of(req: Any, prefix_len: int, extend_len: int) -> int:
    """SGLang's own ``compute_extend_logprob_start_len`` on the request's current state (its
    prefix and extend lengths as the generation holds them)."""
    compute = importlib.import_module("sglang.srt.managers.schedule_batch").compute_extend_logprob_start_len
    return int(compute(
        logprob_start_len=req.logprob_start_len, prefix_len=prefix_len, extend_len=extend_len,
        full_untruncated_fill_len=len(req.full_untruncated_fill_ids),
    ))


def _with_kvparity_names(req_class: Any, entry: VersionEntry) -> Any:
    """SGLang's ``Req``, or (where a release renamed a field kvparity's scheduler loop and snapshots
    read) a subclass that only adds read-only properties under the 0.5.3 names. Nothing SGLang
    reads or writes changes: SGLang never uses these names in those releases."""
    names: dict[str, Any] = {}
    if entry.protected_len_field != "last_matched_prefix_len":
        field_name = entry.protected_len_field
        names["last_matched_prefix_len"] = property(lambda req: _dotted(req, field_name))
    if entry.admission in ("fill_len", "extend_range"):
        names["fill_ids"] = property(_fill_ids)
    if entry.req_kv_info:
        names["req_pool_idx"] = property(lambda req: req.kv.req_pool_idx)
    if entry.admission == "extend_range":
        names["extend_input_len"] = property(_extend_len)
        names["extend_logprob_start_len"] = property(_extend_logprob_start_len)
    if not names:
        return req_class
    return type(req_class.__name__, (req_class,), {"__module__": req_class.__module__, **names})


class _Sglang:
    """The real SGLang classes and functions this adapter uses (one version per process)."""

    def __init__(self, entry: VersionEntry) -> None:
        sb = importlib.import_module("sglang.srt.managers.schedule_batch")
        self.schedule_batch = sb
        self.ScheduleBatch = sb.ScheduleBatch
        self.Req = _with_kvparity_names(sb.Req, entry)
        self.SamplingParams = importlib.import_module("sglang.srt.sampling.sampling_params").SamplingParams
        self.SamplingBatchInfo = importlib.import_module("sglang.srt.sampling.sampling_batch_info").SamplingBatchInfo
        self.SpeculativeAlgorithm = importlib.import_module("sglang.srt.speculative.spec_info").SpeculativeAlgorithm
        self.server_args = importlib.import_module("sglang.srt.server_args")
        self.ServerArgs = self.server_args.ServerArgs
        pool = importlib.import_module("sglang.srt.mem_cache.memory_pool")
        self.ReqToTokenPool = pool.ReqToTokenPool
        self.MHATokenToKVPool = pool.MHATokenToKVPool
        alloc = importlib.import_module("sglang.srt.mem_cache.allocator")  # a module, a package from 0.5.13
        self.TokenToKVPoolAllocator = alloc.TokenToKVPoolAllocator
        self.PagedTokenToKVPoolAllocator = alloc.PagedTokenToKVPoolAllocator
        self.RadixCache = importlib.import_module("sglang.srt.mem_cache.radix_cache").RadixCache
        self.ChunkCache = _optional(entry.chunk_cache)
        self.release_kv_cache = _optional(entry.finish_via)
        self.EvictParams = _optional(entry.evict_params)
        # From 0.5.6 the caches take one CacheInitParams instead of keyword arguments.
        self.CacheInitParams = _optional(entry.cache_init_params)
        self.set_globals: Callable[[Any], None] | None = None
        if entry.globals_style == "server_args":
            self.set_globals = _lookup(entry.globals_target)


_SGLANG: dict[str, _Sglang] = {}


def sglang_for(entry: VersionEntry) -> _Sglang:
    if entry.version not in _SGLANG:
        _SGLANG[entry.version] = _Sglang(entry)
    return _SGLANG[entry.version]


def verify_entry(entry: VersionEntry) -> list[str]:
    """Check the adapter entry against the imported SGLang; returns the mismatches (empty: all good)."""
    problems: list[str] = []
    sg = sglang_for(entry)

    def exists(qualified: str) -> bool:
        try:
            _lookup(qualified)
            return True
        except (ImportError, AttributeError):
            return False

    has_method = hasattr(sg.ScheduleBatch, "write_cache_indices")
    if entry.write_cache_indices is None:
        if has_method or exists("sglang.srt.mem_cache.common:write_cache_indices"):
            problems.append("the entry says there is no write_cache_indices, but SGLang has one")
    elif not exists(entry.write_cache_indices):
        problems.append(f"write_cache_indices is not at {entry.write_cache_indices}")
    for what in ("get_last_loc", "alloc_extend_caller", "globals_target"):
        if not exists(getattr(entry, what)):
            problems.append(f"{what} is not at {getattr(entry, what)}")
    init_new = list(inspect.signature(sg.ScheduleBatch.init_new).parameters)
    if tuple(init_new) != entry.init_new_params:
        problems.append(f"ScheduleBatch.init_new takes {init_new}, the entry says {list(entry.init_new_params)}")
    release = list(inspect.signature(sg.ScheduleBatch.release_req).parameters)[1:]
    if tuple(release) != entry.release_req_params:
        problems.append(f"ScheduleBatch.release_req takes {release}, the entry says {list(entry.release_req_params)}")
    return problems


def behaviour_notes(entry: VersionEntry) -> list[str]:
    """Where the imported SGLang behaves otherwise than the release ``entry`` records (a checkout
    or a patched copy may: that is what kvparity then checks). The adapter needs none of these
    facts, so they are reported, never refused."""
    problems: list[str] = []
    sg = sglang_for(entry)
    release_src = inspect.getsource(sg.ScheduleBatch.release_req)
    if entry.release_req_function is not None:  # 0.5.13+: the method calls a module function
        release_src += inspect.getsource(_lookup(entry.release_req_function))
    no_insert = "is_insert=False" in release_src
    if no_insert != (entry.release_req_kind == "cache_finished_req_no_insert"):
        problems.append(f"release_req {'calls' if no_insert else 'does not call'} cache_finished_req(is_insert=False)")
    chunk_src = inspect.getsource(sg.ChunkCache.cache_unfinished_req)
    copies = "copy=True" in chunk_src
    if copies != (entry.chunk_prefix == "int64 copy"):
        problems.append(
            f"ChunkCache.cache_unfinished_req {'copies' if copies else 'does not copy'} the row; "
            f"the entry says {entry.chunk_prefix}"
        )
    reset_src = inspect.getsource(sg.Req.reset_for_retract)
    clears = "self.req_pool_idx = None" in reset_src
    if clears != entry.retract_clears_req_pool_idx:
        problems.append(f"Req.reset_for_retract {'clears' if clears else 'keeps'} req_pool_idx; the entry says otherwise")
    prefill_src = inspect.getsource(sg.Req.is_prefill_only.fget)
    if "global_server_args_dict" not in prefill_src:  # a server-args getter (get_global_server_args, get_spec, ...)
        found = "server_args is None"
    elif "SpeculativeAlgorithm.NONE" in prefill_src:
        found = "dict None or NONE"
    else:
        found = "dict is None"
    if found != entry.prefill_only_spec_check:
        problems.append(f"Req.is_prefill_only checks {found!r}; the entry says {entry.prefill_only_spec_check!r}")
    probe = sg.Req("probe", "", array("q", [1, 2]) if entry.input_ids_type == "array" else [1, 2], sg.SamplingParams(max_new_tokens=1))
    kind = "list" if isinstance(probe.prefix_indices, list) else "int64"
    if kind != entry.prefix_default:
        problems.append(f"Req.prefix_indices defaults to a {kind}, the entry says {entry.prefix_default}")
    return problems


# --------------------------------------------------------------------------- configuration


class ModelConfigStandIn:
    """The few fields of SGLang's ModelConfig that ScheduleBatch reads on this path; any other
    read raises, naming the field, so a version that starts reading more fails loudly."""

    __slots__ = ("is_encoder_decoder", "vocab_size", "attention_chunk_size", "is_matryoshka")

    def __init__(self, vocab_size: int = VOCAB_SIZE) -> None:
        self.is_encoder_decoder = False
        self.vocab_size = vocab_size
        self.attention_chunk_size = None
        self.is_matryoshka = False  # read by prepare_for_extend from 0.5.4.post2 (embedding dimensions)

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(
            f"kvparity's model_config stand-in has no {name!r}: SGLang read a field this adapter does not provide"
        )


def make_server_args(sg: _Sglang, **overrides: Any) -> Any:
    """A real ``ServerArgs`` holding its defaults without resolving them (up to 0.5.19 a dataclass
    built without ``__post_init__``, which looks for a model, GPUs and memory; from 0.5.20 a
    msgspec Struct, whose ``__post_init__`` resolves nothing); ``overrides`` set the fields this
    path reads."""
    cls: Any = sg.ServerArgs
    if isinstance(cls, type) and dataclasses.is_dataclass(cls):
        args = object.__new__(cls)
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING:
                value = f.default
            elif f.default_factory is not dataclasses.MISSING:
                value = f.default_factory()
            else:
                value = None
            object.__setattr__(args, f.name, value)
    else:
        args = cls(model_path=overrides.get("model_path"))
    for name, value in overrides.items():
        if not hasattr(args, name):
            raise RealSGLangError(f"ServerArgs of this SGLang has no field {name!r}")
        object.__setattr__(args, name, value) if dataclasses.is_dataclass(cls) else setattr(args, name, value)
    return args


# --------------------------------------------------------------------------- the world


@dataclasses.dataclass(frozen=True)
class GeometryView:
    """What the adapter needs of ``kvparity.engine.world.Geometry`` (accepts that class, this, or a dict)."""

    pool_rows: int
    max_context_len: int
    kv_slots: int
    page_size: int = 1
    need_sort: bool = False

    @classmethod
    def of(cls, geometry: Any) -> GeometryView:
        if isinstance(geometry, dict):
            return cls(**geometry)
        return cls(
            geometry.pool_rows, geometry.max_context_len, geometry.kv_slots,
            getattr(geometry, "page_size", 1), getattr(geometry, "need_sort", False),
        )


def _check_host_tier(entry: VersionEntry, window: Window | None, mamba: Mamba | None, cache_kind: str) -> None:
    """Refuse a host tier kvparity does not drive, naming why."""
    if entry.host_tier is None:
        raise RealSGLangError(f"SGLang {entry.version}: its version entry names no host tier (kvparity drives "
                              f"HiRadixCache's up to 0.5.18 and UnifiedRadixCache's from 0.5.19)")
    if window is not None or cache_kind != "radix":
        raise RealSGLangError("a host tier is driven for a full-attention or Mamba model with its radix cache only")
    if mamba is not None and not entry.host_mamba:
        raise RealSGLangError(f"SGLang {entry.version}: a Mamba model's host tier is not driven for this release: "
                              f"it is UnifiedRadixCache's, which a Mamba model's server builds from 0.5.16 "
                              f"(its version entry's host_mamba)")


def sglang_out_of_memory(entry: VersionEntry, exc: BaseException) -> Exhausted | None:
    """The typed form of SGLang's out-of-memory error. SGLang raises a plain ``RuntimeError`` in
    its own words (the version table's ``oom_messages``); this is the one place that reads them:
    at the boundary to real SGLang, so that everything after it tests ``Exhausted``, never text."""
    kind = entry.oom_kind(str(exc)) if isinstance(exc, RuntimeError) else None
    if kind is None:
        return None
    return Exhausted.ROWS if kind == "rows" else Exhausted.KV


class RealWorld:
    """One real SGLang world: real pools, allocator and cache of one version on one backend."""

    def __init__(self, entry: VersionEntry, backend: str, geometry: Any, cache_kind: str, device: str = "cpu", *,
                 tree_class: str | None = None, tree_core: str | None = None,
                 caches: tuple[CacheConfig, ...] = ()) -> None:
        # What the server holds beside full attention (``ServerConfig.caches``): a hybrid
        # sliding-window model (its window and window pool) or a hybrid linear model (its state
        # pool), and a host tier (issue 35: full attention or Mamba, on the tree the release
        # attaches HiCache to).
        g = GeometryView.of(geometry)
        window = part_of(caches, SlidingWindow)
        self.window = None if window is None else Window(window.size, window_slots(g.kv_slots, g.page_size, window.kv_slots),
                                                         window.eviction_interval)
        states = part_of(caches, MambaStates)
        self.mamba = None if states is None else Mamba(states.slots)
        hybrid = self.window is not None or self.mamba is not None
        self.host = part_of(caches, HostTier)
        if self.host is not None:
            _check_host_tier(entry, self.window, self.mamba, cache_kind)
            if entry.host_tier == "unified":
                tree_core = tree_core or "python"  # kvparity reads each node's host slots: the Python core's
        # The tree a server of this release builds (UnifiedRadixCache from 0.5.19, or from 0.5.16 for
        # a hybrid model, on the release's default core), unless a world asks for another tree or core.
        unified = entry.unified_radix_cache is not None or (hybrid and entry.hybrid_tree == "unified")
        self.tree_class = tree_class or ("unified" if unified else "radix")
        self.tree_core = tree_core or (entry.tree_cores[0] if entry.tree_cores else None)
        if self.tree_class not in TREE_CLASSES or (self.tree_class == "unified" and not unified):
            raise RealSGLangError(f"tree_class={self.tree_class!r}: SGLang {entry.version} has "
                                  f"{('radix', 'unified') if unified else ('radix',)}")
        if hybrid and cache_kind == "chunk":
            raise RealSGLangError("a hybrid model's chunk cache (radix cache disabled) is not driven yet")
        # A Mamba model's host tier is UnifiedRadixCache's wherever its tree is (0.5.16+).
        host_tree = "unified" if self.mamba is not None else {"unified": "unified", "hiradix": "radix"}.get(entry.host_tier or "")
        if self.host is not None and self.tree_class != host_tree:
            raise RealSGLangError(f"tree_class={self.tree_class!r}: SGLang {entry.version}'s host tier is "
                                  f"{entry.host_tier}'s, on its {host_tree} tree")
        if tree_core is not None and tree_core not in entry.tree_cores:
            raise RealSGLangError(f"tree_core={tree_core!r}: SGLang {entry.version} has {entry.tree_cores or 'one core'}")
        if backend not in BACKENDS:
            raise ValueError(f"backend={backend!r}: expected one of {tuple(BACKENDS)}")
        if cache_kind not in CACHE_KINDS:
            raise ValueError(f"cache_kind={cache_kind!r}: expected one of {CACHE_KINDS} (there is no cache kind 'none')")
        self.entry = entry
        self.sg = sglang_for(entry)
        self.version = entry.label
        self.backend = backend
        self.family = entry.family
        self.cache_kind = cache_kind
        self.geometry = g
        self.device = str(device)
        self.model_config = ModelConfigStandIn()
        self.server_args = make_server_args(
            self.sg,
            model_path="dummy",  # the name SGLang 0.5.20+ resolve without loading a model
            device=self.device,
            attention_backend=BACKENDS[backend],
            page_size=g.page_size,
            disable_radix_cache=cache_kind == "chunk",
            speculative_algorithm=None,
            disaggregation_mode="null",
            **({} if self.host is None else host_server_fields(self.host, states=self.mamba is not None)),
        )
        if self.mamba is not None:  # what a Mamba tree reads of the model's config, preset (none is loaded)
            self.server_args._mamba_cache_chunk_size = MAMBA_CACHE_CHUNK_SIZE
        self.spec_algorithm = self.sg.SpeculativeAlgorithm.NONE
        self.activate()
        sg = self.sg
        if self.mamba is not None:
            self.req_to_token_pool, self.kv_pool, self.allocator = mamba_pools(
                entry, self.mamba, g.pool_rows, g.max_context_len, g.kv_slots, self._kv_form(), self.device,
                g.need_sort)
        else:
            self.req_to_token_pool = sg.ReqToTokenPool(g.pool_rows, g.max_context_len, self.device,
                                                       enable_memory_saver=False)
            if self.window is not None:
                self.kv_pool, self.allocator = window_pools(entry, self.window, g.kv_slots, g.page_size, KV_DTYPE,
                                                            self.device, g.need_sort)
            else:
                self._full_attention_pools()
        self.req_to_token_pool.req_to_token.fill_(POISON)
        if self.host is not None:
            self._canary_keys().zero_()  # unwritten KV reads as the canary's "unstamped"
        # A Mamba model's state slots and the rows requests may take, as the pools hand them out when
        # built (the oracles' whole of the state pool; a padding row or slot is neither).
        allocator = state_allocator(self.req_to_token_pool, entry) if self.mamba is not None else None
        self.state_slots = () if allocator is None else tuple(sorted(int(s) for s in allocator.free_slots.tolist()))
        self.request_rows = tuple(sorted(int(r) for r in self.req_to_token_pool.free_slots))
        self.observed: dict[str, Any] = {}
        self._observe_allocator()
        self.tree_cache = self._make_tree_cache()
        self.host_pool = None
        if self.host is not None and self.tree_class == "unified":
            self.host_pool = attach_host_tier(self.tree_cache, self.server_args, self._cache_init_params, self.host,
                                              self.entry)
        elif self.host is not None:
            self.host_pool = host_pool(self.tree_cache)
        # A Mamba model's host tier backs its states up to a host pool of their own.
        self.state_host_pool = None if self.host is None or self.mamba is None else state_host_pool(self.tree_cache)

    def _full_attention_pools(self) -> None:
        sg, g = self.sg, self.geometry
        dtype, width = self._kv_form()
        self.kv_pool = sg.MHATokenToKVPool(
            g.kv_slots, g.page_size, dtype, head_num=1, head_dim=width, layer_num=1,
            device=self.device, enable_memory_saver=False,
        )
        if g.page_size == 1:
            self.allocator = sg.TokenToKVPoolAllocator(g.kv_slots, KV_DTYPE, self.device, self.kv_pool, g.need_sort)
        else:
            self.allocator = sg.PagedTokenToKVPoolAllocator(
                g.kv_slots, g.page_size, KV_DTYPE, self.device, self.kv_pool, g.need_sort
            )

    def _make_tree_cache(self) -> Any:
        """The cache SGLang's scheduler builds for this kind: a UnifiedRadixCache from 0.5.19
        (disabled in place of the chunk cache), else a RadixCache, or (radix cache disabled,
        chunked prefill on) a ChunkCache; from 0.5.6 they take a CacheInitParams."""
        sg, g = self.sg, self.geometry
        fields = dict(req_to_token_pool=self.req_to_token_pool, token_to_kv_pool_allocator=self.allocator, page_size=g.page_size)
        unified = self._unified_radix_cache if self.tree_class == "unified" else None
        if self.window is not None:
            return window_tree(self.entry, self.window, fields, sg.CacheInitParams, unified)
        if self.mamba is not None:
            return mamba_tree(self.entry, fields, sg.CacheInitParams, unified)
        if self.tree_class == "unified":
            return self._unified_radix_cache(fields)
        if self.host is not None:  # HiRadixCache: the radix tree with its host tier (0.5.3 to 0.5.18)
            return hiradix_cache(fields, sg.CacheInitParams, self.server_args, self.host, self.entry)
        cls = sg.RadixCache if self.cache_kind == "radix" else sg.ChunkCache
        if cls is None:
            raise RealSGLangError(f"SGLang {self.entry.version} has no ChunkCache (cache kind 'chunk'): its chunk "
                                  f"cache is a disabled UnifiedRadixCache (tree_class 'unified')")
        if sg.CacheInitParams is None:
            return cls(**fields)
        return cls(sg.CacheInitParams(disable=self.cache_kind == "chunk", **fields))

    def _unified_radix_cache(self, fields: dict[str, Any]) -> Any:
        """A UnifiedRadixCache of the FULL component alone (what the scheduler's factory builds for
        a plain model; ``fields`` may name others), on this world's tree core: passed as
        ``tree_core_backend`` where the parameters take it (0.5.21+), else through the environment
        variable SGLang reads (0.5.19-0.5.20)."""
        sg = self.sg
        component = _lookup(self.entry.component_types or "")
        params = dict({"tree_components": (component.FULL,)}, **fields, disable=self.cache_kind == "chunk")
        takes_core = "tree_core_backend" in {f.name for f in dataclasses.fields(sg.CacheInitParams)}
        if takes_core:
            params["tree_core_backend"] = self.tree_core
        elif self.tree_core is not None:
            os.environ["SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"] = self.tree_core
        self._cache_init_params = sg.CacheInitParams(**params)
        return _lookup(UNIFIED_RADIX_CACHE)(self._cache_init_params)  # from 0.5.16 for a hybrid model

    def _kv_form(self) -> tuple[Any, int]:
        """The KV pool's dtype and head width: the smallest real pool (the allocators only store
        it), or for a host tier one that keeps the canary (``kv_canary_store``), which its copies
        to and from the host then carry."""
        return (KV_DTYPE, 1) if self.host is None else (torch.float32, KV_LANES)

    def kv_canary_store(self) -> LaneStore | None:
        """Where the forward's canary keeps the KV: in the KV pool itself for a host tier (its
        copies carry it; a Mamba model's full-attention pool), else None (a side table)."""
        if self.host is None:
            return None
        keys = self._canary_keys()
        return LaneStore(keys.view(keys.shape[0], -1).numpy())

    def _canary_keys(self) -> Any:
        """The keys of the full-attention layer (a Mamba model's pool holds them in its full pool)."""
        return getattr(self.kv_pool, "full_kv_pool", self.kv_pool).k_buffer[0]

    # ------------------------------------------------------------------ kvparity's World interface

    @property
    def id(self) -> WorldId:
        return WorldId(self.version, self.backend, self.family, self.entry.version)

    @property
    def name(self) -> str:
        return str(self.id)

    def activate(self) -> None:
        """Set SGLang's process-wide server arguments to this world's (as its ModelRunner does),
        and the environment a hybrid model's server reads."""
        Window.publish(self.window)
        if self.entry.globals_style == "dict":
            sb = self.sg.schedule_batch
            values = {k: getattr(self.server_args, k) for k in sb.GLOBAL_SERVER_ARGS_KEYS if hasattr(self.server_args, k)}
            sb.global_server_args_dict.update(values)
            sb.global_server_args_dict.update(
                {"use_mla_backend": False, "speculative_algorithm": self.spec_algorithm}
            )
        else:
            assert self.sg.set_globals is not None
            self.sg.set_globals(self.server_args)

    def new_req(
        self,
        rid: str,
        tokens: list[int],
        *,
        return_logprob: bool = False,
        logprob_start_len: int = -1,
        max_new_tokens: int = 16,
        extra_key: str | None = None,
    ) -> Any:
        """A real ``Req``, its ``logprob_start_len`` set as the scheduler sets it on arrival (a value
        at or past the prompt's end, which the server aborts, is clamped to ``len - 1``)."""
        self.activate()  # is_prefill_only reads the global speculative algorithm
        if logprob_start_len < -1:
            raise ValueError(f"logprob_start_len={logprob_start_len}: must be -1 or >= 0")
        input_ids = array("q", tokens) if self.entry.input_ids_type == "array" else list(tokens)
        req = self._req_class()(
            rid, "", input_ids, self.sg.SamplingParams(max_new_tokens=max_new_tokens),
            return_logprob=return_logprob, extra_key=extra_key,
        )
        n = len(req.origin_input_ids)
        if logprob_start_len == -1 or not return_logprob:
            req.logprob_start_len = n if req.is_prefill_only else n - 1
        else:
            req.logprob_start_len = logprob_start_len
        if not req.is_prefill_only and req.logprob_start_len >= n:
            req.logprob_start_len = n - 1  # the server would abort this request instead
        return req

    def _req_class(self) -> Any:
        """SGLang's ``Req`` with the names kvparity's loop reads (a generation may add its own)."""
        return self.sg.Req

    @staticmethod
    def behaviour_notes(entry: VersionEntry) -> list[str]:
        """Where the imported SGLang behaves otherwise than the release ``entry`` records."""
        return behaviour_notes(entry)

    def batch(self, reqs: list[Any], chunked_req: Any = None) -> RealBatch:
        batch = RealBatch(self, list(reqs), chunked_req)
        if self.host is not None:  # the server starts the batch's load-backs as it forms the batch
            batch.inner.hicache_consumer_index = self.tree_cache.ready_to_load_host_cache()
        return batch

    def host_events(self) -> None:
        """A host tier's finished backups and load-backs, as a server reads them when its pass starts."""
        if self.host is not None:
            self.activate()
            self.tree_cache.check_hicache_events()

    def load_back(self, req: Any) -> None:
        """The PrefillAdder's load-back of a host hit (0.5.3 to 0.5.21): the slots the device
        gets back extend the request's prefix, which its protected length then covers."""
        loaded = self._init_load_back(req)
        if loaded is None:
            return
        new_indices, req.last_node = loaded
        if self.entry.host_loaded_length:  # 0.5.20+ keeps how much came back
            req.host_loaded_length = len(new_indices)
        req.prefix_indices = torch.cat([req.prefix_indices, new_indices])
        style = self.entry.admission  # up to 0.5.14 the extend length is the request's own
        if style in ("fill_len", "setter"):
            whole = req.full_untruncated_fill_ids if style == "fill_len" else req.fill_ids
            req.set_extend_input_len(len(whole) - len(req.prefix_indices))
        elif style == "assign":
            req.extend_input_len = len(req.fill_ids) - len(req.prefix_indices)
        _set_dotted(req, self.entry.protected_len_field, len(req.prefix_indices))

    def _init_load_back(self, req: Any) -> Any:
        """``init_load_back`` for a request with a host hit (None without one, or without a host tier)."""
        if self.host is None or req.host_hit_length <= 0:  # a full-attention host hit
            return None
        self.activate()
        params = getattr(importlib.import_module("sglang.srt.mem_cache.base_prefix_cache"), "InitLoadBackParams", None)
        if params is None:  # up to 0.5.9: the node the hit ends at and the hit's length
            return self.tree_cache.init_load_back(req.last_host_node, req.host_hit_length)
        # The node the hit ends at: ``best_match_node`` (0.5.12+), ``last_host_node`` before.
        node = "best_match_node" if "best_match_node" in {f.name for f in dataclasses.fields(params)} else "last_host_node"
        return self.tree_cache.init_load_back(params(**{node: getattr(req, node)}, host_hit_length=req.host_hit_length,
                                                     req=req))

    # ------------------------------------------------------------------ helpers for scenarios

    def init_next_round_input(self, req: Any, use_tree_cache: bool = True) -> None:
        self.activate()
        req.init_next_round_input(self.tree_cache if use_tree_cache else None)
        # Until the PrefillAdder cuts it, the fill boundary is the whole sequence, as 0.5.3's
        # init_next_round_input leaves fill_ids (0.5.13+ keep the boundary of the last round).
        if self.entry.admission == "fill_len":
            req.fill_len = len(req.full_untruncated_fill_ids)
        elif self.entry.admission == "extend_range":
            req.extend_range = None
            _note_extend_logprob_start_len(req)

    def cache_unfinished_req(self, req: Any, chunked: bool = False) -> None:
        self.activate()
        self.tree_cache.cache_unfinished_req(req, chunked=chunked)

    def admit(self, req: Any, tokens: int | None, *, continuing: bool) -> None:
        """``req`` joins the batch, cut to ``tokens`` new tokens (None: whole), as this release's
        PrefillAdder does it (``VersionEntry.admission``)."""
        style = self.entry.admission
        prefix_len = len(req.prefix_indices)
        if style == "extend_range":
            whole = len(req.full_untruncated_fill_ids) - prefix_len
            req.set_extend_range(prefix_len, prefix_len + (whole if tokens is None else tokens))
            _note_extend_logprob_start_len(req)
        elif style == "fill_len":
            if continuing:
                req.set_extend_input_len(req.extend_input_len if tokens is None else tokens)
                req.fill_len = prefix_len + req.extend_input_len
            elif tokens is None:
                req.fill_len = len(req.full_untruncated_fill_ids)
            else:
                req.set_extend_input_len(tokens)
                req.fill_len = prefix_len + tokens
        elif tokens is not None:
            req.fill_ids = req.fill_ids[: prefix_len + tokens]
            if style == "setter" and not continuing:
                req.set_extend_input_len(tokens)
            else:
                req.extend_input_len = tokens
        if tokens is not None and not self.entry.stash_frees_row:
            req.is_chunked = 1  # the scheduler counts chunks; the row pool asserts a kept row is chunked

    def lock(self, req: Any) -> None:
        """The PrefillAdder's admission lock on the matched node (radix cache only)."""
        if self.cache_kind == "radix":
            self.activate()
            result = self.tree_cache.inc_lock_ref(req.last_node)
            if self.entry.lock_receipt:
                req.lock_receipt = result.to_dec_params()  # 0.5.20+: the release receipt, as the PrefillAdder keeps it
            if self.window is not None:
                # Where the window's lock stopped (the node whose tokens reach the window), as the
                # PrefillAdder keeps it: an IncLockRefResult's field from 0.5.9, the bare uuid before.
                # Without it the request's release unlocks the window up to the root (SGLang asserts).
                req.swa_uuid_for_lock = getattr(result, "swa_uuid_for_lock", result)

    @property
    def stash_frees_row(self) -> bool:
        return self.entry.stash_frees_row

    def out_of_memory(self, exc: BaseException) -> Exhausted | None:
        """What ran out, when ``exc`` is one of this version's out-of-memory errors, else None."""
        return sglang_out_of_memory(self.entry, exc)

    def evict(self, num_tokens: int) -> None:
        """``tree_cache.evict``: with a count up to 0.5.8, an EvictParams from 0.5.9."""
        self.activate()
        params = self.sg.EvictParams
        self.tree_cache.evict(num_tokens if params is None else params(num_tokens=num_tokens))

    def refuse(self, req: Any) -> None:
        """What the release's scheduler does for a request its adder refused after matching it
        (0.5.10+, ``mamba_refusal_frees``): drop the deferred copy, free the state slot the match
        took. Before, the waiting request keeps the slot for its admission."""
        if self.mamba is None or not self.entry.mamba_refusal_frees:
            return
        kv = state_fields(req, self.entry)
        kv.mamba_cow_src_index, kv.mamba_needs_clear = None, False
        if kv.mamba_pool_idx is not None:
            state_allocator(self.req_to_token_pool, self.entry).free(kv.mamba_pool_idx.unsqueeze(-1))
            kv.mamba_pool_idx = None

    def cache_finished_req(self, req: Any) -> None:
        """What this release's scheduler calls for a finished request."""
        self.activate()
        if self.sg.release_kv_cache is None:
            self.tree_cache.cache_finished_req(req)
        else:
            self.sg.release_kv_cache(req, self.tree_cache)

    def free_group(self) -> _FreeGroup:
        return _FreeGroup(self.allocator)

    def _observe_allocator(self) -> None:
        """Record ``last_loc`` (a local variable of prepare_for_extend / prepare_for_decode) at the
        allocator's alloc_extend / alloc_decode call, then call the real method."""
        allocator = self.allocator
        for method in ("alloc_extend", "alloc_decode"):
            real = getattr(allocator, method, None)
            if real is None:
                continue

            def observed(*args: Any, _real: Callable[..., Any] = real, _method: str = method, **kwargs: Any) -> Any:
                names = list(inspect.signature(_real).parameters)
                bound = dict(zip(names, args)) | kwargs
                last_loc = bound.get("last_loc")
                self.observed[_method] = {
                    "last_loc": None if last_loc is None else last_loc.detach().to("cpu", copy=True),
                }
                return _real(*args, **kwargs)

            setattr(allocator, method, observed)

    # ------------------------------------------------------------------ plain views (for snapshots)

    def state_view(self, rows: dict[str, int]) -> StateView:
        """A Mamba model's states of the requests on ``rows`` (request id -> row), as the forward's
        canary reads and writes them."""
        return state_view(self.req_to_token_pool, rows)

    def release_pages(self) -> torch.Tensor:
        """Freed pages waiting for the next sort (of the full pool's allocator, for a
        sliding-window model): see ``released_pages``."""
        return released_pages(full_allocator(self.allocator))

    def tree_contents(self, cache: Any = None) -> list[tuple]:
        """One ``(extra_key, full token path, node slots, lock_ref)`` per node of the real radix
        tree, sorted (kvparity's ``RadixCache.contents()`` format); [] for a ChunkCache."""
        cache = self.tree_cache if cache is None else cache
        if self.tree_class == "unified":
            return unified_tree_nodes(cache, self.entry) if self.cache_kind == "radix" else []
        entries = [(extra, path, tuple(int(v) for v in node.value.tolist()), _lock_ref(node))
                   for node, extra, path in _walk(cache) if node.value is not None]  # None: on the host only
        return sorted(entries, key=lambda e: (e[0] is not None, e[0] or "", e[1], e[2], e[3]))

    def host_nodes(self) -> list[HostNode]:
        """A host tier's nodes holding host KV or listed by a load-back (``HostNode``), by path."""
        if self.tree_class == "unified":
            return host_nodes(self.tree_cache, self.entry)
        return _radix_host_nodes(self.tree_cache)

    def state_host_nodes(self) -> list[HostNode]:
        """A Mamba model's host tier's nodes holding a host state (``HostNode``), by path."""
        return state_host_nodes(self.tree_cache, self.entry)

    def pool_records(self, radix: bool, reqs: Iterable[Any]) -> dict[str, PoolRecord]:
        """The records of the pools beside the device's KV (``pool_readers``)."""
        return pool_records(self, radix, reqs)

    def all_tree_slots(self, cache: Any = None) -> list[int]:
        """Every slot the tree holds, depth first over sorted children (kvparity's order)."""
        cache = self.tree_cache if cache is None else cache
        if self.tree_class == "unified":
            return [slot for _, _, slots, _ in self.tree_contents(cache) for slot in slots]
        return [int(v) for node, _, _ in _walk(cache) if node.value is not None for v in node.value.tolist()]

    def state(self) -> dict[str, Any]:
        """Everything SPEC section 7 compares, as plain data (the requests are viewed separately)."""
        a = full_allocator(self.allocator)
        out: dict[str, Any] = {
            "req_to_token": self.req_to_token_pool.req_to_token.tolist(),
            "free_pages": a.free_pages.tolist(),
            "release_pages": self.release_pages().tolist(),
            "available_size": int(a.available_size()),
            "free_rows": list(self.req_to_token_pool.free_slots),
            "tree": [list(e) for e in self.tree_contents()],
            "tree_slots": self.all_tree_slots(),
        }
        if self.cache_kind == "radix":
            out["evictable_size"], out["protected_size"] = full_sizes(self.tree_cache)
        return out

    def req_view(self, req: Any) -> dict[str, Any]:
        """The request fields SPEC section 7 compares, as plain data."""
        prefix = req.prefix_indices
        table = self.req_to_token_pool.req_to_token
        alias = _alias_row(prefix, table)
        if isinstance(prefix, torch.Tensor):
            kind = f"{prefix.dtype} view of row {alias}" if alias is not None else f"{prefix.dtype} {prefix.device.type} tensor"
            values = [int(v) for v in prefix.tolist()]
        else:
            kind = type(prefix).__name__
            values = [int(v) for v in prefix]
        return {
            "rid": req.rid,
            "fill_ids": list(req.fill_ids),
            "output_ids": list(req.output_ids),
            "extend_input_len": int(req.extend_input_len),
            "req_pool_idx": None if req.req_pool_idx is None else int(req.req_pool_idx),
            "cached_tokens": int(req.cached_tokens),
            "already_computed": int(req.already_computed),
            "extend_logprob_start_len": int(req.extend_logprob_start_len),
            "last_matched_prefix_len": int(req.last_matched_prefix_len),
            "logprob_start_len": int(req.logprob_start_len),
            "is_retracted": bool(req.is_retracted),
            "prefix_values": values,
            "prefix_kind": kind,
            "alias_row": alias,
        }


class _FreeGroup:
    def __init__(self, allocator: Any) -> None:
        self.allocator = allocator

    def __enter__(self) -> None:
        self.allocator.free_group_begin()

    def __exit__(self, *exc: Any) -> None:
        self.allocator.free_group_end()


def _lock_ref(node: Any) -> int:
    """A node's lock count in the full pool (a sliding-window tree's node counts its window's apart)."""
    return int(node.full_lock_ref if hasattr(node, "full_lock_ref") else node.lock_ref)


def _radix_host_nodes(cache: Any) -> list[HostNode]:
    """HiRadixCache's nodes with host KV: a backup lists a node by its id until acknowledged, a
    load-back the last node of the path it loads."""
    loading = {id(node) for node in cache.ongoing_load_back.values()}
    out = [HostNode(path, () if node.host_value is None else tuple(int(v) for v in node.host_value.tolist()),
                    None if node.value is None else tuple(int(v) for v in node.value.tolist()),
                    node.id in cache.ongoing_write_through, id(node) in loading, extra)
           for node, extra, path in _walk(cache) if node.host_value is not None or id(node) in loading]
    return in_tree_order(out)


def _walk(cache: Any):
    """(node, extra_key, full token path) for every non-root node of a real RadixCache, depth
    first, children sorted by (extra key, first tokens); nothing for a ChunkCache."""
    root = getattr(cache, "root_node", None)
    if root is None:
        return

    def tokens(node: Any) -> tuple[int, ...]:
        return tuple(int(t) for t in node.key.token_ids)

    def extra(node: Any) -> Any:
        return node.key.extra_key

    def ordered(node: Any) -> list[Any]:
        return sorted(node.children.values(), key=lambda c: (extra(c) is not None, extra(c) or "", tokens(c)))

    stack = [(child, tokens(child)) for child in reversed(ordered(root))]
    while stack:
        node, path = stack.pop()
        yield node, extra(node), path
        stack.extend((child, path + tokens(child)) for child in reversed(ordered(node)))


# --------------------------------------------------------------------------- batches


class RealBatch:
    """A real ``ScheduleBatch.init_new(...)`` (no overlap, no speculative decoding) plus the steps
    kvparity plays on it. ``inner`` is the real batch; ``reqs`` its requests."""

    def __init__(self, world: RealWorld, reqs: list[Any], chunked_req: Any = None) -> None:
        world.activate()
        self.world = world
        sg = world.sg
        positional = (
            reqs, world.req_to_token_pool, world.allocator, world.tree_cache, world.model_config,
            False, world.spec_algorithm,
        )
        self.inner = sg.ScheduleBatch.init_new(*positional, chunked_req=chunked_req)
        self.out_cache_loc: torch.Tensor | None = None
        self.last_loc: torch.Tensor | None = None  # of the last extend (None for page size 1)
        self.decode_last_loc: torch.Tensor | None = None  # of the last decode (None for page size 1)
        # True between the first release_req of a retraction and the filter that ends it: the
        # released requests hold no row any more, so the running fields are not rebuilt then.
        self._retracting = False

    @property
    def reqs(self) -> list[Any]:
        return self.inner.reqs

    def prepare_for_extend(self) -> torch.Tensor:
        """The real prepare_for_extend. ``out_cache_loc`` and ``last_loc`` are set afterwards (also
        ``last_loc`` when the allocation then failed: the real allocator saw it)."""
        self.world.activate()
        self.world.observed.pop("alloc_extend", None)
        self.out_cache_loc = None
        self._retracting = False
        try:
            self.inner.prepare_for_extend()
        finally:
            seen = self.world.observed.get("alloc_extend")
            self.last_loc = None if seen is None else seen["last_loc"]
        self.out_cache_loc = self.inner.out_cache_loc
        if self.world.mamba is not None:  # what the model runner does before the forward's Mamba layers read
            run_deferred_state_work(self.world.entry, self.world.req_to_token_pool, self.inner)
        return self.out_cache_loc

    def as_running(self, slotted: list[int] | None = None) -> None:
        """Give the batch the fields a real running (decode) batch has before
        ``check_decode_mem`` / ``retract`` / ``prepare_for_decode`` in the non-overlap loop:
        ``req_pool_indices``, ``seq_lens`` / ``seq_lens_cpu`` (``slotted``: the number of tokens of
        each request that already have a KV slot, by default ``len(origin) + len(output) - 1``),
        ``orig_seq_lens``, ``seq_lens_sum``, ``output_ids`` (each request's last token: the one
        the model just produced, which has no slot yet), ``sampling_info`` and the logprob lists."""
        b = self.inner
        reqs = b.reqs
        missing = [r.rid for r in reqs if r.req_pool_idx is None]
        if missing:
            raise RealSGLangError(f"requests {missing} of the batch hold no row (retracted or finished?): filter them out first")
        if slotted is None:
            slotted = [len(r.origin_input_ids) + len(r.output_ids) - 1 for r in reqs]
        if len(slotted) != len(reqs):
            raise ValueError(f"slotted has {len(slotted)} entries for {len(reqs)} requests")
        device = b.device
        b.req_pool_indices = torch.tensor([r.req_pool_idx for r in reqs], dtype=torch.int64, device=device)
        if self.world.entry.batch_rows_on_host:  # 0.5.13+ keep a host copy (filter_batch indexes it)
            b.req_pool_indices_cpu = b.req_pool_indices.cpu()
        b.seq_lens = torch.tensor(slotted, dtype=torch.int64, device=device)
        b.seq_lens_cpu = torch.tensor(slotted, dtype=torch.int64)
        b.orig_seq_lens = torch.tensor(
            [max(s, len(r.origin_input_ids)) for s, r in zip(slotted, reqs)], dtype=torch.int32, device=device
        )
        b.seq_lens_sum = int(sum(slotted))
        b.output_ids = torch.tensor(
            [r.output_ids[-1] if r.output_ids else r.origin_input_ids[-1] for r in reqs], dtype=torch.int64, device=device
        )
        if b.multimodal_inputs is None:
            b.multimodal_inputs = [r.multimodal_inputs for r in reqs]
        b.return_logprob = any(r.return_logprob for r in reqs)
        if b.return_logprob:
            b.top_logprobs_nums = [r.top_logprobs_num for r in reqs]
            b.token_ids_logprobs = [r.token_ids_logprob for r in reqs]
        if b.sampling_info is None:
            b.sampling_info = self.world.sg.SamplingBatchInfo.from_schedule_batch(b, self.world.model_config.vocab_size)

    def check_decode_mem(self, selected_indices: list[int] | None = None) -> bool:
        """The real ``check_decode_mem`` (evicts from the tree when short, then says whether the
        next decode step fits)."""
        self.world.activate()
        return bool(self.inner.check_decode_mem(selected_indices=selected_indices))

    def release_req(self, idx: int, remaining_req_count: int) -> None:
        """The real retract release of ``reqs[idx]`` (``ScheduleBatch.release_req`` with this
        world's ServerArgs; 0.5.3.post2+ inside it call ``cache_finished_req(req, is_insert=False)``).
        The request stays in the batch: ``filter`` it out afterwards, as ``retract_decode`` does
        (the running fields are rebuilt from the requests at the first release of a retraction)."""
        self.world.activate()
        if not self._retracting:
            self.as_running()
            self._retracting = True
        call_declared(self.inner.release_req, idx, remaining_req_count, server_args=self.world.server_args)

    def retract_decode(self) -> list[Any]:
        """The real ``retract_decode(server_args)``: SGLang's own retraction order and loop
        (``check_decode_mem`` / ``release_req`` until the rest fits, at least one, never the last),
        then ``filter_batch``. Returns the retracted requests, in the order SGLang took them."""
        self.world.activate()
        self.as_running()
        self._retracting = False
        result = call_declared(self.inner.retract_decode, server_args=self.world.server_args)
        return list(result[0])

    def filter(self, keep_indices: list[int]) -> None:
        """The real ``filter_batch(keep_indices=...)``."""
        self.world.activate()
        if not self._retracting:
            self.as_running()
        self._retracting = False
        self.inner.filter_batch(keep_indices=list(keep_indices))

    def prepare_for_decode(self, slotted: list[int] | None = None) -> torch.Tensor:
        """The real ``prepare_for_decode`` (one new slot per request, written in column
        ``seq_len``); the running fields are refreshed from the requests first. Returns
        ``out_cache_loc``; ``decode_last_loc`` is what the paged allocator was given."""
        self.world.activate()
        self.as_running(slotted)
        self._retracting = False
        self.world.observed.pop("alloc_decode", None)
        self.out_cache_loc = None
        try:
            self.inner.prepare_for_decode()
        finally:
            seen = self.world.observed.get("alloc_decode")
            self.decode_last_loc = None if seen is None else seen["last_loc"]
        self.out_cache_loc = self.inner.out_cache_loc
        return self.out_cache_loc


# The world class of each state-model generation (``VersionEntry.generation``): its adapter module.
WORLD_CLASSES = {
    "prefix_indices": "kvparity.engine.real.adapter:RealWorld",
    "prefix_len": "kvparity.engine.real.adapter_prefix_len:PrefixLenWorld",
}


def world_class(entry: VersionEntry) -> type[RealWorld]:
    """The world class that drives ``entry``'s generation."""
    return _lookup(WORLD_CLASSES[entry.generation])


def build_real_world(version_entry: VersionEntry, backend: str, geometry: Any, cache_kind: str, device: str = "cpu",
                     **options: Any) -> RealWorld:
    """A fresh real world of the entry's generation (see RealWorld); ``req_to_token`` is filled with
    the poison value. ``options``: what the generation offers (0.5.22+: ``tree_core``, ``tree_class``)
    and the server's caches, as records (``caches``) or printed flat (``sliding_window=8``, from a
    harness lane)."""
    rest = dict(options)
    flat = {name: rest.pop(name) for name in options if name in flat_owner()}
    caches = cache_parts(flat, tuple(rest.pop("caches", ())))
    return world_class(version_entry)(version_entry, backend, geometry, cache_kind, device, caches=caches, **rest)
