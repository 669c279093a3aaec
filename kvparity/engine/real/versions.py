"""The version adapter table: what differs, on the KV-index path, between the SGLang releases
kvparity drives for real. One frozen ``VersionEntry`` per supported version, read from the release
registry's rows (``kvparity.engine.releases``: each row says which fields changed).

Every entry was written from the release's own source (``pip download --no-deps sglang==V``) and is
checked against the imported code when a worker starts (``adapter.verify_entry``), so a wrong
entry fails loudly instead of driving the wrong code. This module never imports sglang.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from packaging.version import Version

from kvparity.engine.real import RealSGLangError
from kvparity.engine.release_order import parse_version, version_key
from kvparity.engine.releases import INIT_NEW, OOM_SCHEDULE_BATCH, RELEASE_REQ, RELEASES, Release
from kvparity.model.traffic import HostOffer


@dataclass(frozen=True)
class VersionEntry:
    version: str  # "0.5.3"
    family: str  # "legacy" (before PR #11200) or "refactored"
    # Where the refactored prefix+extend write lives; None when the version has none (legacy
    # writes the prefix in its per-request loop and the extend part with its own kernel).
    write_cache_indices: str | None
    # Where get_last_loc lives (legacy calls it on the extend path; later versions do not).
    get_last_loc: str
    # Where the KV allocation of prepare_for_extend lives (its alloc_extend call is where
    # ``last_loc`` is observed).
    alloc_extend_caller: str
    # How the scheduler's global server arguments are set:
    #   "dict": update the module dict ``global_server_args_dict`` of schedule_batch with
    #           ``speculative_algorithm`` (SpeculativeAlgorithm.NONE, as ModelRunner does) and
    #           ``attention_backend``;
    #   "server_args": ``server_args.set_global_server_args_for_scheduler(ServerArgs)``; readers
    #           call ``get_global_server_args()``.
    globals_style: str
    globals_target: str
    init_new_params: tuple[str, ...] = INIT_NEW
    release_req_params: tuple[str, ...] = RELEASE_REQ
    # What ScheduleBatch.release_req does with a radix-cache request:
    #   "free_row_columns": frees row columns [floor(len(prefix)/ps)*ps, seq_len), frees the row,
    #                       dec_lock_ref, evicts remaining*retract_decode_steps;
    #   "cache_finished_req_no_insert": tree_cache.cache_finished_req(req, is_insert=False), then
    #                       the same eviction.
    release_req_kind: str = "free_row_columns"
    # Where the retract eviction step count (20) comes from.
    retract_decode_steps: str = "sglang.global_config:global_config.retract_decode_steps"
    # Req.prefix_indices default and reset_for_retract value: "list" ([]) or "int64" (empty tensor);
    # "none": the field is gone (0.5.22+).
    prefix_default: str = "int64"
    # ChunkCache.cache_unfinished_req: "int32 view" (aliases req_to_token) or "int64 copy"; "none":
    # there is no ChunkCache (0.5.22+).
    chunk_prefix: str = "int64 copy"
    # RadixCache.cache_finished_req, paged: free the unaligned tail "first" or "last".
    finished_tail_free: str = "first"
    # How Req.is_prefill_only (max_new_tokens == 0 and no speculative decoding) reads the global
    # speculative algorithm:
    #   "dict is None": global_server_args_dict["speculative_algorithm"] is None. A real 0.5.3
    #       server's ModelRunner stores SpeculativeAlgorithm.NONE there, so no request is ever
    #       prefill-only in 0.5.3 (its logprob_start_len is then len - 1, not len);
    #   "dict None or NONE": the same dict, None or SpeculativeAlgorithm.NONE (0.5.3.post1);
    #   "server_args is None": get_global_server_args().speculative_algorithm is None (the
    #       ServerArgs string field, None without speculative decoding).
    prefill_only_spec_check: str = "server_args is None"
    # Req.reset_for_retract sets req_pool_idx = None (0.5.4 no longer does: a retracted request
    # keeps the index of the row it gave back until its next prepare_for_extend).
    retract_clears_req_pool_idx: bool = True
    oom_messages: dict[str, str] = field(default_factory=lambda: dict(OOM_SCHEDULE_BATCH))
    # The Req field holding the matched prefix length the cache protects (renamed in 0.5.6).
    protected_len_field: str = "last_matched_prefix_len"
    # How the PrefillAdder sets a request's fill boundary: "assign" (fill_ids and extend_input_len
    # assigned on a cut), "setter" (0.5.9+: a new request cut with Req.set_extend_input_len),
    # "fill_len" (0.5.13+: full_untruncated_fill_ids and fill_len, set for every admitted request),
    # "extend_range" (0.5.16+: Req.set_extend_range; extend lengths are computed, not stored),
    # "extend_end" (0.5.22+: Req.extend_end assigned; the prefix is Req.prefix_len).
    admission: str = "assign"
    # The scheduler frees the chunked request's row after caching it (up to 0.5.8; from 0.5.9 the
    # request keeps its row and ReqToTokenPool.alloc(reqs) reuses it).
    stash_frees_row: bool = True
    # What the scheduler calls when a request finishes: None (tree_cache.cache_finished_req), or
    # where ``release_kv_cache(req, tree_cache)`` lives (0.5.5.post1+: it wraps cache_finished_req
    # and, from 0.5.16, passes kv_len_to_handle and frees the row itself).
    finish_via: str | None = None
    # The request's row and KV lengths live in ``req.kv`` (a ReqKvInfo, 0.5.20+), not on Req.
    req_kv_info: bool = False
    # The parameter object RadixCache.evict takes (0.5.9+; before, the number of tokens).
    evict_params: str | None = None
    # What the tokenizer hands Req as origin_input_ids: "list", or "array" (array("q"), 0.5.13+).
    input_ids_type: str = "list"
    # Where ChunkCache lives (None: the release has none, 0.5.22+).
    chunk_cache: str | None = "sglang.srt.mem_cache.chunk_cache:ChunkCache"
    # The one parameter object the caches take from 0.5.6 (None before: keyword arguments).
    cache_init_params: str | None = None
    # The state model, and so the adapter module that drives it (``GENERATIONS``):
    #   "prefix_indices": the request holds its matched prefix in ``Req.prefix_indices`` and the
    #       caches take cache_unfinished_req / cache_finished_req (0.5.3 .. 0.5.21);
    #   "prefix_len": the request holds ``prefix_len`` only (the slots are its row or the locked
    #       tree path), the caches take checkpoint / release_kv_cache, ChunkCache is gone (0.5.22+).
    generation: str = "prefix_indices"
    # Where UnifiedRadixCache lives: what a server builds from 0.5.19 on (enabled; disabled in
    # place of the chunk cache from 0.5.22). None before 0.5.19.
    unified_radix_cache: str | None = None
    # The cores UnifiedRadixCache can build its tree on, the server's default first: the Python one
    # (0.5.19, 0.5.20), then a compiled Rust one beside it (0.5.21+: SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND
    # defaults to "rust").
    tree_cores: tuple[str, ...] = ()
    # The hybrid caches (issue 34, docs/plans/hybrid-caches.md), where the release has them. A
    # sliding-window model's allocator (a full pool and a window pool joined by a slot mapping) and
    # its pool moved out of the allocator and memory-pool modules in 0.5.8 and 0.5.13:
    swa_allocator: str = "sglang.srt.mem_cache.allocator:SWATokenToKVPoolAllocator"
    swa_kv_pool: str = "sglang.srt.mem_cache.memory_pool:SWAKVPool"
    # The trees of their own, before they became UnifiedRadixCache's SWA and MAMBA components (both
    # deleted in 0.5.21; MambaRadixCache from 0.5.3.post2). None where the release has none.
    swa_tree: str | None = "sglang.srt.mem_cache.swa_radix_cache:SWARadixCache"
    mamba_tree: str | None = None
    # The tree a hybrid model's server builds: "own" (the trees above) or "unified" (0.5.16+:
    # UnifiedRadixCache with the model's components, ``UNIFIED_RADIX_CACHE``), and where the component types live.
    hybrid_tree: str = "own"
    component_types: str | None = None
    # Whether the scheduler frees the state slot a Mamba request's match took when its adder
    # refuses the request (0.5.10+); before, the waiting request keeps it for its admission.
    mamba_refusal_frees: bool = False
    # Whether the window pool takes a page size (0.5.8+: SWATokenToKVPoolAllocator(page_size=...));
    # before, a sliding-window model's pools are page size 1 only.
    paged_swa: bool = False
    # The host tier a server attaches with --enable-hierarchical-cache, where kvparity drives it
    # (issue 35): "hiradix" (0.5.3 to 0.5.18: HiRadixCache, a radix tree with its own host tier)
    # or "unified" (0.5.19+: UnifiedRadixCache.init_hicache, the plain model's tree).
    host_tier: str | None = None
    # Whether its host pool refuses to be no larger than the device's (0.5.3 to 0.5.14: "The
    # host memory should be larger than the device memory with the current protocol").
    host_pool_larger: bool = False
    # Whether its cache controller makes torch.cuda events and streams itself (up to 0.5.5.post2):
    # torch.cpu's stand in, in that module only (``host_tier.cpu_streams_for_controller``).
    host_controller_cuda_streams: bool = False
    # Whether its host pool module imports sgl_kernel.kvcacheio whatever the device (0.5.3 to 0.5.12):
    # imported with a stand-in for that one import (``host_tier.import_host_pool_with_copies``).
    host_pool_imports_kvcacheio: bool = False
    # Whether kvparity drives a Mamba model's host tier (its states backed up to a host pool of
    # their own, MambaPoolHost, page-first layout; UnifiedRadixCache.init_hicache): "hicache-mamba"
    # (0.5.16+, where a Mamba model's server builds UnifiedRadixCache).
    host_mamba: bool = False
    # Whether its scheduler takes SGLang's retraction test switch at an interval (SGLANG_TEST_RETRACT
    # with SGLANG_TEST_RETRACT_INTERVAL, read into the scheduler module's TEST_RETRACT and
    # TEST_RETRACT_INTERVAL, 0.5.4+: a decode batch retracts a request every that many forwards,
    # memory or not): the nemesis's forced retraction. 0.5.3 to 0.5.3.post3 retract on it only in
    # a decode batch of more than 10 requests, which kvparity's servers never run.
    test_retract_interval: bool = False
    # Facts the driving code once probed for at run time (``hasattr``), now the entry's, each
    # checked against the release's source by the probe (``probe.entry_facts``):
    # UnifiedRadixCache keeps its tree in a tree core (0.5.17+: ``tree_core``, whose
    # ``build_load_back_spec`` plans a load-back; a KV backup gives up in ``_execute_kv_backup``).
    unified_tree_core: bool = False
    # ScheduleBatch keeps a host copy of its row indices, ``req_pool_indices_cpu`` (0.5.13+).
    batch_rows_on_host: bool = False
    # Req keeps how much of a host hit came back to the device, ``host_loaded_length`` (0.5.20+).
    host_loaded_length: bool = False
    # Req keeps its admission lock's release receipt, ``lock_receipt`` (0.5.20 and 0.5.21; from
    # 0.5.22 the prefix_len adapter releases through the request's own state).
    lock_receipt: bool = False
    # A host tier's cache controller (HiCacheController): its storage loops stop on an event of
    # their own, ``storage_stop_event`` (0.5.9+; the controller's one ``stop_event`` before); a
    # storage fetch transfers a batch of pages and returns their count, ``_page_transfer_kv_batch``
    # (0.5.19+); its module imports the parallel state's rank functions (up to 0.5.15.post1; the
    # runtime context's ``ParallelContext`` after, which keeps an override for good from 0.5.20,
    # ``override_permanently``).
    storage_stop_event: bool = False
    batched_page_transfer: bool = False
    controller_rank_functions: bool = True
    permanent_parallel_override: bool = False
    # Req answers whether its prefix waits on the host, ``needs_host_load_back()`` (0.5.13+), and
    # carries a cache request handle, ``cache_request_handle`` (0.5.20+; a prefetch is keyed by it
    # from 0.5.23).
    needs_host_load_back: bool = False
    cache_request_handle: bool = False
    # A storage prefetch's pages are acknowledged through the controller's ``prefetch_sync_queue``
    # and ``ack_prefetch_queue`` (``PrefetchAck``), its sync and io threads and its buffer made as
    # the storage starts (0.5.19+; before, the prefetch loop makes its buffer and io thread itself).
    prefetch_acks: bool = False
    # The Python tree core's node keeps the ids of its pending load-back and write-through,
    # ``load_back_pending_id`` (0.5.18+).
    node_pending_ids: bool = False
    # A Mamba request pool hands state slots out of ``mamba_allocator`` (0.5.13+; its
    # ``mamba_pool`` before), and its own Mamba tree lists every state it keeps,
    # ``all_mamba_values_flatten`` (0.5.7+; each node's ``mamba_value`` before).
    mamba_allocator: bool = False
    mamba_values_flatten: bool = False
    # The scheduler sends through ``ipc_channels`` (0.5.13+; its own ``send_to_tokenizer`` before).
    scheduler_ipc_channels: bool = False
    # ``ScheduleBatch.release_req`` calls this module function (0.5.13+; None: it is the method's own).
    release_req_function: str | None = None
    # A batch carries the Mamba state work its forward does first, ``mamba_clear_indices`` and
    # ``mamba_cow_src_indices`` (0.5.13+: the scheduler defers it to the forward).
    deferred_mamba_state_work: bool = False

    @property
    def serves_mamba(self) -> bool:
        """Whether a hybrid linear (Mamba) model's server has a tree: MambaRadixCache or UnifiedRadixCache's MAMBA."""
        return self.mamba_tree is not None or self.hybrid_tree == "unified"

    @property
    def host_offer(self) -> HostOffer:
        """The host tiers kvparity drives it with: a host pool smaller than the device's where it takes one."""
        return HostOffer(smaller=not self.host_pool_larger)

    @property
    def prefill_only_possible(self) -> bool:
        """Whether a real server of this version ever treats a request as prefill-only."""
        return self.prefill_only_spec_check != "dict is None"

    @property
    def label(self) -> str:
        return f"sglang-{self.version}"

    def oom_kind(self, message: str) -> str | None:
        """Which of SGLang's out-of-memory errors ``message`` is (a key of ``oom_messages``), or None."""
        for kind, start in self.oom_messages.items():
            if message.startswith(start):
                return kind
        return None


def _chain(rows: tuple[Release, ...]) -> list[VersionEntry]:
    """Each release's entry: the first row's fields, then each release as the release before it plus
    what its row says changed on this path."""
    entries = [VersionEntry(version=rows[0].version, **rows[0].entry)]  # type: ignore[arg-type]
    for row in rows[1:]:
        entries.append(dataclasses.replace(entries[-1], version=row.version, **row.entry))  # type: ignore[arg-type]
    return entries


# The state-model generations, each with the releases that define it (docs and refusals name them).
GENERATIONS = {
    "prefix_indices": "Req.prefix_indices, cache_unfinished_req / cache_finished_req, ChunkCache (0.5.3 .. 0.5.21)",
    "prefix_len": "Req.prefix_len, checkpoint_kv_cache / release_kv_cache, UnifiedRadixCache only (0.5.22 ..)",
}

SUPPORTED: dict[str, VersionEntry] = {e.version: e for e in _chain(RELEASES)}

# Releases on the package index that kvparity cannot drive yet, each with the concrete reason.
NOT_DRIVEN: dict[str, str] = {}


def latest_release_at_or_below(version: str, releases: list[str]) -> str | None:
    """The newest of ``releases`` that is not newer than ``version`` (a setuptools-scm
    ``0.5.22.dev12`` is twelve commits after the 0.5.21 tag, so it is below 0.5.22), or None."""
    key = version_key(version).public
    below = [r for r in releases if version_key(r) <= Version(key)]
    return max(below, key=version_key) if below else None


def nearest_supported(version: str) -> str:
    """The supported version closest to ``version``: one sharing its N.N.N release if any (the
    latest of them below it, else the earliest above), else the neighbour below it in release
    order (the earliest supported one when it is older than all)."""
    key = version_key(version)
    ordered = sorted(SUPPORTED, key=version_key)
    same_release = [v for v in ordered if version_key(v).release == key.release]
    pool = same_release or ordered
    below = [v for v in pool if version_key(v) < key]
    return below[-1] if below else pool[0]


def entry(version: str) -> VersionEntry:
    """The adapter entry of ``version`` (any form ``parse_version`` accepts); an unsupported version
    is refused with a RealSGLangError naming the nearest supported one."""
    bare = parse_version(version)
    if bare in SUPPORTED:
        return SUPPORTED[bare]
    if bare in NOT_DRIVEN:
        raise RealSGLangError(f"SGLang {bare} cannot be driven by kvparity yet: {NOT_DRIVEN[bare]}")
    near = nearest_supported(bare)
    raise RealSGLangError(
        f"SGLang {bare} is not supported by kvparity's real-SGLang adapter (supported: "
        f"{', '.join(sorted(SUPPORTED, key=version_key))}); the nearest supported version is {near}"
    )
