"""Teeth, shown and not assumed: each mutant of the zoo (``kvparity.teeth.zoo``) breaks a copy of the
code the way a real regression would, and the ``ci``-profile properties must fail on it, with a
readable report or the exception the broken code raised. One test per mutant, so pytest-xdist
spreads them; the permanent @examples of test_parity.py kill each in seconds."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from kvparity.cli.mutants import counterexample_line, judge, scenarios_until_failure
from kvparity.model.ledger import read as read_ledger
from kvparity.teeth.results import ENV, RunFailure, failure_of, read
from kvparity.teeth.zoo import MUTANTS, SCHEDULER_MUTANTS, Edit, Mutant, MutantError, apply_edits, run_properties

REPORTED = ("kvparity: the worlds disagree", "kvparity: an oracle failed")


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_properties_kill_mutant(mutant: Mutant) -> None:
    with tempfile.TemporaryDirectory() as ledger_dir:
        result_file = Path(ledger_dir) / "first-failure.json"
        # Killed or not is the question here, not the smallest counterexample (`kvparity mutants` shows
        # that): the mutation profile draws as ci does, stops at the first failure and shrinks nothing.
        done = run_properties(mutant, profile="mutation", ledger_dir=Path(ledger_dir), result_file=result_file,
                              minimize=False)
        entries = read_ledger(ledger_dir)
        failure = read(result_file)
    output = done.stdout + done.stderr
    assert done.returncode == 1, f"{mutant.name} ({mutant.bug_class}) survived:\n{output[-3000:]}"
    killed, scenarios, line = judge(done, entries, failure)
    assert failure is not None and line != "(no report found)", output[-3000:]
    assert killed and scenarios is not None and scenarios <= 20, (
        f"{mutant.name}: killed only after {scenarios} scenarios; give its bug class a permanent @example")
    assert any(m in output for m in REPORTED) or "Error" in output, output[-3000:]


def test_zoo_has_every_bug_class() -> None:
    assert len(MUTANTS) >= 14
    assert len({m.name for m in MUTANTS}) == len(MUTANTS), "mutant names must be unique"
    assert len({m.bug_class for m in MUTANTS}) == len(MUTANTS), "one bug class per mutant"


@pytest.mark.parametrize("mutant", MUTANTS + SCHEDULER_MUTANTS, ids=[m.name for m in MUTANTS + SCHEDULER_MUTANTS])
def test_mutant_applies_cleanly(mutant: Mutant) -> None:
    """Every edit's text occurs exactly once in the current code and the edit changes the file."""
    root = Path(__file__).resolve().parents[2]
    for edit in mutant.edits:
        text = (root / edit.path).read_text()
        assert text.count(edit.old) == 1, f"{mutant.name}: {edit.old!r} occurs {text.count(edit.old)} times in {edit.path}"
        assert edit.old != edit.new


def test_apply_edits_refuses_missing_or_repeated_text(tmp_path: Path) -> None:
    (tmp_path / "f.py").write_text("a = 1\na = 1\n")
    for old in ("a = 1", "b = 2"):
        with pytest.raises(MutantError, match="occurs"):
            apply_edits(Mutant("m", "c", (Edit("f.py", old, "x"),)), tmp_path)
    assert (tmp_path / "f.py").read_text() == "a = 1\na = 1\n"


def test_scenarios_until_failure_counts_through_the_first_failure() -> None:
    assert scenarios_until_failure([{"ok": True}, {"ok": False}, {"ok": False}]) == 2
    assert scenarios_until_failure([{"ok": True}]) is None


REPLAY = {"cache_kind": "radix", "geometry": {"page_size": 4}, "requests": [{}], "steps": [{"step": "Extend"}]}
FAILING_TEST = f"""
from kvparity.teeth.results import ScenarioFailed

def test_fails():
    raise ScenarioFailed("a report the zoo does not read", {{"what": "first difference: step 1 extend ['r0']",
                                                           "replay": {REPLAY!r}}})
"""


def test_judge_survivor_and_counterexample_line() -> None:
    survived = subprocess.CompletedProcess([], 0, "1 passed", "")
    assert judge(survived, [{"ok": True}]) == (False, None, "survived")
    failure = RunFailure("t", "failed", "ScenarioFailed", "ScenarioFailed: kvparity: the worlds disagree",
                         "first difference: step 1 extend ['r0']", REPLAY)
    line = counterexample_line(failure)
    assert line == "first difference: step 1 extend ['r0'] [radix cache, page 4, 1 reqs, steps extend]"
    killed, scenarios, _ = judge(subprocess.CompletedProcess([], 1, "", ""), [{"ok": True}, {"ok": False}], failure)
    assert killed and scenarios == 2
    raised = failure_of("t", "failed", KeyError("r9"))
    assert (raised.error_type, raised.replay, counterexample_line(raised)) == ("KeyError", None, "KeyError: 'r9'")
    assert counterexample_line(None) == "(no report found)"


def test_the_zoo_reads_the_first_failure_as_data_not_from_the_output(tmp_path: Path) -> None:
    """A test run under the zoo's plugin hands back its failure as JSON: the record the error
    carried (not the report it prints), its outcome and its error type."""
    (tmp_path / "test_fails.py").write_text(FAILING_TEST)
    result_file = tmp_path / "first-failure.json"
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, ENV: str(result_file), "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "kvparity.teeth.plugin",
                           str(tmp_path / "test_fails.py")], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 1, done.stdout + done.stderr
    failure = read(result_file)
    assert failure is not None and (failure.outcome, failure.error_type) == ("failed", "ScenarioFailed")
    assert failure.replay == REPLAY
    assert counterexample_line(failure) == "first difference: step 1 extend ['r0'] [radix cache, page 4, 1 reqs, steps extend]"


@pytest.mark.parametrize("mutant", SCHEDULER_MUTANTS, ids=[m.name for m in SCHEDULER_MUTANTS])
def test_the_scheduler_driven_check_kills_a_mutant_of_the_model(mutant: Mutant, tmp_path: Path) -> None:
    """A broken copy of kvparity's model of SGLang's scheduler (shared by both versions, so their
    decisions still agree) breaks the memory oracles kvparity's own model must never break:
    ``kvparity check --drive scheduler`` in the copy is a divergence, shown as a memory oracle."""
    from kvparity.teeth.zoo import mutated_copy

    copy = mutated_copy(mutant, tmp_path / "copy")
    env = {**os.environ, "PYTHONPATH": str(copy)}
    done = subprocess.run([sys.executable, "-m", "kvparity", "check", "--drive", "scheduler", "--traffic-examples", "12",
                           "--jobs", "1", "--no-shrink"], cwd=copy, env=env, capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 1, f"{mutant.name} ({mutant.bug_class}) survived:\n{output[-3000:]}"
    assert "memory oracle" in output and "slots conserved" in output, output[-3000:]
