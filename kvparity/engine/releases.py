"""What kvparity knows of each SGLang release it drives, one row per release (``RELEASES``, in
release order): how its KV-index path differs from the release before it (``entry``: the fields of
the adapter's ``VersionEntry`` that changed), the scheduler shell adapter that first drives it
(``shell``, registered by name in ``kvparity.engine.real.shell_adapters``) and the scheduler
generation it begins (``generation``), the changes found by reading its wheel (``changes``: what
``kvparity matrix`` and the cause searches name) and the differences from the release before that
the judge excuses by name (``known``: reported as findings, never as silent parity).

Every other table is read from these rows: the adapter table (``kvparity.engine.real.versions``),
the shell adapters by release, the named changes between two releases (``changes_between``), the
judge's known differences (``KNOWN_VERSION_DIFFERENCES``). SGLang's own defects, which span ranges of
releases, are ``kvparity.engine.real.defects``. Plain data: nothing here imports SGLang or the
kernels, so the judge and the commands read it directly.

A change's kinds: "renumbering" (which row, page or slot a token gets, or the order of a free list,
and nothing any token can see), "behaviour" (a value a request or the tree ends up with) or
"admission" (which requests a batch admits, or in which order). A change that can be undone says how
(``undo``: in its release's source, the text it wrote and the text before it; ``model_undo``: the
option of kvparity's model that undoes it; ``adapter_undo``: the fact of kvparity's adapter that
follows it, where the harness drive's loop plays it), so that a difference between two releases can
be traced to it: undone in a replay, the two decide alike (``kvparity.run.scheduler_drive``), or keep
the same memory (``kvparity.run.harness_drive``). Pure refactors and moves are ``entry`` fields only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

from kvparity.engine.change import ADMISSION, BEHAVIOUR, RENUMBERING, Change
from kvparity.engine.errors import RealSGLangError
from kvparity.engine.release_order import parse_version, version_key

# Qualified names ("module:attribute" or "module:Class.method") of where things live.
_SB = "sglang.srt.managers.schedule_batch"
_COMMON = "sglang.srt.mem_cache.common"
_ALLOCATION = "sglang.srt.mem_cache.allocation"  # the allocation half of common.py, from 0.5.16
_SERVER_ARGS = "sglang.srt.server_args"
_SWA_POOL = "sglang.srt.mem_cache.swa_memory_pool"  # the sliding-window pool and allocator, 0.5.8 ..
UNIFIED_RADIX_CACHE = "sglang.srt.mem_cache.unified_radix_cache:UnifiedRadixCache"  # from 0.5.11

# ``ScheduleBatch.init_new`` and ``ScheduleBatch.release_req``: the same in 0.5.3 .. 0.5.4.
# ("remaing" is SGLang's spelling.)
INIT_NEW = (
    "reqs", "req_to_token_pool", "token_to_kv_pool_allocator", "tree_cache", "model_config",
    "enable_overlap", "spec_algorithm", "chunked_req",
)
RELEASE_REQ = ("idx", "remaing_req_count", "server_args")

# SGLang's out-of-memory RuntimeError messages start with these (kvparity classifies failures by
# them). Keys: "rows" (alloc_req_slots), "extend_1" (page size 1 extend), "extend_paged",
# "decode_1", "decode_paged".
OOM_SCHEDULE_BATCH = {
    "rows": "alloc_req_slots runs out of memory.",
    "extend_1": "Prefill out of memory.",  # f"{phase_str} out of memory." with phase "Prefill"
    "extend_paged": "Prefill out of memory.",
    "decode_1": "Decode out of memory.",
    "decode_paged": "Decode out of memory.",
}
_OOM_COMMON = {
    "rows": "alloc_req_slots runs out of memory.",
    "extend_1": "Out of memory.",  # mem_cache/common.py alloc_token_slots: no phase word any more
    "extend_paged": "Prefill out of memory.",
    "decode_1": "Out of memory.",
    "decode_paged": "Decode out of memory.",
}

# The known differences the judge's code names (``kvparity.judge.compare``, ``kvparity.judge.renumber``).
PAGED_TAIL_FREED_LAST = "0.5.3.post2 frees the paged tail last"
KEEPS_RETRACTED_ROW_INDEX = "0.5.4 keeps req_pool_idx after retract"
FINISH_SPLITS_AT_PROMPT = "0.5.20 splits the tree at the prompt boundary on finish"
CHECKPOINT_SPLITS_AT_PROMPT = "0.5.22 checkpoint splits the tree at the prompt boundary"
FINISH_REPOINTS_ROW = "0.5.22 repoints a finished row onto the tree's slots"
RELEASED_HAS_NO_PREFIX = "0.5.22 has no prefix for a released request"
INT64_STAGED_FREES = "0.5.22 stages freed slots as int64"


@dataclass(frozen=True)
class KnownDifference:
    """A difference from the release before that the judge excuses by name, and why it is no bug."""

    name: str
    why: str


@dataclass(frozen=True)
class Release:
    """One release, as kvparity knows it (see the module's docstring). A row's changes are stamped
    with its version: a change is written once, under the release that made it."""

    version: str
    entry: Mapping[str, object] = field(default_factory=dict)
    shell: str | None = None  # the shell adapter first driving this release (None: the one before's)
    generation: tuple[str, str] | None = None  # (name, what changed) where a scheduler generation begins
    changes: tuple[Change, ...] = ()
    known: tuple[KnownDifference, ...] = ()

    def __post_init__(self) -> None:
        stamped = tuple(dataclasses.replace(c, release=self.version) for c in self.changes)
        object.__setattr__(self, "changes", stamped)


RELEASES: tuple[Release, ...] = (
    Release(
        "0.5.3", shell="Shell053",
        generation=("thread-overlap", "one __init__; the overlap loop talks to a TP worker thread"),
        entry=dict(family="legacy", write_cache_indices=None, get_last_loc=f"{_SB}:get_last_loc",
            alloc_extend_caller=f"{_SB}:ScheduleBatch.alloc_paged_token_slots_extend", globals_style="dict",
            globals_target=f"{_SB}:global_server_args_dict", prefix_default="list", chunk_prefix="int32 view",
            prefill_only_spec_check="dict is None", host_tier="hiradix", host_pool_larger=True,
            host_pool_imports_kvcacheio=True, host_controller_cuda_streams=True),
    ),
    Release(
        "0.5.3.post1", shell="Shell053Post1",
        generation=("monolithic", "one __init__; the scheduler's own FutureMap for the overlap"),
        entry=dict(family="refactored", write_cache_indices=f"{_SB}:ScheduleBatch.write_cache_indices",
            prefix_default="int64", chunk_prefix="int64 copy", prefill_only_spec_check="dict None or NONE"),
        changes=(
            Change(BEHAVIOUR, "PR #11200: write_cache_indices writes prefix and new slots in one kernel; "
                   "prefix_indices is an int64 tensor and the chunk cache keeps an int64 copy (no value changes)",
                   "#11200"),
            Change(ADMISSION, "PR #11200: the key that ranks the waiting queue under lpm and dfs-weight "
                   "(SchedulePolicy._compute_prefix_matches) went from Req.adjust_max_prefix_ids(), capped at len - "
                   "1 and at the logprob start, to origin_input_ids + output_ids, uncapped", "#11200",
                   undo=("sglang/srt/managers/schedule_policy.py",
                         "prefix_ids = r.origin_input_ids + r.output_ids",
                         "prefix_ids = (r.origin_input_ids + r.output_ids)[: max(min(len(r.origin_input_ids) + "
                         "len(r.output_ids) - 1, r.logprob_start_len if r.return_logprob else 1 << 62), 0)]"),
                   model_undo=("ranking_key_of", "legacy")),
        ),
    ),
    Release(
        "0.5.3.post2", shell="Shell053Post2",
        entry=dict(write_cache_indices=f"{_COMMON}:write_cache_indices", get_last_loc=f"{_COMMON}:get_last_loc",
            alloc_extend_caller=f"{_COMMON}:alloc_paged_token_slots_extend", globals_style="server_args",
            globals_target=f"{_SERVER_ARGS}:set_global_server_args_for_scheduler",
            release_req_kind="cache_finished_req_no_insert",
            retract_decode_steps="sglang.srt.environ:envs.SGLANG_RETRACT_DECODE_STEPS", finished_tail_free="last",
            oom_messages=dict(_OOM_COMMON), prefill_only_spec_check="server_args is None",
            mamba_tree="sglang.srt.mem_cache.mamba_radix_cache:MambaRadixCache"),
        changes=(
            Change(RENUMBERING, "RadixCache.cache_finished_req frees the unaligned paged tail after the duplicate "
                   "pages instead of before (free-list order)"),
            Change(BEHAVIOUR, "a finished request with no output token caches its whole prompt, not all but the "
                   "last token"),
            Change(BEHAVIOUR, "ScheduleBatch.release_req (a retraction) releases through cache_finished_req(req, "
                   "is_insert=False), which frees the row up to the request's own tokens, no longer up to the "
                   "batch's sequence length: in the overlap loop the slot the batch still in flight allocated for a "
                   "request retracted meanwhile is freed by nobody (process_batch_result skips retracted requests): "
                   "one KV slot leaks per such retraction (found by the scheduler-driven memory oracles)"),
        ),
        known=(
            KnownDifference(PAGED_TAIL_FREED_LAST, "RadixCache.cache_finished_req frees the unaligned tail after "
                            "the duplicate pages, not before: the same pages are freed in another order, so the "
                            "free list differs only in order (later slots are renumbered, which only a comparison "
                            "up to renumbering can follow)"),
        ),
    ),
    Release("0.5.3.post3"),
    Release(
        "0.5.4",
        entry=dict(retract_clears_req_pool_idx=False, test_retract_interval=True),
        changes=(
            Change(RENUMBERING, "Req.reset_for_retract keeps req_pool_idx (the row is free all the same)"),
        ),
        known=(
            KnownDifference(KEEPS_RETRACTED_ROW_INDEX, "Req.reset_for_retract no longer clears req_pool_idx: a "
                            "retracted request keeps the index of the row it gave back (the row itself is free; the "
                            "next prepare_for_extend sets a new one)"),
        ),
    ),
    Release("0.5.4.post1"),
    Release("0.5.4.post2", shell="Shell054Post2"),
    Release("0.5.4.post3"),
    Release("0.5.5"),
    Release(
        "0.5.5.post1", shell="Shell055Post1",
        entry=dict(finish_via=f"{_COMMON}:release_kv_cache"),
        changes=(
            Change(BEHAVIOUR, "release lengths follow kv_committed_len (aborted or mid-chunk requests release only "
                   "what they were given); one access time per matched path (LRU ties)", "#12224"),
        ),
    ),
    Release("0.5.5.post2"),
    Release(
        "0.5.5.post3",
        entry=dict(host_controller_cuda_streams=False),
        changes=(
            Change(BEHAVIOUR, "a host tier's host pool is sized up to whole pages and a page more (page_num = size "
                   "// page_size + 1) where 0.5.5.post2 cut it down to whole pages: a page more host slots",
                   undo=("sglang/srt/mem_cache/memory_pool_host.py",
                         "        # Align up the host memory pool size to the page size\n"
                         "        self.page_num = self.size // self.page_size + 1\n"
                         "        self.size = self.page_num * self.page_size\n",
                         "        # Align the host memory pool size to the page size\n"
                         "        self.size = self.size - (self.size % self.page_size)\n"
                         "        self.page_num = self.size // self.page_size\n")),
        ),
    ),
    Release(
        "0.5.6", shell="Shell056",
        entry=dict(init_new_params=INIT_NEW + ("dllm_config",),
            cache_init_params="sglang.srt.mem_cache.cache_init_params:CacheInitParams",
            protected_len_field="cache_protected_len"),
        changes=(
            Change(BEHAVIOUR, "regression: RadixCache.cache_finished_req keys on req.fill_ids, so the tokens a "
                   "request decoded are not inserted into the tree at finish (their slots are freed); fixed in 0.5.9"),
            Change(BEHAVIOUR, "cached_tokens and already_computed are updated only until a request is first "
                   "retracted (retracted_stain)"),
        ),
    ),
    Release("0.5.6.post1", shell="Shell056Post1"),
    Release("0.5.6.post2"),
    Release(
        "0.5.7", shell="Shell057",
        generation=("split-init", "__init__ split into SGLang's own small initialisers"),
        entry=dict(mamba_values_flatten=True),
        changes=(
            Change(BEHAVIOUR, "with return_logprob and logprob_start_len -1 the match is no longer capped at 0; "
                   "extend_logprob_start_len computed by Req.set_extend_input_len with a new formula"),
        ),
    ),
    Release(
        "0.5.8", shell="Shell058",
        entry=dict(init_new_params=INIT_NEW + ("dllm_staging_reqs", "dllm_config"),
            swa_allocator=f"{_SWA_POOL}:SWATokenToKVPoolAllocator", swa_kv_pool=f"{_SWA_POOL}:SWAKVPool",
            paged_swa=True),
    ),
    Release("0.5.8.post1"),
    Release(
        "0.5.9", shell="Shell059",
        entry=dict(init_new_params=INIT_NEW + ("dllm_config",), admission="setter", stash_frees_row=False,
            evict_params="sglang.srt.mem_cache.base_prefix_cache:EvictParams", storage_stop_event=True),
        changes=(
            Change(RENUMBERING, "the chunked request keeps its row between chunks (ReqToTokenPool.alloc(reqs) "
                   "reuses it) instead of freeing and taking one again", "#17850"),
            Change(BEHAVIOUR, "the PrefillAdder cuts a new request with Req.set_extend_input_len, which recomputes "
                   "its extend_logprob_start_len (before: extend_input_len assigned, the value of the match kept)"),
            Change(BEHAVIOUR, "the finished request's decoded tokens are cached again (reverts the 0.5.6 regression)",
                   "#16521"),
            Change(RENUMBERING, "RadixCache.evict takes candidates from a maintained evictable-leaf set (heap order "
                   "on exact ties)"),
        ),
    ),
    Release(
        "0.5.10", shell="Shell0510",
        entry=dict(mamba_refusal_frees=True),
        changes=(
            Change(BEHAVIOUR, "retract_decode aborts the last request when even it does not fit, instead of raising",
                   "#19881"),
            Change(BEHAVIOUR, "a Mamba model's request the PrefillAdder refuses after its match copied a state into "
                   "a slot of its own gives that slot back (0.5.9 leaks it: SGLang's own idle leak check raises; "
                   "the known defect 'Mamba state leaked by a refused request'), so the state pool's free count "
                   "differs from the refusal on", "#21404",
                   undo=("sglang/srt/managers/scheduler.py",
                         "                # revert matched mamba idx to avoid memory leak, if req is not added\n"
                         "                added = len(adder.can_run_list) > 0 and req is adder.can_run_list[-1]\n"
                         "                if not added and req.mamba_pool_idx is not None:\n"
                         "                    self.tree_cache.req_to_token_pool.mamba_pool.free(\n"
                         "                        req.mamba_pool_idx.unsqueeze(-1)\n"
                         "                    )\n"
                         "                    req.mamba_pool_idx = None\n",
                         ""),
                   adapter_undo=("mamba_refusal_frees", False)),
            Change(BEHAVIOUR, "with a host tier (HiRadixCache), update_running_batch acknowledges finished "
                   "write-through backups before its decode memory check (flush_write_through_acks), so their nodes "
                   "are evictable in that pass, not from the next one's check_hicache_events",
                   undo=("sglang/srt/managers/scheduler.py",
                         "        # Eagerly release lock_ref on completed write-through nodes so they\n"
                         "        # become evictable, improving batch scheduling headroom.\n"
                         "        if self.enable_hierarchical_cache:\n"
                         "            self.tree_cache.flush_write_through_acks()\n"
                         "\n",
                         "")),
            Change(BEHAVIOUR, "with a host tier (HiRadixCache), the prefill pass checks the host tier's events "
                   "(check_hicache_events: finished backups acknowledged, their nodes unlocked) before it returns "
                   "for want of waiting requests, so an idle pass acknowledges them; 0.5.9 checked only once "
                   "something could be admitted, so a finished request's node stayed locked (protected, not "
                   "evictable) while nothing waited (shrunk: one request of one token, evictable 1 against 0 after "
                   "the idle pass that follows it)"),
        ),
    ),
    Release("0.5.10.post1"),
    Release(
        "0.5.11", shell="Shell0511",
        entry=dict(component_types="sglang.srt.mem_cache.unified_cache_components:ComponentType"),
        changes=(
            Change(RENUMBERING, "row 0 of req_to_token is reserved as padding: rows are 1..size", "#24243"),
        ),
    ),
    Release(
        "0.5.12",
        changes=(
            Change(ADMISSION, "get_num_allocatable_reqs caps the requests a prefill pass may admit by the request "
                   "pool's free rows whatever the pipeline (0.5.11: only with pipeline parallelism), so where rows "
                   "run out beside a chunked request a pass admits fewer (shrunk: five rows, a decoding request, a "
                   "chunked one and three one-token prompts: 0.5.12 admits two of them, 0.5.11 all three; with the "
                   "cap undone, as 0.5.11)",
                   undo=("sglang/srt/managers/scheduler.py",
                         "        res = min(res, self.req_to_token_pool.available_size())\n"
                         "        return res\n",
                         "        return res\n")),
        ),
    ),
    Release("0.5.12.post1"),
    Release(
        "0.5.13", shell="Shell0513",
        generation=("components", "scheduler components (receiver, streamer, result processor, checker, ...)"),
        entry=dict(input_ids_type="array", admission="fill_len", host_pool_imports_kvcacheio=False,
            swa_allocator="sglang.srt.mem_cache.allocator.swa:SWATokenToKVPoolAllocator", batch_rows_on_host=True,
            needs_host_load_back=True, mamba_allocator=True, scheduler_ipc_channels=True,
            release_req_function="sglang.srt.managers.schedule_batch:release_req", deferred_mamba_state_work=True),
        changes=(
            Change(BEHAVIOUR, "the PrefillAdder recomputes extend_logprob_start_len (set_extend_input_len) for the "
                   "chunked request's next chunk too; fill_ids become full_untruncated_fill_ids up to fill_len"),
        ),
    ),
    Release("0.5.13.post1"),
    Release(
        "0.5.14", shell="Shell0514",
        changes=(
            Change(BEHAVIOUR, "with a storage tier, a request's prefetch asks for its prompt up to the longest "
                   "prefix it may match (_compute_max_prefix_len: the last token is always computed), not the whole "
                   "prompt: fewer host slots held for it (shrunk: a retracted request, 35 slots against 36)",
                   undo=("sglang/srt/managers/scheduler.py",
                         "                new_input_tokens = req.full_untruncated_fill_ids[matched_len:match_end]\n",
                         "                new_input_tokens = req.full_untruncated_fill_ids[matched_len:]\n")),
        ),
    ),
    Release(
        "0.5.15", shell="Shell0515",
        entry=dict(admission="extend_range", host_pool_larger=False),
        changes=(
            Change(BEHAVIOUR, "extend_logprob_start_len is computed by the batch "
                   "(compute_extend_logprob_start_len), no longer stored on the request; the fill boundary is "
                   "Req.extend_range"),
        ),
    ),
    Release("0.5.15.post1"),
    Release(
        "0.5.16", shell="Shell0516",
        generation=("batch-plan", "get_next_batch_to_run returns a NextBatchPlan; runtime-context config from 0.5.19"),
        entry=dict(hybrid_tree="unified", host_mamba=True, write_cache_indices=f"{_ALLOCATION}:write_cache_indices",
            get_last_loc=f"{_ALLOCATION}:get_last_loc",
            alloc_extend_caller=f"{_ALLOCATION}:alloc_paged_token_slots_extend", controller_rank_functions=False),
        changes=(
            Change(BEHAVIOUR, "a hybrid model's server builds UnifiedRadixCache with the model's components (FULL "
                   "and SWA, FULL and MAMBA) in place of SWARadixCache and MambaRadixCache (registry.py; the old "
                   "classes still ship): a sliding-window request's tree keeps its window-freed part as a node of "
                   "its own (4 nodes against SWARadixCache's 3 for one request decoding 32 tokens under a window of "
                   "8, and another window evictable size); when a Mamba state eviction removes a leaf, its parent "
                   "left without a state (no match can end there) keeps its KV, evictable, where MambaRadixCache "
                   "frees it too (kvparity matrix --caches swa,mamba)"),
            Change(BEHAVIOUR, "with a storage tier (HiRadixCache), a prefetch takes host slots only for what the "
                   "storage query found, on the scheduler's thread after the query (prefetch_hit_queue), where "
                   "0.5.15 took slots for the whole unmatched prompt as the request arrived and gave back what the "
                   "query missed an iteration later: 0.5.15's host has fewer free slots meanwhile"),
        ),
    ),
    Release(
        "0.5.17", shell="Shell0517",
        entry=dict(component_types="sglang.srt.mem_cache.unified_cache.component_type:ComponentType",
            unified_tree_core=True),
        changes=(
            Change(BEHAVIOUR, "evict_from_tree_cache evicts only the shortfall (num_tokens - available_size) "
                   "instead of num_tokens, so a retraction or an allocation keeps more of the tree",
                   undo=("sglang/srt/mem_cache/common.py",
                         "        # Standard allocator: evict only the shortfall (mirrors the SWA arm)\n"
                         "        available_size = allocator.available_size()\n"
                         "        if available_size < num_tokens:\n"
                         "            tree_cache.evict(EvictParams(num_tokens=num_tokens - available_size))\n",
                         "        # Standard allocator\n"
                         "        if allocator.available_size() < num_tokens:\n"
                         "            tree_cache.evict(EvictParams(num_tokens=num_tokens))\n")),
            Change(BEHAVIOUR, "with a host tier (HiRadixCache), update_running_batch no longer acknowledges "
                   "finished write-through backups before its decode memory check (flush_write_through_acks is "
                   "gone): their nodes stay locked until the next pass's check_hicache_events",
                   undo=("sglang/srt/managers/scheduler.py",
                         "            return batch\n"
                         "\n"
                         "        # Check if decode out of memory\n",
                         "            return batch\n"
                         "\n"
                         "        if self.enable_hierarchical_cache:\n"
                         "            self.tree_cache.writing_check()\n"
                         "\n"
                         "        # Check if decode out of memory\n")),
        ),
    ),
    Release(
        "0.5.18",
        entry=dict(release_req_params=RELEASE_REQ + ("offload_kv",), node_pending_ids=True),
        changes=(
            Change(BEHAVIOUR, "with a host tier, a Mamba state a node gains after its KV was backed up (a finished "
                   "request ending on a node of an earlier path) is backed up too (UnifiedTreeCore's incremental "
                   "component backup after an insert), where 0.5.17 left it on the device alone (shrunk: two "
                   "requests, the shorter a prefix of the longer; 0.5.18's state host pool holds one state more)"),
            Change(RENUMBERING, "rows are popped from the tail of the free list (the last freed row is reused "
                   "first); its pull request: \"allocation order has no semantic meaning\"", "#32208",
                   undo=("sglang/srt/mem_cache/memory_pool.py",
                         "            select_index = self.free_slots[-need_size:]\n"
                         "            del self.free_slots[-need_size:]\n",
                         "            select_index = self.free_slots[:need_size]\n"
                         "            del self.free_slots[:need_size]\n")),
        ),
    ),
    Release(
        "0.5.19", shell="Shell0519",
        entry=dict(release_req_params=("idx", "remaing_req_count", "offload_kv"), req_kv_info=True,
            protected_len_field="kv.cache_protected_len", unified_radix_cache=UNIFIED_RADIX_CACHE,
            tree_cores=("python",), host_tier="unified", batched_page_transfer=True, prefetch_acks=True),
        changes=(
            Change(BEHAVIOUR, "the request's row and KV lengths move to req.kv (ReqKvInfo); the scheduler builds "
                   "UnifiedRadixCache on the plain path (on its Python tree core), which kvparity drives from this "
                   "release on (RadixCache stays selectable)"),
            Change(BEHAVIOUR, "with a host tier, UnifiedRadixCache's backup that finds the host full evicts only "
                   "the host's shortfall (_execute_kv_backup: kv_tokens - host_avail) where HiRadixCache's evicted "
                   "as many host tokens as the backup holds (write_backup: evict_host(len(node.value))), so the "
                   "host keeps more; the two trees' host evictions differ beyond that (that one line undone, 13, "
                   "14, 14 and 12 of 40 scenarios still differ, against 16, 17, 31 and 35)"),
        ),
    ),
    Release(
        "0.5.20", shell="Shell0520",
        entry=dict(host_loaded_length=True, lock_receipt=True, permanent_parallel_override=True,
            cache_request_handle=True),
        changes=(
            Change(BEHAVIOUR, "with a storage tier, a Mamba model's prefetch takes its state host slots at hit "
                   "time, next to the KV's, so the storage query holds no host memory, where 0.5.19 took them as "
                   "the prefetch started and gave them back after the query (its state host pool has a slot fewer "
                   "free meanwhile)"),
            Change(RENUMBERING, "free pages are sorted near exhaustion whatever need_sort says; the torch "
                   "allocation fallback is vectorised", "#37938"),
        ),
        known=(
            KnownDifference(FINISH_SPLITS_AT_PROMPT, "cache_finished_req inserts the prompt again after the whole "
                            "sequence, splitting the leaf at the prompt boundary (so that eviction can drop the "
                            "output's KV and keep the prompt's): the tree has more nodes, with the same tokens, "
                            "slots and locks per token"),
        ),
    ),
    Release(
        "0.5.21", shell="Shell0521",
        entry=dict(tree_cores=("rust", "python"), swa_tree=None, mamba_tree=None),
        changes=(
            Change(BEHAVIOUR, "cache_finished_req is gone: release_kv_cache inserts (insert_req), frees the row's "
                   "own KV (free_kv_row) and unpins; paged frees wait in staged_pages"),
            Change(BEHAVIOUR, "UnifiedRadixCache builds its tree on a compiled Rust core by default "
                   "(SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=rust; the Python core stays selectable)"),
            Change(BEHAVIOUR, "a sliding-window request's out-of-window slots are freed by the tree's SWA component "
                   "(UnifiedRadixCache.evict_sliding_windows) instead of free_swa_out_of_window_slots with the "
                   "tree's retain floor; SWARadixCache and MambaRadixCache are deleted: after a chunked prefill the "
                   "window pool keeps 3 slots more (one request, window 16, chunks of 7; kvparity matrix --caches "
                   "swa,mamba); Mamba at parity"),
        ),
    ),
    Release(
        "0.5.22", shell="Shell0522",
        generation=("prefix-len", "the prefix_len state model"),
        entry=dict(generation="prefix_len", chunk_cache=None, admission="extend_end", prefix_default="none",
            chunk_prefix="none", lock_receipt=False),
        changes=(
            Change(BEHAVIOUR, "the prefix_len state model: Req.prefix_indices is gone (prefix_len plus the row or "
                   "the locked tree path), ChunkCache is gone (a disabled UnifiedRadixCache), the caches take "
                   "checkpoint_kv_cache / release_kv_cache(checkpoint=...); a finish repoints the row onto the "
                   "tree's slots before freeing it, a checkpoint splits the tree at the prompt boundary, a released "
                   "request has no readable prefix"),
            Change(BEHAVIOUR, "the paged allocator checks the exact page count before its kernels (None instead of "
                   "a launch on too few free pages) and runs torch twins where the platform has no Triton"),
        ),
        known=(
            KnownDifference(CHECKPOINT_SPLITS_AT_PROMPT, "checkpoint (which replaced cache_unfinished_req) also "
                            "inserts the prompt-only key, splitting a node at the prompt boundary where 0.5.21 did "
                            "so only at finish: the same tokens, slots and locks per token"),
            KnownDifference(FINISH_REPOINTS_ROW, "release_kv_cache checkpoints a finished request, which rewrites "
                            "its row's columns with the tree's slots before the row is freed (0.5.21's insert_req "
                            "left the duplicate slots there): only cells of rows free on both sides differ, and "
                            "this release's value is a slot the tree holds"),
            KnownDifference(INT64_STAGED_FREES, "a finished request's slots are freed through the tree's int64 copy "
                            "of its row (checkpoint), so the freed slots waiting for the next merge are an int64 "
                            "list where 0.5.21's int32 row slices made an int32 one: the same slots in the same "
                            "order"),
            KnownDifference(RELEASED_HAS_NO_PREFIX, "Req.prefix_indices is gone: the prefix is prefix_len plus the "
                            "row or the locked tree path, so a request whose KV was released (finished) has no "
                            "readable prefix; it is compared wherever both sides have one"),
        ),
    ),
    Release(
        "0.5.23", shell="Shell0523",
        changes=(
            Change(ADMISSION, "Scheduler.get_next_batch_to_run filters finished requests out of the running batch "
                   "on every step (before: only for a prefill-only batch) and clears batch_is_full when the batch "
                   "shrank, so a prefill is tried where 0.5.22's full batch tried none (the culprit kvparity "
                   "explain named)",
                   undo=("sglang/srt/managers/scheduler.py",
                         "        running_bs = running_batch.batch_size()\n"
                         "        running_batch.filter_batch()\n"
                         "        if running_batch.batch_size() < running_bs:\n"
                         "            running_batch.batch_is_full = False\n",
                         "        if running_batch.is_prefill_only:\n"
                         "            running_batch.filter_batch()\n"
                         "            if running_batch.is_empty():\n"
                         "                running_batch.batch_is_full = False\n")),
            Change(BEHAVIOUR, "the prefill pass stops before matching the next waiting request once its budget is "
                   "spent (AddReqResult.OTHER), so a request that cannot be admitted this pass is not matched "
                   "against the tree: the node split its match made in 0.5.22 is not made (same slots, one node "
                   "fewer)",
                   undo=("sglang/srt/managers/scheduler.py",
                         "            # A spent pass budget admits no one, even before the first\n"
                         "            # candidate: the resumed chunk or mixed decode rows can spend it.\n"
                         "            if adder.budget_state() == AddReqResult.OTHER:\n"
                         "                break\n",
                         "")),
            Change(ADMISSION, "the prefill pass's row budget counts the rows its admitted requests already hold (a "
                   "continuing chunk's: get_num_allocatable_reqs(num_held_rows=...)), so a new request is admitted "
                   "beside a chunk where 0.5.22's free rows alone stopped it",
                   undo=("sglang/srt/managers/scheduler.py",
                         "                num_held_rows=num_held_rows,\n",
                         "")),
        ),
    ),
)

# The releases kvparity drives, by version.
BY_VERSION: dict[str, Release] = {r.version: r for r in RELEASES}
# Every named change, in release order.
CHANGES: tuple[Change, ...] = tuple(c for r in RELEASES for c in r.changes)
# Known differences between releases: name -> (the release that made it, why).
KNOWN_VERSION_DIFFERENCES: dict[str, tuple[str, str]] = {k.name: (r.version, k.why) for r in RELEASES for k in r.known}
# The scheduler's generations: where its structure changed (an adapter within one only adds or
# renames what the loop reads). Name -> (first release, what changed).
SCHEDULER_GENERATIONS: dict[str, tuple[str, str]] = {
    r.generation[0]: (r.version, r.generation[1]) for r in RELEASES if r.generation is not None}


def at_or_before(version: str) -> list[Release]:
    """The rows of the releases up to ``version`` (a bare or checkout version), in release order."""
    key = version_key(version)
    return [r for r in RELEASES if version_key(r.version) <= key]


def shell_of(version: str) -> tuple[str, str, str]:
    """The shell adapter driving ``version``: (its registered name, the first release it drives, the
    scheduler generation it belongs to)."""
    rows = at_or_before(version)
    shells = [r for r in rows if r.shell is not None]
    if not shells:
        raise RealSGLangError(f"the scheduler shell has no adapter for SGLang {version} "
                              f"(the first is {RELEASES[0].version})")
    generation = [r.generation for r in rows if r.generation is not None][-1][0]
    return shells[-1].shell or "", shells[-1].version, generation


def changes_between(reference: str, release: str) -> list[Change]:
    """The changes of the releases after ``reference`` up to and including ``release`` (either
    order: the range between the two)."""
    low, high = sorted((reference, release), key=version_key)
    return [c for c in CHANGES if version_key(low) < version_key(c.release) <= version_key(high)]


def release(version: str) -> Release:
    """The row of ``version`` (any form ``parse_version`` accepts); KeyError for one kvparity does not drive."""
    return BY_VERSION[parse_version(version)]
