"""Kernel-level properties: each kernel entry point, on both backends, against an expectation
derived position by position from SPEC sections 1 and 5 (never from the kernel's own formulas).

One kernel launch per example, so a few hundred examples cost seconds. These are the cheap first
stage of the mutation run (scripts/mutation_score.py): they draw the shapes the hand-written unit
tests do not reach (blocks of 512 and 256 crossed at random places, many page sizes, buffers
larger than the data), and every output lives inside a poisoned buffer, so a write one cell too far
shows.
"""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from kvparity.kernels import runtime
from kvparity.kernels.alloc_extend import alloc_extend
from kvparity.kernels.last_loc import get_last_loc
from kvparity.kernels.legacy_write import write_extend_slots
from kvparity.kernels.linear_write import write_prefix_and_extend_slots_linear
from kvparity.kernels.refactored_write import write_prefix_and_extend_slots
from kvparity.model.poison import POISON

from kernel_cases import assert_tensor_equal

DEVICE = runtime.DEVICE
BACKENDS = runtime.BACKENDS
GUARD = 3  # cells of poisoned margin on each side of an output


def i64(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64, device=DEVICE)


# ---- write kernels ----------------------------------------------------------------------------------
# A length is small, or just around one block of 512 (the kernels' copy loop), so both the masked
# tail and the second block are reached.
lengths = st.one_of(st.integers(0, 6), st.integers(509, 515), st.integers(1020, 1026))


@st.composite
def write_batches(draw):
    bs = draw(st.integers(1, 4))
    pres = draw(st.lists(lengths, min_size=bs, max_size=bs))
    exts = draw(st.lists(lengths, min_size=bs, max_size=bs))
    cols = max(p + e for p, e in zip(pres, exts)) + draw(st.integers(0, 3))
    spare_rows = draw(st.integers(0, 2))
    rows = draw(st.permutations(range(bs + spare_rows)))[:bs]
    return rows, pres, exts, max(cols, 1), bs + spare_rows


def _write_inputs(rows, pres, exts):
    # Each request's values come from its own range, and prefix and extend from different ones.
    prefixes = [i64(list(range(1_000_000 * (i + 1), 1_000_000 * (i + 1) + p))) for i, p in enumerate(pres)]
    extends = [list(range(1_000_000 * (i + 1) + 500_000, 1_000_000 * (i + 1) + 500_000 + e)) for i, e in enumerate(exts)]
    out_cache_loc = i64([v for e in extends for v in e])
    return prefixes, extends, out_cache_loc


def _expected(n_rows, cols, rows, prefixes, extends, with_prefix):
    expected = torch.full((n_rows, cols), POISON, dtype=torch.int32, device=DEVICE)
    for row, prefix, extend in zip(rows, prefixes, extends):
        pre = prefix.numel()
        if with_prefix:
            expected[row, 0:pre] = prefix.to(torch.int32)
        expected[row, pre : pre + len(extend)] = torch.tensor(extend, dtype=torch.int32)
    return expected


@given(batch=write_batches())
def test_legacy_write_kernel_writes_exactly_the_extend_cells(batch):
    rows, pres, exts, cols, n_rows = batch
    prefixes, extends, out_cache_loc = _write_inputs(rows, pres, exts)
    expected = _expected(n_rows, cols, rows, prefixes, extends, with_prefix=False)
    for backend in BACKENDS:
        table = torch.full((n_rows, cols), POISON, dtype=torch.int32, device=DEVICE)
        write_extend_slots(table, i64(rows), i64(pres), i64([p + e for p, e in zip(pres, exts)]), i64(exts),
                           out_cache_loc, backend=backend)
        assert_tensor_equal(table, expected)


def check_prefix_and_extend_write(batch, write) -> None:
    """``write(table, rows, prefixes, prefix_lens, seq_lens, extend_lens, exts, out, backend)``
    leaves each row its prefix then its new slots, on both backends, POISON everywhere else."""
    rows, pres, exts, cols, n_rows = batch
    prefixes, extends, out_cache_loc = _write_inputs(rows, pres, exts)
    # The refactored default for an empty prefix (data_ptr() 0: it must never be read).
    prefixes = [p if p.numel() else torch.empty((0,), dtype=torch.int64, device=DEVICE) for p in prefixes]
    expected = _expected(n_rows, cols, rows, prefixes, extends, with_prefix=True)
    for backend in BACKENDS:
        table = torch.full((n_rows, cols), POISON, dtype=torch.int32, device=DEVICE)
        write(table, i64(rows), prefixes, i64(pres), i64([p + e for p, e in zip(pres, exts)]), i64(exts), exts,
              out_cache_loc, backend)
        assert_tensor_equal(table, expected)


@given(batch=write_batches())
def test_refactored_write_kernel_writes_prefix_and_extend_cells(batch):
    check_prefix_and_extend_write(
        batch, lambda table, rows, prefixes, pre, seq, ext, _, out, backend: write_prefix_and_extend_slots(
            table, rows, prefixes, pre, seq, ext, out, backend=backend))


@st.composite
def linear_batches(draw):
    # More requests than the linear kernel puts in one program (2 to 32 by row length), a ragged
    # last program, and rows crossing its 1,024-column chunks (lengths up to 2,052).
    bs = draw(st.one_of(st.integers(1, 4), st.integers(31, 37)))
    pres = draw(st.lists(lengths, min_size=bs, max_size=bs))
    exts = draw(st.lists(st.one_of(st.integers(0, 6), lengths), min_size=bs, max_size=bs))
    cols = max(p + e for p, e in zip(pres, exts)) + draw(st.integers(0, 3))
    rows = draw(st.permutations(range(bs + 1)))[:bs]
    return rows, pres, exts, max(cols, 1), bs + 1


@given(batch=linear_batches())
def test_linear_write_kernel_writes_prefix_and_extend_cells(batch):
    check_prefix_and_extend_write(
        batch, lambda table, rows, prefixes, pre, seq, ext, exts, out, backend: write_prefix_and_extend_slots_linear(
            table, rows, prefixes, pre, seq, ext, torch.tensor(exts, dtype=torch.int64), out, backend=backend))


# ---- get_last_loc -------------------------------------------------------------------------------------
@st.composite
def last_loc_batches(draw):
    # Up to a little over two blocks of 256 requests; rows may repeat (several requests, one row).
    bs = draw(st.one_of(st.integers(0, 5), st.integers(250, 520)))
    n_rows = draw(st.integers(1, 6))
    cols = draw(st.integers(1, 9))
    rows = draw(st.lists(st.integers(0, n_rows - 1), min_size=bs, max_size=bs))
    pres = draw(st.lists(st.integers(0, cols), min_size=bs, max_size=bs))
    return n_rows, cols, rows, pres


@given(batch=last_loc_batches())
def test_get_last_loc_is_column_prefix_len_minus_one_or_minus_one(batch):
    n_rows, cols, rows, pres = batch
    # Every cell distinct and positive, so a read of the wrong cell shows.
    table = (torch.arange(n_rows * cols, dtype=torch.int32, device=DEVICE) + 1).reshape(n_rows, cols)
    expected = i64([int(table[r, p - 1]) if p > 0 else -1 for r, p in zip(rows, pres)])
    for backend in BACKENDS:
        before = table.clone()
        result = get_last_loc(table, i64(rows), i64(pres), backend=backend)
        assert_tensor_equal(result, expected)
        assert_tensor_equal(table, before)


# ---- alloc_extend -----------------------------------------------------------------------------------
@st.composite
def alloc_batches(draw):
    ps = draw(st.sampled_from([2, 4, 8, 16]))
    bs = draw(st.integers(1, 6))
    reqs = []
    for _ in range(bs):
        pre = draw(st.integers(0, 3 * ps))
        seq = pre + draw(st.integers(0, 3 * ps + 1))
        reqs.append((pre, seq))
    needed = sum(-(-s // ps) - -(-p // ps) for p, s in reqs)
    spare = draw(st.integers(0, 3))
    pages = draw(st.permutations(range(1, needed + spare + 40)))[: needed + spare]
    # last_loc: the slot of position pre-1 in some old page that is not a free page (-1 when pre==0).
    old_pages = draw(st.lists(st.integers(100, 200), min_size=bs, max_size=bs))
    last_locs = [op * ps + (p - 1) % ps if p > 0 else -1 for op, (p, _) in zip(old_pages, reqs)]
    return ps, reqs, pages, last_locs


def _expected_slots(ps, reqs, pages, last_locs):
    """SPEC section 1, one position at a time: inside the old page, the slot after last_loc; past
    it, the j-th new page of the request (taken in order after the earlier requests' pages)."""
    slots, next_page = [], 0
    for (pre, seq), last in zip(reqs, last_locs):
        old_end = -(-pre // ps) * ps
        for pos in range(pre, seq):
            if pos < old_end:
                slots.append(last + 1 + (pos - pre))
            else:
                page = pages[next_page + (pos - old_end) // ps]
                slots.append(page * ps + pos % ps)
        next_page += -(-seq // ps) - -(-pre // ps)
    return slots


@given(batch=alloc_batches())
def test_alloc_extend_kernel_slots_position_by_position(batch):
    ps, reqs, pages, last_locs = batch
    expected = _expected_slots(ps, reqs, pages, last_locs)
    n = len(expected)
    pres, seqs = i64([p for p, _ in reqs]), i64([s for _, s in reqs])
    for backend in BACKENDS:
        free_pages = i64(pages)
        buffer = torch.full((n + 2 * GUARD,), POISON, dtype=torch.int64, device=DEVICE)
        out = buffer[GUARD : GUARD + n]
        result = alloc_extend(pres, seqs, i64(last_locs), free_pages, ps, n, backend=backend, out=out)
        assert result is out
        assert_tensor_equal(out, i64(expected))
        assert_tensor_equal(buffer[:GUARD], i64([POISON] * GUARD))
        assert_tensor_equal(buffer[GUARD + n :], i64([POISON] * GUARD))
        assert_tensor_equal(free_pages, i64(pages))
