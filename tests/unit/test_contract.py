"""SPEC section 8: what a prefix handed to the refactored write must be, and how a violation is
named (request index, id, and the property at fault)."""

from __future__ import annotations

import torch

from kernels.runtime import DEVICE
from parity.contract import prefix_violations, same_device


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
