"""SPEC section 8: the input contract of the refactored write. A prefix that breaks it is misread
by the Triton kernel (it reads raw int64 through a pointer), so every prefix producer of the
refactored version must meet it. Each check returns readable violations, never raises."""

from __future__ import annotations

from dataclasses import dataclass
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


class ContractError(ValueError):
    """Inputs that break SPEC section 8; the message lists every violation."""


def _vector_violations(name: str, t: Any, bs: int, device: torch.device) -> list[str]:
    if not isinstance(t, torch.Tensor):
        return [f"{name} is a {type(t).__name__}, not a tensor"]
    problems = []
    if t.dtype != torch.int64:
        problems.append(f"{name} has dtype {t.dtype}, not torch.int64")
    if t.dim() != 1 or t.numel() != bs:
        problems.append(f"{name} has shape {tuple(t.shape)}, not ({bs},)")
    if not same_device(t.device, device):
        problems.append(f"{name} is on {t.device}, not on the pool's device {device}")
    return problems


@dataclass(frozen=True)
class LengthFindings:
    """What SPEC section 8's rules on plain lengths find, as data: the one check that both the
    tensor inputs here and the plain ``KernelBatch`` of ``kvparity.candidate.inputs`` use (each words
    its findings for its own reader). Empty fields: the lengths are valid."""

    rows_outside: tuple[tuple[int, int], ...] = ()  # (request, row) outside [0, height)
    shared_rows: tuple[tuple[int, tuple[int, ...]], ...] = ()  # (row, the requests sharing it)
    misordered: tuple[int, ...] = ()  # requests breaking 0 <= prefix_len <= seq_len <= width
    slot_count: tuple[int, int] | None = None  # (out_cache_loc slots, extend lens sum) when they differ

    @property
    def rows_ok(self) -> bool:
        return not self.rows_outside and not self.shared_rows


def length_findings(rows: list[int], prefix_lens: list[int], seq_lens: list[int], height: int, width: int,
                    slots: int | None = None, extend_total: int = 0) -> LengthFindings:
    """SPEC section 8 on plain ints: rows in ``[0, height)`` and distinct (two requests in one row
    are two programs writing one row at once), ``0 <= prefix_len <= seq_len <= width``, and, when
    ``slots`` is given, ``slots == extend_total``."""
    owners: dict[int, list[int]] = {}
    for i, row in enumerate(rows):
        owners.setdefault(row, []).append(i)
    return LengthFindings(
        rows_outside=tuple((i, r) for i, r in enumerate(rows) if not 0 <= r < height),
        shared_rows=tuple((row, tuple(who)) for row, who in owners.items() if len(who) > 1),
        misordered=tuple(i for i, (pre, seq) in enumerate(zip(prefix_lens, seq_lens)) if not 0 <= pre <= seq <= width),
        slot_count=(slots, extend_total) if slots is not None and slots != extend_total else None,
    )


def write_input_violations(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_tensors: list[Any],
    prefix_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    out_cache_loc: torch.Tensor,
) -> list[str]:
    """Why these arguments may not be handed to a write kernel (SPEC section 8), plus distinct rows:
    two requests in one row are two programs writing one row at once, whose result depends on
    scheduling. On the GPU such a batch can even *agree* between versions by luck, so it must be
    refused before anything is compared. Empty when the inputs are valid. Reads lengths on the host."""
    device = req_to_token.device
    problems = []
    if req_to_token.dtype != torch.int32 or req_to_token.dim() != 2 or not req_to_token.is_contiguous():
        problems.append(f"req_to_token must be int32, 2-D, contiguous (got {req_to_token.dtype}, shape "
                        f"{tuple(req_to_token.shape)}, contiguous={req_to_token.is_contiguous()})")
    bs = len(prefix_tensors)
    named = (("req_pool_indices", req_pool_indices), ("prefix_lens", prefix_lens), ("seq_lens", seq_lens),
             ("extend_lens", extend_lens))
    for name, t in named:
        problems += _vector_violations(name, t, bs, device)
    if problems:
        return problems  # the per-request checks below need well-formed vectors
    rows, pres, seqs, exts = (t.tolist() for _, t in named)
    height, width = req_to_token.shape
    found = length_findings(rows, pres, seqs, height, width, out_cache_loc.numel(), sum(exts))
    problems += [f"request {i}: row {r} is outside [0, {height})" for i, r in found.rows_outside]
    problems += [f"requests {', '.join(map(str, who))} share row {row}: their programs would race on it"
                 for row, who in found.shared_rows]
    for i, (prefix, pre, seq, ext) in enumerate(zip(prefix_tensors, pres, seqs, exts)):
        problems += prefix_violations(prefix, i, f"#{i}", device)
        if isinstance(prefix, torch.Tensor) and prefix.numel() != pre:
            problems.append(f"request {i}: prefix has {prefix.numel()} elements but prefix_len is {pre}")
        if i in found.misordered:
            problems.append(f"request {i}: not 0 <= prefix_len {pre} <= seq_len {seq} <= row width {width}")
        if ext != seq - pre:
            problems.append(f"request {i}: extend_len {ext} != seq_len {seq} - prefix_len {pre}")
    if found.slot_count is not None:
        problems.append(f"out_cache_loc has {found.slot_count[0]} slots but extend_lens sum to {found.slot_count[1]}")
    return problems


def check_write_inputs(*args: Any) -> None:
    """Raise ``ContractError`` listing every violation ``write_input_violations`` finds."""
    problems = write_input_violations(*args)
    if problems:
        raise ContractError("inputs break SPEC section 8:\n  " + "\n  ".join(problems))
