"""Teeth, shown and not assumed: each mutant of the zoo (``parity.mutants``) breaks a copy of the
code the way a real regression would, and the ``ci``-profile properties must fail on it, with a
readable report or the exception the broken code raised. One test per mutant, so pytest-xdist
spreads them; the permanent @examples of test_parity.py kill each in seconds."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

import pytest

from parity.cli_mutants import counterexample_line, judge, scenarios_until_failure
from parity.ledger import read
from parity.mutants import MUTANTS, Edit, Mutant, MutantError, apply_edits, run_properties

REPORTED = ("kvparity: the worlds disagree", "kvparity: an oracle failed")


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_properties_kill_mutant(mutant: Mutant) -> None:
    with tempfile.TemporaryDirectory() as ledger_dir:
        done = run_properties(mutant, profile="ci", ledger_dir=Path(ledger_dir))
        entries = read(ledger_dir)
    output = done.stdout + done.stderr
    assert done.returncode == 1, f"{mutant.name} ({mutant.bug_class}) survived:\n{output[-3000:]}"
    killed, scenarios, _ = judge(done, entries)
    assert killed and scenarios is not None and scenarios <= 20, (
        f"{mutant.name}: killed only after {scenarios} scenarios; give its bug class a permanent @example")
    assert any(m in output for m in REPORTED) or "Error" in output, output[-3000:]


def test_zoo_has_every_bug_class() -> None:
    assert len(MUTANTS) >= 14
    assert len({m.name for m in MUTANTS}) == len(MUTANTS), "mutant names must be unique"
    assert len({m.bug_class for m in MUTANTS}) == len(MUTANTS), "one bug class per mutant"


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
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


def test_judge_survivor_and_counterexample_line() -> None:
    survived = subprocess.CompletedProcess([], 0, "1 passed", "")
    assert judge(survived, [{"ok": True}]) == (False, None, "survived")
    report = ("E   kvparity: the worlds disagree\nE   first difference: step 1 extend ['r0']\n"
              "or: python -m parity.replay '{\"cache_kind\": \"radix\", \"geometry\": {\"page_size\": 4}, "
              "\"requests\": [{}], \"steps\": [{\"step\": \"Extend\"}]}'\n")
    line = counterexample_line(report)
    assert line.startswith("first difference: step 1 extend ['r0']") and "radix cache, page 4" in line
    killed, scenarios, _ = judge(subprocess.CompletedProcess([], 1, report, ""), [{"ok": True}, {"ok": False}])
    assert killed and scenarios == 2
