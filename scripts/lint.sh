#!/usr/bin/env bash
# The style gates: ruff check and mypy, configured in pyproject.toml ([tool.ruff], [tool.mypy]),
# with the venv's binaries (pip install -e '.[lint]'). Runs both, then exits non-zero if either
# failed. Extra arguments are not taken: the paths checked are fixed here and in [tool.mypy] files.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
bin="$root/.venv/bin"
status=0
"$bin/ruff" check kvparity mem_cache kernels legacy refactored tests scripts benchmarks examples conftest.py || status=1
"$bin/mypy" || status=1
exit "$status"
