"""A linear-time write kernel: the refactored write without the per-program serial loop.

Not SGLang code. The refactored kernel (``kernels/refactored_write.py``) has program ``i`` sum the
``extend_lens`` of requests ``0 .. i-1`` to find where its share of ``out_cache_loc`` starts, so a
batch of ``bs`` requests does ``bs * (bs - 1) / 2`` loads before writing anything: 0.3 ms at 4,096
requests on an H200, 1.1 ms at 8,192. Here the exclusive prefix sum of ``extend_lens`` is computed
once on the host, from ``extend_lens_cpu``, which SGLang's ``write_cache_indices`` already receives,
and travels to the device in the same copy as the prefix pointer table (one ``int64`` tensor of
``2 * bs``: pointers, then starts). No program loops over other requests, so the work grows with
the batch's cells (at most ``bs`` times its longest row), not with the square of ``bs``.

Same effect as the refactored write (SPEC section 5): row ``i`` gets its prefix in columns
``[0, prefix_len)``, read through a raw ``int64`` pointer, and its share of ``out_cache_loc`` in
``[prefix_len, seq_len)``. Same input contract (SPEC section 8). The torch backend is the refactored
write's torch twin: with the same effect to reach, a second twin would only be a copy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import triton
import triton.language as tl

from kvparity.kernels import runtime
from kvparity.kernels.launches import launch
from kvparity.kernels.refactored_write import write_prefix_and_extend_slots

# Program (g, c) writes requests [g * REQS, (g + 1) * REQS) in columns [c * CHUNK, (c + 1) * CHUNK),
# as [REQS, COLS] tiles; the host picks the tile from the batch's longest row (``linear_tile``).
# Rows up to SINGLE_TILE_MAX long get one tile per program, as wide as the longest row, with many
# requests per program (8,192 one-token rows would otherwise be 8,192 tiny programs); longer rows
# are split into column chunks so that 1,024 rows of 4,600 tokens still fill the GPU. Tuned on an
# H200 with benchmarks/tune_linear.py and benchmarks/probe_floor.py.
SINGLE_TILE_MAX = 1024
TILE_ELEMENTS = 2048
LONG_TILE = (4, 256, 1024)  # (REQS, COLS, CHUNK) for longer rows
LINEAR_WARPS = 4


def linear_tile(longest: int) -> tuple[int, int, int]:
    """(REQS, COLS, CHUNK) for a batch whose longest row has ``longest`` cells."""
    if longest > SINGLE_TILE_MAX:
        return LONG_TILE
    cols = max(16, triton.next_power_of_2(max(longest, 1)))
    return min(32, max(2, TILE_ELEMENTS // cols)), cols, cols


@triton.jit
def write_req_to_token_pool_linear_triton(
    req_to_token,
    req_pool_indices,
    pointers_and_starts,  # int64 [2 * bs]: prefix data_ptr() of each request, then its out_cache_loc start
    prefix_lens,
    seq_lens,
    out_cache_loc,
    bs,
    longest,  # the batch's largest seq_len, from the host: no reduction in the kernel
    row_stride: tl.constexpr,
    REQS: tl.constexpr,
    COLS: tl.constexpr,
    CHUNK: tl.constexpr,
):
    reqs = tl.program_id(0) * REQS + tl.arange(0, REQS)
    chunk_start = tl.program_id(1) * CHUNK
    live = reqs < bs
    row = tl.load(req_pool_indices + reqs, mask=live, other=0)
    prefix_len = tl.load(prefix_lens + reqs, mask=live, other=0)
    seq_len = tl.load(seq_lens + reqs, mask=live, other=0)  # 0 for a lane past the batch: writes nothing
    out_start = tl.load(pointers_and_starts + bs + reqs, mask=live, other=0)
    # Each request's prefix through its raw int64 pointer, as the refactored kernel reads it. An
    # empty prefix (address 0) is never read: its mask is all false.
    prefix = tl.load(pointers_and_starts + reqs, mask=live, other=0).to(tl.pointer_type(tl.int64))
    row_base = req_to_token + row * row_stride

    chunk_end = tl.minimum(longest, chunk_start + CHUNK)
    for first in range(chunk_start, chunk_end, COLS):
        cols = first + tl.arange(0, COLS)[None, :]
        in_prefix = cols < prefix_len[:, None]
        in_new = (cols >= prefix_len[:, None]) & (cols < seq_len[:, None])
        cached = tl.load(prefix[:, None] + cols, mask=in_prefix, other=0)
        new = tl.load(out_cache_loc + out_start[:, None] + (cols - prefix_len[:, None]), mask=in_new, other=0)
        slots = tl.where(in_prefix, cached, new)
        tl.store(row_base[:, None] + cols, slots.to(tl.int32), mask=in_prefix | in_new)


def pointers_and_starts(
    prefix_tensors: Sequence[torch.Tensor], extend_lens_cpu: torch.Tensor, device: torch.device
) -> torch.Tensor:
    """One ``int64`` tensor of ``2 * bs`` on ``device``: each prefix's ``data_ptr()``, then the
    exclusive prefix sum of ``extend_lens_cpu`` (where each request's new slots start in
    ``out_cache_loc``). Built on the host and copied once."""
    lens = extend_lens_cpu.to(device="cpu", dtype=torch.int64)
    if lens.numel() != len(prefix_tensors):
        raise ValueError(
            f"extend_lens_cpu has {lens.numel()} entries but there are {len(prefix_tensors)} prefix tensors"
        )
    starts = torch.cumsum(lens, 0) - lens
    host = torch.cat([torch.tensor([t.data_ptr() for t in prefix_tensors], dtype=torch.int64), starts])
    return host.to(device)


def write_prefix_and_extend_slots_linear(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_tensors: Sequence[torch.Tensor],
    prefix_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    extend_lens_cpu: torch.Tensor,
    out_cache_loc: torch.Tensor,
    *,
    backend: str,
    seq_lens_cpu: torch.Tensor | None = None,
) -> None:
    """The refactored write's effect in one launch whose cost is linear in the batch's tokens.
    ``seq_lens_cpu``, when given, spares a Python pass over the prefixes to find the longest row."""
    runtime.check_backend(backend)
    bs = req_pool_indices.numel()
    if bs == 0:
        return
    if backend == "torch":
        write_prefix_and_extend_slots(
            req_to_token, req_pool_indices, prefix_tensors, prefix_lens, seq_lens, extend_lens, out_cache_loc,
            backend="torch",
        )
        return
    table = pointers_and_starts(prefix_tensors, extend_lens_cpu, req_to_token.device)
    if seq_lens_cpu is not None:
        longest = int(seq_lens_cpu.max())
    else:
        longest = max(p.numel() + e for p, e in zip(prefix_tensors, extend_lens_cpu.tolist()))
    launch_linear_write(req_to_token, req_pool_indices, table, prefix_lens, seq_lens, out_cache_loc, longest)


def launch_linear_write(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    table: torch.Tensor,
    prefix_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    out_cache_loc: torch.Tensor,
    longest: int,
) -> None:
    """Launch the kernel alone, on a table from ``pointers_and_starts``; ``longest`` is the
    batch's largest ``seq_len``, known on the host (benchmarks time this call)."""
    bs = req_pool_indices.numel()
    reqs, cols, chunk = linear_tile(longest)
    launch(
        write_req_to_token_pool_linear_triton,
        (triton.cdiv(bs, reqs), max(1, triton.cdiv(longest, chunk))),
        req_to_token,
        req_pool_indices,
        table,
        prefix_lens,
        seq_lens,
        out_cache_loc,
        bs,
        longest,
        req_to_token.stride(0),
        reqs,
        cols,
        chunk,
        num_warps=LINEAR_WARPS,
    )


def write_cache_indices(
    out_cache_loc: torch.Tensor,
    req_pool_indices_tensor: torch.Tensor,
    req_pool_indices_cpu: torch.Tensor,
    prefix_lens_tensor: torch.Tensor,
    prefix_lens_cpu: torch.Tensor,
    seq_lens_tensor: torch.Tensor,
    seq_lens_cpu: torch.Tensor,
    extend_lens_tensor: torch.Tensor,
    extend_lens_cpu: torch.Tensor,
    prefix_tensors: Sequence[torch.Tensor],
    req_to_token_pool: Any,
    *,
    backend: str = "triton",
) -> None:
    """SGLang's ``write_cache_indices`` signature (SPEC section 9) on the linear kernel, so
    ``kvparity check --target write_cache_indices --candidate kvparity.kernels.linear_write:write_cache_indices``
    checks it as a plug-in; the refactored world ``refactored-linear`` uses it with ``backend``."""
    write_prefix_and_extend_slots_linear(
        req_to_token_pool.req_to_token,
        req_pool_indices_tensor,
        prefix_tensors,
        prefix_lens_tensor,
        seq_lens_tensor,
        extend_lens_tensor,
        extend_lens_cpu,
        out_cache_loc,
        backend=backend,
        seq_lens_cpu=seq_lens_cpu,
    )
