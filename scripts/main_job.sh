#!/usr/bin/env bash
# The main job (until `kvparity check` exists): install, then run the suite and print a summary of
# how kernels ran (device, Triton mode), per-area test counts and the verdict.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
py=$(bash "$root/scripts/setup_env.sh")
cd "$root"
exec "$py" -m pytest -n auto -p parity.summary_plugin "$@"
