"""What changed on the KV-index path, release by release: the behaviour and numbering changes found
by reading each release's wheel (``mem_cache/``, ``managers/schedule_batch.py``, the scheduler's
row handling), with the pull request where one was found. ``kvparity matrix`` names, for every
pair it compares, the changes of the releases between them, so that a reader can tell the changes
a divergence comes from. Pure refactors and moves are in the adapter table
(``kvparity.engine.real.versions.CHANGES``), not here.

Kinds: "renumbering" (which row, page or slot a token gets, or the order of a free list, and
nothing any token can see), "behaviour" (a value a request or the tree ends up with) or "admission"
(which requests a batch admits, or in which order).

A change that can be undone says how (``undo``: in its release's source, the text it wrote and the
text before it; ``model_undo``: the option of kvparity's model that undoes it; ``adapter_undo``: the
fact of kvparity's adapter that follows it, where the harness drive's loop plays it), so that a difference
between two releases can be traced to it: undone in a replay, the two decide alike
(``kvparity.run.scheduler_drive``), or keep the same memory (``kvparity.run.harness_drive``).
"""

from __future__ import annotations

from kvparity.engine.change import ADMISSION, BEHAVIOUR, RENUMBERING, Change
from kvparity.engine.release_order import version_key

CHANGES: tuple[Change, ...] = (
    Change("0.5.3.post1", BEHAVIOUR, "PR #11200: write_cache_indices writes prefix and new slots in one kernel; "
           "prefix_indices is an int64 tensor and the chunk cache keeps an int64 copy (no value changes)", "#11200"),
    Change("0.5.3.post1", ADMISSION, "PR #11200: the key that ranks the waiting queue under lpm and dfs-weight "
           "(SchedulePolicy._compute_prefix_matches) went from Req.adjust_max_prefix_ids(), capped at len - 1 and at "
           "the logprob start, to origin_input_ids + output_ids, uncapped", "#11200",
           undo=("sglang/srt/managers/schedule_policy.py", "prefix_ids = r.origin_input_ids + r.output_ids",
                 "prefix_ids = (r.origin_input_ids + r.output_ids)[: max(min(len(r.origin_input_ids) + "
                 "len(r.output_ids) - 1, r.logprob_start_len if r.return_logprob else 1 << 62), 0)]"),
           model_undo=("ranking_key_of", "legacy")),
    Change("0.5.3.post2", RENUMBERING, "RadixCache.cache_finished_req frees the unaligned paged tail after the duplicate "
           "pages instead of before (free-list order)"),
    Change("0.5.3.post2", BEHAVIOUR, "a finished request with no output token caches its whole prompt, not all but the "
           "last token"),
    Change("0.5.3.post2", BEHAVIOUR, "ScheduleBatch.release_req (a retraction) releases through "
           "cache_finished_req(req, is_insert=False), which frees the row up to the request's own tokens, no longer up "
           "to the batch's sequence length: in the overlap loop the slot the batch still in flight allocated for a "
           "request retracted meanwhile is freed by nobody (process_batch_result skips retracted requests): one KV slot "
           "leaks per such retraction (found by the scheduler-driven memory oracles)"),
    Change("0.5.4", RENUMBERING, "Req.reset_for_retract keeps req_pool_idx (the row is free all the same)"),
    Change("0.5.5.post1", BEHAVIOUR, "release lengths follow kv_committed_len (aborted or mid-chunk requests release only "
           "what they were given); one access time per matched path (LRU ties)", "#12224"),
    Change("0.5.5.post3", BEHAVIOUR, "a host tier's host pool is sized up to whole pages and a page more "
           "(page_num = size // page_size + 1) where 0.5.5.post2 cut it down to whole pages: a page more host slots",
           undo=("sglang/srt/mem_cache/memory_pool_host.py",
                 "        # Align up the host memory pool size to the page size\n"
                 "        self.page_num = self.size // self.page_size + 1\n"
                 "        self.size = self.page_num * self.page_size\n",
                 "        # Align the host memory pool size to the page size\n"
                 "        self.size = self.size - (self.size % self.page_size)\n"
                 "        self.page_num = self.size // self.page_size\n")),
    Change("0.5.6", BEHAVIOUR, "regression: RadixCache.cache_finished_req keys on req.fill_ids, so the tokens a request "
           "decoded are not inserted into the tree at finish (their slots are freed); fixed in 0.5.9"),
    Change("0.5.6", BEHAVIOUR, "cached_tokens and already_computed are updated only until a request is first retracted "
           "(retracted_stain)"),
    Change("0.5.7", BEHAVIOUR, "with return_logprob and logprob_start_len -1 the match is no longer capped at 0; "
           "extend_logprob_start_len computed by Req.set_extend_input_len with a new formula"),
    Change("0.5.9", RENUMBERING, "the chunked request keeps its row between chunks (ReqToTokenPool.alloc(reqs) reuses "
           "it) instead of freeing and taking one again", "#17850"),
    Change("0.5.9", BEHAVIOUR, "the PrefillAdder cuts a new request with Req.set_extend_input_len, which recomputes its "
           "extend_logprob_start_len (before: extend_input_len assigned, the value of the match kept)"),
    Change("0.5.9", BEHAVIOUR, "the finished request's decoded tokens are cached again (reverts the 0.5.6 regression)",
           "#16521"),
    Change("0.5.9", RENUMBERING, "RadixCache.evict takes candidates from a maintained evictable-leaf set (heap order on "
           "exact ties)"),
    Change("0.5.10", BEHAVIOUR, "retract_decode aborts the last request when even it does not fit, instead of raising",
           "#19881"),
    Change("0.5.10", BEHAVIOUR, "a Mamba model's request the PrefillAdder refuses after its match copied a state into "
           "a slot of its own gives that slot back (0.5.9 leaks it: SGLang's own idle leak check raises; the known "
           "defect 'Mamba state leaked by a refused request'), so the state pool's free count differs from the "
           "refusal on", "#21404",
           undo=("sglang/srt/managers/scheduler.py",
                 "                # revert matched mamba idx to avoid memory leak, if req is not added\n"
                 "                added = len(adder.can_run_list) > 0 and req is adder.can_run_list[-1]\n"
                 "                if not added and req.mamba_pool_idx is not None:\n"
                 "                    self.tree_cache.req_to_token_pool.mamba_pool.free(\n"
                 "                        req.mamba_pool_idx.unsqueeze(-1)\n"
                 "                    )\n                    req.mamba_pool_idx = None\n", ""),
           adapter_undo=("mamba_refusal_frees", False)),
    Change("0.5.10", BEHAVIOUR, "with a host tier (HiRadixCache), update_running_batch acknowledges finished "
           "write-through backups before its decode memory check (flush_write_through_acks), so their nodes are "
           "evictable in that pass, not from the next one's check_hicache_events",
           undo=("sglang/srt/managers/scheduler.py",
                 "        # Eagerly release lock_ref on completed write-through nodes so they\n"
                 "        # become evictable, improving batch scheduling headroom.\n"
                 "        if self.enable_hierarchical_cache:\n            self.tree_cache.flush_write_through_acks()\n\n",
                 "")),
    Change("0.5.10", BEHAVIOUR, "with a host tier (HiRadixCache), the prefill pass checks the host tier's events "
           "(check_hicache_events: finished backups acknowledged, their nodes unlocked) before it returns for want "
           "of waiting requests, so an idle pass acknowledges them; 0.5.9 checked only once something could be "
           "admitted, so a finished request's node stayed locked (protected, not evictable) while nothing waited "
           "(shrunk: one request of one token, evictable 1 against 0 after the idle pass that follows it)"),
    Change("0.5.11", RENUMBERING, "row 0 of req_to_token is reserved as padding: rows are 1..size", "#24243"),
    Change("0.5.12", ADMISSION, "get_num_allocatable_reqs caps the requests a prefill pass may admit by the request "
           "pool's free rows whatever the pipeline (0.5.11: only with pipeline parallelism), so where rows run out "
           "beside a chunked request a pass admits fewer (shrunk: five rows, a decoding request, a chunked one and "
           "three one-token prompts: 0.5.12 admits two of them, 0.5.11 all three; with the cap undone, as 0.5.11)",
           undo=("sglang/srt/managers/scheduler.py",
                 "        res = min(res, self.req_to_token_pool.available_size())\n        return res\n",
                 "        return res\n")),
    Change("0.5.13", BEHAVIOUR, "the PrefillAdder recomputes extend_logprob_start_len (set_extend_input_len) for the "
           "chunked request's next chunk too; fill_ids become full_untruncated_fill_ids up to fill_len"),
    Change("0.5.14", BEHAVIOUR, "with a storage tier, a request's prefetch asks for its prompt up to the longest "
           "prefix it may match (_compute_max_prefix_len: the last token is always computed), not the whole prompt: "
           "fewer host slots held for it (shrunk: a retracted request, 35 slots against 36)",
           undo=("sglang/srt/managers/scheduler.py",
                 "                new_input_tokens = req.full_untruncated_fill_ids[matched_len:match_end]\n",
                 "                new_input_tokens = req.full_untruncated_fill_ids[matched_len:]\n")),
    Change("0.5.15", BEHAVIOUR, "extend_logprob_start_len is computed by the batch (compute_extend_logprob_start_len), "
           "no longer stored on the request; the fill boundary is Req.extend_range"),
    Change("0.5.16", BEHAVIOUR, "a hybrid model's server builds UnifiedRadixCache with the model's components (FULL and "
           "SWA, FULL and MAMBA) in place of SWARadixCache and MambaRadixCache (registry.py; the old classes still "
           "ship): a sliding-window request's tree keeps its window-freed part as a node of its own (4 nodes against "
           "SWARadixCache's 3 for one request decoding 32 tokens under a window of 8, and another window evictable "
           "size); when a Mamba state eviction removes a leaf, its parent left without a state (no match can end there) "
           "keeps its KV, evictable, where MambaRadixCache frees it too (kvparity matrix --caches swa,mamba)"),
    Change("0.5.16", BEHAVIOUR, "with a storage tier (HiRadixCache), a prefetch takes host slots only for what the "
           "storage query found, on the scheduler's thread after the query (prefetch_hit_queue), where 0.5.15 took "
           "slots for the whole unmatched prompt as the request arrived and gave back what the query missed an "
           "iteration later: 0.5.15's host has fewer free slots meanwhile"),
    Change("0.5.17", BEHAVIOUR, "evict_from_tree_cache evicts only the shortfall (num_tokens - available_size) instead "
           "of num_tokens, so a retraction or an allocation keeps more of the tree",
           undo=("sglang/srt/mem_cache/common.py",
                 "        # Standard allocator: evict only the shortfall (mirrors the SWA arm)\n"
                 "        available_size = allocator.available_size()\n        if available_size < num_tokens:\n"
                 "            tree_cache.evict(EvictParams(num_tokens=num_tokens - available_size))\n",
                 "        # Standard allocator\n        if allocator.available_size() < num_tokens:\n"
                 "            tree_cache.evict(EvictParams(num_tokens=num_tokens))\n")),
    Change("0.5.17", BEHAVIOUR, "with a host tier (HiRadixCache), update_running_batch no longer acknowledges finished "
           "write-through backups before its decode memory check (flush_write_through_acks is gone): their nodes stay "
           "locked until the next pass's check_hicache_events",
           undo=("sglang/srt/managers/scheduler.py",
                 "            return batch\n\n        # Check if decode out of memory\n",
                 "            return batch\n\n        if self.enable_hierarchical_cache:\n"
                 "            self.tree_cache.writing_check()\n\n        # Check if decode out of memory\n")),
    Change("0.5.18", BEHAVIOUR, "with a host tier, a Mamba state a node gains after its KV was backed up (a finished "
           "request ending on a node of an earlier path) is backed up too (UnifiedTreeCore's incremental component "
           "backup after an insert), where 0.5.17 left it on the device alone (shrunk: two requests, the shorter a "
           "prefix of the longer; 0.5.18's state host pool holds one state more)"),
    Change("0.5.18", RENUMBERING, "rows are popped from the tail of the free list (the last freed row is reused first); "
           "its pull request: \"allocation order has no semantic meaning\"", "#32208",
           undo=("sglang/srt/mem_cache/memory_pool.py",
                 "            select_index = self.free_slots[-need_size:]\n            del self.free_slots[-need_size:]\n",
                 "            select_index = self.free_slots[:need_size]\n            del self.free_slots[:need_size]\n")),
    Change("0.5.19", BEHAVIOUR, "the request's row and KV lengths move to req.kv (ReqKvInfo); the scheduler builds "
           "UnifiedRadixCache on the plain path (on its Python tree core), which kvparity drives from this release on "
           "(RadixCache stays selectable)"),
    Change("0.5.19", BEHAVIOUR, "with a host tier, UnifiedRadixCache's backup that finds the host full evicts only "
           "the host's shortfall (_execute_kv_backup: kv_tokens - host_avail) where HiRadixCache's evicted as many "
           "host tokens as the backup holds (write_backup: evict_host(len(node.value))), so the host keeps more; the "
           "two trees' host evictions differ beyond that (that one line undone, 13, 14, 14 and 12 of 40 scenarios "
           "still differ, against 16, 17, 31 and 35)"),
    Change("0.5.20", BEHAVIOUR, "with a storage tier, a Mamba model's prefetch takes its state host slots at hit "
           "time, next to the KV's, so the storage query holds no host memory, where 0.5.19 took them as the prefetch "
           "started and gave them back after the query (its state host pool has a slot fewer free meanwhile)"),
    Change("0.5.20", RENUMBERING, "free pages are sorted near exhaustion whatever need_sort says; the torch allocation "
           "fallback is vectorised", "#37938"),
    Change("0.5.21", BEHAVIOUR, "cache_finished_req is gone: release_kv_cache inserts (insert_req), frees the row's own "
           "KV (free_kv_row) and unpins; paged frees wait in staged_pages"),
    Change("0.5.21", BEHAVIOUR, "UnifiedRadixCache builds its tree on a compiled Rust core by default "
           "(SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=rust; the Python core stays selectable)"),
    Change("0.5.21", BEHAVIOUR, "a sliding-window request's out-of-window slots are freed by the tree's SWA component "
           "(UnifiedRadixCache.evict_sliding_windows) instead of free_swa_out_of_window_slots with the tree's retain "
           "floor; SWARadixCache and MambaRadixCache are deleted: after a chunked prefill the window pool keeps 3 slots "
           "more (one request, window 16, chunks of 7; kvparity matrix --caches swa,mamba); Mamba at parity"),
    Change("0.5.22", BEHAVIOUR, "the prefix_len state model: Req.prefix_indices is gone (prefix_len plus the row or the "
           "locked tree path), ChunkCache is gone (a disabled UnifiedRadixCache), the caches take checkpoint_kv_cache / "
           "release_kv_cache(checkpoint=...); a finish repoints the row onto the tree's slots before freeing it, a "
           "checkpoint splits the tree at the prompt boundary, a released request has no readable prefix"),
    Change("0.5.22", BEHAVIOUR, "the paged allocator checks the exact page count before its kernels (None instead of a "
           "launch on too few free pages) and runs torch twins where the platform has no Triton"),
    Change("0.5.23", ADMISSION, "Scheduler.get_next_batch_to_run filters finished requests out of the running batch on "
           "every step (before: only for a prefill-only batch) and clears batch_is_full when the batch shrank, so a "
           "prefill is tried where 0.5.22's full batch tried none (the culprit kvparity explain named)", None,
           undo=("sglang/srt/managers/scheduler.py",
                 "        running_bs = running_batch.batch_size()\n        running_batch.filter_batch()\n"
                 "        if running_batch.batch_size() < running_bs:\n            running_batch.batch_is_full = False\n",
                 "        if running_batch.is_prefill_only:\n            running_batch.filter_batch()\n"
                 "            if running_batch.is_empty():\n                running_batch.batch_is_full = False\n")),
    Change("0.5.23", BEHAVIOUR, "the prefill pass stops before matching the next waiting request once its budget is "
           "spent (AddReqResult.OTHER), so a request that cannot be admitted this pass is not matched against the "
           "tree: the node split its match made in 0.5.22 is not made (same slots, one node fewer)", None,
           undo=("sglang/srt/managers/scheduler.py",
                 "            # A spent pass budget admits no one, even before the first\n"
                 "            # candidate: the resumed chunk or mixed decode rows can spend it.\n"
                 "            if adder.budget_state() == AddReqResult.OTHER:\n                break\n", "")),
    Change("0.5.23", ADMISSION, "the prefill pass's row budget counts the rows its admitted requests already hold (a "
           "continuing chunk's: get_num_allocatable_reqs(num_held_rows=...)), so a new request is admitted beside a "
           "chunk where 0.5.22's free rows alone stopped it", None,
           undo=("sglang/srt/managers/scheduler.py", "                num_held_rows=num_held_rows,\n", "")),
)


def changes_between(reference: str, release: str) -> list[Change]:
    """The changes of the releases after ``reference`` up to and including ``release`` (either
    order: the range between the two)."""
    low, high = sorted((reference, release), key=version_key)
    return [c for c in CHANGES if version_key(low) < version_key(c.release) <= version_key(high)]
