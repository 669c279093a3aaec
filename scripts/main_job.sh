#!/usr/bin/env bash
# The main job: install what is needed (scripts/setup_env.sh), then
#   1. `kvparity check --drive both`: this repository's refactored path against the legacy
#      reference: the memory path under identical decisions, over every scenario class, in every
#      world this machine runs (harness-driven), and admission through kvparity's model of SGLang's
#      scheduler, per schedule policy (scheduler-driven); extra arguments go here (e.g. --examples 200);
#   2. `kvparity check --sglang 0.5.3.post1 --against 0.5.3 --drive both`: the same two proofs on
#      REAL SGLang, the release after pull request #11200 against the one before, the admission half
#      through each release's own scheduler, both event loops, with the in-flight oracle.
# The four verdicts are printed together at the end (scripts/main_job_summary.py reads the two
# checks' --json files); the exit status is the worse of the two checks (0 parity, 1 divergence,
# 2 usage or loading error). Pull request #11200 changes admission under lpm and dfs-weight, so
# the main job's honest answer is 1: the memory path PARITY, admission DIVERGENCE under those two
# policies (cause named), parity under fcfs and lof.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
py=$(bash "$root/scripts/setup_env.sh") || exit 2
cd "$root"
kvparity="$(dirname "$py")/kvparity"
verdicts=$(mktemp -d)
trap 'rm -rf "$verdicts"' EXIT
"$kvparity" check --drive both --json "$verdicts/model.json" "$@"
model=$?
echo
"$kvparity" check --sglang 0.5.3.post1 --against 0.5.3 --drive both --json "$verdicts/real.json"
real=$?
echo
"$py" scripts/main_job_summary.py "$verdicts/model.json" $model "$verdicts/real.json" $real
[ $model -ge $real ] && exit $model || exit $real
