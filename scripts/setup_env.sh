#!/usr/bin/env bash
# Create (once) the project's virtual environment in .venv and install kvparity with its
# test, real and lint extras. Idempotent: a second run only checks. Prints the path of the
# environment's python.
#   KVPARITY_VENV     where to put the environment (default: .venv in the repository)
#   KVPARITY_TORCH    the torch requirement to install first (default: torch==2.13.0; any other
#                     pip requirement works, e.g. a CUDA build on a GPU machine)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${KVPARITY_VENV:-$root/.venv}
python=${PYTHON:-python3}

"$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
  || { echo "kvparity needs Python >= 3.10 (found $("$python" --version 2>&1))" >&2; exit 2; }
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv" >&2
fi
py="$venv/bin/python"
# "Installed" means: the environment imports everything (kernels FIRST: it fixes Triton's mode, and
# importing triton before it raises on purpose), has the console script, and was installed from
# this very pyproject.toml (its hash is stamped in the environment). Then nothing is installed and
# no network is needed, so a second run works offline.
stamp="$venv/.kvparity-installed"
want=$(cd "$root" && "$python" -c 'import hashlib,sys; print(hashlib.sha256(open("pyproject.toml","rb").read()).hexdigest())')
installed() {
  [ -x "$venv/bin/kvparity" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] \
    && (cd "$root" && "$py" -c 'import kvparity.kernels, torch, triton, hypothesis, pytest, xdist') >/dev/null 2>&1
}
if ! installed; then
  "$py" -m pip install -q --upgrade pip >&2
  "$py" -m pip install -q "${KVPARITY_TORCH:-torch==2.13.0}" >&2
  "$py" -m pip install -q -e "$root[test,real,lint]" >&2
  echo "$want" > "$stamp"
fi
# The real SGLang releases of the main job, the faithfulness lane and the CI matrix slice (0.5.3 .. 0.5.4), and
# today's releases that tests and CI drive (0.5.21 .. 0.5.23), installed once into the per-user cache (offline
# afterwards: a cached release is reused without pip; KVPARITY_SGLANG_WHEELS=DIR installs from a wheel folder).
(cd "$root" && "$py" -m kvparity.engine.real.install 0.5.3 0.5.3.post1 0.5.3.post2 0.5.4 0.5.21 0.5.22 0.5.23) >&2
echo "$py"
