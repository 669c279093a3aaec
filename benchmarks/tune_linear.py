"""How ``kernels/linear_write.py``'s tile was chosen: time the linear kernel with several
(REQS, COLS, CHUNK, num_warps) on the benchmark's configurations for bs >= 1024 and print, per choice,
its worst and median ratio to the floor (see ``write_kernels.py``). Needs CUDA.

    python benchmarks/tune_linear.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import write_kernels as wk  # noqa: E402  (benchmarks/ is on sys.path when run as a script)

# (REQS, COLS, CHUNK, num_warps)
CHOICES = ((4, 256, 1024, 4), (2, 256, 1024, 2), (8, 128, 1024, 4), (16, 64, 1024, 4), (32, 32, 1024, 4),
           (16, 32, 1024, 2), (32, 32, 1024, 2), (64, 16, 1024, 4), (32, 64, 1024, 4), (16, 16, 1024, 1),
           (32, 16, 1024, 2), (64, 32, 1024, 8))
SHORT = 256  # rows no longer than this are "short": many requests, little data each


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print("benchmarks/tune_linear.py: needs a CUDA GPU; skipped")
        return 0
    import triton

    from kvparity.kernels.linear_write import write_req_to_token_pool_linear_triton as kernel

    bandwidth, launch = wk.copy_bandwidth(), wk.empty_kernel_us()
    batches = [(bs, p, e, wk.Batch(bs, p, e)) for bs in (1024, 4096, 8192) for p in wk.PREFIX_LENS for e in wk.EXTEND_LENS]
    print(f"{'REQS':>4} {'COLS':>5} {'CHUNK':>5} {'warps':>5}  worst/floor, rows <= {SHORT}    worst/floor, longer rows")
    for reqs, cols, chunk, warps in CHOICES:
        ratios: dict[bool, list] = {True: [], False: []}
        for bs, p, e, b in batches:
            grid = (triton.cdiv(bs, reqs), triton.cdiv(b.longest, chunk))
            us = wk.median_device_us(
                lambda grid=grid, b=b, bs=bs, reqs=reqs, cols=cols, chunk=chunk, warps=warps: kernel[grid](
                    b.table, b.rows, b.pointers_and_starts, b.prefix_lens, b.seq_lens, b.out, bs, b.longest,
                    b.table.stride(0), reqs, cols, chunk, num_warps=warps), 30)
            ratio = us / wk.floor_us(wk.write_bytes(bs, p, e), bandwidth, launch)
            ratios[b.longest <= SHORT].append((ratio, bs, p, e))
        cells = [f"{w[0]:>6.2f} (bs {w[1]}, {w[2]}+{w[3]})" for w in (max(ratios[True]), max(ratios[False]))]
        print(f"{reqs:>4} {cols:>5} {chunk:>5} {warps:>5}  {cells[0]:<28} {cells[1]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
