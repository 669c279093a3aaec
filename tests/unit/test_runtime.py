"""How this process runs kernels: decided once, before Triton is imported (kernels/runtime.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from kvparity.kernels import runtime


def test_mode_matches_the_device():
    if runtime.DEVICE.type == "cpu":
        assert runtime.INTERPRET and os.environ["TRITON_INTERPRET"] == "1"
    else:
        assert not runtime.INTERPRET and os.environ["TRITON_INTERPRET"] == "0"
    assert runtime.DEVICE.type == ("cuda" if torch.cuda.is_available() else "cpu")


def test_each_xdist_worker_has_its_own_triton_cache():
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    assert os.path.basename(os.environ["TRITON_CACHE_DIR"]) == f"worker-{worker}"


def test_importing_triton_first_with_the_wrong_mode_is_refused():
    """If something imported Triton in compiled mode before kernels.runtime ran on a CPU-only
    process, the kernels would be decorated in the wrong mode: runtime refuses to go on."""
    code = (
        "import os; os.environ['TRITON_INTERPRET'] = '0'; os.environ['KVPARITY_DEVICE'] = 'cpu'\n"
        "import triton\n"
        "import kernels\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=_repo_root())
    assert done.returncode != 0
    assert "triton was imported before kernels.runtime chose its mode" in done.stderr


@pytest.mark.parametrize("bad", ["gpu", "tpu"])
def test_bad_device_request_names_the_variable(bad):
    code = f"import os; os.environ['KVPARITY_DEVICE'] = '{bad}'\nimport kernels\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=_repo_root())
    assert done.returncode != 0 and f"KVPARITY_DEVICE='{bad}'" in done.stderr


def _repo_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
