"""The write benchmark's arithmetic (benchmarks/write_kernels.py), which runs only on a GPU: the
bytes a write must move, its floor, and the acceptance lines it prints. Checked here on the CPU
with hand-computed figures, so a wrong formula cannot hide behind a GPU-only job."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import write_kernels as wk  # noqa: E402


def test_bytes_moved_by_one_request_of_128_cached_and_8_new_tokens():
    # 136 int32 cells written + 128 int64 prefix slots read + 8 int64 new slots read + 40 bytes of metadata
    assert wk.write_bytes(1, 128, 8) == 136 * 4 + 128 * 8 + 8 * 8 + 40 == 1672
    assert wk.write_bytes(1000, 128, 8) == 1000 * 1672


def test_floor_is_launch_plus_transfer_and_the_strict_one_their_maximum():
    assert wk.floor_us(4_000_000, 2e12, 3.0) == pytest.approx(3.0 + 2.0)
    assert wk.strict_floor_us(4_000_000, 2e12, 3.0) == pytest.approx(3.0)
    assert wk.strict_floor_us(40_000_000, 2e12, 3.0) == pytest.approx(20.0)


def row(bs, prefix, extend, serial, linear, floor=2.0):
    return wk.Row(bs, prefix, extend, 0, floor, floor, 1.0, serial, linear, 0.0, 0.0, 0.0)


def test_acceptance_fails_below_ten_times_at_4096_or_above_twice_the_floor():
    good = [row(4096, 0, 1, serial=300.0, linear=3.9), row(8192, 4096, 512, serial=1200.0, linear=3.9)]
    assert all(met for _, met in wk.acceptance(good))
    slow = [row(4096, 0, 1, serial=300.0, linear=31.0)]  # 9.7x, and 15.5x the floor
    verdicts = dict(wk.acceptance(slow))
    assert [met for line, met in verdicts.items() if not line.startswith("  ")] == [False, False]
    far = [row(1024, 0, 1, serial=300.0, linear=4.2)]  # fine speed-up, 2.1x the floor
    assert [met for line, met in wk.acceptance(far) if "floor" in line and not line.startswith("  ")] == [False]
