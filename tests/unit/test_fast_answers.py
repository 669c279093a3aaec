"""A fast "no": the first failing scenario is handed over (and printed) the moment it is found,
before it is shrunk; nothing more of the plan is played after it; shrinking is bounded and
visible; progress never counts past its total; an output file that cannot be written is refused
before the run, and one that fails after it costs exit 2, never the verdict."""

from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path

import pytest
import torch

from kvparity.cli.main import main
from kvparity.golden.scenarios import GOLDENS
from kvparity.model import profiles
from kvparity.model.scenario import scenario_to_dict
from kvparity.refactored import schedule_batch
from kvparity.report.progress import Progress
from kvparity.run.harness_drive import check_harness
from kvparity.run.runner import run_scenario

TORCH_WORLDS = (("legacy", "torch"), ("refactored", "torch"))


@pytest.fixture(autouse=True)
def keep_the_suites_profile():
    """``kvparity check`` loads its own Hypothesis profile; give the suite's back afterwards."""
    suite_profile = os.environ["HYPOTHESIS_PROFILE"]
    yield
    profiles.load(suite_profile)


@pytest.fixture
def planted(monkeypatch):
    """The refactored last_loc from the second-to-last prefix element (in this process only)."""

    def second_to_last(prefix_tensors, device):
        minus_one = torch.tensor([-1], dtype=torch.int64, device=device)
        return torch.cat([p[-2:-1].to(device) if len(p) > 1 else minus_one for p in prefix_tensors])

    monkeypatch.setattr(schedule_batch, "last_loc_from_prefixes", second_to_last)
    return monkeypatch


class Recorder:
    """SweepEvents that keep what they hear, in order."""

    def __init__(self) -> None:
        self.heard: list[tuple] = []

    def played(self) -> None:
        self.heard.append(("played",))

    def found(self, first, *, stop: bool) -> bool:
        self.heard.append(("found", first))
        return True

    def shrinking(self, tried, smallest) -> None:
        self.heard.append(("shrinking", tried, smallest))

    def cancelled(self) -> bool:
        return False

    def claim(self, key: str) -> bool:
        return True

    def elapsed(self) -> float:
        return 0.0

    def kinds(self) -> list[str]:
        return [h[0] for h in self.heard]


def test_the_failure_is_handed_over_as_found_then_shrunk(planted):
    heard = Recorder()
    verdict = check_harness(TORCH_WORLDS, 60, None, events=heard)
    kinds = heard.kinds()
    found = kinds.index("found")
    assert "shrinking" not in kinds[:found] and "shrinking" in kinds[found:]
    assert "played" not in kinds[found:]  # nothing more of the plan, and no replay by Hypothesis
    assert kinds[found - 1] == "played"  # the failing scenario is played (and counted) before it is handed over
    first = heard.heard[found][1]
    assert verdict.first is not None and verdict.first.found.scenario == first.found.scenario
    shown = verdict.shrunk
    assert shown is not None and not first.found.result.ok and not shown.shown.result.ok
    assert shown.shrunk is not None and shown.shrunk.complete
    assert len(shown.shown.scenario.requests) <= len(first.found.scenario.requests)
    assert verdict.scenarios == kinds.count("played")  # the failing one is counted too


def test_no_shrink_reports_the_failure_as_found(planted):
    heard = Recorder()
    verdict = check_harness(TORCH_WORLDS, 60, None, events=heard, shrink_budget_s=None)
    assert verdict.verdict == "divergence" and verdict.first is not None and verdict.first.shrunk is None
    assert verdict.shrunk is verdict.first and verdict.first.shown.scenario == verdict.first.found.scenario
    assert "shrinking" not in heard.kinds()


def test_a_known_defects_first_example_is_shrunk_and_still_reaches_it():
    profiles.load("ci")  # the default run's scenarios, which reach legacy's chunk-cache alias
    verdict = check_harness(TORCH_WORLDS, 100, None)
    examples = {label: verdict.finding_example(label) for label in verdict.findings}
    assert examples, "no known defect reached: pick a run that reaches one"
    shrunk = {d: e for d, e in examples.items() if e is not None and e.shrunk is not None}
    assert shrunk, "no first example was shrunk"
    for defect, example in shrunk.items():
        small, original = example.shown.scenario, example.found.scenario
        assert len(small.requests) + len(small.steps) < len(original.requests) + len(original.steps)
        assert defect in {d.known_defect for d in run_scenario(small, TORCH_WORLDS).findings}
    unshrunk = check_harness(TORCH_WORLDS, 100, None, finding_budget_s=0)
    assert unshrunk.findings and all(unshrunk.finding_example(label).shrunk is None for label in unshrunk.findings)


class Terminal(io.StringIO):
    def isatty(self) -> bool:  # a bar redrawn at every step
        return True


def test_progress_never_counts_past_its_total():
    out = Terminal()
    progress = Progress(3, after_seconds=0, stream=out)
    for _ in range(5):
        progress.step()
    progress.say("shrinking: 2 smaller scenarios tried, now 1 requests, 2 steps")
    counts = [tuple(map(int, m)) for m in re.findall(r"(\d+)/(\d+) scenarios", out.getvalue())]
    assert counts == [(1, 3), (2, 3), (3, 3), (3, 3), (3, 3)], out.getvalue()
    assert out.getvalue().endswith("shrinking: 2 smaller scenarios tried, now 1 requests, 2 steps, 0 s")


def test_check_prints_the_first_divergence_before_the_shrunk_one(planted, tmp_path, capsys):
    out = tmp_path / "v.json"
    status = main(["check", "--examples", "60", "--backend", "torch", "--jobs", "1", "--json", str(out)])
    printed = capsys.readouterr().out
    assert status == 1
    first, shrunk, verdict = (printed.index(w) for w in ("first divergence found", "shrunk counterexample",
                                                          "verdict (harness-driven): DIVERGENCE"))
    assert first < shrunk < verdict
    data = json.loads(out.read_text())
    found = data["first_difference"]
    assert found["scenario"] and found["shrunk"]["scenario"]
    assert found["shrunk"]["complete"] is True
    replay = re.search(r"replay: (kvparity check .* --replay (\S+))", printed[first:shrunk])
    assert replay and Path(replay.group(2)).exists()


def test_replay_plays_a_saved_scenario_in_the_runs_worlds(planted, tmp_path, capsys):
    verdict = tmp_path / "v.json"
    assert main(["check", "--examples", "60", "--backend", "torch", "--jobs", "1", "--no-shrink",
                 "--json", str(verdict)]) == 1
    assert main(["check", "--backend", "torch", "--replay", str(verdict)]) == 1  # a --json verdict's counterexample
    planted.undo()
    assert main(["check", "--backend", "torch", "--replay", str(verdict)]) == 0
    saved = tmp_path / "golden.json"
    saved.write_text(json.dumps(scenario_to_dict(GOLDENS["chunked-radix-cache"])))
    assert main(["check", "--backend", "torch", "--replay", str(saved)]) == 0
    assert "verdict: PARITY" in capsys.readouterr().out


@pytest.mark.parametrize("argv, words", [
    (["--json", "/proc/kvparity-verdict.json"], "--json /proc/kvparity-verdict.json: cannot be written"),
    (["--replay", "/nonexistent-kvparity/s.json"], "--replay /nonexistent-kvparity/s.json: no scenario"),
    (["--no-shrink", "--shrink-budget", "5"], "contradict"),
    (["--shrink-budget", "0"], "--shrink-budget must be greater than 0"),
])
def test_bad_outputs_and_shrink_options_are_refused_before_the_run(argv, words, capsys):
    assert main(["check", *argv]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


def test_a_probe_leaves_nothing_behind(tmp_path, capsys):
    out = tmp_path / "verdict.json"
    assert main(["check", "--examples", "1", "--backend", "torch", "--jobs", "1", "--json", str(out),
                 "--markdown", str(tmp_path / "missing" / "v.md")]) == 2  # refused: a folder is missing
    assert not out.exists()


def test_a_file_that_fails_after_the_run_costs_exit_2_not_the_verdict(tmp_path, monkeypatch, capsys):
    out = tmp_path / "verdict.json"
    write_text = Path.write_text

    def refuse(self, *args, **kwargs):
        if self == out:
            raise OSError(28, "No space left on device")
        return write_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", refuse)
    assert main(["check", "--examples", "10", "--backend", "torch", "--jobs", "1", "--json", str(out)]) == 2
    captured = capsys.readouterr()
    assert "verdict (harness-driven): PARITY" in captured.out
    assert "--json" in captured.err and "No space left on device" in captured.err and "Traceback" not in captured.err


def test_shrinking_replays_the_reference_and_one_failed_world_torch_first():
    from kvparity.judge.compare import Difference
    from kvparity.judge.run_result import RunResult
    from kvparity.run.harness_drive import replay_worlds

    worlds = ("sglang-0.5.3/torch", "copy@0.5.3.post1/triton", "copy@0.5.3.post1/torch")
    result = RunResult(GOLDENS["chunked-radix-cache"], worlds)
    result.divergences = [Difference(w, worlds[0], "cells", "") for w in worlds[1:]]
    assert replay_worlds(result) == {"sglang-0.5.3/torch", "copy@0.5.3.post1/torch"}
    result.divergences = [Difference(worlds[0], worlds[0], "stages", "the worlds ran different stages")]
    assert replay_worlds(result) is None  # only the reference named: every world replays


def test_a_disagreement_is_replayed_in_a_world_that_disagreed():
    """A torch world that only broke an oracle would turn the disagreement into an oracle failure."""
    from kvparity.judge.compare import Difference
    from kvparity.judge.oracles import Violation
    from kvparity.judge.run_result import RunResult
    from kvparity.run.harness_drive import replay_worlds

    worlds = ("sglang-0.5.3/torch", "copy@0.5.3.post1/triton", "copy@0.5.3.post1/torch")
    result = RunResult(GOLDENS["chunked-radix-cache"], worlds)
    result.divergences = [Difference(worlds[1], worlds[0], "cells", "")]
    result.violations = [Violation(worlds[2], "step 1 extend: prefix_indices has dtype torch.int32")]
    assert replay_worlds(result) == {"sglang-0.5.3/torch", "copy@0.5.3.post1/triton"}
