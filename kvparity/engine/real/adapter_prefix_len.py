"""The "prefix_len" state model (SGLang 0.5.22 on): what differs from ``adapter`` (0.5.3 .. 0.5.21).

What changed (``../shared/sglang-0.5.22.md``, checked against the wheels):
- a request holds ``prefix_len`` only; its prefix slots are its row while it holds one, else the
  locked tree path (SGLang's own ``allocation._prefix_kv_indices`` reads them, and so does this
  adapter); a finished request's prefix is not readable any more;
- the fill boundary is ``Req.extend_end`` (``extend_len`` a property);
- the caches take ``common.checkpoint_kv_cache`` (stash and after-prefill) and
  ``release_kv_cache(..., checkpoint=True)`` (finish); the admission lock is ``req.lock = tree.lock(node)``;
- ChunkCache is gone: a disabled ``UnifiedRadixCache`` stands in its place, and an enabled one is
  what a server builds, on a Rust tree core by default or a Python one;
- the allocator and the write path pick Triton or torch from the platform's capabilities
  (``supports_triton``), read when the allocator is built and on every write.

The scheduler loop and the snapshots read the 0.5.3 names (``prefix_indices``, ``fill_ids``,
``extend_input_len``, ...): the request class gains read-only properties under them, which
SGLang 0.5.22 never uses.
"""

from __future__ import annotations

import importlib
from typing import Any

from kvparity.engine.real.adapter import RealWorld, extend_logprob_start_len_of
from kvparity.engine.real.versions import VersionEntry


class ReleasedPrefix(tuple):
    """The prefix of a request whose KV was released: 0.5.22 keeps no readable prefix then
    (``prefix_len`` may outlive the tree path it counted). Empty; its type names it in snapshots."""

    __slots__ = ()


RELEASED_PREFIX = ReleasedPrefix()


class _PrefixSources:
    """What ``allocation._prefix_kv_indices(batch, req)`` reads of a batch: the pool and the tree."""

    def __init__(self, world: RealWorld) -> None:
        self.req_to_token_pool = world.req_to_token_pool
        self.tree_cache = world.tree_cache


def _prefix_now(req: Any) -> Any:
    if req.finished() and not req.kv.holds_kv:
        return RELEASED_PREFIX
    world = req._kvparity_world
    return world.prefix_kv_indices(world.prefix_sources, req)


def _fill_ids(req: Any) -> Any:
    return req.full_untruncated_fill_ids if req.extend_end is None else req.get_fill_ids()


def _extend_len(req: Any) -> int:
    """The length of the request's extend: before admission the whole unmatched rest (as 0.5.3
    computed it); from admission on, ``extend_end`` less the prefix it was admitted with. (0.5.22's
    ``extend_len`` reads 0 once a checkpoint moved ``prefix_len`` up to ``extend_end``; 0.5.21's
    ``extend_range`` kept the length of the extend that ran, which is what the view compares.)"""
    if req.extend_end is None:
        return len(req.full_untruncated_fill_ids) - req.prefix_len
    return int(req.extend_end - req._kvparity_admitted_prefix_len)


def _note_extend_logprob_start_len(req: Any) -> None:
    """Kept as of the match and the cut, as ``adapter`` does for 0.5.15+ (see there)."""
    req._kvparity_extend_logprob_start_len = extend_logprob_start_len_of(req, req.prefix_len, _extend_len(req))


def _named_req_class(req_class: Any) -> Any:
    names = {
        "prefix_indices": property(_prefix_now),
        "fill_ids": property(_fill_ids),
        "extend_input_len": property(_extend_len),
        "extend_logprob_start_len": property(lambda req: req._kvparity_extend_logprob_start_len),
        "last_matched_prefix_len": property(lambda req: req.kv.cache_protected_len),
        "req_pool_idx": property(lambda req: req.kv.req_pool_idx),
    }
    return type(req_class.__name__, (req_class,), {"__module__": req_class.__module__, **names})


_REQ_CLASSES: dict[int, Any] = {}


class PrefixLenWorld(RealWorld):
    """A real SGLang 0.5.22+ world. ``tree_core``: "rust" (a server's default) or "python";
    ``tree_class``: "unified" (a server's) or "radix" (RadixCache, still shipped)."""

    def __init__(self, entry: VersionEntry, backend: str, geometry: Any, cache_kind: str, device: str = "cpu",
                 **options: Any) -> None:
        super().__init__(entry, backend, geometry, cache_kind, device, **options)
        self.prefix_kv_indices = importlib.import_module("sglang.srt.mem_cache.allocation")._prefix_kv_indices
        self.prefix_sources = _PrefixSources(self)
        self.common = importlib.import_module("sglang.srt.mem_cache.common")
        self.kernels = self._kernels_in_use()

    # ------------------------------------------------------------------ platform and kernels

    def _platform_capabilities(self) -> Any:
        """What a CUDA server's platform says for a Triton world; the plain platform (no Triton:
        SGLang's torch twins and torch write loop) for a torch world."""
        interface = importlib.import_module("sglang.srt.platforms.interface")
        return interface.PlatformCapabilities(supports_triton=self.backend == "triton")

    def activate(self) -> None:
        """Globals as the base does, and the platform's capabilities (``support_triton`` reads
        them on every write; the paged allocator when it is built)."""
        platform = importlib.import_module("sglang.srt.platforms").current_platform
        platform.capabilities = self._platform_capabilities()
        super().activate()

    def _kernels_in_use(self) -> dict[str, str]:
        """Which kernels this world runs, as SGLang decides it (the report says it)."""
        common = importlib.import_module("sglang.srt.utils.common")
        triton_alloc = bool(getattr(self.allocator, "use_triton_kernels", False))
        return {
            "alloc": "n/a (page size 1)" if self.geometry.page_size == 1 else ("triton" if triton_alloc else "torch twins"),
            "write": "triton" if common.support_triton(self.server_args.attention_backend) else "torch loop",
            "tree_core": self._built_tree_core(),
        }

    def _built_tree_core(self) -> str:
        """The core actually built (SGLang falls back to Python silently when Rust cannot load)."""
        from kvparity.engine.real.unified_tree import tree_core_kind

        return tree_core_kind(self.tree_cache, self.entry) if self.tree_class == "unified" else "n/a"

    # ------------------------------------------------------------------ the scheduler's hooks

    def _req_class(self) -> Any:
        raw = self.sg.schedule_batch.Req
        return _REQ_CLASSES.setdefault(id(raw), _named_req_class(raw))

    @staticmethod
    def behaviour_notes(entry: VersionEntry) -> list[str]:
        """0.5.22's model has none of the facts the older notes read (ChunkCache, prefix_indices);
        its own are checked by the probe (``probe.entry_facts``)."""
        return []

    def new_req(self, rid: str, tokens: list[int], **options: Any) -> Any:
        req = super().new_req(rid, tokens, **options)
        req._kvparity_world = self
        req._kvparity_extend_logprob_start_len = 0
        _note_extend_logprob_start_len(req)
        return req

    def init_next_round_input(self, req: Any, use_tree_cache: bool = True) -> None:
        self.activate()
        req.init_next_round_input(self.tree_cache if use_tree_cache else None)
        req.extend_end = None  # until the PrefillAdder sets it, the whole rest is to come
        _note_extend_logprob_start_len(req)

    def cache_unfinished_req(self, req: Any, chunked: bool = False) -> None:
        """Both the stash of the chunked request and the after-prefill call are a checkpoint."""
        self.activate()
        self.common.checkpoint_kv_cache(req, self.tree_cache)

    def admit(self, req: Any, tokens: int | None, *, continuing: bool) -> None:
        whole = len(req.full_untruncated_fill_ids) - req.prefix_len
        req._kvparity_admitted_prefix_len = req.prefix_len
        req.extend_end = req.prefix_len + (whole if tokens is None else tokens)
        _note_extend_logprob_start_len(req)
        if tokens is not None:
            req.is_chunked = 1  # as the scheduler counts chunks (the row pool asserts a kept row is chunked)

    def load_back(self, req: Any) -> None:
        """The PrefillAdder's load-back of a host hit (0.5.22+): the prefix length grows by what
        the device gets back, and the protected length with it where the cache owns the load."""
        loaded = self._init_load_back(req)
        if loaded is None:
            return
        req.host_loaded_length, req.last_node = loaded
        req.prefix_len += req.host_loaded_length
        if self.tree_cache.load_back_is_cache_owned():
            req.kv.cache_protected_len = req.prefix_len

    def lock(self, req: Any) -> None:
        """The PrefillAdder's admission lock (also on a disabled cache, as SGLang calls it)."""
        self.activate()
        req.lock = self.tree_cache.lock(req.last_node)

    def cache_finished_req(self, req: Any) -> None:
        """The request finishes as ``update_finish_state`` marks a length finish (its owned KV
        length reads ``finished_len``), then its KV is released into the tree."""
        self.activate()
        if not req.finished():
            req.finished_reason = self.sg.schedule_batch.FINISH_LENGTH(length=len(req.output_ids))
            req.finished_len = len(req.output_ids)
        self.common.release_kv_cache(req, self.tree_cache, checkpoint=True)
