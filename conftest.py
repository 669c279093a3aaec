"""Root conftest: fix the Triton mode before anything imports Triton, and give each pytest-xdist
worker its own Triton cache directory (compiled kernels written concurrently by several workers
into one cache can collide)."""

from __future__ import annotations

import os
import sys
import tempfile

_worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix=f"kvparity-triton-{_worker}-"))
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
