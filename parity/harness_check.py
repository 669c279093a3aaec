"""``kvparity check`` without a candidate: this repository's refactored path against the legacy
reference, over every scenario template, in the worlds this machine can run.

Scenarios are drawn per template (so every family of situations gets its share); the first
failure is shrunk by Hypothesis and returned as a readable report.
"""

from __future__ import annotations

import functools
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from hypothesis import Verbosity, given, seed, settings

from parity.classes import REQUIRED
from parity.minimize import failure_kind, minimize
from parity.report import format_failure
from parity.runner import RunResult, run_scenario
from parity.scenario import Scenario
from parity.strategies import TEMPLATES, scenarios


@dataclass
class HarnessVerdict:
    worlds: tuple[str, ...]
    verdict: str = "parity"  # parity | divergence
    scenarios: int = 0
    classes: set[str] = field(default_factory=set)
    findings: Counter = field(default_factory=Counter)  # known defect -> scenarios reaching it
    # known defect -> the first scenario that reached it (Python source) and what was seen there
    finding_examples: dict[str, str] = field(default_factory=dict)
    counterexample: str | None = None
    scenario: Scenario | None = None
    diverged: set[str] = field(default_factory=set)  # worlds that differed or broke an oracle
    seconds: float = 0.0

    @property
    def required_reached(self) -> list[str]:
        return [c for c in REQUIRED if c in self.classes]


class Progress:
    """A progress bar on stderr once a run has taken a few seconds: redrawn in place on a
    terminal, a plain line every ten seconds otherwise (logs stay readable)."""

    def __init__(self, total: int, after_seconds: float = 2.0) -> None:
        self.total, self.after, self.start, self.shown = total, after_seconds, time.monotonic(), False
        self.tty = sys.stderr.isatty()
        self.last_line = 0.0

    def update(self, done: int) -> None:
        elapsed = time.monotonic() - self.start
        if elapsed < self.after:
            return
        if not self.tty:
            if elapsed - self.last_line >= 10 or done == self.total:
                self.last_line = elapsed
                sys.stderr.write(f"kvparity: {done}/{self.total} scenarios, {elapsed:.0f} s\n")
            return
        width = 30
        filled = min(width, width * done // max(self.total, 1))
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{self.total} scenarios, {elapsed:.0f} s")
        sys.stderr.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown and self.tty:
            sys.stderr.write("\n")


def check_repository(
    worlds: tuple[tuple[str, str], ...],
    examples: int,
    random_seed: int | None,
    *,
    lane: Any = None,
    real_reference: bool = False,
) -> HarnessVerdict:
    """Play about ``examples`` scenarios (split over the templates) in ``worlds``; the first world
    is the reference. ``random_seed`` None means derandomized (the same scenarios every run).
    ``lane`` adds real SGLang worlds; with ``real_reference`` its first world is the reference
    (``parity.runner.run_scenario``)."""
    names = tuple(f"{v}/{b}" for v, b in worlds)
    if lane is not None:
        names = tuple(lane.names) if real_reference else names + tuple(lane.names)
    verdict = HarnessVerdict(names)
    play_one = functools.partial(run_scenario, worlds=worlds, lane=lane, real_reference=real_reference)
    per_template = max(1, examples // len(TEMPLATES))
    progress = Progress(per_template * len(TEMPLATES))
    started = time.monotonic()
    failing: list[tuple[Scenario, RunResult]] = []
    try:
        for template in TEMPLATES:
            _play_template(template, play_one, per_template, random_seed, verdict, failing, progress)
            if failing:
                break
    finally:
        progress.close()
    if failing:
        scenario, result = _preferred(failing)
        scenario, result = _minimal(scenario, result, play_one)
        verdict.verdict = "divergence"
        verdict.scenario = scenario
        verdict.counterexample = format_failure(result)
        verdict.diverged = {d.world for d in result.divergences} | {v.split(":", 1)[0] for v in result.violations}
        verdict.worlds = result.worlds
    verdict.seconds = time.monotonic() - started
    return verdict


def _play_template(template, play_one, count, random_seed, verdict, failing, progress) -> None:
    chosen = settings(
        settings(), max_examples=count, database=None, derandomize=random_seed is None, verbosity=Verbosity.quiet
    )

    def play(scenario: Scenario) -> None:
        result = play_one(scenario)
        verdict.scenarios += 1
        verdict.classes |= result.classes
        verdict.findings.update({d.known_defect for d in result.findings})
        for d in result.findings:
            verdict.finding_examples.setdefault(d.known_defect, f"{d.what}: {d.detail}\n{scenario.to_python()}")
        progress.update(verdict.scenarios)
        if result.divergences:
            failing.append((scenario, result))
            raise WorldsDisagree(format_failure(result))
        if not result.ok:
            failing.append((scenario, result))
            raise OracleFailed(format_failure(result))

    test = chosen(given(scenarios(templates=(template,)))(play))
    if random_seed is not None:
        test = seed(random_seed)(test)
    try:
        test()
    except Exception:  # one of ours, or an ExceptionGroup of both kinds (Hypothesis reports each)
        if not failing:
            raise


def _minimal(scenario: Scenario, result: RunResult, play_one) -> tuple[Scenario, RunResult]:
    """Remove what plays no part (``parity.minimize``), keeping the kind of failure."""
    kind = failure_kind(result)
    results: dict[Scenario, RunResult] = {}

    def fails(candidate: Scenario) -> bool:
        results[candidate] = play_one(candidate)
        return failure_kind(results[candidate]) == kind

    smallest = minimize(scenario, fails)
    return (scenario, result) if smallest == scenario else (smallest, results[smallest])


class WorldsDisagree(AssertionError):
    """Some world differs from the reference (cells, fields, stages)."""


class OracleFailed(AssertionError):
    """Every world agrees, but an oracle that does not trust the reference failed."""


def _preferred(failing: list[tuple[Scenario, RunResult]]) -> tuple[Scenario, RunResult]:
    """The counterexample to show. Hypothesis shrinks a disagreement and an oracle failure as two
    bugs and replays each shrunk example last; a disagreement shows the differing cells, so it
    wins. (Hypothesis replays the shrunk example of each bug after its search.)"""
    disagreements = [f for f in failing if f[1].divergences]
    return (disagreements or failing)[-1]
