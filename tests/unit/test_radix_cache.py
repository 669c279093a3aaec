"""Contract of ``mem_cache.radix_cache`` (SPEC section 1, "RadixCache"), with hand-computed values.

Conventions: slot tensors are compared exactly (``torch.equal``) and their dtype/device checked;
``req_to_token`` is filled with SENTINEL first so any cell the cache should not touch shows; the
allocator is drained and every pool row taken up front, so ``free_pages`` and ``free_slots`` list
exactly what the cache gave back.
"""

from kvparity.kernels import runtime  # noqa: I001  (must come first: fixes Triton's mode)

import types

import pytest
import torch

from kvparity.mem_cache.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
from kvparity.mem_cache.memory_pool import ReqToTokenPool
from kvparity.mem_cache.radix_cache import MatchResult, RadixCache, RadixKey, TreeNode

DEV = runtime.DEVICE
SENTINEL = -12345


# ---- helpers ---------------------------------------------------------------------------------
def i64(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64, device=DEV)


def assert_slots(actual: torch.Tensor, expected: list[int]) -> None:
    assert actual.dtype == torch.int64, actual.dtype
    assert actual.device.type == DEV.type
    assert torch.equal(actual, torch.tensor(expected, dtype=torch.int64, device=DEV)), (actual.tolist(), expected)


def assert_row(pool: ReqToTokenPool, row: int, expected: list[int]) -> None:
    """Row ``row`` equals ``expected`` followed by SENTINEL in every other column."""
    want = torch.full((pool.max_context_len,), SENTINEL, dtype=torch.int32, device=DEV)
    want[: len(expected)] = torch.tensor(expected, dtype=torch.int32, device=DEV)
    assert torch.equal(pool.req_to_token[row], want), pool.req_to_token[row].tolist()


def make(page_size: int = 1, drained: bool = True, size: int = 64, rows: int = 4, width: int = 12):
    pool = ReqToTokenPool(rows, width, DEV)
    pool.req_to_token.fill_(SENTINEL)
    assert pool.alloc(rows) == list(range(rows))  # every row is owned: free_slots lists frees only
    if page_size == 1:
        alloc = TokenToKVPoolAllocator(size, DEV)
    else:
        alloc = PagedTokenToKVPoolAllocator(size, page_size, DEV)
    if drained:
        alloc.alloc(alloc.available_size())  # from now on free_pages lists exactly what was freed
        assert alloc.free_pages.numel() == 0
    return RadixCache(pool, alloc, page_size), pool, alloc


def freed(alloc) -> list[int]:
    return alloc.free_pages.tolist()


def ins(cache: RadixCache, tokens: list[int], slots: list[int], extra_key: str | None = None) -> int:
    return cache.insert(RadixKey(tokens, extra_key), i64(*slots))


def match(cache: RadixCache, tokens: list[int], extra_key: str | None = None) -> MatchResult:
    return cache.match_prefix(RadixKey(tokens, extra_key))


def make_req(row: int, *, origin=(), output=(), fill=(), prefix=None, last_node=None, extra_key=None):
    return types.SimpleNamespace(
        origin_input_ids=list(origin),
        output_ids=list(output),
        fill_ids=list(fill),
        prefix_indices=torch.empty((0,), dtype=torch.int64) if prefix is None else prefix,
        req_pool_idx=row,
        last_node=last_node,
        extra_key=extra_key,
    )


def write_row(pool: ReqToTokenPool, row: int, slots: list[int]) -> None:
    pool.write((row, slice(0, len(slots))), i64(*slots))


# ---- RadixKey ----------------------------------------------------------------------------------
def test_radix_key_len_and_slicing_keep_namespace():
    key = RadixKey([5, 6, 7, 8], "lora-a")
    assert len(key) == 4
    assert key[1:3] == RadixKey([6, 7], "lora-a")
    assert RadixKey((1, 2)).token_ids == [1, 2]


def test_radix_key_rejects_non_integer_tokens():
    with pytest.raises(ValueError, match="integers"):
        RadixKey([1, 2.5])
    with pytest.raises(ValueError, match="list of ints"):
        RadixKey(torch.tensor([1, 2]))


# ---- match -------------------------------------------------------------------------------------
def test_match_on_empty_tree_and_empty_key_is_empty_int64_on_device_at_root():
    cache, _, _ = make()
    prefix, node = match(cache, [1, 2, 3])
    assert_slots(prefix, [])
    assert node is cache.root_node
    ins(cache, [1, 2, 3], [11, 12, 13])
    prefix, node = match(cache, [])
    assert_slots(prefix, [])
    assert node is cache.root_node


def test_match_hit_miss_and_longer_key():
    cache, _, _ = make()
    ins(cache, [1, 2, 3, 4], [11, 12, 13, 14])
    prefix, node = match(cache, [1, 2, 3, 4])
    assert_slots(prefix, [11, 12, 13, 14])
    assert isinstance(node, TreeNode) and node.key == [1, 2, 3, 4]
    # a key longer than the cached path matches the cached part only
    prefix, node = match(cache, [1, 2, 3, 4, 5, 6])
    assert_slots(prefix, [11, 12, 13, 14])
    assert node.key == [1, 2, 3, 4]
    # first token differs: miss
    prefix, node = match(cache, [9, 2, 3, 4])
    assert_slots(prefix, [])
    assert node is cache.root_node


def test_match_returns_a_copy_not_the_tree_storage():
    cache, _, _ = make()
    ins(cache, [1, 2], [11, 12])
    prefix, _ = match(cache, [1, 2])
    prefix[0] = 999
    assert_slots(match(cache, [1, 2]).device_indices, [11, 12])


def test_partial_match_splits_the_node_in_two():
    cache, _, _ = make()
    ins(cache, [1, 2, 3, 4], [11, 12, 13, 14])
    assert cache.contents() == [(None, (1, 2, 3, 4), (11, 12, 13, 14), 0)]
    prefix, node = match(cache, [1, 2, 9])
    assert_slots(prefix, [11, 12])
    # the match ended inside the node: upper part [1,2] is the returned node, [3,4] its child
    assert cache.contents() == [
        (None, (1, 2), (11, 12), 0),
        (None, (1, 2, 3, 4), (13, 14), 0),
    ]
    assert node.key == [1, 2] and node.parent is cache.root_node
    (child,) = node.children.values()
    assert child.key == [3, 4] and child.parent is node
    assert_slots(child.value, [13, 14])
    assert cache.total_size() == 4 and cache.evictable_size() == 4


def test_split_copies_lock_ref_so_sizes_do_not_change():
    cache, _, _ = make()
    ins(cache, [1, 2, 3, 4], [11, 12, 13, 14])
    leaf = match(cache, [1, 2, 3, 4]).last_device_node
    cache.inc_lock_ref(leaf)
    match(cache, [1, 2, 3])  # splits the locked node
    assert cache.contents() == [
        (None, (1, 2, 3), (11, 12, 13), 1),
        (None, (1, 2, 3, 4), (14,), 1),
    ]
    assert (cache.evictable_size(), cache.protected_size()) == (0, 4)
    assert cache.dec_lock_ref(leaf) == 4  # the original node object is still the leaf
    assert (cache.evictable_size(), cache.protected_size()) == (4, 0)


# ---- insert --------------------------------------------------------------------------------------
def test_insert_returns_how_many_tokens_were_already_present():
    cache, _, _ = make()
    assert ins(cache, [1, 2, 3], [11, 12, 13]) == 0
    assert ins(cache, [1, 2, 3, 4, 5], [21, 22, 23, 24, 25]) == 3
    assert ins(cache, [1, 2, 9], [31, 32, 39]) == 2
    assert ins(cache, [1, 2, 3], [41, 42, 43]) == 3
    # the tree keeps the slots it had first; duplicates are the caller's to free
    assert cache.contents() == [
        (None, (1, 2), (11, 12), 0),
        (None, (1, 2, 3), (13,), 0),
        (None, (1, 2, 3, 4, 5), (24, 25), 0),
        (None, (1, 2, 9), (39,), 0),
    ]
    assert cache.total_size() == 6 and cache.evictable_size() == 6 and cache.protected_size() == 0
    assert sorted(cache.all_values_flatten().tolist()) == [11, 12, 13, 24, 25, 39]
    assert cache.all_values_flatten().dtype == torch.int64


def test_insert_stores_an_int64_copy_of_the_value():
    cache, _, _ = make()
    value = torch.tensor([11, 12], dtype=torch.int32, device=DEV)
    ins_count = cache.insert(RadixKey([1, 2]), value)
    value[0] = 0
    assert ins_count == 0
    assert_slots(match(cache, [1, 2]).device_indices, [11, 12])


def test_contents_is_independent_of_insertion_order():
    a, _, _ = make()
    b, _, _ = make()
    ins(a, [1, 2, 3], [11, 12, 13])
    ins(a, [1, 2, 4], [11, 12, 14])
    ins(b, [1, 2, 4], [11, 12, 14])
    ins(b, [1, 2, 3], [11, 12, 13])
    assert a.contents() == b.contents()
    assert "[1, 2] -> [11, 12]" in a.pretty()


def test_insert_rejects_bad_values():
    cache, _, _ = make()
    with pytest.raises(ValueError, match="value length 2 != key length 3"):
        ins(cache, [1, 2, 3], [11, 12])
    with pytest.raises(ValueError, match="1-D"):
        cache.insert(RadixKey([1, 2]), i64(11, 12).reshape(1, 2))
    with pytest.raises(ValueError, match="RadixKey"):
        cache.insert([1, 2], i64(11, 12))
    assert cache.contents() == []


def test_page_size_must_match_the_allocator():
    pool = ReqToTokenPool(2, 8, DEV)
    with pytest.raises(ValueError, match="page_size"):
        RadixCache(pool, PagedTokenToKVPoolAllocator(16, 4, DEV), 2)


# ---- pages ---------------------------------------------------------------------------------------
def test_paged_match_truncates_to_whole_pages():
    cache, _, _ = make(page_size=4)
    assert ins(cache, [1, 2, 3, 4, 5, 6, 7, 8], [4, 5, 6, 7, 8, 9, 10, 11]) == 0
    # 7 tokens = 1 whole page: only 4 match, although all 7 are cached
    prefix, node = match(cache, [1, 2, 3, 4, 5, 6, 7])
    assert_slots(prefix, [4, 5, 6, 7])
    assert node.key == [1, 2, 3, 4]  # the match split the 8-token node at the page boundary
    assert_slots(match(cache, [1, 2, 3, 4, 5, 6, 7, 8, 9]).device_indices, [4, 5, 6, 7, 8, 9, 10, 11])
    # a first page that differs in its last token does not match at all
    assert_slots(match(cache, [1, 2, 3, 9, 5, 6, 7, 8]).device_indices, [])
    assert_slots(match(cache, [1, 2, 3]).device_indices, [])


def test_paged_insert_counts_and_splits_in_whole_pages():
    cache, _, _ = make(page_size=4)
    ins(cache, [1, 2, 3, 4, 5, 6, 7, 8], [4, 5, 6, 7, 8, 9, 10, 11])
    # the second page shares 3 of 4 tokens: only the first page counts as present
    assert ins(cache, [1, 2, 3, 4, 5, 6, 7, 99], [12, 13, 14, 15, 16, 17, 18, 19]) == 4
    assert cache.contents() == [
        (None, (1, 2, 3, 4), (4, 5, 6, 7), 0),
        (None, (1, 2, 3, 4, 5, 6, 7, 8), (8, 9, 10, 11), 0),
        (None, (1, 2, 3, 4, 5, 6, 7, 99), (16, 17, 18, 19), 0),
    ]
    # an unaligned key/value is truncated to whole pages (6 -> 4), already present
    assert ins(cache, [1, 2, 3, 4, 5, 6], [20, 21, 22, 23, 24, 25]) == 4
    assert cache.total_size() == 12


# ---- extra_key -----------------------------------------------------------------------------------
def test_extra_key_namespaces_never_share():
    cache, _, _ = make()
    assert ins(cache, [1, 2, 3], [11, 12, 13], "a") == 0
    assert_slots(match(cache, [1, 2, 3]).device_indices, [])
    assert_slots(match(cache, [1, 2, 3], "b").device_indices, [])
    assert_slots(match(cache, [1, 2, 3], "a").device_indices, [11, 12, 13])
    assert ins(cache, [1, 2, 3], [21, 22, 23], "b") == 0
    assert ins(cache, [1, 2], [31, 32]) == 0
    assert cache.contents() == [
        (None, (1, 2), (31, 32), 0),
        ("a", (1, 2, 3), (11, 12, 13), 0),
        ("b", (1, 2, 3), (21, 22, 23), 0),
    ]


# ---- locks ---------------------------------------------------------------------------------------
def _three_node_tree() -> RadixCache:
    """A=[1,2] with children B=[3,4] and C=[5]."""
    cache, _, _ = make()
    ins(cache, [1, 2, 3, 4], [11, 12, 13, 14])
    ins(cache, [1, 2, 5], [11, 12, 15])
    return cache


def test_lock_counts_along_the_path_and_sizes():
    cache = _three_node_tree()
    b = match(cache, [1, 2, 3, 4]).last_device_node
    c = match(cache, [1, 2, 5]).last_device_node
    assert (cache.evictable_size(), cache.protected_size()) == (5, 0)
    assert cache.inc_lock_ref(b) == -4  # A (2) and B (2) become protected
    assert (cache.evictable_size(), cache.protected_size()) == (1, 4)
    assert cache.inc_lock_ref(c) == -1  # A already protected; only C (1) moves
    assert (cache.evictable_size(), cache.protected_size()) == (0, 5)
    assert cache.contents() == [
        (None, (1, 2), (11, 12), 2),
        (None, (1, 2, 3, 4), (13, 14), 1),
        (None, (1, 2, 5), (15,), 1),
    ]
    assert cache.dec_lock_ref(b) == 2  # B only: A is still held by C
    assert cache.dec_lock_ref(c) == 3  # C and A
    assert (cache.evictable_size(), cache.protected_size()) == (5, 0)
    assert [e[3] for e in cache.contents()] == [0, 0, 0]
    assert cache.inc_lock_ref(cache.root_node) == 0 and cache.dec_lock_ref(cache.root_node) == 0


def test_dec_lock_ref_below_zero_raises_and_changes_nothing():
    cache = _three_node_tree()
    b = match(cache, [1, 2, 3, 4]).last_device_node
    before = cache.contents()
    with pytest.raises(ValueError, match="not locked"):
        cache.dec_lock_ref(b)
    assert cache.contents() == before
    assert (cache.evictable_size(), cache.protected_size()) == (5, 0)


# ---- eviction ------------------------------------------------------------------------------------
def _eviction_tree():
    """A=[1,2]:(11,12) with children B=[3]:(13) and C=[4,5]:(14,15); D=[7,8]:(17,18) at the root.
    Recency, oldest first: C (inserted), A and B (matched), D (matched last)."""
    cache, _, alloc = make()
    ins(cache, [1, 2, 3], [11, 12, 13])
    ins(cache, [1, 2, 4, 5], [11, 12, 14, 15])
    ins(cache, [7, 8], [17, 18])
    match(cache, [1, 2, 3])
    match(cache, [7, 8])
    return cache, alloc


def test_evict_frees_lru_leaves_and_then_parents_that_became_leaves():
    cache, alloc = _eviction_tree()
    assert cache.evict(1) == 2  # C is the oldest leaf; a whole leaf goes
    assert freed(alloc) == [14, 15]
    assert cache.evict(100) == 5  # B, then A (a leaf now, older than D), then D
    assert freed(alloc) == [14, 15, 13, 11, 12, 17, 18]
    assert cache.contents() == [] and cache.total_size() == 0 and cache.evictable_size() == 0
    assert cache.evict(5) == 0


def test_evict_stops_once_enough_is_freed():
    cache, alloc = _eviction_tree()
    assert cache.evict(3) == 3  # C (2) then B (1)
    assert freed(alloc) == [14, 15, 13]
    assert cache.contents() == [(None, (1, 2), (11, 12), 0), (None, (7, 8), (17, 18), 0)]
    assert cache.evictable_size() == 4


def test_evict_never_frees_locked_nodes_or_their_ancestors():
    cache, alloc = _eviction_tree()
    b = match(cache, [1, 2, 3]).last_device_node
    cache.inc_lock_ref(b)
    assert cache.evict(100) == 4  # C, then D; A and B are locked
    assert freed(alloc) == [14, 15, 17, 18]
    assert cache.contents() == [(None, (1, 2), (11, 12), 1), (None, (1, 2, 3), (13,), 1)]
    assert (cache.evictable_size(), cache.protected_size()) == (0, 3)
    cache.dec_lock_ref(b)
    assert cache.evict(100) == 3
    assert freed(alloc) == [14, 15, 17, 18, 13, 11, 12]


def test_paged_evict_frees_whole_pages():
    cache, _, alloc = make(page_size=4)
    ins(cache, [1, 2, 3, 4, 5, 6, 7, 8], [8, 9, 10, 11, 20, 21, 22, 23])
    assert cache.evict(1) == 8
    assert freed(alloc) == [2, 5]  # the distinct pages, ascending, go to the FRONT


# ---- cache_unfinished_req ------------------------------------------------------------------------
def test_unfinished_req_gives_a_new_int64_prefix_not_aliasing_the_row():
    cache, pool, alloc = make()
    req = make_req(0, origin=[1, 2, 3, 4, 5, 6], fill=[1, 2, 3, 4], last_node=cache.root_node)
    write_row(pool, 0, [21, 22, 23, 24])
    old_prefix = req.prefix_indices
    cache.cache_unfinished_req(req)
    assert req.prefix_indices is not old_prefix
    assert_slots(req.prefix_indices, [21, 22, 23, 24])
    assert_row(pool, 0, [21, 22, 23, 24])
    assert freed(alloc) == [] and pool.free_slots == []  # the row is NOT freed here
    assert cache.contents() == [(None, (1, 2, 3, 4), (21, 22, 23, 24), 1)]
    assert req.last_node.key == [1, 2, 3, 4]
    assert (cache.evictable_size(), cache.protected_size()) == (0, 4)
    # the row is freed and reused by the scheduler: the prefix must not see the new contents
    pool.write((0, slice(0, 4)), i64(0, 0, 0, 0))
    assert_slots(req.prefix_indices, [21, 22, 23, 24])
    # and writing into the prefix must not change the tree
    req.prefix_indices[0] = 999
    assert_slots(match(cache, [1, 2, 3, 4]).device_indices, [21, 22, 23, 24])


def test_unfinished_req_rewrites_row_with_tree_slots_and_frees_duplicates():
    cache, pool, alloc = make()
    ins(cache, [1, 2, 3, 4], [31, 32, 33, 34])  # another request cached the same tokens first
    req = make_req(1, origin=[1, 2, 3, 4, 5, 6, 7, 8], fill=[1, 2, 3, 4, 5, 6], last_node=cache.root_node)
    write_row(pool, 1, [41, 42, 43, 44, 45, 46])
    cache.cache_unfinished_req(req)
    assert freed(alloc) == [41, 42, 43, 44]  # this request's copies of tokens the tree had
    assert_row(pool, 1, [31, 32, 33, 34, 45, 46])
    assert_slots(req.prefix_indices, [31, 32, 33, 34, 45, 46])
    assert cache.contents() == [
        (None, (1, 2, 3, 4), (31, 32, 33, 34), 1),
        (None, (1, 2, 3, 4, 5, 6), (45, 46), 1),
    ]
    first_last_node = req.last_node
    assert first_last_node.key == [5, 6]

    # next chunk: the prefix is already the tree's, nothing is a duplicate, the lock moves down
    req.fill_ids = [1, 2, 3, 4, 5, 6, 7, 8]
    pool.write((1, slice(6, 8)), i64(47, 48))
    cache.cache_unfinished_req(req)
    assert freed(alloc) == [41, 42, 43, 44]
    assert_row(pool, 1, [31, 32, 33, 34, 45, 46, 47, 48])
    assert_slots(req.prefix_indices, [31, 32, 33, 34, 45, 46, 47, 48])
    assert req.last_node.key == [7, 8] and req.last_node.parent is first_last_node
    assert [e[3] for e in cache.contents()] == [1, 1, 1]
    assert (cache.evictable_size(), cache.protected_size()) == (0, 8)


def test_unfinished_req_paged_keeps_the_unaligned_tail_in_the_prefix():
    cache, pool, alloc = make(page_size=4)
    req = make_req(0, origin=list(range(1, 11)), fill=[1, 2, 3, 4, 5, 6], last_node=cache.root_node)
    write_row(pool, 0, [8, 9, 10, 11, 12, 13])  # page 2 full, page 3 half used
    cache.cache_unfinished_req(req)
    assert cache.contents() == [(None, (1, 2, 3, 4), (8, 9, 10, 11), 1)]  # whole pages only
    assert_slots(req.prefix_indices, [8, 9, 10, 11, 12, 13])  # tree slots + the row's tail
    assert_row(pool, 0, [8, 9, 10, 11, 12, 13])
    assert freed(alloc) == []  # the tail stays with the request
    pool.write((0, slice(0, 6)), i64(0, 0, 0, 0, 0, 0))
    assert_slots(req.prefix_indices, [8, 9, 10, 11, 12, 13])


def test_unfinished_req_paged_duplicate_page_is_freed_and_row_rewritten():
    cache, pool, alloc = make(page_size=4)
    ins(cache, [1, 2, 3, 4], [20, 21, 22, 23])  # page 5, cached by another request
    req = make_req(2, origin=list(range(1, 11)), fill=[1, 2, 3, 4, 5, 6], last_node=cache.root_node)
    write_row(pool, 2, [8, 9, 10, 11, 12, 13])
    cache.cache_unfinished_req(req)
    assert freed(alloc) == [2]  # page 2 held this request's duplicate of the first page
    assert_row(pool, 2, [20, 21, 22, 23, 12, 13])
    assert_slots(req.prefix_indices, [20, 21, 22, 23, 12, 13])
    assert cache.contents() == [(None, (1, 2, 3, 4), (20, 21, 22, 23), 1)]


def test_unfinished_req_keeps_extra_key_namespace():
    cache, pool, _ = make()
    req = make_req(0, fill=[1, 2], last_node=cache.root_node, extra_key="lora-7")
    write_row(pool, 0, [21, 22])
    cache.cache_unfinished_req(req)
    assert cache.contents() == [("lora-7", (1, 2), (21, 22), 1)]
    assert_slots(match(cache, [1, 2]).device_indices, [])


# ---- cache_finished_req --------------------------------------------------------------------------
def test_finished_req_frees_row_and_duplicates_and_leaves_out_last_output_token():
    cache, pool, alloc = make()
    ins(cache, [1, 2], [61, 62])  # another request's
    req = make_req(3, origin=[1, 2, 3], output=[4, 5], last_node=cache.root_node)
    write_row(pool, 3, [51, 52, 53, 54])  # token 5 was sampled last: it has no slot
    cache.cache_finished_req(req)
    assert cache.contents() == [(None, (1, 2), (61, 62), 0), (None, (1, 2, 3, 4), (53, 54), 0)]
    assert freed(alloc) == [51, 52]
    assert pool.free_slots == [3]  # the request's row came back
    assert_row(pool, 3, [51, 52, 53, 54])  # freeing a row never clears it
    assert (cache.evictable_size(), cache.protected_size()) == (4, 0)


def test_finished_req_that_matched_unlocks_and_frees_no_duplicates():
    cache, pool, alloc = make()
    ins(cache, [1, 2], [61, 62])
    prefix, node = match(cache, [1, 2, 3])
    cache.inc_lock_ref(node)  # what the scheduler does for a matched request
    req = make_req(0, origin=[1, 2, 3], output=[4, 5], prefix=prefix, last_node=node)
    write_row(pool, 0, [61, 62, 53, 54])
    assert (cache.evictable_size(), cache.protected_size()) == (0, 2)
    cache.cache_finished_req(req)
    assert freed(alloc) == []
    assert cache.contents() == [(None, (1, 2), (61, 62), 0), (None, (1, 2, 3, 4), (53, 54), 0)]
    assert (cache.evictable_size(), cache.protected_size()) == (4, 0)
    assert pool.free_slots == [0]


def test_finished_req_paged_frees_tail_then_duplicate_pages():
    cache, pool, alloc = make(page_size=4)
    ins(cache, [1, 2, 3, 4], [20, 21, 22, 23])  # page 5
    req = make_req(1, origin=[1, 2, 3, 4, 5], output=[6, 7], last_node=cache.root_node)
    write_row(pool, 1, [8, 9, 10, 11, 12, 13])  # 6 tokens with slots: page 2 + half of page 3
    cache.cache_finished_req(req)
    # tail (page 3) freed first, then the duplicate page 2; freed pages go to the front
    assert freed(alloc) == [2, 3]
    assert cache.contents() == [(None, (1, 2, 3, 4), (20, 21, 22, 23), 0)]
    assert pool.free_slots == [1]


def test_finished_req_paged_inserts_aligned_part():
    cache, pool, alloc = make(page_size=4)
    req = make_req(0, origin=[1, 2, 3, 4, 5, 6, 7, 8, 9], output=[10], last_node=cache.root_node)
    write_row(pool, 0, [8, 9, 10, 11, 24, 25, 26, 27, 12])
    cache.cache_finished_req(req)
    assert cache.contents() == [(None, (1, 2, 3, 4, 5, 6, 7, 8), (8, 9, 10, 11, 24, 25, 26, 27), 0)]
    assert freed(alloc) == [3]  # slot 12's page
    assert pool.free_slots == [0]


def test_reset_empties_the_tree():
    cache = _three_node_tree()
    cache.reset()
    assert cache.contents() == [] and cache.total_size() == 0
    assert (cache.evictable_size(), cache.protected_size()) == (0, 0)
    assert_slots(cache.all_values_flatten(), [])
