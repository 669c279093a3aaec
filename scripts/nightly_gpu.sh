#!/usr/bin/env bash
# The nightly GPU job: kvparity on CUDA with compiled Triton, which the CPU lane (Triton's
# interpreter: one program after another, no bounds checks) cannot stand in for.
#
#   bash scripts/nightly_gpu.sh [LANE ...]      lanes, in this order by default:
#     properties  the whole test suite under the `nightly` Hypothesis profile (seed printed)
#     golden      the golden files replayed on the GPU, in every world
#     memcheck    compute-sanitizer --tool memcheck over scripts/sanitizer_scenarios.py,
#                 with PYTORCH_NO_CUDA_MEMORY_CACHING=1 (each tensor its own allocation)
#     race        batches whose requests share a row are refused by the input checks
#     bench       benchmarks/write_kernels.py (table, JSON) and benchmarks/plot.py (PNG)
#     real        real SGLang with compiled Triton: `kvparity check --sglang 0.5.3.post1 --against
#                 0.5.3` and the faithfulness lane (kvparity's model against real 0.5.3 / 0.5.3.post1)
#     scale       `kvparity check --examples 100000 --jobs <cores>`: all templates, every world with
#                 its oracles, jobs pinned to the visible GPUs round-robin; per-GPU counts and the rate
#
# Environment:
#   PYTHON                 the interpreter with torch (CUDA build), triton, hypothesis, pytest, xdist
#   KVPARITY_SEED          replay a nightly run's seed (default: a fresh random one, printed)
#   KVPARITY_MAX_EXAMPLES  cap examples per property (a time-boxed run; default: the profile's)
#   KVPARITY_REPORTS       where reports go (default: reports/)
#   KVPARITY_SCALE_EXAMPLES, KVPARITY_JOBS  the scale lane's scenarios (100000) and jobs (the cores)
#   COMPUTE_SANITIZER      the compute-sanitizer binary (default: on PATH, else under CUDA_HOME)
#   KVPARITY_SGLANG_WHEELS a folder of SGLang wheels for the real lane on a machine without a network
#                          (fill it where there is one: bash scripts/fetch_sglang_wheels.sh DIR)
# Exit status: 2 without a usable CUDA device, else 1 if any lane failed, else 0.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
py=${PYTHON:-python3}
reports=${KVPARITY_REPORTS:-reports}
mkdir -p "$reports"
lanes=("$@")
[ ${#lanes[@]} -eq 0 ] && lanes=(properties golden memcheck race bench real scale)

if ! "$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "nightly_gpu.sh: $py sees no CUDA device; this job needs one (the CPU lane is .ci/run)" >&2
  exit 2
fi
export KVPARITY_DEVICE=cuda
export KVPARITY_SEED=${KVPARITY_SEED:-$("$py" -c 'import random; print(random.getrandbits(32))')}
echo "kvparity nightly GPU job, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
"$py" -c 'from kernels import runtime; import torch; print(runtime.describe() + ", " + torch.cuda.get_device_name())'
echo "hypothesis seed: $KVPARITY_SEED (replay: KVPARITY_SEED=$KVPARITY_SEED bash scripts/nightly_gpu.sh properties)"
[ -n "${KVPARITY_MAX_EXAMPLES:-}" ] && echo "examples per property capped at $KVPARITY_MAX_EXAMPLES (time-boxed run)"

lane_properties() {
  HYPOTHESIS_PROFILE=nightly "$py" -m pytest -n auto -p no:cacheprovider tests \
    --junitxml="$reports/properties.xml"
}

lane_golden() {
  "$py" -m kvparity golden check && "$py" -m pytest -q -p no:cacheprovider tests/golden
}

find_sanitizer() {
  if [ -n "${COMPUTE_SANITIZER:-}" ]; then echo "$COMPUTE_SANITIZER"; return; fi
  command -v compute-sanitizer && return
  for dir in "${CUDA_HOME:-}" /usr/local/cuda; do
    [ -n "$dir" ] && [ -x "$dir/bin/compute-sanitizer" ] && { echo "$dir/bin/compute-sanitizer"; return; }
  done
  return 1
}

lane_memcheck() {
  local sanitizer
  if ! sanitizer=$(find_sanitizer); then
    echo "compute-sanitizer not found (set COMPUTE_SANITIZER or CUDA_HOME); the memcheck lane cannot run" >&2
    return 1
  fi
  echo "using $sanitizer"
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 "$sanitizer" --tool memcheck --error-exitcode 3 --leak-check no \
    --print-limit 20 "$py" scripts/sanitizer_scenarios.py
}

lane_real() {
  "$py" -m kvparity.engine.real.install 0.5.3 0.5.3.post1 || return 1
  "$py" -m kvparity check --sglang 0.5.3.post1 --against 0.5.3 --json "$reports/real.json" | tee "$reports/real.txt"
  local status=${PIPESTATUS[0]}
  "$py" -m pytest -q -p no:cacheprovider tests/properties/test_faithfulness.py --junitxml="$reports/faithfulness.xml" \
    || status=1
  return "$status"
}

# Scale: KVPARITY_SCALE_EXAMPLES scenarios (default 100,000), all templates, every world with its
# oracles, over every core (KVPARITY_JOBS, default the usable cores), the jobs pinned to the
# visible GPUs round-robin; prints scenarios per GPU and per second.
# Several processes on one GPU time-slice it unless NVIDIA's MPS daemon runs (measured on an
# H200 with 16 jobs: 40 scenarios/s without, 205 with); the lane starts one when it can and none
# is running (KVPARITY_MPS=0: never), and stops the one it started.
lane_scale() {
  local jobs=${KVPARITY_JOBS:-$("$py" -c 'import os; print(len(os.sched_getaffinity(0)))')}
  echo "GPUs: $("$py" -c 'import torch; print(torch.cuda.device_count())'), jobs: $jobs"
  local mps=""
  if [ "${KVPARITY_MPS:-1}" = 1 ] && command -v nvidia-cuda-mps-control >/dev/null && ! pgrep -x nvidia-cuda-mps >/dev/null; then
    export CUDA_MPS_PIPE_DIRECTORY=${CUDA_MPS_PIPE_DIRECTORY:-/tmp/kvparity-mps-pipe}
    export CUDA_MPS_LOG_DIRECTORY=${CUDA_MPS_LOG_DIRECTORY:-/tmp/kvparity-mps-log}
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    nvidia-cuda-mps-control -d && mps=started && echo "MPS daemon started for this lane"
  fi
  (while sleep 60; do nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader; done) \
    > "$reports/scale-nvidia-smi.txt" 2>&1 &
  local sampler=$!
  "$py" -m kvparity check --examples "${KVPARITY_SCALE_EXAMPLES:-100000}" --seed "$KVPARITY_SEED" --jobs "$jobs" \
    --json "$reports/scale.json" | tee "$reports/scale.txt"
  local status=${PIPESTATUS[0]}
  kill "$sampler" 2>/dev/null
  [ -n "$mps" ] && echo quit | nvidia-cuda-mps-control
  return "$status"
}

lane_race() {
  # -rs: a GPU test that skipped would say why; on this job none may skip.
  "$py" -m pytest -q -s -rs -p no:cacheprovider tests/unit/test_race_lane.py | tee "$reports/race.txt"
  local status=${PIPESTATUS[0]}
  if grep -q "SKIPPED" "$reports/race.txt"; then
    echo "race lane: the GPU tests were skipped; they must run on this job" >&2
    return 1
  fi
  return "$status"
}

lane_bench() {
  "$py" benchmarks/write_kernels.py --json "$reports/bench.json" | tee "$reports/bench.txt"
  local status=${PIPESTATUS[0]}
  if "$py" -c 'import matplotlib' 2>/dev/null; then
    "$py" benchmarks/plot.py "$reports/bench.json" "$reports/bench.png"
  else
    echo "matplotlib is not installed here: plot later with python benchmarks/plot.py $reports/bench.json out.png"
  fi
  return "$status"
}

failed=()
summary="$reports/summary.md"
printf '## kvparity nightly GPU job\n\nseed %s\n\n| lane | result | seconds |\n|---|---|---|\n' "$KVPARITY_SEED" > "$summary"
for lane in "${lanes[@]}"; do
  if ! declare -F "lane_$lane" >/dev/null; then
    echo "unknown lane '$lane' (lanes: properties golden memcheck race bench real scale)" >&2
    exit 2
  fi
  echo
  echo "=== lane $lane ==="
  start=$SECONDS
  if "lane_$lane"; then result=passed; else result=FAILED; failed+=("$lane"); fi
  echo "=== lane $lane: $result in $((SECONDS - start)) s ==="
  echo "| $lane | $result | $((SECONDS - start)) |" >> "$summary"
done
[ -n "${GITHUB_STEP_SUMMARY:-}" ] && cat "$summary" >> "$GITHUB_STEP_SUMMARY"
echo
if [ ${#failed[@]} -gt 0 ]; then
  echo "nightly GPU job: FAILED lanes: ${failed[*]}"
  exit 1
fi
echo "nightly GPU job: all lanes passed (${lanes[*]})"
