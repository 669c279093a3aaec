#!/usr/bin/env bash
# The body of the kvparity GitHub Action (action.yml): check an SGLang checkout against a release
# with `kvparity check --sglang PATH --against RELEASE`, write the Markdown verdict to the job
# summary and the verdict to the step's outputs, and exit with kvparity's status (0 parity,
# 1 divergence, 2 a usage, loading or install error), so the step fails unless the verdict is
# parity. It runs the same way on a workstation, outside GitHub (docs/github-action.md).
#
# Read from the environment (action.yml passes each input as INPUT_<NAME>):
#   INPUT_AGAINST       the reference: a release, e.g. 0.5.3, or a folder holding the sglang package
#                       (relative to the workspace, or absolute); required
#   INPUT_SGLANG_PATH   the folder holding the sglang package, relative to the workspace (default python)
#   INPUT_BACKEND       torch, triton or all (default torch)
#   INPUT_EXAMPLES      scenarios to play (empty: kvparity's default)
#   INPUT_ARGS          further `kvparity check` arguments, split on whitespace (no quoting)
#   INPUT_TORCH         the torch pip requirement for a fresh install (empty: $KVPARITY_TORCH, else
#                       scripts/setup_env.sh's default)
#   KVPARITY_PYTHON     the python that runs kvparity (default: the one scripts/setup_env.sh makes,
#                       $KVPARITY_VENV/bin/python, else .venv/bin/python beside this script); kvparity
#                       is installed into it only when it cannot import kvparity already
#   GITHUB_WORKSPACE    where INPUT_SGLANG_PATH is relative to (default: the current folder)
#   GITHUB_STEP_SUMMARY, GITHUB_OUTPUT   GitHub's files; when unset, the summary is printed instead
#   RUNNER_TEMP         where the reports go (default: a fresh temporary folder)
# Outputs: verdict (parity | divergence | error), exit-code, markdown (the report, an error's too) and
# json (the JSON verdict; empty when there is none).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

against=${INPUT_AGAINST:-}
sglang_path=${INPUT_SGLANG_PATH:-python}
backend=${INPUT_BACKEND:-torch}
examples=${INPUT_EXAMPLES:-}
read -r -a extra <<< "${INPUT_ARGS:-}"
workspace=${GITHUB_WORKSPACE:-$PWD}
case "$sglang_path" in
  /*) checkout=$sglang_path ;;
  *) checkout=$workspace/$sglang_path ;;
esac
case "$against" in  # a reference folder, given relative to the workspace (kvparity runs elsewhere)
  /* | "") ;;
  *) if [ -d "$workspace/$against" ]; then against=$workspace/$against; fi ;;
esac
reports=$(mktemp -d "${RUNNER_TEMP:-${TMPDIR:-/tmp}}/kvparity-XXXXXX")
markdown=$reports/kvparity.md
json=$reports/kvparity.json
log=$reports/kvparity.log

output() {  # name=value lines for the step's outputs
  if [ -n "${GITHUB_OUTPUT:-}" ]; then
    printf '%s\n' "$@" >> "$GITHUB_OUTPUT"
  else
    printf 'output: %s\n' "$@"
  fi
}

summary() {  # append stdin to the job summary (printed outside GitHub)
  if [ -n "${GITHUB_STEP_SUMMARY:-}" ]; then
    cat >> "$GITHUB_STEP_SUMMARY"
  else
    cat
  fi
}

finish() {  # finish STATUS: outputs, the summary of an error, and the exit
  local status=$1 verdict
  case "$status" in
    0) verdict=parity ;;
    1) verdict=divergence ;;
    *) verdict=error ;;
  esac
  if [ "$verdict" = error ] || [ ! -s "$markdown" ]; then
    {
      printf '### kvparity check: ERROR (exit status %s)\n\n' "$status"
      printf 'Checking `%s` against `%s` gave no verdict; the last lines it printed:\n\n' "$sglang_path" "$against"
      printf '```text\n'
      tail -n 40 "$log" 2>/dev/null || true
      printf '```\n'
    } > "$markdown"
  fi
  summary < "$markdown"
  [ -s "$json" ] || json=
  output "verdict=$verdict" "exit-code=$status" "markdown=$markdown" "json=$json"
  exit "$status"
}

if [ -z "$against" ]; then
  echo "kvparity action: the input 'against' (the reference release, e.g. 0.5.3) is required" | tee "$log" >&2
  finish 2
fi

venv=${KVPARITY_VENV:-$root/.venv}
py=${KVPARITY_PYTHON:-$venv/bin/python}
importable() {  # from an empty folder: a source tree in the current folder must not count
  [ -x "$py" ] || command -v "$py" >/dev/null 2>&1 || return 1
  (cd "$reports" && "$py" -c 'import kvparity.cli.main') >/dev/null 2>&1
}
if importable; then
  echo "kvparity action: kvparity is importable in $py; nothing to install"
else
  echo "kvparity action: installing kvparity from $root into $py"
  {
    if [ -z "${KVPARITY_PYTHON:-}" ] && [ ! -x "$py" ]; then
      "${PYTHON:-python3}" -m venv "$venv"
    fi
    "$py" -m pip install -q --upgrade pip
    "$py" -m pip install -q "${INPUT_TORCH:-${KVPARITY_TORCH:-torch==2.13.0}}"
    "$py" -m pip install -q -e "$root[real]"
  } > "$log" 2>&1 || { cat "$log" >&2; finish 2; }
fi

args=(check --sglang "$checkout" --against "$against" --backend "$backend" --markdown "$markdown" --json "$json")
if [ -n "$examples" ]; then
  args+=(--examples "$examples")
fi
args+=("${extra[@]}")
echo "kvparity action: kvparity ${args[*]}"
set +e
(cd "$reports" && "$py" -m kvparity "${args[@]}") 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
finish "$status"
