"""A test run leaves no kvparity-* folders in the temporary directory (the ledger and the Triton
cache base are removed by the process that made them)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_run_removes_the_folders_it_made(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVPARITY_") and k != "TRITON_CACHE_DIR"}
    env["TMPDIR"] = str(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider", "tests/unit/test_contract.py"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    left = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("kvparity-"))
    assert left == [], left
