"""Root conftest: fix the Triton mode before anything imports Triton, and give each pytest-xdist
worker its own Triton cache directory (compiled kernels written concurrently by several workers
into one cache can collide)."""

from __future__ import annotations

import os
import sys
import tempfile

# The controller picks one base directory (the user's TRITON_CACHE_DIR, or a fresh temporary one);
# workers inherit it through the environment and each takes its own sub-directory.
_worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
_base = os.environ.setdefault(
    "KVPARITY_TRITON_CACHE_BASE", os.environ.get("TRITON_CACHE_DIR") or tempfile.mkdtemp(prefix="kvparity-triton-")
)
os.environ["TRITON_CACHE_DIR"] = os.path.join(_base, f"worker-{_worker}")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from kernels import runtime  # noqa: E402  (decides TRITON_INTERPRET before triton is imported)

import pytest  # noqa: E402
import torch  # noqa: E402

from parity.poison import POISON  # noqa: E402,F401  (re-exported for tests)


def pytest_report_header(config):
    return f"kvparity: {runtime.describe()}"


@pytest.fixture
def device() -> torch.device:
    return runtime.DEVICE


@pytest.fixture(params=runtime.BACKENDS)
def backend(request) -> str:
    return request.param
