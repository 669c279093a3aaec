"""SPEC section 8: what a prefix handed to the refactored write must be, and how a violation is
named (request index, id, and the property at fault)."""

from __future__ import annotations

import torch

from kvparity.kernels.runtime import DEVICE
from kvparity.model.contract import prefix_violations, same_device


def test_contiguous_int64_prefix_and_empty_cpu_default_pass():
    assert prefix_violations(torch.arange(4, dtype=torch.int64, device=DEVICE), 0, "r0", DEVICE) == []
    assert prefix_violations(torch.empty((0,), dtype=torch.int64), 1, "r1", DEVICE) == []


def test_each_violation_is_named():
    assert prefix_violations([], 2, "r2", DEVICE) == ["request 2 ('r2') prefix_indices is a list, not a tensor"]
    int32 = torch.arange(4, dtype=torch.int32, device=DEVICE)
    assert prefix_violations(int32, 0, "a", DEVICE) == ["request 0 ('a') prefix_indices has dtype torch.int32, not torch.int64"]
    strided = torch.arange(8, dtype=torch.int64, device=DEVICE)[::2]
    assert "is not contiguous" in prefix_violations(strided, 0, "a", DEVICE)[0]
    matrix = torch.zeros((2, 2), dtype=torch.int64, device=DEVICE)
    assert "has 2 dimensions, not 1" in prefix_violations(matrix, 0, "a", DEVICE)[0]
    elsewhere = torch.arange(3, dtype=torch.int64, device="meta")
    assert "is on meta, not on the pool's device" in prefix_violations(elsewhere, 0, "a", DEVICE)[0]


def test_same_device_ignores_the_default_index_only():
    assert same_device(torch.device("cpu"), torch.device("cpu"))
    assert not same_device(torch.device("cpu"), torch.device("meta"))
    if torch.cuda.is_available():
        assert same_device(torch.device("cuda"), torch.device("cuda", torch.cuda.current_device()))


def test_length_findings_is_the_one_spec8_check_of_tensors_and_plain_batches():
    """``length_findings`` by hand: a row outside the table, two requests in one row, two requests
    breaking 0 <= prefix_len <= seq_len <= width, one slot too few. The plain batch words them its way."""
    from kvparity.candidate.inputs import KernelBatch, contract_violations
    from kvparity.model.contract import LengthFindings, length_findings

    found = length_findings([0, 3, 0], [1, 0, 2], [2, 5, 1], height=2, width=4, slots=3, extend_total=4)
    assert found == LengthFindings(rows_outside=((1, 3),), shared_rows=((0, (0, 2)),), misordered=(1, 2),
                                   slot_count=(3, 4))
    assert not found.rows_ok
    assert length_findings([1, 0], [0, 4], [4, 4], height=2, width=4, slots=4, extend_total=4) == LengthFindings()
    batch = KernelBatch("write_cache_indices", rows=(1, 0), prefixes=((), (1, 2, 3)), seq_lens=(5, 2), pool_rows=2,
                        width=4, out_cache_loc=(4,))
    assert contract_violations(batch) == [
        "request 0: not 0 <= prefix_len 0 <= seq_len 5 <= width 4",
        "request 1: not 0 <= prefix_len 3 <= seq_len 2 <= width 4",
        "out_cache_loc has 1 slots, extend lens sum to 4",
    ]
