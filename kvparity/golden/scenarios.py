"""The golden scenarios: each pins one behaviour a reviewer cares about (see ``WHY``), and
``REACHES`` lists the scenario classes it must still reach when regenerated."""

from __future__ import annotations

from kvparity.model.scenario import Decode, Evict, Extend, RequestSpec, Retract, Scenario
from kvparity.model.worlds import Geometry

# (name, why it is pinned, scenario classes it must reach, scenario). Small geometries: the whole
# golden test replays each of these in every world, on the Triton interpreter too.
_P = Geometry(pool_rows=3, max_context_len=24, kv_slots=64, page_size=1)
_TABLE: tuple[tuple[str, str, tuple[str, ...], Scenario], ...] = (
    (
        "empty-prefixes",
        "a batch of two with no cache at all: prefixes are [] (legacy) or empty int64 tensors, never written",
        ("prefix: all empty", "batch size 2-4"),
        Scenario(_P, "chunk", (RequestSpec("r0", (11, 12, 13, 14, 15)), RequestSpec("r1", (21, 22, 23))),
                 (Extend(("r0", "r1")), Decode(finish=("r0", "r1")))),
    ),
    (
        "mixed-prefixes",
        "one batch with a cached prefix next to an empty one: running offsets and prefix_len columns",
        ("prefix: mixed empty and non-empty", "radix: hit from a shared prompt prefix"),
        Scenario(Geometry(pool_rows=6, max_context_len=24, kv_slots=96), "radix",
                 (RequestSpec("r0", tuple(range(10, 18))), RequestSpec("r1", (10, 11, 12, 13, 99, 98)),
                  RequestSpec("r2", (70, 71, 72))),
                 (Extend(("r0",)), Decode(finish=("r0",)), Extend(("r1", "r2")))),
    ),
    (
        "chunked-chunk-cache",
        "a request chunked over three rounds with the chunk cache (legacy's prefix: an int32 view of its row)",
        ("chunked: two or more rounds",),
        Scenario(_P, "chunk", (RequestSpec("r0", tuple(range(50, 60))),),
                 (Extend(("r0",)), Extend(()), Extend(()), Decode(finish=("r0",))), chunk_size=4),
    ),
    (
        "chunked-radix-cache",
        "the same three rounds with the radix cache: each chunk is inserted into the tree and re-matched",
        ("chunked: two or more rounds",),
        Scenario(_P, "radix", (RequestSpec("r0", tuple(range(50, 60))),),
                 (Extend(("r0",)), Extend(()), Extend(()), Decode(finish=("r0",))), chunk_size=4),
    ),
    (
        "paged-unaligned-chunk-tail",
        "page size 4, chunks of 6: the prefix ends inside a page, so last_loc must be its last slot",
        ("chunked: unaligned prefix tail (page > 1)", "page size 4"),
        Scenario(Geometry(pool_rows=3, max_context_len=24, kv_slots=64, page_size=4), "radix",
                 (RequestSpec("r0", tuple(range(30, 45))), RequestSpec("r1", (5, 6, 7))),
                 (Extend(("r0",)), Extend(("r1",)), Extend(()), Decode()), chunk_size=6),
    ),
    (
        "radix-node-split",
        "a radix hit that ends inside a node (page size 2): the node is split at a page boundary",
        ("radix: node split", "page size 2"),
        Scenario(Geometry(pool_rows=3, max_context_len=24, kv_slots=64, page_size=2), "radix",
                 (RequestSpec("r0", tuple(range(10, 20))), RequestSpec("r1", (10, 11, 12, 13, 90, 91, 92))),
                 (Extend(("r0",)), Decode(finish=("r0",)), Extend(("r1",)), Decode())),
    ),
    (
        "exact-repeat",
        "the exact prompt of a finished request: everything but the last token comes from the cache",
        ("radix: exact repeat of a finished prompt",),
        Scenario(_P, "radix", (RequestSpec("r0", tuple(range(60, 67))), RequestSpec("r1", tuple(range(60, 67)))),
                 (Extend(("r0",)), Decode(finish=("r0",)), Extend(("r1",)), Decode())),
    ),
    (
        "allocation-failure",
        "an extend that runs out of KV slots after a radix hit: legacy has already written the prefix "
        "and changed the request (SPEC 4); the refactored version has touched nothing",
        ("off-path: prefill out of memory",),
        Scenario(Geometry(pool_rows=3, max_context_len=24, kv_slots=16), "radix",
                 (RequestSpec("r0", tuple(range(1, 9))), RequestSpec("r1", tuple(range(1, 7)) + tuple(range(50, 62)))),
                 (Extend(("r0",)), Decode(finish=("r0",)), Extend(("r1",)))),
    ),
    (
        "logprob-start-below-prefix",
        "logprobs from token 3 while 9 tokens are cached: the match stops at the logprob start",
        ("logprob: start inside the cached prefix",),
        Scenario(_P, "radix",
                 (RequestSpec("r0", tuple(range(20, 32))),
                  RequestSpec("r1", tuple(range(20, 30)) + (5, 6), return_logprob=True, logprob_start_len=3)),
                 (Extend(("r0",)), Decode(finish=("r0",)), Extend(("r1",)), Decode())),
    ),
    (
        "retract-readmit",
        "a running request retracted (its own slots freed) and re-admitted: it matches its cached prefix again",
        ("retract then re-admit", "radix: hit from a shared prompt prefix"),
        Scenario(Geometry(pool_rows=3, max_context_len=24, kv_slots=64, page_size=2), "radix",
                 (RequestSpec("r0", tuple(range(1, 10))), RequestSpec("r1", tuple(range(1, 6)) + (50,))),
                 (Extend(("r0",)), Decode(finish=("r0",)), Extend(("r1",)), Decode(), Retract("r1"), Extend(("r1",)))),
    ),
    (
        "lengths-cross-512",
        "an extend of 530 tokens, then a cached prefix of 528 (page size 16): the write kernels copy in blocks of 512",
        ("length: extend crosses 512", "length: prefix crosses 512", "page size 16"),
        Scenario(Geometry(pool_rows=2, max_context_len=544, kv_slots=1120, page_size=16), "radix",
                 (RequestSpec("r0", tuple(range(100, 630))), RequestSpec("r1", tuple(range(100, 630)) + (7, 8, 9))),
                 (Extend(("r0",)), Decode(finish=("r0",)), Extend(("r1",)), Decode())),
    ),
    (
        "row-reuse-alias",
        "SPEC 7's legacy defect: r0's chunk row is freed and taken by r1 in the next batch, and legacy's int32 "
        "view of r0's prefix then shows r1's slots; the refactored int64 copy is immune",
        ("row reuse: freed chunked row taken by another request in the same batch",),
        Scenario(Geometry(pool_rows=2, max_context_len=16, kv_slots=32), "chunk",
                 (RequestSpec("r0", tuple(range(40, 46))), RequestSpec("r1", (7, 8))),
                 (Extend(("r0",)), Extend(("r1",)), Decode()), chunk_size=4),
    ),
    (
        "evict-and-reuse",
        "slots the tree held are evicted and handed out again in the same extend",
        ("batch size 1",),
        Scenario(Geometry(pool_rows=2, max_context_len=16, kv_slots=8), "radix",
                 (RequestSpec("r0", (1, 2, 3, 4, 5, 6)), RequestSpec("r1", (50, 51, 52, 53, 54, 55))),
                 (Extend(("r0",)), Decode(finish=("r0",)), Evict(1), Extend(("r1",)))),
    ),
)
_NEW = (
    (
        "chunked-chunk-cache-paged",
        "the chunk cache at page size 4 over three chunks (8, 8, 3 tokens): each round's prefix is the "
        "row's copy (refactored) or view (legacy), and the last chunk ends inside a page",
        ("chunked: two or more rounds", "page size 4"),
        Scenario(Geometry(pool_rows=3, max_context_len=24, kv_slots=64, page_size=4), "chunk",
                 (RequestSpec("r0", tuple(range(50, 69))),),
                 (Extend(("r0",)), Extend(()), Extend(()), Decode(), Decode(finish=("r0",))), chunk_size=8),
    ),
    (
        "running-prompt-matched",
        "r0's prompt enters the tree right after its prefill (cache_unfinished_req), so r1, admitted while "
        "r0 still runs, matches it; r0's row is repointed and its unaligned tail stays its own (page size 2)",
        ("radix: hit on a running request's prompt", "page size 2"),
        Scenario(Geometry(pool_rows=3, max_context_len=24, kv_slots=64, page_size=2), "radix",
                 (RequestSpec("r0", tuple(range(10, 17))), RequestSpec("r1", tuple(range(10, 16)) + (90, 91))),
                 (Extend(("r0",)), Decode(), Extend(("r1",)), Decode(finish=("r0", "r1")))),
    ),
    (
        "decode-retract-pressure",
        "two running requests, one free slot, a decode that needs two: the tree cannot evict (both prompts "
        "are locked), so SGLang retracts r1 (same outputs and prompt length: the later one), whose prompt "
        "the tree then evicts for the others (20 slots per remaining request)",
        ("decode: retract under memory pressure",),
        Scenario(Geometry(pool_rows=3, max_context_len=16, kv_slots=11), "radix",
                 (RequestSpec("r0", (1, 2, 3, 4, 5)), RequestSpec("r1", (6, 7, 8, 9, 10))),
                 (Extend(("r0", "r1")), Decode(), Decode())),
    ),
    (
        "extend-evicts-from-tree",
        "page size 4: r0 finished, its 3 pages sit unlocked in the tree; r1 needs 5 pages and asks for 24 "
        "slots (its tokens plus a page per request) while 20 are free, "
        "so the allocation first evicts r0's least recently used pages",
        ("extend: allocation evicts from the tree", "page size 4"),
        Scenario(Geometry(pool_rows=2, max_context_len=24, kv_slots=32, page_size=4), "radix",
                 (RequestSpec("r0", tuple(range(1, 14))), RequestSpec("r1", tuple(range(50, 70)))),
                 (Extend(("r0",)), Decode(finish=("r0",)), Extend(("r1",)))),
    ),
    (
        "need-sort-merge-extend",
        "need_sort, page size 4: freed pages wait in release_pages; alloc_extend merges and sorts them when "
        "extend_num_tokens // page_size + bs + 1 > len(free_pages), although the free pages alone would do",
        ("paged: merge before alloc_extend (need_sort)",),
        Scenario(Geometry(pool_rows=3, max_context_len=24, kv_slots=32, page_size=4, need_sort=True), "chunk",
                 (RequestSpec("r0", tuple(range(1, 13))), RequestSpec("r1", tuple(range(20, 26))),
                  RequestSpec("r2", tuple(range(40, 44)))),
                 (Extend(("r0",)), Decode(finish=("r0",)), Extend(("r1", "r2")))),
    ),
    (
        "need-sort-merge-decode",
        "need_sort, page size 2: two requests finish in one free group (their pages go to release_pages "
        "together, ascending); the next decode of three requests merges because bs > len(free_pages)",
        ("paged: merge before alloc_decode (need_sort)", "paged: several finishes in one decode free group"),
        Scenario(Geometry(pool_rows=6, max_context_len=16, kv_slots=22, page_size=2, need_sort=True), "chunk",
                 (RequestSpec("r0", (1, 2, 3)), RequestSpec("r1", (4, 5, 6)), RequestSpec("r2", (7, 8)),
                  RequestSpec("r3", (9, 10)), RequestSpec("r4", (11, 12, 13, 14))),
                 (Extend(("r0", "r1", "r2", "r3", "r4")), Decode(finish=("r0", "r1")), Decode())),
    ),
    (
        "stale-row-after-duplicate-page",
        "SGLang's latent defect (SPEC 1, cache_unfinished_req step 2), page size 4, chunks of 14: r0's "
        "second chunk leaves an unaligned prefix (26); r1, placed first (a harness widening), caches the "
        "same page first, so r0's copy of it is freed as a duplicate and row columns 24-25, before r0's old "
        "prefix end, keep slots of the freed page while r0 keeps running (reported, not a failure)",
        ("chunked: unaligned prefix tail (page > 1)",),
        Scenario(Geometry(pool_rows=3, max_context_len=40, kv_slots=96, page_size=4), "radix",
                 (RequestSpec("r0", tuple(range(100, 130))), RequestSpec("r1", tuple(range(100, 128)) + (99,))),
                 (Extend(("r0",)), Extend(()), Extend(("r1",), chunked_last=True), Decode()), chunk_size=14),
    ),
)
# Production-shaped state (issue 25): short warm-ups (w...) leave rows and pages out of order, then the
# batch that meets them. Each was drawn by the "warm start" template and shrunk.
_WARM = (
    (
        "warm-scattered-prefix",
        "after a warm-up, r0 matches w6's token (slot 2) and gets slot 5 for its own, so r4's cached prefix "
        "is (2, 5): two slots that are not neighbours; its batch takes rows 3, 4 and then 0, which w5 gave "
        "back (a write that assumes contiguous prefixes or ascending rows breaks here)",
        ("order: a batch's rows not ascending", "order: a request's pages not contiguous",
         "radix: hit on a running request's prompt"),
        Scenario(Geometry(pool_rows=5, max_context_len=17, kv_slots=25, page_size=1), "radix",
                 (RequestSpec("w5", (905000,), max_new_tokens=2), RequestSpec("w6", (10000,), max_new_tokens=2),
                  RequestSpec("r0", (10000, 10001), arrival=2, max_new_tokens=64),
                  RequestSpec("r1", (20000,), arrival=3, max_new_tokens=64),
                  RequestSpec("r4", (10000, 10001, 10002), arrival=3, max_new_tokens=64),
                  RequestSpec("r5", (60000,), arrival=3, max_new_tokens=64)),
                 (Extend(("w5", "w6")), Decode(), Extend(("r0",)), Extend(("r1", "r4", "r5")))),
    ),
    (
        "warm-chunk-on-scattered-pages",
        "page size 4, chunks of 13: w3's page comes back while w1 still holds the next one, so w0's first "
        "chunk gets pages 1, 3 and 4; its third round starts from a 25-token prefix that ends inside a page "
        "and spans pages that are not contiguous, so last_loc (slot 32) is not its first slot plus 24",
        ("chunked: unaligned prefix tail (page > 1)", "order: a request's pages not contiguous", "page size 4"),
        Scenario(Geometry(pool_rows=5, max_context_len=44, kv_slots=172, page_size=4), "radix",
                 (RequestSpec("w0", (*range(40000, 40006), *range(900000, 900020)), arrival=2, max_new_tokens=2),
                  RequestSpec("w1", (901000,), max_new_tokens=3), RequestSpec("w3", (903000,), max_new_tokens=2)),
                 (Extend(("w3", "w1")), Decode(), Extend(("w0",)), Extend(()), Decode()), chunk_size=13),
    ),
    (
        "warm-rows-freed-apart",
        "page size 2: w2 and w3 run one after the other and give their rows back at different steps, and "
        "the eviction puts their pages back in front of the never-used ones; r1, r2 and r3 then get rows "
        "2, 0, 1 and pages from a free list out of ascending order",
        ("order: a batch mixing rows freed at different times", "order: allocation from a free list that has wrapped",
         "order: a batch's rows not ascending"),
        Scenario(Geometry(pool_rows=3, max_context_len=14, kv_slots=22, page_size=2), "radix",
                 (RequestSpec("w2", (902000,), max_new_tokens=2),
                  RequestSpec("w3", (903000,), arrival=2, max_new_tokens=2),
                  RequestSpec("r1", (10000, 10001, 10002), arrival=5, max_new_tokens=64),
                  RequestSpec("r2", (30000,), arrival=5, max_new_tokens=64),
                  RequestSpec("r3", (40000,), arrival=5, max_new_tokens=64)),
                 (Extend(("w2",)), Decode(), Extend(("w3",)), Decode(), Evict(3), Extend(("r1", "r2", "r3")))),
    ),
)
_TABLE = _TABLE + _NEW + _WARM
GOLDENS: dict[str, Scenario] = {name: scenario for name, _, _, scenario in _TABLE}
WHY: dict[str, str] = {name: why for name, why, _, _ in _TABLE}
REACHES: dict[str, tuple[str, ...]] = {name: classes for name, _, classes, _ in _TABLE}
