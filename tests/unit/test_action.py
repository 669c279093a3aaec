"""The GitHub Action (``action.yml``, ``scripts/action_check.sh``, docs/github-action.md), tested
without GitHub: the action's declarations against the script it runs, and the script itself on a
checkout-shaped folder, with GitHub's summary and output files pointed at temporary files.

The runs of real SGLang use the releases 0.5.3 and 0.5.3.post1 from the per-user cache
(``kvparity.engine.real.install.cache_root``, filled by ``scripts/setup_env.sh``) and skip, saying
why, when they are not there: the test installs nothing and needs no network."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvparity.engine.real.install import cache_root

ROOT = Path(__file__).resolve().parents[2]
ACTION = ROOT / "action.yml"
SCRIPT = ROOT / "scripts" / "action_check.sh"
WORKFLOW = ROOT / "examples" / "workflows" / "sglang-kvparity.yml"
CHECKED, REFERENCE = "0.5.3.post1", "0.5.3"


# --- reading the YAML (the standard library has none; PyYAML is not a dependency) ----------------

def _lines(text: str) -> list[tuple[int, str]]:
    """(indent, content) of each line that holds something; comments dropped."""
    found = []
    for raw in text.splitlines():
        quote, cut = None, len(raw)
        for i, ch in enumerate(raw):
            if quote:
                quote = None if ch == quote else quote
            elif ch in "'\"":
                quote = ch
            elif ch == "#" and (i == 0 or raw[i - 1] in " \t"):
                cut = i
                break
        line = raw[:cut].rstrip()
        if line.strip():
            found.append((len(line) - len(line.lstrip()), line.strip()))
    return found


def _scalar(text: str) -> Any:
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    if text.startswith("[") and text.endswith("]"):
        return [_scalar(t.strip()) for t in text[1:-1].split(",") if t.strip()]
    return {"true": True, "false": False}.get(text, text)


KEY = re.compile(r"^([\w.-]+):(?: (.*))?$")


def _block(lines: list[tuple[int, str]], i: int, indent: int) -> tuple[Any, int]:
    """The mapping or sequence that starts at line ``i`` (indented ``indent``), and the line after it."""
    if lines[i][1].startswith("- "):
        items = []
        while i < len(lines) and lines[i][0] == indent and lines[i][1].startswith("- "):
            rest = lines[i][1][2:]
            if KEY.match(rest):  # a mapping item: its first key sits two columns in
                lines[i] = (indent + 2, rest)
                item, i = _block(lines, i, indent + 2)
            else:
                item, i = _scalar(rest), i + 1
            items.append(item)
        return items, i
    mapping: dict[str, Any] = {}
    while i < len(lines) and lines[i][0] == indent:
        match = KEY.match(lines[i][1])
        assert match, f"not a YAML key: {lines[i][1]!r}"
        key, value = match.group(1), (match.group(2) or "").strip()
        i += 1
        if value == "|":  # a block scalar: the more-indented lines, joined
            body = []
            while i < len(lines) and lines[i][0] > indent:
                body.append(lines[i][1])
                i += 1
            mapping[key] = "\n".join(body) + "\n"
        elif value:
            mapping[key] = _scalar(value)
        elif i < len(lines) and lines[i][0] > indent:
            mapping[key], i = _block(lines, i, lines[i][0])
        else:
            mapping[key] = None
    return mapping, i


def read_yaml(path: Path) -> dict[str, Any]:
    """The small part of YAML these files use: block mappings and sequences, plain and quoted
    scalars, ``|`` blocks and one-line ``[a, b]`` lists."""
    lines = _lines(path.read_text())
    data, end = _block(lines, 0, 0)
    assert end == len(lines), f"{path.name}: unread from line {lines[end]}"
    return data


def test_the_yaml_reader_agrees_with_pyyaml():
    yaml = pytest.importorskip("yaml", reason="PyYAML is not installed (it is no dependency of kvparity)")
    assert read_yaml(ACTION) == yaml.safe_load(ACTION.read_text())


# --- action.yml against scripts/action_check.sh ---------------------------------------------------

ACTION_DATA = read_yaml(ACTION)
SCRIPT_TEXT = SCRIPT.read_text()
STEP = next(s for s in ACTION_DATA["runs"]["steps"] if s.get("id") == "check")


def script_inputs() -> dict[str, str | None]:
    """INPUT_* variables the script reads, as action input names, with the default it takes."""
    found: dict[str, str | None] = {}
    for var, default in re.findall(r"\$\{(INPUT_[A-Z_]+)(?::-([^}$]*))?", SCRIPT_TEXT):
        found[var.removeprefix("INPUT_").lower().replace("_", "-")] = default or None
    return found


def test_the_action_is_composite_and_runs_the_script_that_exists():
    assert ACTION_DATA["runs"]["using"] == "composite"
    steps = ACTION_DATA["runs"]["steps"]
    assert steps[0]["uses"].startswith("actions/setup-python@")
    assert steps[0]["with"]["python-version"] == "${{ inputs.python-version }}"
    assert STEP["shell"] == "bash"
    ran = re.fullmatch(r'bash "\$\{\{ github\.action_path \}\}/([\w./-]+)"', STEP["run"])
    assert ran, STEP["run"]
    assert (ROOT / ran.group(1)) == SCRIPT and SCRIPT.is_file()
    assert SCRIPT_TEXT.startswith("#!/usr/bin/env bash") and "set -euo pipefail" in SCRIPT_TEXT


def test_every_input_the_script_reads_is_declared_and_passed():
    declared = ACTION_DATA["inputs"]
    read = script_inputs()
    assert set(read) >= {"against", "sglang-path", "backend", "examples", "args"}, read
    assert not set(read) - set(declared), f"the script reads undeclared inputs {set(read) - set(declared)}"
    for name in read:
        var = "INPUT_" + name.upper().replace("-", "_")
        assert STEP["env"].get(var) == f"${{{{ inputs.{name} }}}}", (var, STEP["env"])
    # The script's defaults are the action's (a local run behaves as the action does).
    for name, default in read.items():
        assert (declared[name].get("default") or None) == default, (name, declared[name], default)
    assert declared["against"]["required"] is True and "default" not in declared["against"]
    # Every declared input is used: passed to the script, or to setup-python.
    text = ACTION.read_text()
    assert not [n for n in declared if f"inputs.{n} }}}}" not in text], "declared inputs nobody reads"


def test_every_output_is_one_the_script_writes():
    written = set(re.findall(r'"([a-z-]+)=\$', next(line for line in SCRIPT_TEXT.splitlines()
                                                     if line.strip().startswith('output "verdict='))))
    outputs = ACTION_DATA["outputs"]
    assert {"verdict", "exit-code"} <= set(outputs)
    for name, spec in outputs.items():
        assert spec["value"] == f"${{{{ steps.check.outputs.{name} }}}}" and name in written, (name, written)


def test_a_fresh_install_takes_setup_envs_torch():
    ours = re.search(r"KVPARITY_TORCH:-([^}]+)\}", SCRIPT_TEXT)
    theirs = re.search(r"KVPARITY_TORCH:-([^}]+)\}", (ROOT / "scripts" / "setup_env.sh").read_text())
    assert ours and theirs and ours.group(1) == theirs.group(1)
    assert ours.group(1) in ACTION_DATA["inputs"]["torch"]["description"]


def test_the_example_workflow_uses_the_action_on_sglangs_memory_path():
    workflow = read_yaml(WORKFLOW)
    paths = workflow["on"]["pull_request"]["paths"]
    assert paths == ["python/sglang/srt/mem_cache/**", "python/sglang/srt/managers/schedule_*"]
    steps = workflow["jobs"]["kv-index-parity"]["steps"]
    assert steps[0]["uses"].startswith("actions/checkout@")
    ours = next(s for s in steps if s.get("uses", "").startswith("kvparity/kvparity@"))
    assert ours["with"]["against"] == "0.5.23"
    assert not set(ours["with"]) - set(ACTION_DATA["inputs"]), ours["with"]
    assert "PLACEHOLDER" in WORKFLOW.read_text()


# --- scripts/action_check.sh, run here ------------------------------------------------------------

def run_action(tmp_path: Path, checkout: Path, **inputs: str) -> tuple[subprocess.CompletedProcess, str, dict]:
    """Run the script as the action does (inputs as INPUT_*), from a folder that is not the checkout.
    Returns the run, the job summary and the step's outputs."""
    summary, outputs = tmp_path / "step-summary.md", tmp_path / "github-output"
    summary.write_text("an earlier step's summary\n")
    outputs.write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "INPUT_", "RUNNER_"))}
    env.update({f"INPUT_{k.upper()}": v for k, v in inputs.items()})
    env.update(GITHUB_WORKSPACE=str(checkout), GITHUB_STEP_SUMMARY=str(summary), GITHUB_OUTPUT=str(outputs),
               RUNNER_TEMP=str(tmp_path), KVPARITY_PYTHON=sys.executable)
    done = subprocess.run(["bash", str(SCRIPT)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=540)
    text = summary.read_text()
    assert text.startswith("an earlier step's summary\n"), "the summary must be appended to, not replaced"
    values = dict(line.split("=", 1) for line in outputs.read_text().splitlines())
    return done, text, values


def _cached(version: str) -> Path:
    return cache_root() / version


needs_releases = pytest.mark.skipif(
    not all((_cached(v) / "sglang").is_dir() for v in (CHECKED, REFERENCE)),
    reason=f"needs sglang {CHECKED} and {REFERENCE} in the per-user release cache ({cache_root()}): "
           "run scripts/setup_env.sh once",
)


def _checkout(tmp_path: Path) -> Path:
    """An SGLang checkout's shape: the release's sglang package in its python/ folder."""
    checkout = tmp_path / "sglang-checkout"
    shutil.copytree(_cached(CHECKED), checkout / "python", ignore=shutil.ignore_patterns("__pycache__"))
    return checkout


def _log(done: subprocess.CompletedProcess) -> str:
    return f"exit {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"


def _pair_rows(summary: str) -> list[str]:
    """The world-pair rows of the verdict's table (the ```text block under its heading and summary line)."""
    lines = summary.splitlines()
    start = lines.index("```text") + 1
    table = lines[start:lines.index("```", start)]
    assert table[0].split() == ["world", "pair", "scenarios", "verdict"], summary
    return table[1:]


@needs_releases
def test_parity_writes_the_table_to_the_summary_and_the_verdict_to_the_outputs(tmp_path):
    checkout = _checkout(tmp_path)
    done, summary, outputs = run_action(tmp_path, checkout, against=REFERENCE, examples="2", backend="torch",
                                        args="--jobs 1")
    assert done.returncode == 0, _log(done)
    assert "nothing to install" in done.stdout, _log(done)  # KVPARITY_PYTHON already imports kvparity
    assert "### kvparity check (harness-driven): PARITY" in summary
    rows = _pair_rows(summary)
    assert len(rows) == 1 and re.fullmatch(
        rf"sglang-{REFERENCE}/torch vs sglang-checkout@{CHECKED}/torch +\d+  parity", rows[0]), summary
    assert outputs["verdict"] == "parity" and outputs["exit-code"] == "0", outputs
    assert json.loads(Path(outputs["json"]).read_text())["verdict"] == "parity"
    assert Path(outputs["markdown"]).read_text() in summary


@needs_releases
def test_a_divergence_fails_with_the_first_difference_in_the_summary(tmp_path):
    """The checkout's torch write path puts every new slot one off: the step fails, exit 1."""
    checkout = _checkout(tmp_path)
    batch = checkout / "python" / "sglang" / "srt" / "managers" / "schedule_batch.py"
    source = batch.read_text()
    right = "out_cache_loc[pt : pt + extend_lens[i]],\n"
    assert source.count(right) == 1
    batch.write_text(source.replace(right, "out_cache_loc[pt : pt + extend_lens[i]] + 1,\n"))
    done, summary, outputs = run_action(tmp_path, checkout, against=REFERENCE, examples="2", args="--jobs 1")
    assert done.returncode == 1, _log(done)
    assert "### kvparity check (harness-driven): DIVERGENCE" in summary
    rows = _pair_rows(summary)
    assert len(rows) == 1 and re.fullmatch(
        rf"sglang-{REFERENCE}/torch vs sglang-checkout@{CHECKED}/torch +\d+  DIVERGENCE", rows[0]), summary
    assert re.search(r"\*\*First difference\*\* \([^)]*\): `first difference: step ", summary), summary
    assert outputs["verdict"] == "divergence" and outputs["exit-code"] == "1", outputs


@pytest.mark.parametrize("against", ["", "no-sglang-here"], ids=["no against", "a folder without sglang"])
def test_an_error_fails_with_exit_2_and_says_why(tmp_path, against):
    checkout = tmp_path / "sglang-checkout"
    (checkout / "python").mkdir(parents=True)
    if against:
        against = str(tmp_path / against)
        Path(against).mkdir()
    done, summary, outputs = run_action(tmp_path, checkout, against=against)
    assert done.returncode == 2, _log(done)
    assert "### kvparity check: ERROR (exit status 2)" in summary
    why = "the input 'against'" if not against else "holds no sglang package"
    assert why in summary.split("```text", 1)[1], summary
    assert outputs["verdict"] == "error" and outputs["exit-code"] == "2" and outputs["json"] == "", outputs
    assert Path(outputs["markdown"]).read_text() in summary
