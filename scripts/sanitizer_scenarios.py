"""The memcheck lane's workload: a small fixed set of scenarios and batches, run under
``compute-sanitizer --tool memcheck`` by ``scripts/nightly_gpu.sh``.

- every golden scenario (tests/golden/), replayed in every world and compared with its file;
- one batch per write kernel whose rows and lengths cross the 512-token block, with every tensor
  its own allocation (``PYTORCH_NO_CUDA_MEMORY_CACHING=1``, set by the lane), so a read or write one
  element out of bounds is an invalid access the sanitizer reports, not a neighbour's cell.

Exit status 0 when every replay matches and every table is as expected; the sanitizer adds its own
(``--error-exitcode``) for any memory error."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvparity.kernels import runtime  # noqa: E402  (fixes the Triton mode first)

# isort: split

import torch  # noqa: E402

from kvparity.golden import store as golden  # noqa: E402
from kvparity.golden.scenarios import GOLDENS  # noqa: E402
from kvparity.kernels.legacy_write import write_extend_slots  # noqa: E402
from kvparity.kernels.linear_write import write_prefix_and_extend_slots_linear  # noqa: E402
from kvparity.kernels.refactored_write import write_prefix_and_extend_slots  # noqa: E402
from kvparity.model.contract import check_write_inputs  # noqa: E402
from kvparity.model.poison import POISON  # noqa: E402
from kvparity.run.runner import ALL_WORLDS  # noqa: E402

LONG = ((3, 600, 513), (0, 0, 700), (2, 513, 0), (1, 1, 1))  # (row, prefix_len, extend_len)


def replay_goldens() -> list[str]:
    problems = []
    for name in GOLDENS:
        for version, backend in ALL_WORLDS:
            problems += [f"{version}/{backend}: {p}" for p in golden.replay_in_world(name, version, backend)]
    print(f"golden replays: {len(GOLDENS)} scenarios x {len(ALL_WORLDS)} worlds, {len(problems)} problems")
    return problems


def long_rows_batch(device: torch.device):
    width = max(p + e for _, p, e in LONG)
    table = torch.full((4, width), POISON, dtype=torch.int32, device=device)
    rows = torch.tensor([r for r, _, _ in LONG], dtype=torch.int64, device=device)
    prefixes, out, expected = [], [], torch.full((4, width), POISON, dtype=torch.int32)
    next_slot = 1
    for row, pre, ext in LONG:
        prefix = list(range(next_slot, next_slot + pre))
        new = list(range(next_slot + pre, next_slot + pre + ext))
        next_slot += pre + ext
        prefixes.append(torch.tensor(prefix, dtype=torch.int64, device=device))
        out += new
        expected[row, : pre + ext] = torch.tensor(prefix + new, dtype=torch.int32)
    lens = [torch.tensor(v, dtype=torch.int64, device=device) for v in zip(*[(p, p + e, e) for _, p, e in LONG])]
    return table, rows, prefixes, *lens, torch.tensor(out, dtype=torch.int64, device=device), expected


def write_long_rows(device: torch.device) -> list[str]:
    problems = []
    for kernel in ("legacy", "refactored", "linear"):
        table, rows, prefixes, pre, seq, ext, out, expected = long_rows_batch(device)
        check_write_inputs(table, rows, prefixes, pre, seq, ext, out)
        if kernel == "legacy":
            for row, prefix in zip(rows.tolist(), prefixes):
                table[row, : prefix.numel()] = prefix.to(torch.int32)
            write_extend_slots(table, rows, pre, seq, ext, out, backend="triton")
        elif kernel == "refactored":
            write_prefix_and_extend_slots(table, rows, prefixes, pre, seq, ext, out, backend="triton")
        else:
            write_prefix_and_extend_slots_linear(table, rows, prefixes, pre, seq, ext, ext.cpu(), out, backend="triton")
        if not torch.equal(table.cpu(), expected):
            problems.append(f"{kernel} write: the long-rows table differs from the expected one")
    print(f"long-rows batch: 3 write kernels, {len(problems)} problems")
    return problems


def main() -> int:
    print(f"memcheck workload: {runtime.describe()}")
    problems = replay_goldens() + write_long_rows(runtime.DEVICE)
    for p in problems:
        print(f"  {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
