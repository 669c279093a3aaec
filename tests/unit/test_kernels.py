"""Unit tests of the KV-index kernels and their torch twins (SPEC sections 1, 5 and 8).

Every expectation here is written out by hand from the spec, or built from the test's own lists in
the most literal way (see ``kernel_cases``); "triton == torch" is checked as well, but never on its
own. Tables are filled with POISON before each run, and every cell a kernel must not write is
checked to still hold POISON. Comparisons are exact (``torch.equal``), with dtype, shape and device
asserted explicitly.
"""

from __future__ import annotations

import pytest
import torch

from kvparity.kernels.alloc_extend import alloc_extend, next_power_of_2
from kvparity.kernels.last_loc import get_last_loc
from kvparity.kernels.launches import LAUNCHES
from kvparity.kernels.legacy_write import write_extend_slots
from kvparity.kernels.refactored_write import prefix_pointer_table, write_prefix_and_extend_slots
from kvparity.mem_cache.allocator import PagedTokenToKVPoolAllocator
from kvparity.model.poison import POISON

from kernel_cases import (
    WRITE_CASES,
    assert_tensor_equal,
    assert_untouched_is_poison,
    ramp,
)

CASE_IDS = [c.name for c in WRITE_CASES]


def i64(values, device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64, device=device)


# ==================================================================================================
# Legacy write kernel: write_extend_slots writes row columns [prefix_len, seq_len) only.
# ==================================================================================================
def run_legacy_write(case, device, backend) -> torch.Tensor:
    table = case.poisoned_table(device)
    write_extend_slots(
        table,
        case.req_pool_indices(device),
        case.prefix_lens(device),
        case.seq_lens(device),
        case.extend_lens(device),
        case.out_cache_loc(device),
        backend=backend,
    )
    return table


def test_legacy_write_small_batch_spelled_out(device, backend):
    """Rows [3, 0, 2] with prefix lengths [4, 0, 2]: each row gets its share of out_cache_loc from
    column prefix_len on; the prefix columns, rows 1 and 4 and every column past seq_len stay POISON."""
    P = POISON
    table = torch.full((5, 12), P, dtype=torch.int32, device=device)
    write_extend_slots(
        table,
        req_pool_indices=i64([3, 0, 2], device),
        prefix_lens=i64([4, 0, 2], device),
        seq_lens=i64([7, 5, 3], device),
        extend_lens=i64([3, 5, 1], device),
        out_cache_loc=i64([41, 42, 43, 51, 52, 53, 54, 55, 71], device),
        backend=backend,
    )
    expected = torch.tensor(
        [
            [51, 52, 53, 54, 55, P, P, P, P, P, P, P],  # row 0: request 1, no prefix
            [P, P, P, P, P, P, P, P, P, P, P, P],  # row 1: nobody's
            [P, P, 71, P, P, P, P, P, P, P, P, P],  # row 2: request 2, prefix 2 left alone
            [P, P, P, P, 41, 42, 43, P, P, P, P, P],  # row 3: request 0, prefix 4 left alone
            [P, P, P, P, P, P, P, P, P, P, P, P],  # row 4: nobody's
        ],
        dtype=torch.int32,
        device=device,
    )
    assert_tensor_equal(table, expected)


@pytest.mark.parametrize("case", WRITE_CASES, ids=CASE_IDS)
def test_legacy_write_matches_hand_built_table(case, device, backend):
    """Only [prefix_len, seq_len) of each owned row is written (the legacy prefix is written
    earlier by torch, not by this kernel); every other cell, prefix columns included, stays POISON."""
    table = run_legacy_write(case, device, backend)
    assert table.dtype == torch.int32 and table.device.type == device.type
    assert_untouched_is_poison(table, case.written_mask(with_prefix=False))
    assert_tensor_equal(table, case.expected_table(device, with_prefix=False))


@pytest.mark.parametrize("case", WRITE_CASES, ids=CASE_IDS)
def test_legacy_write_triton_equals_torch_twin(case, device):
    """The Triton kernel and its torch twin leave identical tables (POISON cells included)."""
    assert_tensor_equal(run_legacy_write(case, device, "triton"), run_legacy_write(case, device, "torch"))


# ==================================================================================================
# Refactored write kernel: write_prefix_and_extend_slots writes [0, prefix_len) from the prefix
# tensor (Triton: through a table of raw int64 pointers) and then [prefix_len, seq_len).
# ==================================================================================================
def run_refactored_write(case, device, backend, prefixes=None) -> torch.Tensor:
    table = case.poisoned_table(device)
    write_prefix_and_extend_slots(
        table,
        case.req_pool_indices(device),
        case.prefix_tensors(device) if prefixes is None else prefixes,
        case.prefix_lens(device),
        case.seq_lens(device),
        case.extend_lens(device),
        case.out_cache_loc(device),
        backend=backend,
    )
    return table


def test_refactored_write_small_batch_spelled_out(device, backend):
    """Rows [3, 0, 2], prefixes [31..34], [] and [61, 62]: each row gets prefix then new slots;
    the empty prefix has address 0 and is never read; rows 1 and 4 and the tails stay POISON."""
    P = POISON
    prefixes = [i64([31, 32, 33, 34], device), torch.empty((0,), dtype=torch.int64, device=device), i64([61, 62], device)]
    assert prefixes[1].data_ptr() == 0, "the empty-prefix (address 0) case is not exercised"
    table = torch.full((5, 12), P, dtype=torch.int32, device=device)
    write_prefix_and_extend_slots(
        table,
        req_pool_indices=i64([3, 0, 2], device),
        prefix_tensors=prefixes,
        prefix_lens=i64([4, 0, 2], device),
        seq_lens=i64([7, 5, 3], device),
        extend_lens=i64([3, 5, 1], device),
        out_cache_loc=i64([41, 42, 43, 51, 52, 53, 54, 55, 71], device),
        backend=backend,
    )
    expected = torch.tensor(
        [
            [51, 52, 53, 54, 55, P, P, P, P, P, P, P],  # row 0: request 1, empty prefix
            [P, P, P, P, P, P, P, P, P, P, P, P],  # row 1: nobody's
            [61, 62, 71, P, P, P, P, P, P, P, P, P],  # row 2: request 2
            [31, 32, 33, 34, 41, 42, 43, P, P, P, P, P],  # row 3: request 0
            [P, P, P, P, P, P, P, P, P, P, P, P],  # row 4: nobody's
        ],
        dtype=torch.int32,
        device=device,
    )
    assert_tensor_equal(table, expected)


@pytest.mark.parametrize("case", WRITE_CASES, ids=CASE_IDS)
def test_refactored_write_matches_hand_built_table(case, device, backend):
    """[0, prefix_len) gets the prefix and [prefix_len, seq_len) the request's new slots; every
    other cell stays POISON. Empty prefixes really have data_ptr() == 0 (pointer-table entry 0)."""
    prefixes = case.prefix_tensors(device)
    for req, prefix in zip(case.reqs, prefixes):
        if not req.prefix:
            assert prefix.data_ptr() == 0, "the empty-prefix (address 0) case is not exercised"
    pointers = prefix_pointer_table(prefixes, device)
    assert pointers.dtype == torch.int64
    assert [p == 0 for p in pointers.tolist()] == [not r.prefix for r in case.reqs]

    table = run_refactored_write(case, device, backend, prefixes)
    assert table.dtype == torch.int32 and table.device.type == device.type
    assert_untouched_is_poison(table, case.written_mask(with_prefix=True))
    assert_tensor_equal(table, case.expected_table(device, with_prefix=True))


@pytest.mark.parametrize("case", WRITE_CASES, ids=CASE_IDS)
def test_refactored_write_triton_equals_torch_twin(case, device):
    """The Triton kernel and its torch twin leave identical tables (POISON cells included)."""
    assert_tensor_equal(run_refactored_write(case, device, "triton"), run_refactored_write(case, device, "torch"))


@pytest.mark.parametrize("case", WRITE_CASES, ids=CASE_IDS)
def test_refactored_write_equals_legacy_torch_prefix_write_plus_legacy_kernel(case, device, backend):
    """SPEC 3 vs 4: legacy's torch prefix write followed by the legacy kernel gives the same table
    as the refactored one-step write, on the same backend."""
    legacy = case.poisoned_table(device)
    for req, prefix in zip(case.reqs, case.prefix_tensors(device)):
        if req.prefix:
            legacy[req.row, : len(req.prefix)] = prefix
    write_extend_slots(
        legacy,
        case.req_pool_indices(device),
        case.prefix_lens(device),
        case.seq_lens(device),
        case.extend_lens(device),
        case.out_cache_loc(device),
        backend=backend,
    )
    assert_tensor_equal(run_refactored_write(case, device, backend), legacy)


# ---- the int32-prefix misread (SPEC sections 5 and 8) ----------------------------------------------
INT32_N = 6


def int32_misread_inputs(device):
    """Row 1 gets an int32 prefix of 6 values, row 0 a proper int64 prefix [7, 8].

    The int32 prefix is the first 6 elements of a 12-element int32 buffer [100, 101, ..., 111]:
    reading 6 int64 values from its address covers exactly the 12 int32s of the buffer, so the
    over-read SPEC 5 describes stays inside memory this test owns."""
    buffer = torch.arange(100, 100 + 2 * INT32_N, dtype=torch.int32, device=device)
    int32_prefix = buffer[:INT32_N]
    assert int32_prefix.dtype == torch.int32 and int32_prefix.is_contiguous()
    assert int32_prefix.data_ptr() == buffer.data_ptr()
    return dict(
        buffer=buffer,
        req_pool_indices=i64([1, 0], device),
        prefix_tensors=[int32_prefix, i64([7, 8], device)],
        prefix_lens=i64([INT32_N, 2], device),
        seq_lens=i64([INT32_N + 2, 3], device),
        extend_lens=i64([2, 1], device),
        out_cache_loc=i64([900, 901, 902], device),
    )


def run_int32_prefix(device, backend) -> torch.Tensor:
    inp = int32_misread_inputs(device)
    table = torch.full((3, 10), POISON, dtype=torch.int32, device=device)
    write_prefix_and_extend_slots(
        table,
        inp["req_pool_indices"],
        inp["prefix_tensors"],
        inp["prefix_lens"],
        inp["seq_lens"],
        inp["extend_lens"],
        inp["out_cache_loc"],
        backend=backend,
    )
    return table


P = POISON
#: What a correct write gives: the int32 prefix 100..105 read by value.
INT32_PREFIX_READ_CORRECTLY = [
    [7, 8, 902, P, P, P, P, P, P, P],
    [100, 101, 102, 103, 104, 105, 900, 901, P, P],
    [P, P, P, P, P, P, P, P, P, P],
]
#: What the refactored Triton kernel gives: each int64 load packs buffer[2k] (low half) and
#: buffer[2k+1] (high half); the int32 store keeps the low half, so buffer elements 0, 2, 4, ...
INT32_PREFIX_MISREAD_BY_TRITON = [
    [7, 8, 902, P, P, P, P, P, P, P],
    [100, 102, 104, 106, 108, 110, 900, 901, P, P],
    [P, P, P, P, P, P, P, P, P, P],
]


def test_refactored_triton_misreads_int32_prefix_as_packed_int64_pairs(device):
    """Faithful to SGLang: an int32 prefix violates SPEC 8's contract and the Triton kernel, which
    reads raw int64 through the pointer table, writes buffer elements 0, 2, 4, ... The int64
    prefix of the other request and both extend parts are unaffected."""
    table = run_int32_prefix(device, "triton")
    assert_tensor_equal(table, torch.tensor(INT32_PREFIX_MISREAD_BY_TRITON, dtype=torch.int32, device=device))


def test_refactored_torch_twin_reads_int32_prefix_correctly(device):
    """The torch twin of the same function copies by value, so the int32 prefix lands correctly."""
    table = run_int32_prefix(device, "torch")
    assert_tensor_equal(table, torch.tensor(INT32_PREFIX_READ_CORRECTLY, dtype=torch.int32, device=device))


def test_legacy_path_reads_int32_prefix_correctly(device, backend):
    """Legacy: a plain torch write of the prefix (any dtype accepted) followed by write_extend_slots
    gives the correct table on either backend."""
    inp = int32_misread_inputs(device)
    table = torch.full((3, 10), POISON, dtype=torch.int32, device=device)
    for row, prefix in zip(inp["req_pool_indices"].tolist(), inp["prefix_tensors"]):
        table[row, : prefix.numel()] = prefix
    write_extend_slots(
        table,
        inp["req_pool_indices"],
        inp["prefix_lens"],
        inp["seq_lens"],
        inp["extend_lens"],
        inp["out_cache_loc"],
        backend=backend,
    )
    assert_tensor_equal(table, torch.tensor(INT32_PREFIX_READ_CORRECTLY, dtype=torch.int32, device=device))


# ==================================================================================================
# get_last_loc: slot in column prefix_len - 1 of each request's row, -1 when prefix_len == 0.
# ==================================================================================================
def test_get_last_loc_small_batch_spelled_out(device, backend):
    """Rows [3, 0, 2, 1] with prefix lengths [2, 0, 8, 1] read columns 1, -, 7 (the last column)
    and 0. Only those cells hold values, the rest is POISON, so a read of any other column shows;
    row 0 (empty prefix) is all POISON and must still give -1. The table is not written."""
    P = POISON
    table = torch.tensor(
        [
            [P, P, P, P, P, P, P, P],
            [101, P, P, P, P, P, P, P],
            [201, 202, 203, 204, 205, 206, 207, 208],
            [301, 302, P, P, P, P, P, P],
        ],
        dtype=torch.int32,
        device=device,
    )
    before = table.clone()
    last = get_last_loc(table, i64([3, 0, 2, 1], device), i64([2, 0, 8, 1], device), backend=backend)
    assert_tensor_equal(last, i64([302, -1, 208, 101], device))
    assert_tensor_equal(table, before)


def test_get_last_loc_more_requests_than_one_block_of_256(device, backend):
    """600 requests (blocks of 256: 256 + 256 + 88) over 7 rows in scrambled order, prefix lengths
    cycling 0..16 (0 -> -1, 16 = the full row width). Cell (r, c) holds 1000*r + c + 1, so the
    expected value is 1000*row + prefix_len, built by a plain Python loop."""
    rows, cols, n = 7, 16, 600
    table = (
        torch.arange(rows, dtype=torch.int32)[:, None] * 1000 + torch.arange(cols, dtype=torch.int32)[None, :] + 1
    ).to(device)
    req_rows = [(5 * i + 3) % rows for i in range(n)]
    prefix_lens = [i % (cols + 1) for i in range(n)]
    expected = [-1 if p == 0 else 1000 * r + p for r, p in zip(req_rows, prefix_lens)]
    assert expected[:3] == [-1, 1001, 6002] and expected[16] == 6016 and expected[17] == -1

    last = get_last_loc(table, i64(req_rows, device), i64(prefix_lens, device), backend=backend)
    assert_tensor_equal(last, i64(expected, device))


def test_get_last_loc_triton_equals_torch_twin(device):
    """Both backends agree on a batch with empty prefixes, the last column and repeated rows."""
    table = torch.arange(3 * 5, dtype=torch.int32, device=device).reshape(3, 5) * 7 + 1
    rows, pres = i64([2, 2, 0, 1, 0], device), i64([0, 5, 1, 3, 0], device)
    assert_tensor_equal(get_last_loc(table, rows, pres, backend="triton"), get_last_loc(table, rows, pres, backend="torch"))


# ==================================================================================================
# alloc_extend (SPEC section 1, worked example: page size 4, free_pages 10..19).
# ==================================================================================================
PS = 4
EXAMPLE_PRE = [0, 5, 8, 6]
EXAMPLE_SEQ = [6, 7, 13, 14]
EXAMPLE_LAST_LOC = [-1, 12, 23, 29]
EXAMPLE_SLOTS = [
    40, 41, 42, 43, 44, 45,  # req 0: pages 10, 11 (no old page)
    13, 14,  # req 1: rest of its old page 3 only, no new page
    48, 49, 50, 51, 52,  # req 2: prefix page-aligned; pages 12, 13
    30, 31, 56, 57, 58, 59, 60, 61,  # req 3: rest of old page 7, then pages 14, 15
]  # fmt: skip
EXAMPLE_TOKENS = 21


def example_inputs(device):
    return dict(
        prefix_lens=i64(EXAMPLE_PRE, device),
        prefix_lens_cpu=torch.tensor(EXAMPLE_PRE, dtype=torch.int64),
        seq_lens=i64(EXAMPLE_SEQ, device),
        seq_lens_cpu=torch.tensor(EXAMPLE_SEQ, dtype=torch.int64),
        last_loc=i64(EXAMPLE_LAST_LOC, device),
        extend_num_tokens=EXAMPLE_TOKENS,
    )


def allocator_with_free_pages_from_10(num_pages: int, device, backend) -> PagedTokenToKVPoolAllocator:
    """A page-size-4 allocator whose free_pages are exactly 10 .. 10+num_pages-1: built with pages
    1..9+num_pages, then pages 1..9 (slots 4..39) taken by a plain alloc."""
    allocator = PagedTokenToKVPoolAllocator((9 + num_pages) * PS, PS, device, backend=backend)
    assert_tensor_equal(allocator.alloc(9 * PS), i64(list(range(4, 40)), device))
    assert_tensor_equal(allocator.free_pages, i64(list(range(10, 10 + num_pages)), device))
    return allocator


def test_alloc_extend_worked_example_through_allocator(device, backend):
    """SPEC's table, slot for slot; pages 10..15 are consumed, free_pages becomes 16..19."""
    assert sum(s - p for p, s in zip(EXAMPLE_PRE, EXAMPLE_SEQ)) == EXAMPLE_TOKENS == len(EXAMPLE_SLOTS)
    allocator = allocator_with_free_pages_from_10(10, device, backend)
    out = allocator.alloc_extend(**example_inputs(device))
    assert out is not None
    assert_tensor_equal(out, i64(EXAMPLE_SLOTS, device))
    assert_tensor_equal(allocator.free_pages, i64([16, 17, 18, 19], device))
    assert allocator.release_pages.numel() == 0
    assert allocator.available_size() == 4 * PS


def test_alloc_extend_worked_example_exact_fit_uses_every_free_page(device, backend):
    """With exactly the 6 pages the example needs (10..15), it succeeds and leaves none free."""
    allocator = allocator_with_free_pages_from_10(6, device, backend)
    out = allocator.alloc_extend(**example_inputs(device))
    assert out is not None
    assert_tensor_equal(out, i64(EXAMPLE_SLOTS, device))
    assert_tensor_equal(allocator.free_pages, i64([], device))


def test_alloc_extend_out_of_pages_returns_none_and_keeps_free_pages(device, backend):
    """The example needs 6 new pages; with only 5 free (10..14) alloc_extend returns None and
    free_pages, release_pages and available_size are unchanged."""
    allocator = allocator_with_free_pages_from_10(5, device, backend)
    assert allocator.alloc_extend(**example_inputs(device)) is None
    assert_tensor_equal(allocator.free_pages, i64([10, 11, 12, 13, 14], device))
    assert allocator.release_pages.numel() == 0
    assert allocator.available_size() == 5 * PS


def test_alloc_extend_kernel_fills_every_cell_of_poisoned_out(device, backend):
    """The kernel function writes into the given ``out`` (pre-filled with POISON), leaves no cell
    poisoned, returns that same tensor, and does not change free_pages."""
    free_pages = i64(list(range(10, 20)), device)
    out = torch.full((EXAMPLE_TOKENS,), POISON, dtype=torch.int64, device=device)
    inp = example_inputs(device)
    result = alloc_extend(
        inp["prefix_lens"], inp["seq_lens"], inp["last_loc"], free_pages, PS, EXAMPLE_TOKENS, backend=backend, out=out
    )
    assert result is out
    assert not (out == POISON).any(), f"cells left poisoned: {(out == POISON).nonzero().flatten().tolist()}"
    assert_tensor_equal(out, i64(EXAMPLE_SLOTS, device))
    assert_tensor_equal(free_pages, i64(list(range(10, 20)), device))


def test_alloc_extend_kernel_triton_equals_torch_twin(device):
    """Both backends give the worked example's slots, hence each other's."""
    inp = example_inputs(device)
    free_pages = i64(list(range(10, 20)), device)
    args = (inp["prefix_lens"], inp["seq_lens"], inp["last_loc"], free_pages, PS, EXAMPLE_TOKENS)
    assert_tensor_equal(alloc_extend(*args, backend="triton"), alloc_extend(*args, backend="torch"))


# ---- a second hand-computed example: the cases the worked example does not reach -------------------
# Page size 4, free_pages [7, 3, 9, 5, 2, 8] (unsorted: pages are taken in list order).
#
# | req | pre | seq | last_loc        | new pages | slots                                   |
# |-----|-----|-----|-----------------|-----------|-----------------------------------------|
# | 0   | 5   | 10  | 24 (page 6, +0) | 7         | 25 26 27 | 28 29                        |
# | 1   | 3   | 4   | 46 (page 11,+2) | -         | 47   (fills its old page exactly)       |
# | 2   | 0   | 1   | -1              | 3         | 12   (part 3 only)                      |
# | 3   | 2   | 11  | 49 (page 12,+1) | 9, 5      | 50 51 | 36 37 38 39 | 20 21 22          |
#
# Request 0 is the case where the old page ends exactly where whole pages would (ceil(5/4)*4 ==
# floor(10/4)*4 == 8): no part 2, yet a trailing partial page (positions 8, 9) in its new page 7.
SECOND_PRE = [5, 3, 0, 2]
SECOND_SEQ = [10, 4, 1, 11]
SECOND_LAST_LOC = [24, 46, -1, 49]
SECOND_FREE_PAGES = [7, 3, 9, 5, 2, 8]
SECOND_SLOTS = [
    25, 26, 27, 28, 29,
    47,
    12,
    50, 51, 36, 37, 38, 39, 20, 21, 22,
]  # fmt: skip
SECOND_TOKENS = 16


def test_alloc_extend_second_example_kernel_on_poisoned_out(device, backend):
    """Unsorted free_pages, a trailing partial page right after the old page (no whole page in
    between), a request that exactly fills its old page, and one that only has part 3."""
    assert sum(s - p for p, s in zip(SECOND_PRE, SECOND_SEQ)) == SECOND_TOKENS == len(SECOND_SLOTS)
    out = torch.full((SECOND_TOKENS,), POISON, dtype=torch.int64, device=device)
    free_pages = i64(SECOND_FREE_PAGES, device)
    result = alloc_extend(
        i64(SECOND_PRE, device), i64(SECOND_SEQ, device), i64(SECOND_LAST_LOC, device), free_pages, PS,
        SECOND_TOKENS, backend=backend, out=out,
    )  # fmt: skip
    assert result is out
    assert_tensor_equal(out, i64(SECOND_SLOTS, device))
    assert_tensor_equal(free_pages, i64(SECOND_FREE_PAGES, device))


def test_alloc_extend_second_example_through_allocator_after_frees(device, backend):
    """free_pages [7, 3, 9, 5, 2, 8] reached through the public API (paged free puts pages at the
    FRONT, so freeing pages 8, 2, 5, 9, 3, 7 one by one gives that order); alloc_extend then takes
    7, 3, 9, 5 and leaves [2, 8]."""
    allocator = PagedTokenToKVPoolAllocator(12 * PS, PS, device, backend=backend)
    assert allocator.alloc(12 * PS) is not None
    for page in [8, 2, 5, 9, 3, 7]:
        allocator.free(i64(ramp(page * PS, PS), device))
    assert_tensor_equal(allocator.free_pages, i64(SECOND_FREE_PAGES, device))
    out = allocator.alloc_extend(
        i64(SECOND_PRE, device), torch.tensor(SECOND_PRE, dtype=torch.int64), i64(SECOND_SEQ, device),
        torch.tensor(SECOND_SEQ, dtype=torch.int64), i64(SECOND_LAST_LOC, device), SECOND_TOKENS,
    )  # fmt: skip
    assert out is not None
    assert_tensor_equal(out, i64(SECOND_SLOTS, device))
    assert_tensor_equal(allocator.free_pages, i64([2, 8], device))


# ---- the Triton kernel's tile: SGLang passes a power of two >= the batch's token count ----------
def test_next_power_of_2_as_sglang_sizes_tiles():
    """1 for 0 and 1; otherwise the smallest power of two not below n."""
    expected = {0: 1, 1: 1, 2: 2, 3: 4, 4: 4, 5: 8, 8: 8, 9: 16, 1000: 1024, 1024: 1024}
    assert {n: next_power_of_2(n) for n in expected} == expected


@pytest.mark.parametrize("tile", [32, 64])
def test_alloc_extend_any_power_of_two_tile_at_least_the_batch_gives_the_same_slots(tile, device):
    """The allocator passes its running maximum, so the tile may exceed this batch's 21 tokens."""
    inp = example_inputs(device)
    out = alloc_extend(
        inp["prefix_lens"], inp["seq_lens"], inp["last_loc"], i64(list(range(10, 20)), device), PS,
        EXAMPLE_TOKENS, backend="triton", max_num_extend_tokens=tile,
    )  # fmt: skip
    assert_tensor_equal(out, i64(EXAMPLE_SLOTS, device))


# 16 is a power of two below the batch's 21 tokens; 40 (0b101000) is above it but no power of two,
# and shares no bit with its own double or half.
@pytest.mark.parametrize("tile", [16, 40])
def test_alloc_extend_rejects_a_tile_below_the_batch_or_not_a_power_of_two(tile, device):
    """The error names the argument and the batch's token count, and nothing is written."""
    inp = example_inputs(device)
    out = torch.full((EXAMPLE_TOKENS,), POISON, dtype=torch.int64, device=device)
    with pytest.raises(ValueError, match=f"max_num_extend_tokens={tile} must be a power of two >= 21"):
        alloc_extend(
            inp["prefix_lens"], inp["seq_lens"], inp["last_loc"], i64(list(range(10, 20)), device), PS,
            EXAMPLE_TOKENS, backend="triton", out=out, max_num_extend_tokens=tile,
        )  # fmt: skip
    assert (out == POISON).all()


# ==================================================================================================
# The Triton backend really launches Triton; the torch backend never does.
# ==================================================================================================
def _call_legacy_write(device, backend):
    case = WRITE_CASES[0]
    run_legacy_write(case, device, backend)


def _call_refactored_write(device, backend):
    run_refactored_write(WRITE_CASES[0], device, backend)


def _call_get_last_loc(device, backend):
    table = torch.full((2, 3), 5, dtype=torch.int32, device=device)
    get_last_loc(table, i64([1, 0], device), i64([2, 0], device), backend=backend)


def _call_alloc_extend(device, backend):
    inp = example_inputs(device)
    alloc_extend(inp["prefix_lens"], inp["seq_lens"], inp["last_loc"], i64(list(range(10, 20)), device), PS,
                 EXAMPLE_TOKENS, backend=backend)  # fmt: skip


KERNEL_CALLS = {
    "write_req_to_token_pool_triton": _call_legacy_write,
    "write_req_to_token_pool_with_prefix_triton": _call_refactored_write,
    "get_last_loc_kernel": _call_get_last_loc,
    "alloc_extend_kernel": _call_alloc_extend,
}


def _launch_deltas(before: dict[str, int]) -> dict[str, int]:
    keys = set(before) | set(LAUNCHES)
    return {k: LAUNCHES[k] - before.get(k, 0) for k in keys if LAUNCHES[k] != before.get(k, 0)}


@pytest.mark.parametrize("kernel_name", list(KERNEL_CALLS))
def test_triton_backend_launches_its_kernel_once_per_call(kernel_name, device):
    """Two calls on backend="triton" count exactly two launches of this kernel and nothing else,
    so "triton == torch" comparisons are never torch compared with itself."""
    before = dict(LAUNCHES)
    KERNEL_CALLS[kernel_name](device, "triton")
    assert _launch_deltas(before) == {kernel_name: 1}
    KERNEL_CALLS[kernel_name](device, "triton")
    assert _launch_deltas(before) == {kernel_name: 2}


@pytest.mark.parametrize("kernel_name", list(KERNEL_CALLS))
def test_torch_backend_launches_no_triton_kernel(kernel_name, device):
    """backend="torch" leaves every launch count unchanged."""
    before = dict(LAUNCHES)
    KERNEL_CALLS[kernel_name](device, "torch")
    assert _launch_deltas(before) == {}


def test_allocator_alloc_extend_uses_the_backend_it_was_built_with(device, backend):
    """PagedTokenToKVPoolAllocator(..., backend="triton") launches alloc_extend_kernel once per
    alloc_extend; backend="torch" launches nothing."""
    allocator = allocator_with_free_pages_from_10(10, device, backend)
    before = dict(LAUNCHES)
    allocator.alloc_extend(**example_inputs(device))
    assert _launch_deltas(before) == ({"alloc_extend_kernel": 1} if backend == "triton" else {})


# ==================================================================================================
# Invalid backend names.
# ==================================================================================================
BAD_BACKEND = "tirton"


def test_invalid_backend_raises_value_error_naming_it_in_every_kernel_and_writes_nothing(device):
    """Every public kernel function rejects an unknown backend with a ValueError that names it,
    before touching the table or ``out``."""
    case = WRITE_CASES[0]
    table = case.poisoned_table(device)
    out = torch.full((EXAMPLE_TOKENS,), POISON, dtype=torch.int64, device=device)
    inp = example_inputs(device)
    calls = {
        "write_extend_slots": lambda: write_extend_slots(
            table, case.req_pool_indices(device), case.prefix_lens(device), case.seq_lens(device),
            case.extend_lens(device), case.out_cache_loc(device), backend=BAD_BACKEND),
        "write_prefix_and_extend_slots": lambda: write_prefix_and_extend_slots(
            table, case.req_pool_indices(device), case.prefix_tensors(device), case.prefix_lens(device),
            case.seq_lens(device), case.extend_lens(device), case.out_cache_loc(device), backend=BAD_BACKEND),
        "get_last_loc": lambda: get_last_loc(table, case.req_pool_indices(device), case.prefix_lens(device),
                                             backend=BAD_BACKEND),
        "alloc_extend": lambda: alloc_extend(inp["prefix_lens"], inp["seq_lens"], inp["last_loc"],
                                             i64(list(range(10, 20)), device), PS, EXAMPLE_TOKENS,
                                             backend=BAD_BACKEND, out=out),
    }  # fmt: skip
    before = dict(LAUNCHES)
    for _name, call in calls.items():
        with pytest.raises(ValueError, match=BAD_BACKEND):
            call()
    assert _launch_deltas(before) == {}
    assert bool((table == POISON).all())
    assert bool((out == POISON).all())


def test_invalid_backend_rejected_by_allocator_constructor(device):
    with pytest.raises(ValueError, match=BAD_BACKEND):
        PagedTokenToKVPoolAllocator(64, PS, device, backend=BAD_BACKEND)


def test_backend_is_keyword_only(device):
    """Backend can never be picked up positionally (or defaulted) by accident."""
    case = WRITE_CASES[0]
    with pytest.raises(TypeError):
        get_last_loc(case.poisoned_table(device), case.req_pool_indices(device), case.prefix_lens(device), "torch")
    with pytest.raises(TypeError):
        get_last_loc(case.poisoned_table(device), case.req_pool_indices(device), case.prefix_lens(device))
