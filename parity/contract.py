"""SPEC section 8: the input contract of the refactored write. A prefix that breaks it is misread
by the Triton kernel (it reads raw int64 through a pointer), so every prefix producer of the
refactored version must meet it. Each check returns readable violations, never raises."""

from __future__ import annotations

from typing import Any

import torch


def same_device(a: torch.device, b: torch.device) -> bool:
    """``cuda`` and ``cuda:0`` are the same device when 0 is the current one."""
    def norm(d: torch.device) -> torch.device:
        d = torch.device(d)
        if d.type == "cuda" and d.index is None:
            return torch.device("cuda", torch.cuda.current_device())
        return d

    return norm(a) == norm(b)


def prefix_violations(prefix: Any, index: int, rid: str, device: torch.device) -> list[str]:
    """Why ``prefix`` (request ``index``, id ``rid``) may not be handed to the refactored write."""
    where = f"request {index} ({rid!r}) prefix_indices"
    if not isinstance(prefix, torch.Tensor):
        return [f"{where} is a {type(prefix).__name__}, not a tensor"]
    problems = []
    if prefix.dtype != torch.int64:
        problems.append(f"{where} has dtype {prefix.dtype}, not torch.int64")
    if prefix.dim() != 1:
        problems.append(f"{where} has {prefix.dim()} dimensions, not 1")
    if prefix.numel() > 0:
        if not prefix.is_contiguous():
            problems.append(f"{where} is not contiguous (stride {prefix.stride()})")
        if not same_device(prefix.device, device):
            problems.append(f"{where} is on {prefix.device}, not on the pool's device {device}")
    return problems


def batch_prefix_violations(reqs: list[Any], device: torch.device) -> list[str]:
    problems: list[str] = []
    for i, req in enumerate(reqs):
        problems += prefix_violations(req.prefix_indices, i, req.rid, device)
    return problems
