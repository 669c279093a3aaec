"""The GPU lane's entry points on a machine without CUDA: they must say so and stop cleanly, so
the CPU lane is unaffected (issue 7). On a GPU machine these are skipped: the nightly job runs
the real thing there."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvparity.kernels import runtime

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(runtime.DEVICE.type == "cuda", reason="checks the behaviour without CUDA")


def run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable, "KVPARITY_DEVICE": "cpu"}
    return subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def test_nightly_script_refuses_to_run_without_cuda():
    done = run("bash", "scripts/nightly_gpu.sh", "race")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "sees no CUDA device; this job needs one" in done.stderr


@pytest.mark.parametrize("script", ["write_kernels.py", "tune_linear.py", "probe_floor.py"])
def test_benchmarks_say_they_need_cuda_and_exit_0(script):
    done = run(sys.executable, f"benchmarks/{script}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "needs a CUDA GPU" in done.stdout and "skipped" in done.stdout
