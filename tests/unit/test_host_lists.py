"""``runtime.host_lists``: many small device tensors read back in one transfer, each as its own
``tolist``. On the CPU nothing is batched, so the tests batch CPU tensors to exercise the split."""

import pytest
import torch

from kvparity.kernels import runtime


@pytest.fixture
def batch_cpu_tensors(monkeypatch):
    monkeypatch.setattr(runtime, "_batchable", lambda t: t.dim() == 1 and t.numel() > 0 and t.dtype in runtime.INT_DTYPES)


def test_each_tensor_gets_its_own_values_back(batch_cpu_tensors):
    """Mixed dtypes, an empty tensor and a 2-D one in between: every list is the tensor's tolist."""
    tensors = [
        torch.tensor([5, 6, 7], dtype=torch.int64),
        torch.tensor([], dtype=torch.int64),
        torch.tensor([9], dtype=torch.int32),
        torch.tensor([[1, 2], [3, 4]], dtype=torch.int32),
        torch.tensor([0, 2**40], dtype=torch.int64),
    ]
    assert runtime.host_lists(tensors) == [[5, 6, 7], [], [9], [[1, 2], [3, 4]], [0, 2**40]]


def test_values_stay_python_ints(batch_cpu_tensors):
    """An int32 tensor batched with an int64 one still gives ints (the promotion is invisible)."""
    lists = runtime.host_lists([torch.tensor([1], dtype=torch.int32), torch.tensor([2**33])])
    assert lists == [[1], [2**33]] and all(type(v) is int for part in lists for v in part)


def test_cpu_tensors_are_not_batched():
    """On the CPU each tensor is read as it is: nothing is concatenated."""
    assert not runtime._batchable(torch.tensor([1, 2]))
    assert runtime.host_lists([torch.tensor([1, 2]), torch.tensor([3])]) == [[1, 2], [3]]
