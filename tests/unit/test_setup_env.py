"""``scripts/setup_env.sh`` on a complete environment installs nothing and needs no package index
(issue 12, item 1: it used to import triton before ``kernels``, always fail its check, and
reinstall everything, which fails offline)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VENV_PYTHON = ROOT / ".venv" / "bin" / "python"


@pytest.mark.skipif(not VENV_PYTHON.exists(), reason="needs the repository's .venv (made by scripts/setup_env.sh)")
def test_a_second_setup_installs_nothing_without_an_index(tmp_path):
    env = dict(os.environ, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(tmp_path / "no-wheels-here"),
               KVPARITY_SGLANG_WHEELS=str(tmp_path))  # any pip call now fails
    done = subprocess.run(["bash", str(ROOT / "scripts" / "setup_env.sh")], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == str(VENV_PYTHON)
    assert "pip" not in done.stderr.lower() or "installed" not in done.stderr.lower()


def test_the_user_docs_are_in_the_repository_and_linked():
    readme = (ROOT / "README.md").read_text()
    for page in ("docs/what-is-checked.md", "docs/real-sglang.md"):
        assert (ROOT / page).exists() and page in readme, page
    examples = (ROOT / "examples" / "README.md").read_text()
    for target in ("write_cache_indices", "get_last_loc", "alloc_extend"):
        assert target in examples, target
