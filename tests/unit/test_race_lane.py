"""The race lane: inputs that would make write programs race are refused, not compared.

Two requests in one row are two programs writing one row at the same time. On the CPU the Triton
interpreter runs programs one after another, so the last request simply wins; on a GPU the winner of
each cell depends on scheduling, and legacy and refactored can even *agree by luck*. kvparity
therefore refuses such a batch (and every other SPEC section 8 violation) by its input checks before
anything runs or is compared. The nightly GPU job runs this file on CUDA (``scripts/nightly_gpu.sh``);
the last test runs only there and shows the race itself."""

from __future__ import annotations

import json

import pytest
import torch

from kvparity.candidate.check import replay_batch
from kvparity.candidate.inputs import KernelBatch, contract_violations
from kvparity.kernels import runtime
from kvparity.kernels.linear_write import write_prefix_and_extend_slots_linear
from kvparity.kernels.refactored_write import write_prefix_and_extend_slots
from kvparity.model.contract import ContractError, check_write_inputs, write_input_violations
from kvparity.model.poison import POISON

from kernel_cases import WRITE_CASES


def i64(values, device=None) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64, device=device or runtime.DEVICE)


def shared_row_batch(device, width=600):
    """Requests 0 and 2 both in row 1, each writing columns [0, 520) with its own values."""
    prefixes = [i64(list(range(1000, 1010)), device), torch.empty((0,), dtype=torch.int64, device=device),
                torch.empty((0,), dtype=torch.int64, device=device)]
    seq = [520, 3, 520]
    ext = [510, 3, 520]
    out = i64(list(range(2000, 2510)) + [7, 8, 9] + list(range(5000, 5520)), device)
    table = torch.full((3, width), POISON, dtype=torch.int32, device=device)
    return table, i64([1, 0, 1], device), prefixes, i64([10, 0, 0], device), i64(seq, device), i64(ext, device), out


def valid_args(case, device):
    return (case.poisoned_table(device), case.req_pool_indices(device), case.prefix_tensors(device),
            case.prefix_lens(device), case.seq_lens(device), case.extend_lens(device), case.out_cache_loc(device))


def test_requests_sharing_a_row_are_refused_naming_them(device):
    problems = write_input_violations(*shared_row_batch(device))
    assert problems == ["requests 0, 2 share row 1: their programs would race on it"]
    with pytest.raises(ContractError, match="requests 0, 2 share row 1"):
        check_write_inputs(*shared_row_batch(device))


@pytest.mark.parametrize("case", WRITE_CASES, ids=[c.name for c in WRITE_CASES])
def test_valid_batches_pass_the_input_checks(case, device):
    assert write_input_violations(*valid_args(case, device)) == []


def test_every_other_spec8_violation_is_named(device):
    table, rows, prefixes, pre, seq, ext, out = valid_args(WRITE_CASES[0], device)
    bad_prefixes = [prefixes[0].to(torch.int32), prefixes[1], prefixes[2][:1]]
    problems = write_input_violations(table, i64([3, 0, 9], device), bad_prefixes, pre, seq, ext, out[:-1])
    assert problems == [
        "request 2: row 9 is outside [0, 5)",
        "request 0 ('#0') prefix_indices has dtype torch.int32, not torch.int64",
        "request 2: prefix has 1 elements but prefix_len is 2",
        "out_cache_loc has 8 slots but extend_lens sum to 9",
    ]
    assert write_input_violations(table.t(), rows, prefixes, pre, seq, ext.to(torch.int32), out)[:2] == [
        "req_to_token must be int32, 2-D, contiguous (got torch.int32, shape (12, 5), contiguous=False)",
        "extend_lens has dtype torch.int32, not torch.int64",
    ]


def test_replay_refuses_a_shared_row_batch_before_running_the_candidate():
    """``kvparity``'s replay of a user's batch (what a ``--repro`` script calls) checks the batch
    first: the candidate is never loaded, so no verdict can come from a racy run."""
    batch = KernelBatch("write_cache_indices", rows=(1, 0, 1), prefixes=((), (), ()), seq_lens=(2, 1, 2),
                        pool_rows=2, width=4, out_cache_loc=(1, 2, 3, 4, 5))
    assert contract_violations(batch) == ["rows (1, 0, 1) are not distinct rows of [0, 2)"]
    with pytest.raises(ContractError, match=r"rows \(1, 0, 1\) are not distinct"):
        replay_batch("write_cache_indices", "no.such.module:never_loaded", batch.to_json())
    assert json.loads(batch.to_json())["rows"] == [1, 0, 1]


@pytest.mark.skipif(runtime.DEVICE.type != "cuda", reason="the race only exists with compiled kernels on a GPU")
@pytest.mark.parametrize("write", ["refactored", "linear"])
def test_on_the_gpu_a_shared_row_is_written_by_both_programs_and_refused(write, device):
    """Compiled, both programs really write row 1: every cell of [0, 520) holds a value of request
    0 or of request 2 (which one is up to the GPU), and nothing outside the batch's cells changes.
    The input checks refuse the batch, which is what keeps such a run out of any verdict."""
    args = shared_row_batch(device)
    with pytest.raises(ContractError):
        check_write_inputs(*args)
    table, rows, prefixes, pre, seq, ext, out = args
    if write == "refactored":
        write_prefix_and_extend_slots(table, rows, prefixes, pre, seq, ext, out, backend="triton")
    else:
        write_prefix_and_extend_slots_linear(table, rows, prefixes, pre, seq, ext, ext.cpu(), out, backend="triton")
    torch.cuda.synchronize()
    row = table[1, :520].tolist()
    first = list(range(1000, 1010)) + list(range(2000, 2510))
    second = list(range(5000, 5520))
    assert all(v in (a, b) for v, a, b in zip(row, first, second)), "a cell holds neither request's value"
    assert table[1, 520:].eq(POISON).all() and table[2].eq(POISON).all()
    won = sum(v == b for v, b in zip(row, second))
    print(f"\n{write}: request 2 won {won} of 520 cells of the shared row, request 0 the other {520 - won}")
