"""Tests written for mutants that survived the first mutation run (docs/mutation.md names each).

Each test pins a behaviour of SPEC sections 4, 5 and 9 that no earlier test checked directly; the
docstring says which cosmic-ray mutant it kills (the score script runs these in its fast stage).
"""

from __future__ import annotations

import pytest
import torch

from kvparity.judge.exact import assert_exact
from kvparity.kernels.alloc_extend import alloc_extend
from kvparity.kernels.last_loc import get_last_loc
from kvparity.kernels.launches import LAUNCHES, launch_count
from kvparity.kernels.legacy_write import write_extend_slots
from kvparity.kernels.linear_write import write_prefix_and_extend_slots_linear
from kvparity.kernels.refactored_write import write_prefix_and_extend_slots
from kvparity.kernels.runtime import BACKENDS, DEVICE
from kvparity.mem_cache.memory_pool import ReqToTokenPool
from kvparity.model.poison import POISON
from kvparity.refactored.schedule_batch import last_loc_from_prefixes, write_cache_indices


def i64(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64, device=DEVICE)


def test_last_loc_from_prefixes_of_a_one_element_prefix_is_that_element():
    """SPEC 4.3: the last element of each prefix, -1 only when it is EMPTY. Kills
    ``len(p) > 0`` -> ``len(p) > 1`` in ``last_loc_from_prefixes`` (a one-slot prefix given -1)."""
    prefixes = [i64([7]), torch.empty((0,), dtype=torch.int64), i64([3, 9])]
    assert_exact(last_loc_from_prefixes(prefixes, DEVICE), i64([7, -1, 9]))


@pytest.mark.parametrize("backend", BACKENDS)
def test_write_cache_indices_takes_sglang_parameter_names_as_keywords(backend):
    """SPEC 9: a plug-in candidate has SGLang's exact signature, so every parameter can be passed by
    its name, and ``backend`` (this repository's addition) only by keyword. Kills the keyword-only
    marker ``*,`` turned into the positional-only marker ``/,`` by cosmic-ray's ``Mul_Div``."""
    pool = ReqToTokenPool(2, 6, DEVICE)
    pool.req_to_token.fill_(POISON)
    lens = dict(
        req_pool_indices_tensor=i64([1]),
        req_pool_indices_cpu=torch.tensor([1]),
        prefix_lens_tensor=i64([2]),
        prefix_lens_cpu=torch.tensor([2]),
        seq_lens_tensor=i64([5]),
        seq_lens_cpu=torch.tensor([5]),
        extend_lens_tensor=i64([3]),
        extend_lens_cpu=torch.tensor([3]),
    )
    write_cache_indices(out_cache_loc=i64([30, 31, 32]), prefix_tensors=[i64([10, 11])],
                        req_to_token_pool=pool, backend=backend, **lens)
    expected = torch.full((2, 6), POISON, dtype=torch.int32, device=DEVICE)
    expected[1, :5] = torch.tensor([10, 11, 30, 31, 32], dtype=torch.int32)
    assert_exact(pool.req_to_token, expected)
    with pytest.raises(TypeError):
        write_cache_indices(i64([30, 31, 32]), *lens.values(), [i64([10, 11])], pool, backend)


# ---- kernel entry points: empty batches and the backend string ---------------------------------------
def _empty_calls(table: torch.Tensor, backend: str) -> dict:
    empty = i64([])
    return {
        "write_req_to_token_pool_triton": lambda: write_extend_slots(
            table, empty, empty, empty, empty, empty, backend=backend),
        "write_req_to_token_pool_with_prefix_triton": lambda: write_prefix_and_extend_slots(
            table, empty, [], empty, empty, empty, empty, backend=backend),
        "write_req_to_token_pool_linear_triton": lambda: write_prefix_and_extend_slots_linear(
            table, empty, [], empty, empty, empty, torch.tensor([], dtype=torch.int64), empty, backend=backend),
        "get_last_loc_kernel": lambda: get_last_loc(table, empty, empty, backend=backend),
        "alloc_extend_kernel": lambda: alloc_extend(empty, empty, empty, i64([3, 4]), 4, 0, backend=backend),
    }


@pytest.mark.parametrize("kernel_name", list(_empty_calls(torch.empty(0), "triton")))
def test_empty_batch_launches_no_kernel_and_writes_nothing(kernel_name):
    """An empty batch returns before the launch: no Triton program runs (LAUNCHES, the counter that
    proves the Triton backend ran Triton, stays put) and the table keeps its poison. Kills the
    early-return guards ``bs == 0`` / ``num_reqs == 0`` turned into ``== -1`` or ``< 0`` (the
    linear write, not SGLang's, included)."""
    table = torch.full((2, 4), POISON, dtype=torch.int32, device=DEVICE)
    before = launch_count(kernel_name)
    result = _empty_calls(table, "triton")[kernel_name]()
    assert launch_count(kernel_name) == before
    assert_exact(table, torch.full((2, 4), POISON, dtype=torch.int32, device=DEVICE))
    if result is not None:
        assert result.numel() == 0 and result.dtype == torch.int64


def test_backend_compared_by_value_not_identity():
    """A backend name built at run time (from a command line, a config file) is an equal but
    distinct string: it must choose the torch twin all the same. Kills ``backend == "torch"``
    turned into ``backend is "torch"`` in the kernel entry points."""
    torch_name = "".join(["tor", "ch"])  # equal to "torch", not the interned literal
    assert torch_name == "torch" and torch_name is not "torch"  # noqa: F632  (the point of the test)
    table = torch.full((2, 4), POISON, dtype=torch.int32, device=DEVICE)
    before = sum(LAUNCHES.values())
    write_extend_slots(table, i64([1]), i64([1]), i64([3]), i64([2]), i64([7, 8]), backend=torch_name)
    write_prefix_and_extend_slots(table, i64([0]), [i64([5])], i64([1]), i64([2]), i64([1]), i64([9]),
                                  backend=torch_name)
    linear = torch.full((2, 4), POISON, dtype=torch.int32, device=DEVICE)
    write_prefix_and_extend_slots_linear(linear, i64([0]), [i64([5])], i64([1]), i64([2]), i64([1]),
                                         torch.tensor([1]), i64([9]), backend=torch_name)
    last = get_last_loc(table, i64([1, 0]), i64([3, 0]), backend=torch_name)
    slots = alloc_extend(i64([0]), i64([3]), i64([-1]), i64([6]), 4, 3, backend=torch_name)
    assert sum(LAUNCHES.values()) == before, "a torch-backend call launched a Triton kernel"
    expected = torch.tensor([[5, 9, POISON, POISON], [POISON, 7, 8, POISON]], dtype=torch.int32, device=DEVICE)
    assert_exact(table, expected)
    assert_exact(linear[0], expected[0])
    assert_exact(last, i64([8, -1]))
    assert_exact(slots, i64([24, 25, 26]))


def test_alloc_extend_empty_batch_checks_its_token_count():
    """An empty batch must ask for 0 tokens: it returns an empty ``out`` for 0 and raises
    ValueError for any other count. Kills the mutants of ``if extend_num_tokens != 0``."""
    empty = i64([])
    assert alloc_extend(empty, empty, empty, i64([3]), 4, 0, backend="torch").numel() == 0
    for backend in BACKENDS:
        with pytest.raises(ValueError, match="extend_num_tokens=3"):
            alloc_extend(empty, empty, empty, i64([3]), 4, 3, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_alloc_extend_takes_its_arguments_by_name(backend):
    """Every argument of ``alloc_extend`` can be named, ``backend`` only by keyword. Kills the
    keyword-only marker ``*,`` turned into the positional-only marker ``/,``."""
    slots = alloc_extend(prefix_lens=i64([0]), seq_lens=i64([3]), last_loc=i64([-1]), free_pages=i64([6]),
                         page_size=4, extend_num_tokens=3, backend=backend)
    assert_exact(slots, i64([24, 25, 26]))
    with pytest.raises(TypeError):
        alloc_extend(i64([0]), i64([3]), i64([-1]), i64([6]), 4, 3, backend)
