#!/usr/bin/env bash
# The main job: install what is needed (scripts/setup_env.sh), then `kvparity check`: this
# repository's refactored path against the legacy reference, over every scenario class, in every
# world this machine runs. Extra arguments go to `kvparity check` (e.g. --examples 200).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
py=$(bash "$root/scripts/setup_env.sh")
cd "$root"
exec "$(dirname "$py")/kvparity" check "$@"
