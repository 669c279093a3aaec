"""Decide, once per process, where tensors live and how Triton runs.

Triton fixes interpreter-or-compiled when a kernel is *decorated*, and the interpreter cannot
follow a pointer table into CUDA memory. So the choice is made here, before any kernel module is
imported, and never changes afterwards:

- no CUDA (or ``KVPARITY_DEVICE=cpu``): ``TRITON_INTERPRET=1``, every tensor on the CPU;
- CUDA available (or ``KVPARITY_DEVICE=cuda``): compiled Triton, every tensor on the GPU.
"""

from __future__ import annotations

import itertools
import os
import sys
from typing import Any

import torch

_ENV_DEVICE = "KVPARITY_DEVICE"


def _choose_device() -> torch.device:
    requested = os.environ.get(_ENV_DEVICE, "").strip().lower()
    if requested not in ("", "cpu", "cuda"):
        raise RuntimeError(f"{_ENV_DEVICE}={requested!r}: expected 'cpu' or 'cuda'")
    if requested == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"{_ENV_DEVICE}=cuda but torch sees no CUDA device")
    if requested == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    # With its index: tensors report "cuda:0", and torch.device("cuda") != torch.device("cuda:0").
    return torch.device("cuda", torch.cuda.current_device())


def _fix_triton_mode(device: torch.device) -> bool:
    interpret = device.type == "cpu"
    wanted = "1" if interpret else "0"
    current = os.environ.get("TRITON_INTERPRET")
    if "triton" in sys.modules and (current == "1") != interpret:
        raise RuntimeError(
            "triton was imported before kernels.runtime chose its mode "
            f"(TRITON_INTERPRET={current!r}, device {device}); import kernels first"
        )
    os.environ["TRITON_INTERPRET"] = wanted
    return interpret


DEVICE: torch.device = _choose_device()
INTERPRET: bool = _fix_triton_mode(DEVICE)
if INTERPRET:  # the interpreter's per-launch overhead, cut (kvparity.kernels.interpreter_patch_cache)
    from kvparity.kernels import interpreter_patch_cache

    interpreter_patch_cache.install()
BACKENDS: tuple[str, ...] = ("triton", "torch")


def check_backend(backend: str) -> str:
    """Return ``backend`` if it names a known backend, else raise a clear ValueError."""
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}: expected one of {BACKENDS}")
    return backend


def describe() -> str:
    """One line saying how this process runs kernels (printed by test runs and benchmarks)."""
    import triton

    mode = "Triton interpreter" if INTERPRET else "compiled Triton"
    return f"device={DEVICE} ({mode}), torch {torch.__version__}, triton {triton.__version__}"


# Integer dtypes whose ``tolist`` gives Python ints.
INT_DTYPES = frozenset((torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64))


def host_lists(tensors: list[torch.Tensor]) -> list[list[Any]]:
    """``[t.tolist() for t in tensors]``, with the device's 1-D integer tensors read back in one
    transfer. Each ``tolist`` of a GPU tensor waits for the device and copies on its own; a
    snapshot of a batch of 64 requests reads back hundreds of small tensors (prefixes, tree
    nodes), and those waits, not the copies, were most of a snapshot's time on the H200."""
    batchable = [_batchable(t) for t in tensors]  # once per tensor: a snapshot calls this per stage
    batched = [t for t, b in zip(tensors, batchable) if b]
    if len(batched) < 2:
        return [t.tolist() for t in tensors]
    # torch.cat promotes mixed integer dtypes; every value fits the promoted one.
    values = iter(torch.cat(batched).tolist())
    return [list(itertools.islice(values, t.numel())) if b else t.tolist() for t, b in zip(tensors, batchable)]


def _batchable(tensor: torch.Tensor) -> bool:
    return tensor.device.type != "cpu" and tensor.dim() == 1 and tensor.numel() > 0 and tensor.dtype in INT_DTYPES
