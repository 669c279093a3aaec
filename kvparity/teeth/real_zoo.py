"""Mutated copies of real SGLang: each an exact-text edit of an installed release, applied to a
copy in a folder of the caller's, so that ``kvparity check --sglang FOLDER`` (and the faithfulness
lane's teeth test) can show what a comparison with real code catches. Nothing of SGLang's source
is stored here beyond the one line each edit replaces.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvparity.engine.errors import RealSGLangError
from kvparity.engine.real.door import SGLangSource, copy_with_edits


@dataclass(frozen=True)
class RealMutant:
    name: str
    what: str  # the bug, in one line
    version: str  # the release it edits
    path: str  # the file, relative to the folder holding the sglang package
    old: str
    new: str
    # The reference a run checks the copy against (``kvparity check --sglang COPY --against``); None:
    # the copy's own Rust radix-tree core (0.5.21+, ``check --sglang COPY`` alone).
    against: str | None = None


_P1 = "0.5.3.post1"
_AGAINST = {"against": "0.5.3"}
REAL_MUTANTS: tuple[RealMutant, ...] = (
    RealMutant("chunk-cache-int32-view", "0.5.3's int32 chunk-cache view put back into 0.5.3.post1 (what PR #11200 fixed)",
               _P1, "sglang/srt/mem_cache/chunk_cache.py",
               "req.prefix_indices = kv_indices.to(dtype=torch.int64, copy=True)", "req.prefix_indices = kv_indices", **_AGAINST),
    RealMutant("write-offset-includes-own-request", "write_cache_indices' running offset includes its own request",
               _P1, "sglang/srt/managers/schedule_batch.py",
               "    for i in range(pid):\n        cumsum_start += tl.load(extend_lens + i)",
               "    for i in range(pid + 1):\n        cumsum_start += tl.load(extend_lens + i)", **_AGAINST),
    RealMutant("unfinished-keeps-last-matched", "cache_unfinished_req no longer sets last_matched_prefix_len",
               _P1, "sglang/srt/mem_cache/radix_cache.py",
               "        req.last_matched_prefix_len = len(new_indices)\n", "\n", **_AGAINST),
    RealMutant("alloc-extend-merges-only-when-short", "alloc_extend merges a pending sort only when short of pages",
               _P1, "sglang/srt/mem_cache/allocator.py",
               "if self.need_sort and extend_num_tokens // self.page_size + bs + 1 > len(",
               "if self.need_sort and extend_num_tokens // self.page_size + bs * 0 - 1 > len(", **_AGAINST),
    RealMutant("last-loc-first-element", "last_loc is taken from the prefix's first element, not its last",
               _P1, "sglang/srt/managers/schedule_batch.py",
               "r.prefix_indices[-1:]\n", "r.prefix_indices[:1]\n", **_AGAINST),
    # Order assumed (issue 25): right on a fresh pool, wrong on a long-running server's.
    RealMutant("rows-deduplicated-for-the-write",
               "the batch's rows are de-duplicated (a set, sorted) before the write: rows assumed ascending",
               _P1, "sglang/srt/managers/schedule_batch.py",
               "req_pool_indices_tensor = torch.tensor(req_pool_indices, dtype=torch.int64).to(",
               "req_pool_indices_tensor = torch.tensor(sorted(set(req_pool_indices)), dtype=torch.int64).to(",
               **_AGAINST),
    RealMutant("prefix-read-as-first-plus-offset",
               "write_req_to_token_pool_triton writes a prefix as its first slot plus an offset: pages assumed contiguous",
               _P1, "sglang/srt/managers/schedule_batch.py",
               "value = tl.load(prefix_tensor + offset, mask=mask)", "value = tl.load(prefix_tensor) + offset",
               **_AGAINST),
)
_MEM = "sglang/srt/mem_cache"
# The 0.5.22+ generation (prefix_len): one checked against the release itself, one whose Python
# radix-tree core is checked against the release's Rust core.
REAL_MUTANTS_PREFIX_LEN: tuple[RealMutant, ...] = (
    RealMutant("held-prefix-one-column-off", "a request that holds its row reads its prefix one column off",
               "0.5.22", f"{_MEM}/allocation.py",
               "return row[: req.prefix_len].to(torch.int64)", "return row[1 : req.prefix_len + 1].to(torch.int64)",
               against="0.5.22"),
    RealMutant("python-tree-locks-short", "the Python tree core's FULL lock stops below the root's child",
               "0.5.22", f"{_MEM}/unified_cache/components/full.py",
               "        delta = 0\n        while cur is not root:\n",
               "        delta = 0\n        while cur is not root and cur.parent is not root:\n"),
)
# For the scheduler-driven check's in-flight oracle (issue 26): a copy that rewrites a cell an
# in-flight batch reads. Only the overlap loop is broken (the normal loop plays it as the release).
REAL_INFLIGHT_MUTANTS: tuple[RealMutant, ...] = (
    RealMutant("overlap-decode-writes-one-column-back",
               "in the overlap loop, prepare_for_decode writes the new token's slot one column back (the overlap's "
               "one-step delay applied to the write): it rewrites the last cell the batch in flight reads",
               _P1, "sglang/srt/managers/schedule_batch.py",
               "            locs = self.seq_lens.clone()\n",
               "            locs = self.seq_lens.clone() - int(self.enable_overlap)\n", **_AGAINST),
)
# For the scheduler-driven check's memory judges (issue 32): copies whose scheduler decides as the
# release does while its memory goes wrong; each is killed by ``--drive scheduler`` against the release.
REAL_MEMORY_MUTANTS: tuple[RealMutant, ...] = (
    RealMutant("chunk-stash-keeps-duplicates",
               "cache_unfinished_req of a chunked request no longer frees the slots the tree already held (its "
               "duplicates leak)", _P1, f"{_MEM}/radix_cache.py",
               "            chunked=chunked,\n        )\n        self.token_to_kv_pool_allocator.free(kv_indices[old_prefix_len"
               ":new_prefix_len])",
               "            chunked=chunked,\n        )\n        if not chunked:\n            self.token_to_kv_pool_allocator"
               ".free(kv_indices[old_prefix_len:new_prefix_len])", against=_P1),
    RealMutant("finished-last-slot-freed-twice",
               "cache_finished_req (page size 1) also frees the request's last cached slot, which the tree keeps",
               _P1, f"{_MEM}/radix_cache.py",
               "            page_aligned_kv_indices = kv_indices.to(dtype=torch.int64, copy=True)\n            if self.is_eagle:",
               "            page_aligned_kv_indices = kv_indices.to(dtype=torch.int64, copy=True)\n"
               "            self.token_to_kv_pool_allocator.free(kv_indices[-1:])\n            if self.is_eagle:", against=_P1),
    RealMutant("decode-writes-one-column-back",
               "prepare_for_decode writes the new token's slot one column back (in both loops): the row names the new "
               "slot where the previous token's belongs, and nothing where the new one's does",
               _P1, "sglang/srt/managers/schedule_batch.py",
               "            locs = self.seq_lens.clone()\n", "            locs = self.seq_lens.clone() - 1\n", against=_P1),
    RealMutant("chunk-stash-frees-the-row-it-keeps",
               "the chunked request's stash (0.5.9, which keeps the row for the next chunk) also puts the row back on "
               "the free list: another request is handed a row that is still read and written",
               "0.5.9", "sglang/srt/managers/scheduler.py",
               "        self.tree_cache.cache_unfinished_req(req, chunked=True)\n",
               "        self.tree_cache.cache_unfinished_req(req, chunked=True)\n"
               "        self.req_to_token_pool.free_slots.append(req.req_pool_idx)\n", against="0.5.9"),
)
# For the window judges (issue 34): copies of 0.5.23 whose sliding-window path goes wrong; each is
# killed by ``--drive scheduler`` against the release on a sliding-window model.
REAL_WINDOW_MUTANTS: tuple[RealMutant, ...] = (
    RealMutant("swa-frontier-one-past",
               "free_swa_out_of_window_slots frees one slot past the window's frontier (a slot the window still reads)",
               "0.5.23", f"{_MEM}/common.py",
               "        evict_threshold = pre_len - ceil_align(\n",
               "        evict_threshold = pre_len + 1 - ceil_align(\n", against="0.5.23"),
    RealMutant("swa-free-keeps-mapping",
               "freeing window pages no longer clears their full slots' mapping: a freed window slot stays named",
               "0.5.23", f"{_MEM}/allocator/swa.py",
               "        self.clear_full_to_swa_mapping(mapping_indices)\n        return swa_pages\n",
               "        return swa_pages\n", against="0.5.23"),
)
# For the state judges (issue 34): copies of 0.5.23 (and of 0.5.15, whose Mamba tree is its own)
# whose Mamba path goes wrong; each is killed by ``--drive scheduler`` against the release on a
# Mamba model.
REAL_STATE_MUTANTS: tuple[RealMutant, ...] = (
    RealMutant("mamba-cow-kept-on-refusal",
               "a request whose prefix match took a copy-on-write state slot, then refused by the prefill adder, "
               "keeps the slot (it is neither freed nor anyone's: leaked)",
               "0.5.23", "sglang/srt/managers/scheduler.py",
               "                        self.tree_cache.req_to_token_pool.mamba_allocator.free(\n"
               "                            req.kv.mamba_pool_idx.unsqueeze(-1)\n"
               "                        )\n                        req.kv.mamba_pool_idx = None\n",
               "                        req.kv.mamba_pool_idx = None\n", against="0.5.23"),
    RealMutant("mamba-restore-wrong-node",
               "MambaRadixCache's match restores the state its matched node's parent keeps, where the parent keeps "
               "one, instead of the matched node's own (0.5.15's own tree)",
               "0.5.15", f"{_MEM}/mamba_radix_cache.py",
               "            req.mamba_cow_src_index = last_node.mamba_value\n",
               "            req.mamba_cow_src_index = (last_node.parent.mamba_value if last_node.parent is not None\n"
               "                                       and last_node.parent.mamba_value is not None\n"
               "                                       else last_node.mamba_value)\n", against="0.5.15"),
    RealMutant("mamba-fresh-slot-not-cleared",
               "a request's fresh state slot is not cleared before its first forward: it starts from whatever state "
               "the slot's last owner left",
               "0.5.23", f"{_MEM}/memory_pool.py",
               "                req.kv.mamba_pool_idx = mid[0]\n                req.kv.mamba_needs_clear = True\n",
               "                req.kv.mamba_pool_idx = mid[0]\n                req.kv.mamba_needs_clear = False\n",
               against="0.5.23"),
)
# For the host-tier judges (issue 35): copies of 0.5.23 whose HiCache goes wrong; each is killed by
# ``--drive scheduler --caches hicache`` against the release.
_TREE_CORE = f"{_MEM}/unified_cache/unified_tree_core.py"
REAL_HOST_MUTANTS: tuple[RealMutant, ...] = (
    RealMutant("hicache-load-back-skips-copy",
               "a load-back gives the request device slots for the prefix the host keeps, but copies nothing into "
               "them", "0.5.23", "sglang/srt/managers/cache_controller.py",
               "            self._l2_load_transfers(host_indices, device_indices, pool_transfers),\n",
               "            [],\n", against="0.5.23"),
    RealMutant("hicache-demotion-pruned",
               "device eviction deletes a node the host backs up (and frees its host copy) instead of demoting it "
               "to the host: the host tier is never hit", "0.5.23", _TREE_CORE,
               "            self._demote(\n                node,\n                result.tracker,\n",
               "            self._delete_unbacked_device_leaf(\n                node,\n                result.tracker,\n",
               against="0.5.23"),
    RealMutant("hicache-host-slots-freed-twice",
               "the host slots an eviction frees are released twice (as a release on two completion paths does)",
               "0.5.23", f"{_MEM}/unified_radix_cache.py",
               "            self.components[ct].free_host_values(host_frees.pop(ct))\n",
               "            values = host_frees.pop(ct)\n            self.components[ct].free_host_values(values)\n"
               "            self.components[ct].free_host_values(values)\n", against="0.5.23"),
    RealMutant("hicache-host-evicted-during-load-back",
               "write-back's reclaim of host copies the device also holds takes one a load-back still lists and "
               "locks (before its acknowledgement), when the load-back's own request needs device room",
               "0.5.23", _TREE_CORE,
               "            node.write_through_pending_id is not None\n"
               "            or node.load_back_pending_id is not None\n        ):\n            return False\n"
               "        return cd.host_lock_ref == 0\n",
               "            node.write_through_pending_id is not None\n        ):\n            return False\n"
               "        return True\n", against="0.5.23"),
    RealMutant("hicache-mamba-state-load-skips-copy",
               "a Mamba model's load-back gives the request a state slot for the state the host keeps, but copies "
               "no recurrent state into it", "0.5.23", f"{_MEM}/pool_host/mamba.py",
               "                if self.temporal_state_elem_size > 0:\n                    self._copy_tensor_pf_lf(\n",
               "                if self.temporal_state_elem_size < 0:\n                    self._copy_tensor_pf_lf(\n",
               against="0.5.23"),
    RealMutant("hicache-mamba-host-state-leaked",
               "a Mamba model's host eviction drops a node's host state without freeing its host slot",
               "0.5.23", f"{_MEM}/unified_cache/components/mamba.py",
               "            host_frees[self.component_type].append(cd.host_value)\n            cd.host_value = None\n",
               "            cd.host_value = None\n", against="0.5.23"),
    # HiRadixCache (0.5.15 to 0.5.18): the host tier of a radix tree of its own.
    RealMutant("hiradix-load-back-skips-copy",
               "HiRadixCache's load-back gives the request device slots for the prefix the host keeps, but copies "
               "nothing into them", "0.5.15", "sglang/srt/managers/cache_controller.py",
               "            for i in range(self.layer_num):\n                self.mem_pool_host.load_to_device_per_layer(",
               "            for i in range(self.layer_num):\n                i < 0 and self.mem_pool_host.load_to_device_per_layer(",
               against="0.5.15"),
    RealMutant("hiradix-demotion-pruned",
               "HiRadixCache's device eviction deletes a backed-up leaf (its host copy never freed) instead of "
               "demoting it to the host", "0.5.15", f"{_MEM}/hiradix_cache.py",
               "            if x.backuped:\n                num_evicted += self._evict_backuped(x)\n            else:\n"
               "                num_evicted += self._evict_regular(x)\n",
               "            if x.backuped and x.children:\n                num_evicted += self._evict_backuped(x)\n"
               "            else:\n                num_evicted += self._evict_regular(x)\n",
               against="0.5.15"),
)
# For the nemesis (issue 48): copies of 0.5.23 whose failure paths go wrong, each acting only under a
# fault the nemesis draws (a client's abort, while prefetching too; a storage read that fails); killed by ``--drive
# scheduler --nemesis`` against the release.
_SCHEDULER = "sglang/srt/managers/scheduler.py"
_CHUNKED_ABORT = ("        self._release_aborted_request(req)\n        release_kv_cache(req, self.tree_cache, checkpoint=False)\n"
                  "\n        self.chunked_req = None\n")
REAL_NEMESIS_MUTANTS: tuple[RealMutant, ...] = (
    RealMutant("abort-between-chunks-keeps-kv",
               "a request aborted between chunks is dropped without giving its row and KV slots back (leaked)",
               "0.5.23", _SCHEDULER, _CHUNKED_ABORT,
               "        self._release_aborted_request(req)\n\n        self.chunked_req = None\n", against="0.5.23"),
    RealMutant("abort-between-chunks-inserted",
               "a request aborted between chunks has its chunks inserted into the radix tree anyway, as if it "
               "had finished", "0.5.23", _SCHEDULER, _CHUNKED_ABORT,
               _CHUNKED_ABORT.replace("checkpoint=False", "checkpoint=True"), against="0.5.23"),
    RealMutant("abort-prefetching-keeps-fetch",
               "a request aborted while its prefix is fetched from storage leaves the fetch running: the host "
               "slots it took are never given back", "0.5.23", "sglang/srt/mem_cache/unified_radix_cache.py",
               "        self.discard_storage_prefetch_accounting(request)\n        if request not in self.ongoing_prefetch:\n",
               "        self.discard_storage_prefetch_accounting(request)\n        if True:\n", against="0.5.23"),
    RealMutant("storage-failed-read-counted",
               "a page the storage tier failed to read is counted as fetched: the host slots it was to fill are "
               "loaded back as the prefix's KV", "0.5.23", "sglang/srt/managers/cache_controller.py",
               "                    f\"Prefetch operation {operation.request_id} failed to retrieve page {hash_values[i]}.\"\n"
               "                )\n                break\n            if operation.is_terminated():\n",
               "                    f\"Prefetch operation {operation.request_id} failed to retrieve page {hash_values[i]}.\"\n"
               "                )\n                count += 1\n                continue\n"
               "            if operation.is_terminated():\n", against="0.5.23"),
)
ALL_REAL_MUTANTS = (REAL_MUTANTS + REAL_MUTANTS_PREFIX_LEN + REAL_INFLIGHT_MUTANTS + REAL_MEMORY_MUTANTS
                    + REAL_WINDOW_MUTANTS + REAL_STATE_MUTANTS + REAL_HOST_MUTANTS + REAL_NEMESIS_MUTANTS)
REAL_MUTANTS_BY_NAME = {m.name: m for m in ALL_REAL_MUTANTS}


def make_mutated_copy(source: SGLangSource, mutant: RealMutant, dest: str | Path) -> Path:
    """Copy the ``sglang`` package of ``source`` into ``dest`` and apply ``mutant``; the edit's
    text must occur exactly once. Returns ``dest`` (give it to ``kvparity check --sglang``)."""
    if source.version != mutant.version:
        raise RealSGLangError(f"mutant {mutant.name} edits SGLang {mutant.version}, not {source.version}")
    try:
        return copy_with_edits(source, [(mutant.path, mutant.old, mutant.new)], dest)
    except RealSGLangError as exc:
        raise RealSGLangError(f"mutant {mutant.name}: {exc}") from None
