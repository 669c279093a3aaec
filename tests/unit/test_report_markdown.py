"""``kvparity check --markdown PATH`` (``kvparity.report.markdown``): the verdict table the console
prints (the drive's own), as Markdown, and on a divergence the first difference; built from the
result objects."""

from __future__ import annotations

import os
from collections import Counter
from types import SimpleNamespace

import pytest

from kvparity.candidate.check import CheckResult
from kvparity.candidate.inputs import Fault
from kvparity.candidate.markdown import candidate_markdown
from kvparity.cli.main import main
from kvparity.judge.compare import Difference
from kvparity.judge.oracles import Violation
from kvparity.judge.run_result import RunResult
from kvparity.judge.verdict import Example, Row, Verdict
from kvparity.model import profiles
from kvparity.model.classes import REQUIRED
from kvparity.model.records import StageRecord
from kvparity.model.scenario import Extend, RequestSpec, Scenario
from kvparity.model.strategies import TEMPLATES
from kvparity.model.worlds import Geometry
from kvparity.report.markdown import check_markdown
from kvparity.run.harness_drive import HarnessDrive, HarnessSpec


@pytest.fixture(autouse=True)
def keep_the_suites_profile():
    """``kvparity check`` loads its own Hypothesis profile; give the suite's back afterwards."""
    suite_profile = os.environ["HYPOTHESIS_PROFILE"]
    yield
    profiles.load(suite_profile)


SCENARIO = Scenario(
    geometry=Geometry(pool_rows=2, max_context_len=5, kv_slots=8, page_size=1, need_sort=False),
    cache_kind="radix",
    chunk_size=1,
    requests=(RequestSpec("r0", (10000,), max_new_tokens=64),),
    steps=(Extend(admit=("r0",)),),
)
WORLDS = ("sglang-0.5.3/torch", "sglang@0.5.3.post1/torch", "sglang@0.5.3.post1/triton")


def _table_rows(text: str) -> list[list[str]]:
    """The world-pair rows of the drive's table (the ```text block under the summary), split in words."""
    lines = text.splitlines()
    start = lines.index("```text") + 1
    table = lines[start:lines.index("```", start)]
    assert table[0].split() == ["world", "pair", "scenarios", "verdict"], table
    return [line.split() for line in table[1:]]


def _drive() -> HarnessDrive:
    """A harness drive whose worlds are WORLDS (a stand-in lane names them; nothing is played)."""
    return HarnessDrive(HarnessSpec((("legacy", "torch"),), real_reference=True), lane=SimpleNamespace(names=WORLDS))


def _verdict(drive: HarnessDrive, row: Row, seconds: float = 0.0) -> Verdict:
    verdict = Verdict("harness", drive.reference, drive.checked, [row], REQUIRED, seconds=seconds)
    verdict.summary_line = drive.summary(verdict)
    return verdict


def test_parity_is_one_row_per_world_pair():
    drive = _drive()
    verdict = _verdict(drive, Row("chunked rounds", (0,), scenarios=40, classes=Counter({REQUIRED[0]: 40})), 3.2)
    text = check_markdown(verdict, drive)
    assert text.startswith("### kvparity check (harness-driven): PARITY\n")
    assert _table_rows(text) == [
        ["sglang-0.5.3/torch", "vs", "sglang@0.5.3.post1/torch", "40", "parity"],
        ["sglang-0.5.3/torch", "vs", "sglang@0.5.3.post1/triton", "40", "parity"],
    ]
    assert f"classes reached: 1/{len(REQUIRED)}." in text and f"- {REQUIRED[1]}" in text
    assert "First difference" not in text


def test_divergence_names_the_world_and_the_first_difference():
    record = StageRecord(step=0, kind="extend", rids=("r0",))
    failure = RunResult(SCENARIO, WORLDS, divergences=[
        Difference(WORLDS[1], WORLDS[0], "req_to_token", "1 cell differs", cells=[(0, 0, 1, 2)])],
        violations=[Violation(WORLDS[1], "step 0 extend: request r0 row 0 columns [0]: got [2], expected [1]")],
        first_difference=record)
    drive = _drive()
    played = drive._played(failure)
    assert not played.agree and played.kind == "disagree"
    row = Row("chunked rounds", (0,), scenarios=12, differing=1, kinds=Counter({"disagree": 1}),
              first=Example(played, "chunked rounds"), findings=Counter({"stale row cells": 3}))
    text = check_markdown(_verdict(drive, row), drive)
    assert text.startswith("### kvparity check (harness-driven): DIVERGENCE\n")
    assert _table_rows(text) == [
        ["sglang-0.5.3/torch", "vs", "sglang@0.5.3.post1/torch", "12", "DIVERGENCE"],
        ["sglang-0.5.3/torch", "vs", "sglang@0.5.3.post1/triton", "12", "parity"],
    ]
    assert ("**First difference** (chunked rounds): `first difference: step 0 extend ['r0'] "
            "(reference sglang-0.5.3/torch)`") in text
    cells = next(line for line in text.splitlines() if line.startswith(WORLDS[1]) and " 0 0 " in line)
    assert cells.split()[-2:] == ["1", "2"]  # expected, got
    assert "got [2], expected [1]" in text and "stale row cells, in 3 scenarios" in text
    assert "RequestSpec('r0', (10000,), max_new_tokens=64)" in text and "python -m kvparity.run.replay" in text
    assert "kvparity check --drive harness --replay FILE" in text
    assert text.count("```") % 2 == 0  # every fence closed


def test_a_candidate_gets_its_row_and_fault():
    result = CheckResult("write_cache_indices", "examples/x.py:write", "divergence", batches_run=7, drawn=9,
                         fault=Fault("wrong", "req_to_token differs", ["row 0 col 1: expected 5, got 6"]))
    text = candidate_markdown(result)
    assert "| `write_cache_indices` | `examples/x.py:write` | 7 of 9 drawn | **DIVERGENCE** |" in text
    assert "**Fault: wrong**" in text and "row 0 col 1: expected 5, got 6" in text


def test_check_writes_the_markdown_it_prints(tmp_path, capsys):
    out = tmp_path / "verdict.md"
    examples = len(TEMPLATES)  # one per template
    assert main(["check", "--examples", str(examples), "--backend", "torch", "--jobs", "1", "--markdown", str(out)]) == 0
    printed = capsys.readouterr().out
    text = out.read_text()
    assert "legacy/torch vs refactored/torch" in printed and f"wrote {out}" in printed
    assert _table_rows(text) == [["legacy/torch", "vs", "refactored/torch", str(examples), "parity"]]


def test_an_unwritable_markdown_path_is_a_usage_error(tmp_path, capsys):
    status = main(["check", "--examples", "10", "--markdown", str(tmp_path / "no-such-folder" / "v.md")])
    assert status == 2 and "--markdown" in capsys.readouterr().err
