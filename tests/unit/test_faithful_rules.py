"""The rules real SGLang follows where kvparity's model used to differ (issue "Faithful to real
SGLang"; SPEC sections 1 and 6 as corrected on 2026-12-01). Each test computes its expectation by
hand from SGLang's rule and would fail on the old model.
"""

from kvparity.kernels import runtime  # noqa: I001  (must come first: fixes Triton's mode)

import types

import pytest
import torch

from kvparity.mem_cache.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
from kvparity.mem_cache.chunk_cache import ChunkCacheBase
from kvparity.mem_cache.memory_pool import ReqToTokenPool
from kvparity.mem_cache.radix_cache import RadixCache, RadixKey
from kvparity.model.poison import POISON
from kvparity.run.runner import run_scenario
from kvparity.model.scenario import Decode, Extend, RequestSpec, Scenario, scenario_from_dict
from kvparity.engine.scheduler import Scheduler, retract_order
from kvparity.model.worlds import Geometry
from kvparity.engine.world import build_world

DEV = runtime.DEVICE
BACKENDS = runtime.BACKENDS


def i64(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64, device=DEV)


def paged(free: list[int], release: list[int], *, page_size: int = 4, backend: str = "torch"):
    """A paged allocator with a pending sort whose free and released pages are exactly these."""
    alloc = PagedTokenToKVPoolAllocator(64, page_size, DEV, need_sort=True, backend=backend)
    alloc.free_pages, alloc.release_pages = i64(*free), i64(*release)
    return alloc


# ---- allocator merge rules (SPEC 1) ----------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_alloc_extend_merges_on_the_upper_bound_not_the_need(backend):
    """One request of 4 new tokens needs 1 page and 2 are free, but 4 // 4 + 1 + 1 = 3 > 2, so SGLang
    merges and sorts first: the request gets page 1 (slots 4..7), not page 5 (20..23)."""
    alloc = paged([5, 6], [2, 1], backend=backend)
    out = alloc.alloc_extend(i64(0), torch.tensor([0]), i64(4), torch.tensor([4]), i64(-1), 4)
    assert out.tolist() == [4, 5, 6, 7]
    assert (alloc.free_pages.tolist(), alloc.release_pages.tolist()) == ([2, 5, 6], [])


def test_alloc_extend_does_not_merge_below_the_bound():
    """4 free pages: 4 // 4 + 1 + 1 = 3 <= 4, no merge; the released pages keep waiting."""
    alloc = paged([5, 6, 7, 8], [1])
    assert alloc.alloc_extend(i64(0), torch.tensor([0]), i64(4), torch.tensor([4]), i64(-1), 4).tolist() == [20, 21, 22, 23]
    assert (alloc.free_pages.tolist(), alloc.release_pages.tolist()) == ([6, 7, 8], [1])


def test_alloc_extend_failure_keeps_the_merge():
    """12 tokens need 3 pages; after the merge only 2 exist: None, nothing consumed, merge kept."""
    alloc = paged([5], [1])
    assert alloc.alloc_extend(i64(0), torch.tensor([0]), i64(12), torch.tensor([12]), i64(-1), 12) is None
    assert (alloc.free_pages.tolist(), alloc.release_pages.tolist()) == ([1, 5], [])


def test_alloc_decode_merges_when_bs_exceeds_free_pages():
    """Two requests continue their pages (no new page needed), one page is free: bs = 2 > 1, so
    SGLang merges anyway; each request gets last_loc + 1."""
    alloc = paged([7], [3], page_size=2)
    seq_lens = i64(4, 6)  # new lengths: positions 3 and 5, both inside a started page
    out = alloc.alloc_decode(seq_lens, seq_lens.cpu(), i64(20, 30))
    assert out.tolist() == [21, 31]
    assert (alloc.free_pages.tolist(), alloc.release_pages.tolist()) == ([3, 7], [])


def test_alloc_decode_new_page_after_merge_is_the_lowest():
    """bs = 1, 0 free pages and one released: merged, the new page is page 3 (slot 6)."""
    alloc = paged([], [3], page_size=2)
    seq_lens = i64(5)  # position 4 opens a page
    assert alloc.alloc_decode(seq_lens, seq_lens.cpu(), i64(9)).tolist() == [6]


def test_page_size_1_alloc_merges_only_when_short():
    alloc = TokenToKVPoolAllocator(8, DEV, need_sort=True)
    alloc.free_pages, alloc.release_pages = i64(6, 7), i64(2)
    assert alloc.alloc(2).tolist() == [6, 7] and alloc.release_pages.tolist() == [2]
    alloc.free_pages = i64(6, 7)
    assert alloc.alloc(3).tolist() == [2, 6, 7]


def test_free_group_frees_once_ascending_in_front():
    """Freeing page 1 then page 3 puts [3, 1] in front; inside one free group, [1, 3]."""
    alone = paged([9], [], page_size=2)
    alone.need_sort = False
    alone.free(i64(2, 3))
    alone.free(i64(6))
    assert alone.free_pages.tolist() == [3, 1, 9]
    grouped = paged([9], [], page_size=2)
    grouped.need_sort = False
    grouped.free_group_begin()
    grouped.free(i64(6))
    grouped.free(i64(2, 3))
    grouped.free_group_end()
    assert grouped.free_pages.tolist() == [1, 3, 9]


# ---- RadixCache.cache_unfinished_req (SPEC 1) -----------------------------------------------------------
def _radix(page_size: int, rows: int = 2, width: int = 12):
    pool = ReqToTokenPool(rows, width, DEV)
    pool.req_to_token.fill_(POISON)
    pool.alloc(rows)
    alloc = PagedTokenToKVPoolAllocator(64, page_size, DEV) if page_size > 1 else TokenToKVPoolAllocator(64, DEV)
    alloc.alloc(alloc.available_size())  # drained: free_pages lists exactly what the cache frees
    return RadixCache(pool, alloc, page_size), pool, alloc


def _req(row: int, fill: list[int], prefix: list[int], last_node):
    return types.SimpleNamespace(fill_ids=fill, prefix_indices=i64(*prefix), req_pool_idx=row,
                                 last_node=last_node, extra_key=None, last_matched_prefix_len=0)


def test_cache_unfinished_req_sets_last_matched_prefix_len_to_the_aligned_length():
    """Page size 4, 6 computed tokens: 4 enter the tree, last_matched_prefix_len = 4 (the model
    used to keep the admission value, 0)."""
    cache, pool, _ = _radix(4)
    pool.req_to_token[0, :6] = torch.tensor([8, 9, 10, 11, 12, 13], dtype=torch.int32)
    req = _req(0, [1, 2, 3, 4, 5, 6], [], cache.root_node)
    cache.cache_unfinished_req(req)
    assert req.last_matched_prefix_len == 4
    assert req.prefix_indices.tolist() == [8, 9, 10, 11, 12, 13]  # the tree's 4, then its own tail


def test_cache_unfinished_req_leaves_stale_cells_before_the_old_prefix():
    """SGLang's latent defect, step by step. Page size 4. The tree holds tokens 1..4 -> slots 4..7
    (page 1) and, from another request, 5..8 -> slots 12..15 (page 3). This request's row is
    [4 5 6 7 | 8 9 10 11] (its own page 2 after the tree's), its old prefix is 6 long (4 + a tail
    of 2). Caching its 8 tokens: insert finds all 8 (n = 8 > old = 6) and frees its slots 10, 11,
    i.e. all of page 2, including slots 8, 9 under columns 4, 5. The row is rewritten only from
    column 6: columns 4, 5 keep 8, 9, slots of a freed page."""
    cache, pool, alloc = _radix(4)
    cache.insert(RadixKey([1, 2, 3, 4, 5, 6, 7, 8]), i64(4, 5, 6, 7, 12, 13, 14, 15))
    first_page = cache.match_prefix(RadixKey([1, 2, 3, 4])).last_device_node
    cache.inc_lock_ref(first_page)
    pool.req_to_token[0, :8] = torch.tensor([4, 5, 6, 7, 8, 9, 10, 11], dtype=torch.int32)
    req = _req(0, [1, 2, 3, 4, 5, 6, 7, 8], [4, 5, 6, 7, 8, 9], first_page)
    cache.cache_unfinished_req(req)
    assert pool.req_to_token[0, :8].tolist() == [4, 5, 6, 7, 8, 9, 14, 15]
    assert req.prefix_indices.tolist() == [4, 5, 6, 7, 12, 13, 14, 15]
    assert alloc.free_pages.tolist() == [2]
    assert req.last_matched_prefix_len == 8


def test_chunk_cache_unfinished_leaves_last_matched_prefix_len_alone():
    pool = ReqToTokenPool(1, 8, DEV)
    pool.req_to_token[0, :3] = torch.tensor([5, 6, 7], dtype=torch.int32)
    req = types.SimpleNamespace(fill_ids=[1, 2, 3], req_pool_idx=0, last_matched_prefix_len=0)

    class Copying(ChunkCacheBase):
        def _prefix_from_row(self, row_slots):
            return row_slots.to(torch.int64, copy=True)

    Copying(pool, None, 1).cache_unfinished_req(req)
    assert req.prefix_indices.tolist() == [5, 6, 7] and req.last_matched_prefix_len == 0


# ---- retraction (SPEC 6) --------------------------------------------------------------------------------
def test_retract_order_fewest_outputs_then_longest_prompt_then_latest():
    reqs = [types.SimpleNamespace(output_ids=o, origin_input_ids=p) for o, p in
            [([1, 2], [0] * 3), ([1], [0] * 3), ([1], [0] * 5), ([1], [0] * 3)]]
    order = retract_order(reqs)
    # Popped from the end: request 2 (one output, longest prompt), then 3 (the later of 1 and 3),
    # then 1, then 0 (two outputs).
    assert [order.pop() for _ in range(4)] == [2, 3, 1, 0]


@pytest.mark.parametrize("version", ("legacy", "refactored"))
def test_release_req_radix_frees_from_the_last_whole_prefix_page_and_evicts_for_the_others(version):
    """Page size 2: r0 (prompt of 5, prefix 5 after caching: 4 in the tree + a tail of 1) and r1
    run. Retracting r0 frees its columns [4, 6) (tail and one decode slot) and its row, unlocks
    its node, then evicts 1 remaining * 20 slots' worth since fewer are free: r0's unlocked
    prompt pages leave the tree."""
    geometry = Geometry(pool_rows=2, max_context_len=12, kv_slots=16, page_size=2)
    scenario = Scenario(geometry, "radix", (RequestSpec("r0", (1, 2, 3, 4, 5)), RequestSpec("r1", (9, 8, 7))),
                        (Extend(("r0", "r1")), Decode()))
    sched = Scheduler(build_world(version, "torch", geometry, "radix"), scenario)
    for i, step in enumerate(scenario.steps):
        list(sched.apply(i, step))
    r0 = sched.reqs["r0"]
    assert r0.last_matched_prefix_len == 4 and len(r0.prefix_indices) == 5
    row = sched.pool.req_to_token[r0.req_pool_idx, :6].tolist()
    assert row == [2, 3, 4, 5, 6, 7]  # pages 1, 2 in the tree; page 3 (slots 6, 7) its own
    batch = sched.world.batch([sched.reqs["r0"], sched.reqs["r1"]])
    free_before = sched.allocator.free_pages.tolist()
    batch.release_req(0, 1)
    # Page 3 freed first (front), then eviction freed pages 1 and 2 (r0's prompt), r1's stays locked.
    assert sched.allocator.free_pages.tolist() == [1, 2, 3] + free_before
    assert sched.cache.evictable_size() == 0 and r0.req_pool_idx is None


# ---- the scheduler loop (SPEC 6, "must") ----------------------------------------------------------------
def _play(scenario: Scenario, version: str = "refactored", backend: str = "torch") -> Scheduler:
    sched = Scheduler(build_world(version, backend, scenario.geometry, scenario.cache_kind), scenario)
    sched.records = [r for i, step in enumerate(scenario.steps) for r in sched.apply(i, step)]
    return sched


def test_after_prefill_a_running_request_is_cached_so_others_match_it():
    """r0 is still running when r1 arrives: r0's prompt entered the tree after its prefill, so r1
    matches its 4 shared tokens (slots 1..4), and r0's node is locked by both."""
    scenario = Scenario(Geometry(3, 16, 32), "radix",
                        (RequestSpec("r0", (1, 2, 3, 4, 5)), RequestSpec("r1", (1, 2, 3, 4, 9))),
                        (Extend(("r0",)), Extend(("r1",))))
    sched = _play(scenario)
    r1_extend = [r for r in sched.records if r.kind == "extend"][1]
    assert r1_extend.prefix_values == ((1, 2, 3, 4),) and r1_extend.out_cache_loc == (6,)
    # Then r1's own prompt is cached too: the tree's 4 slots and its own fifth.
    r1 = sched.reqs["r1"]
    assert r1.last_matched_prefix_len == 5 and r1.prefix_indices.tolist() == [1, 2, 3, 4, 6]
    assert sched.status == {"r0": "running", "r1": "running"}


def test_no_decode_while_a_chunked_request_is_pending():
    """Chunks of 4: after the first, a Decode step runs r0's next chunk instead (r1 runs, but
    SGLang runs no decode while r0 is chunked)."""
    scenario = Scenario(Geometry(3, 16, 32), "chunk",
                        (RequestSpec("r1", (7, 8)), RequestSpec("r0", tuple(range(20, 30)))),
                        (Extend(("r1", "r0")), Decode()), chunk_size=4)
    sched = _play(scenario)
    assert sched.reqs["r1"].output_ids and len(sched.reqs["r1"].output_ids) == 1  # no decode token
    assert len(sched.reqs["r0"].fill_ids) == 6  # 2 tokens in chunk 1 (after r1's page), 4 in chunk 2


def test_decode_retracts_under_memory_pressure_and_never_runs_out():
    """11 slots, two prompts of 5: one slot left, a decode needs 2. Nothing is evictable (both
    prompts locked), so r1 (same outputs and prompt: the later one) is retracted; its prompt is
    then evicted for r0, which decodes into slot 11."""
    scenario = Scenario(Geometry(3, 16, 11), "radix",
                        (RequestSpec("r0", (1, 2, 3, 4, 5)), RequestSpec("r1", (6, 7, 8, 9, 10))),
                        (Extend(("r0", "r1")), Decode()))
    result = run_scenario(scenario)
    kinds = [(r.kind, r.rids) for r in result.records]
    assert ("decode_retract", ("r1",)) in kinds and ("decode", ("r0",)) in kinds, kinds
    decode = next(r for r in result.records if r.kind == "decode")
    assert decode.out_cache_loc == (11,) and result.ok


def test_decode_finishes_are_freed_in_one_group():
    """Page size 2, chunk cache: r0 and r1 finish in one decode step; their pages (1, 2 and 3, 4)
    go to the front of the free list at once, ascending."""
    scenario = Scenario(Geometry(3, 8, 16, page_size=2), "chunk",
                        (RequestSpec("r0", (1, 2, 3)), RequestSpec("r1", (4, 5, 6))),
                        (Extend(("r0", "r1")), Decode(finish=("r0", "r1"))))
    sched = _play(scenario)
    assert sched.allocator.free_pages.tolist()[:4] == [1, 2, 3, 4]


def test_a_new_request_is_cut_to_whole_pages_and_takes_whole_pages_of_the_budget():
    """Page size 4, chunk budget 6: r0 (5 tokens) takes ceil(5 / 4) * 4 = 8 > 6 of the budget, so
    it is cut to floor(6 / 4) * 4 = 4 tokens and becomes the chunked request; r1 is not admitted."""
    scenario = Scenario(Geometry(3, 16, 32, page_size=4), "chunk",
                        (RequestSpec("r0", (1, 2, 3, 4, 5)), RequestSpec("r1", (7, 8))),
                        (Extend(("r0", "r1")),), chunk_size=6)
    sched = _play(scenario)
    assert len(sched.reqs["r0"].fill_ids) == 4 and sched.chunked == "r0"
    assert sched.status["r1"] == "waiting"


# ---- cache kinds and steps that are no SGLang configuration -------------------------------------------
def test_cache_kind_none_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="ChunkCache, so use cache_kind 'chunk'"):
        Scenario(Geometry(2, 8, 16), "none", (RequestSpec("r0", (1, 2)),), (Extend(("r0",)),))


def test_a_finish_step_is_refused_with_its_replacement():
    data = {"geometry": {"pool_rows": 2, "max_context_len": 8, "kv_slots": 16}, "cache_kind": "chunk",
            "requests": [{"rid": "r0", "tokens": [1, 2]}], "steps": [{"step": "Finish", "rid": "r0"}]}
    with pytest.raises(ValueError, match=r"Decode\(finish="):
        scenario_from_dict(data)
