"""What bounds the write of many one-token rows? Times (device events, median) an empty kernel
over growing grids, and a minimal kernel with the write's dependency chain (load an index, load the
slot it points to, store it), against the linear kernel, at bs 8,192. Needs CUDA.

    python benchmarks/probe_floor.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import write_kernels as wk  # noqa: E402


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print("benchmarks/probe_floor.py: needs a CUDA GPU; skipped")
        return 0
    import triton
    import triton.language as tl

    from kvparity.kernels.linear_write import launch_linear_write

    @triton.jit
    def empty(x):
        pass

    @triton.jit
    def chain(rows, starts, src, dst, row_stride: tl.constexpr, REQS: tl.constexpr):
        i = tl.program_id(0) * REQS + tl.arange(0, REQS)
        row = tl.load(rows + i)
        start = tl.load(starts + i)
        tl.store(dst + row * row_stride, tl.load(src + start).to(tl.int32))

    x = torch.empty(1, device="cuda")
    for grid in (1, 256, 2048, 8192):
        us = wk.median_device_us(lambda grid=grid: empty[(grid,)](x), 200)
        print(f"empty kernel, {grid:>5} programs: {us:6.2f} us")
    for p, e in ((0, 1), (128, 8)):
        b = wk.Batch(8192, p, e)
        starts = b.pointers_and_starts[8192:].contiguous()
        for reqs in (1, 4, 32):
            us = wk.median_device_us(lambda b=b, starts=starts, reqs=reqs: chain[(8192 // reqs,)](
                b.rows, starts, b.out, b.table, b.table.stride(0), reqs), 200)
            print(f"bs 8192, {p}+{e}: load-load-store chain, {reqs:>2} rows per program: {us:6.2f} us")
        us = wk.median_device_us(lambda b=b: launch_linear_write(
            b.table, b.rows, b.pointers_and_starts, b.prefix_lens, b.seq_lens, b.out, b.longest), 200)
        print(f"bs 8192, {p}+{e}: linear kernel: {us:6.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
