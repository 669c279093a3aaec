#!/usr/bin/env bash
# The main job: install what is needed (scripts/setup_env.sh), then
#   1. `kvparity check`: this repository's refactored path against the legacy reference, over every
#      scenario class, in every world this machine runs (extra arguments go here, e.g. --examples 200);
#   2. `kvparity check --sglang 0.5.3.post1 --against 0.5.3`: the same proof on REAL SGLang, the
#      release after pull request #11200 against the one before, on both backends.
# Both verdicts are printed side by side at the end; the exit status is the worse of the two
# (0 parity, 1 divergence, 2 usage or loading error).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
py=$(bash "$root/scripts/setup_env.sh") || exit 2
cd "$root"
kvparity="$(dirname "$py")/kvparity"
"$kvparity" check "$@"
model=$?
echo
"$kvparity" check --sglang 0.5.3.post1 --against 0.5.3
real=$?
verdict() { case $1 in 0) echo PARITY ;; 1) echo DIVERGENCE ;; *) echo "ERROR (exit $1)" ;; esac; }
echo
echo "main job: kvparity's model, refactored vs legacy:       $(verdict $model)"
echo "main job: real SGLang, 0.5.3.post1 vs 0.5.3 (reference): $(verdict $real)"
[ $model -ge $real ] && exit $model || exit $real
