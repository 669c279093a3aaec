"""``kvparity check`` without a candidate: this repository's refactored path against the legacy
reference, over every scenario template, in the worlds this machine can run.

Scenarios are drawn per template (so every family of situations gets its share). The first
failing scenario ends the sweep at once: it is handed to the caller as found (``SweepEvents.found``:
the report comes first), every other task is cancelled, and then it is shrunk
(``kvparity.run.shrink``) within a time budget, replaying only a world that failed. Hypothesis
draws the scenarios but never shrinks them: the first failure leaves it as a ``FoundFailure``.

What is played is the plan (``kvparity.run.plan``); what the caller hears, the events
(``kvparity.run.events``); a parallel run, the jobs (``kvparity.run.jobs``).
"""

from __future__ import annotations

import functools
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hypothesis import Verbosity, given, seed, settings

from kvparity.engine.real.worker import WorkerStartError
from kvparity.model.classes import REQUIRED
from kvparity.model.scenario import Scenario
from kvparity.model.strategies import TEMPLATES, scenarios
from kvparity.model.worlds import WorldId
from kvparity.report.failure import format_failure
from kvparity.run.events import FindingExample, FirstFailure, QuietEvents, SweepEvents
from kvparity.run.jobs import play_in_jobs
from kvparity.run.minimize import DEFAULT_BUDGET_S, Shrunk
from kvparity.run.plan import FINDING_BUDGET_S, SHARD_SIZE, TemplateOutcome, TemplatePlan
from kvparity.run.plan import per_template as plan_per_template
from kvparity.run.runner import RunResult, run_scenario
from kvparity.run.shrink import failed_worlds, shrink_examples, shrunk_failure


@dataclass
class HarnessVerdict:
    worlds: tuple[str, ...]
    verdict: str = "parity"  # parity | divergence
    scenarios: int = 0
    classes: set[str] = field(default_factory=set)
    findings: Counter = field(default_factory=Counter)  # known defect -> scenarios reaching it
    finding_examples: dict[str, FindingExample] = field(default_factory=dict)  # known defect -> its first example
    counterexample: str | None = None
    scenario: Scenario | None = None
    diverged: set[str] = field(default_factory=set)  # worlds that differed or broke an oracle
    failure: RunResult | None = None  # the shrunk counterexample's result (``counterexample`` is its report)
    first_failure: FirstFailure | None = None  # the counterexample as found, before shrinking
    shrink: Shrunk | None = None  # how shrinking went (None: not shrunk, --no-shrink)
    seconds: float = 0.0
    per_device: Counter = field(default_factory=Counter)  # GPU -> scenarios its jobs played (parallel runs)
    kernels: dict[str, dict[str, str]] = field(default_factory=dict)  # real world -> the kernels it ran (0.5.22+)

    @property
    def required_reached(self) -> list[str]:
        return [c for c in REQUIRED if c in self.classes]


def check_repository(
    worlds: tuple[tuple[str, str], ...],
    examples: int,
    random_seed: int | None,
    *,
    lane: Any = None,
    real_reference: bool = False,
    jobs: int = 1,
    lane_factory: Callable[[], Any] | None = None,
    shard_size: int | None = None,
    events: SweepEvents | None = None,
    shrink_budget_s: float | None = DEFAULT_BUDGET_S,
    finding_budget_s: float = FINDING_BUDGET_S,
) -> HarnessVerdict:
    """Play about ``examples`` scenarios (split over the templates) in ``worlds``; the first world
    is the reference. ``random_seed`` None means derandomized (the same scenarios every run).
    ``lane`` adds real SGLang worlds; with ``real_reference`` its first world is the reference
    (``kvparity.run.runner.run_scenario``).

    ``jobs`` > 1 shares the (template, shard) tasks out over that many worker processes (each with
    its own real-SGLang workers, from ``lane_factory``, and, on a GPU run, pinned to one visible
    GPU, round-robin). A template of more than ``shard_size`` scenarios is played as several
    shards of its own seeds. A parity run plays, counts and reaches what ``jobs=1`` does (tasks
    are merged in their order). A failure stops every job at once, so a parallel run reports the
    first failure found, which may differ from run to run where several templates fail.

    ``events`` hears of each scenario played, the failure as found, and shrinking's progress.
    ``shrink_budget_s`` bounds shrinking (None: the failure is reported as found);
    ``finding_budget_s`` bounds shrinking each known defect's first example (0: not shrunk)."""
    names = tuple(str(WorldId.modelled(v, b)) for v, b in worlds)
    real_names = tuple(lane.names) if lane is not None else ()
    if lane is not None:
        names = real_names if real_reference else names + real_names
    verdict = HarnessVerdict(names)
    per_template = plan_per_template(examples)
    events = events or QuietEvents()
    started = time.monotonic()
    plan = TemplatePlan(worlds, per_template, random_seed, real_reference, shard_size or SHARD_SIZE,
                        shrink_budget_s, finding_budget_s)
    if jobs <= 1:
        outcomes = play_templates(plan.tasks(), plan, lane, events)
    else:
        outcomes = play_in_jobs(jobs, plan, lane_factory, events, play_templates)
    _merge(verdict, outcomes)
    verdict.seconds = time.monotonic() - started
    return verdict


class FoundFailure(BaseException):
    """A failing scenario, raised through Hypothesis the moment it is played. A BaseException, so
    Hypothesis neither shrinks it nor replays it: the sweep reports it, then shrinks it itself."""

    def __init__(self, scenario: Scenario, result: RunResult) -> None:
        super().__init__("a failing scenario")
        self.scenario, self.result = scenario, result


class Unplayable(BaseException):
    """A real SGLang that cannot even start its worker, raised through Hypothesis (which would
    otherwise shrink it, starting a failing worker for every candidate) and re-raised after."""

    def __init__(self, error: WorkerStartError) -> None:
        super().__init__(str(error))
        self.error = error


class Cancelled(BaseException):
    """Raised through Hypothesis between two scenarios when another task has failed."""


def play_templates(tasks: list[tuple[int, int]], plan: TemplatePlan, lane: Any, events: SweepEvents) -> list[TemplateOutcome]:
    """Play the (template, shard) ``tasks`` in order, stopping at the first failure."""
    play_one = functools.partial(run_scenario, worlds=plan.worlds, lane=lane, real_reference=plan.real_reference)
    tick = functools.partial(_tick, events)
    outcomes = []
    for index, shard in tasks:
        outcome = TemplateOutcome(index, shard)
        outcomes.append(outcome)
        watch = _watching(play_one, outcome)
        try:
            _play_template(TEMPLATES[index], watch, plan.examples(shard), plan.seed(index, shard), outcome, [], tick)
        except FoundFailure as found:
            _count(outcome, found.scenario, found.result)
            outcome.first_failure = FirstFailure(found.scenario, found.result, TEMPLATES[index].name)
            events.found(outcome.first_failure)
            outcome.reported = not events.cancelled()  # False: another job's failure came first
            if outcome.reported:
                outcome.failure, outcome.shrink = shrunk_failure(found.scenario, found.result, plan, lane, events)
            else:
                outcome.failure = (found.scenario, found.result)
            break
        except Cancelled:
            outcome.cancelled = True
            break
        except Unplayable as unplayable:
            raise unplayable.error from None
        shrink_examples(outcome, plan, lane, events)
    return outcomes


def _tick(events: SweepEvents) -> None:
    events.played()
    if events.cancelled():
        raise Cancelled


def _watching(play_one: Callable[[Scenario], RunResult], outcome: TemplateOutcome) -> Callable[[Scenario], RunResult]:
    """``play_one``, keeping which kernels each real world ran and each known defect's first
    scenario, and raising ``FoundFailure`` on a failing scenario. (A wrapper, not lines in
    ``_play_template``'s ``play``: Hypothesis derives a derandomized run's draws from that
    function's source, so editing it would change every default run's scenarios.)"""

    def play(scenario: Scenario) -> RunResult:
        try:
            result = play_one(scenario)
        except WorkerStartError as exc:  # no scenario can play: not a failure for Hypothesis to shrink
            raise Unplayable(exc) from None
        for world, kernels in result.kernels.items():
            outcome.kernels.setdefault(world, kernels)
        for d in result.findings:
            if d.known_defect and d.known_defect not in outcome.examples:
                outcome.examples[d.known_defect] = FindingExample(scenario, d.what, d.detail, d.world)
        if result.divergences or not result.ok:
            raise FoundFailure(scenario, result)
        return result

    return play


def _count(outcome: TemplateOutcome, scenario: Scenario, result: RunResult) -> None:
    """The failing scenario's share of the counts (Hypothesis's play never returned to count it)."""
    outcome.scenarios += 1
    outcome.classes |= result.classes
    outcome.findings.update({d.known_defect for d in result.findings})


def _merge(verdict: HarnessVerdict, outcomes: list[TemplateOutcome]) -> None:
    """Counts, classes and findings of every task played (a cancelled one's as far as it got), and
    the failure handed over first (in one process, the first failing task in the plan's order)."""
    ordered = sorted(outcomes, key=lambda o: (o.index, o.shard))
    for outcome in ordered:
        verdict.scenarios += outcome.scenarios
        if outcome.device:
            verdict.per_device[outcome.device] += outcome.scenarios
        verdict.classes |= outcome.classes
        verdict.findings.update(outcome.findings)
        for world, kernels in outcome.kernels.items():
            verdict.kernels.setdefault(world, kernels)
    for defect in verdict.findings:
        examples = [o.examples[defect] for o in ordered if defect in o.examples]
        shrunk = [e for e in examples if e.original is not None]
        if examples:
            verdict.finding_examples[defect] = (shrunk or examples)[0]
    failing = next((o for o in ordered if o.failure is not None and o.reported), None) \
        or next((o for o in ordered if o.failure is not None), None)
    if failing is not None and failing.failure is not None:
        scenario, result = failing.failure
        verdict.verdict = "divergence"
        verdict.scenario = scenario
        verdict.counterexample = format_failure(result)
        verdict.failure = result
        verdict.first_failure = failing.first_failure
        verdict.shrink = failing.shrink
        verdict.diverged = failed_worlds(result)
        verdict.worlds = result.worlds


def _play_template(template, play_one, count, random_seed, verdict, failing, tick) -> None:
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
        tick()
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


class WorldsDisagree(AssertionError):
    """Some world differs from the reference (cells, fields, stages)."""


class OracleFailed(AssertionError):
    """Every world agrees, but an oracle that does not trust the reference failed."""
