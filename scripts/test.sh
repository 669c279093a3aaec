#!/usr/bin/env bash
# The test command: install what is needed (scripts/setup_env.sh), then run the whole suite in
# parallel (idle workers steal queued tests: the longest ones otherwise leave one core idle at the
# end). Extra arguments go to pytest. pytest's own exit status is returned (5, "no tests
# collected", is a failure like any other non-zero status).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
py=$(bash "$root/scripts/setup_env.sh")
cd "$root"
exec "$py" -m pytest -n auto --dist worksteal "$@"
