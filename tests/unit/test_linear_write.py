"""The linear-time write kernel (``kernels/linear_write.py``, not SGLang code): the refactored
write's effect (SPEC section 5) with each request's start in ``out_cache_loc`` computed once on the
host, instead of by a serial loop in every program.

Expectations come from ``kernel_cases``' literal tables; tables are POISONed first and every cell
the kernel must not write is checked to still hold POISON. The same kernel is also an extra world of
the parity harness (``refactored-linear/triton``) and a ``kvparity check`` candidate."""

from __future__ import annotations

import pytest
import torch

from kvparity.kernels.launches import LAUNCHES
from kvparity.kernels.linear_write import pointers_and_starts, write_cache_indices, write_prefix_and_extend_slots_linear
from kvparity.kernels.refactored_write import write_prefix_and_extend_slots
from kvparity.mem_cache.memory_pool import ReqToTokenPool
from kvparity.run.runner import ALL_WORLDS

from kernel_cases import WRITE_CASES, assert_tensor_equal, assert_untouched_is_poison

CASE_IDS = [c.name for c in WRITE_CASES]


def run_linear_write(case, device, backend) -> torch.Tensor:
    table = case.poisoned_table(device)
    write_prefix_and_extend_slots_linear(
        table,
        case.req_pool_indices(device),
        case.prefix_tensors(device),
        case.prefix_lens(device),
        case.seq_lens(device),
        case.extend_lens(device),
        case.extend_lens(torch.device("cpu")),
        case.out_cache_loc(device),
        backend=backend,
    )
    return table


def test_pointers_and_starts_holds_addresses_then_exclusive_offsets(device):
    """Extend lengths [3, 0, 5, 2] start at [0, 3, 3, 8] in out_cache_loc; the empty prefix's
    address is 0 and the others are their tensors' data_ptr()."""
    prefixes = [torch.tensor([7, 8], dtype=torch.int64, device=device), torch.empty((0,), dtype=torch.int64, device=device),
                torch.tensor([9], dtype=torch.int64, device=device), torch.tensor([4, 5, 6], dtype=torch.int64, device=device)]
    table = pointers_and_starts(prefixes, torch.tensor([3, 0, 5, 2]), device)
    assert table.dtype == torch.int64 and table.shape == (8,) and table.device.type == device.type
    assert table.tolist() == [prefixes[0].data_ptr(), 0, prefixes[2].data_ptr(), prefixes[3].data_ptr(), 0, 3, 3, 8]


def test_pointers_and_starts_rejects_a_length_list_of_another_batch(device):
    prefixes = [torch.empty((0,), dtype=torch.int64, device=device)] * 3
    with pytest.raises(ValueError, match="extend_lens_cpu has 2 entries but there are 3 prefix tensors"):
        pointers_and_starts(prefixes, torch.tensor([1, 2]), device)


@pytest.mark.parametrize("case", WRITE_CASES, ids=CASE_IDS)
def test_linear_write_matches_hand_built_table(case, device, backend):
    """[0, prefix_len) gets the prefix and [prefix_len, seq_len) the request's new slots; every
    other cell stays POISON (lengths over the block size, empty prefixes, zero-length extends)."""
    table = run_linear_write(case, device, backend)
    assert table.dtype == torch.int32 and table.device.type == device.type
    assert_untouched_is_poison(table, case.written_mask(with_prefix=True))
    assert_tensor_equal(table, case.expected_table(device, with_prefix=True))


@pytest.mark.parametrize("case", WRITE_CASES, ids=CASE_IDS)
def test_linear_write_equals_serial_refactored_kernel(case, device):
    serial = case.poisoned_table(device)
    write_prefix_and_extend_slots(
        serial, case.req_pool_indices(device), case.prefix_tensors(device), case.prefix_lens(device),
        case.seq_lens(device), case.extend_lens(device), case.out_cache_loc(device), backend="triton",
    )
    assert_tensor_equal(run_linear_write(case, device, "triton"), serial)


def test_triton_backend_launches_the_linear_kernel_not_the_serial_one(device):
    case = WRITE_CASES[0]
    before = LAUNCHES.copy()
    run_linear_write(case, device, "triton")
    assert LAUNCHES["write_req_to_token_pool_linear_triton"] == before["write_req_to_token_pool_linear_triton"] + 1
    assert LAUNCHES["write_req_to_token_pool_with_prefix_triton"] == before["write_req_to_token_pool_with_prefix_triton"]


def test_sglang_signature_entry_writes_through_the_pool(device):
    """``write_cache_indices`` with SGLang's 11 parameters writes ``req_to_token_pool.req_to_token``
    (the form ``kvparity check --candidate kvparity.kernels.linear_write:write_cache_indices`` loads)."""
    case = WRITE_CASES[0]
    pool = ReqToTokenPool(case.rows, case.cols, device)
    pool.req_to_token.copy_(case.poisoned_table(device))
    cpu = torch.device("cpu")
    write_cache_indices(
        case.out_cache_loc(device), case.req_pool_indices(device), case.req_pool_indices(cpu),
        case.prefix_lens(device), case.prefix_lens(cpu), case.seq_lens(device), case.seq_lens(cpu),
        case.extend_lens(device), case.extend_lens(cpu), case.prefix_tensors(device), pool,
    )
    assert_tensor_equal(pool.req_to_token, case.expected_table(device, with_prefix=True))


def test_the_linear_kernel_is_an_extra_world_of_the_harness():
    assert ("refactored-linear", "triton") in ALL_WORLDS


def test_more_requests_than_one_program_takes_and_a_ragged_last_program(device, backend):
    """Nine requests (not a multiple of the kernel's requests per program, LINEAR_REQS = 4) with
    scrambled rows, mixed empty and long prefixes and a zero-length extend: every row exactly its
    literal contents, nothing else written."""
    from kernel_cases import Req, WriteCase, ramp

    lengths = [(0, 3), (5, 0), (600, 2), (1, 1), (0, 530), (7, 9), (2, 0), (0, 1), (300, 300)]
    rows = [4, 9, 0, 7, 2, 8, 1, 5, 3]
    reqs = tuple(Req(row=r, prefix=ramp(10_000 * (i + 1), p), extend=ramp(10_000 * (i + 1) + 5_000, e))
                 for i, (r, (p, e)) in enumerate(zip(rows, lengths)))
    case = WriteCase("nine_requests", rows=11, cols=620, reqs=reqs)
    table = run_linear_write(case, device, backend)
    assert_untouched_is_poison(table, case.written_mask(with_prefix=True))
    assert_tensor_equal(table, case.expected_table(device, with_prefix=True))


@pytest.mark.parametrize("longest, tile", [(1, (32, 16, 16)), (136, (8, 256, 256)), (602, (2, 1024, 1024)),
                                           (1024, (2, 1024, 1024)), (1025, (4, 256, 1024)), (4608, (4, 256, 1024))])
def test_tile_covers_the_longest_row(longest, tile):
    """Rows up to 1,024 cells: one tile per program at least as wide as the longest row; longer rows:
    1,024-column chunks, one program each. The tests above use both (rows of 602 and of 1,100)."""
    from kvparity.kernels.linear_write import linear_tile

    reqs, cols, chunk = linear_tile(longest)
    assert (reqs, cols, chunk) == tile
    assert cols >= min(longest, 1024) or chunk == 1024


def test_tile_sizes_are_integers():
    """Triton takes REQS, COLS and CHUNK as constexprs for tl.arange and the grid: a float (e.g.
    ``2048 / 1024 == 2.0``) is accepted by the interpreter but not by the compiler, so the tile
    must be ints of exactly the values above."""
    from kvparity.kernels.linear_write import linear_tile

    for longest in (0, 1, 15, 16, 17, 100, 129, 300, 602, 1024, 1025, 5000):
        assert all(type(v) is int for v in linear_tile(longest)), (longest, linear_tile(longest))


def test_pointers_and_starts_for_a_batch_of_300(device):
    """More requests than CPython's small-int cache (256): the length check compares values."""
    prefixes = [torch.empty((0,), dtype=torch.int64, device=device)] * 300
    table = pointers_and_starts(prefixes, torch.ones(300, dtype=torch.int64), device)
    assert table[300:].tolist() == list(range(300))


def test_pointers_and_starts_rejects_more_lengths_than_prefixes(device):
    prefixes = [torch.empty((0,), dtype=torch.int64, device=device)] * 3
    with pytest.raises(ValueError, match="extend_lens_cpu has 4 entries but there are 3 prefix tensors"):
        pointers_and_starts(prefixes, torch.tensor([1, 2, 3, 4]), device)


def test_every_parameter_can_be_passed_by_name(device, backend):
    """SGLang's names (SPEC 9) for ``write_cache_indices``, the entry point's own names for
    ``write_prefix_and_extend_slots_linear``; ``backend`` keyword-only in both."""
    case = WRITE_CASES[0]
    cpu = torch.device("cpu")
    pool = ReqToTokenPool(case.rows, case.cols, device)
    pool.req_to_token.copy_(case.poisoned_table(device))
    write_cache_indices(
        out_cache_loc=case.out_cache_loc(device), req_pool_indices_tensor=case.req_pool_indices(device),
        req_pool_indices_cpu=case.req_pool_indices(cpu), prefix_lens_tensor=case.prefix_lens(device),
        prefix_lens_cpu=case.prefix_lens(cpu), seq_lens_tensor=case.seq_lens(device), seq_lens_cpu=case.seq_lens(cpu),
        extend_lens_tensor=case.extend_lens(device), extend_lens_cpu=case.extend_lens(cpu),
        prefix_tensors=case.prefix_tensors(device), req_to_token_pool=pool, backend=backend,
    )
    assert_tensor_equal(pool.req_to_token, case.expected_table(device, with_prefix=True))
    table = case.poisoned_table(device)
    write_prefix_and_extend_slots_linear(
        req_to_token=table, req_pool_indices=case.req_pool_indices(device), prefix_tensors=case.prefix_tensors(device),
        prefix_lens=case.prefix_lens(device), seq_lens=case.seq_lens(device), extend_lens=case.extend_lens(device),
        extend_lens_cpu=case.extend_lens(cpu), out_cache_loc=case.out_cache_loc(device), backend=backend,
        seq_lens_cpu=case.seq_lens(cpu),
    )
    assert_tensor_equal(table, case.expected_table(device, with_prefix=True))
