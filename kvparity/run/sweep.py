"""One sweep, for either drive (``kvparity.run.drive``): the drive's tasks, each drawn by Hypothesis
(derandomized unless a seed is given; Hypothesis draws, it never shrinks), every scenario played and
judged by the drive, counted into the task's row (``kvparity.judge.verdict``).

A task's first difference is handed to the caller the moment it is found (``SweepEvents.found``:
the report comes first). A drive that stops at its first difference (the harness drive) ends the
run there: every other task, in every job, stops; one that counts (the scheduler drive) plays on.
Then the difference is shrunk (``kvparity.run.minimize``, the drive's candidates, replaying what can
still show it) within a budget, and its cause named where the drive can show one; and the first
example of each finding is shrunk once per run, by the process that claims it.

``jobs`` > 1 shares the tasks out over that many processes (``kvparity.run.jobs``), each building
the drive from the plan; a parity run plays, counts and reaches what one process does (the rows
are merged in task order).
"""

from __future__ import annotations

import time
from typing import Any

from hypothesis import HealthCheck, Verbosity, given, seed, settings, target

from kvparity.engine.errors import WorkerStartError
from kvparity.judge.verdict import Example, Played, Row, Verdict
from kvparity.run.drive import Drive, Task, finding_reached
from kvparity.run.events import QuietEvents, SweepEvents
from kvparity.run.jobs import play_in_jobs
from kvparity.run.minimize import minimize
from kvparity.run.plan import SweepPlan, TaskOutcome


def sweep(drive: Drive, plan: SweepPlan, *, jobs: int = 1, events: SweepEvents | None = None) -> Verdict:
    """Play ``plan``'s tasks (in ``jobs`` processes, each building its own drive from ``plan.spec``;
    with one, in this process on ``drive``) and merge their rows, task by task, into one verdict."""
    events = events or QuietEvents()
    started = time.monotonic()
    if jobs <= 1 or len(plan.tasks) <= 1:
        outcomes = play_tasks(list(plan.tasks), plan, drive, events)
    else:
        outcomes = play_in_jobs(jobs, plan, events, play_tasks)
    verdict = merge(drive, outcomes)
    verdict.seconds = time.monotonic() - started
    return verdict


def merge(drive: Drive, outcomes: list[TaskOutcome]) -> Verdict:
    """The outcomes' rows, one per task (its shards merged in order), in the order of the tasks."""
    rows: dict[str, Row] = {}
    facts: dict[str, Any] = {}
    per_device: dict[str, int] = {}
    for outcome in sorted(outcomes, key=lambda o: (o.task.key, o.task.shard)):
        row = rows.get(outcome.task.name)
        if row is None:
            rows[outcome.task.name] = outcome.row
        else:
            row.merge(outcome.row)
        for name, value in outcome.facts.items():
            if isinstance(value, dict):
                facts.setdefault(name, {}).update(value)
            else:
                facts.setdefault(name, value)
        if outcome.device:
            per_device[outcome.device] = per_device.get(outcome.device, 0) + outcome.row.scenarios
    if per_device:
        facts["scenarios_per_gpu"] = dict(sorted(per_device.items()))
    verdict = Verdict(drive.name, drive.reference, drive.checked, list(rows.values()), drive.required,
                      counts_all=drive.counts_all, facts=facts)
    verdict.summary_line = drive.summary(verdict)
    return verdict


class FoundFirst(BaseException):
    """A drive that stops at its first difference: raised through Hypothesis the moment it is
    played (a BaseException, so Hypothesis neither shrinks nor replays it)."""


class Cancelled(BaseException):
    """Raised through Hypothesis between two scenarios when another task ended the run."""


class Unplayable(BaseException):
    """A real SGLang that cannot even start its worker, raised through Hypothesis (which would
    otherwise shrink it, starting a failing worker for every candidate) and re-raised after."""

    def __init__(self, error: WorkerStartError) -> None:
        super().__init__(str(error))
        self.error = error


def play_tasks(tasks: list[Task], plan: SweepPlan, drive: Drive, events: SweepEvents) -> list[TaskOutcome]:
    """Play ``tasks`` in order; a drive that stops at its first difference stops at the first."""
    outcomes = []
    for task in tasks:
        outcome = TaskOutcome(task, Row(task.name, task.key))
        outcomes.append(outcome)
        t0 = time.monotonic()
        stop = _play_task(task, drive, events, outcome)
        if outcome.row.first is not None:
            _shrink_first(outcome.row.first, plan, drive, events)
        for kind, example in outcome.row.kind_examples.items():  # once per run each (a counting drive's)
            if events.claim(f"difference of kind {kind}"):
                _shrink_first(example, plan, drive, events)
        _shrink_findings(outcome.row, plan, drive, events)
        outcome.row.seconds = time.monotonic() - t0
        if stop:
            break
    return outcomes


def _play_task(task: Task, drive: Drive, events: SweepEvents, outcome: TaskOutcome) -> bool:
    """Draw and play ``task``'s scenarios; True when the run must stop (a difference found by a
    drive that stops at the first, or another task's)."""
    row = outcome.row
    drive = _Steering(drive)  # (rebound, not renamed: play_one's text decides the derandomized draws)

    def play_one(scenario: Any) -> None:
        try:
            played = drive.play(scenario)
        except WorkerStartError as exc:  # no scenario can play: not a failure for Hypothesis to shrink
            raise Unplayable(exc) from None
        for name, value in played.facts.items():
            outcome.facts.setdefault(name, value)
        first_before = row.first
        row.count(played, task.name)
        events.played()
        if row.first is not None and first_before is None:
            row.first.found_after_s = events.elapsed()
            if not events.found(row.first, stop=not drive.counts_all):
                row.first.found_after_s = None  # another task's was the run's first
            if not drive.counts_all:
                raise FoundFirst
        if events.cancelled():
            raise Cancelled

    try:
        draw(task, drive.strategy(task), play_one)
    except FoundFirst:
        return True
    except Cancelled:
        row.cancelled = True
        return True
    except Unplayable as unplayable:
        raise unplayable.error from None
    return False


class _Steering:
    """A drive whose plays tell Hypothesis what to steer toward (``Drive.targets``, through
    ``hypothesis.target``); everything else is the drive's."""

    def __init__(self, drive: Drive) -> None:
        self.drive = drive

    def play(self, scenario: Any) -> Any:
        played = self.drive.play(scenario)
        for label, score in self.drive.targets(played).items():
            target(score, label=label)
        return played

    def __getattr__(self, name: str) -> Any:
        return getattr(self.drive, name)


def draw(task: Task, strategy: Any, play_one: Any) -> None:
    """Hypothesis draws ``task.examples`` scenarios from ``strategy`` (its seed, or derandomized:
    the same scenarios every run) and plays each; it never shrinks (the sweep's differences leave it
    as BaseExceptions). A derandomized run's draws are derived from ``play_one``'s source
    (``_play_task``'s nested function): editing it changes every default run's scenarios."""
    chosen = settings(settings(), max_examples=task.examples, database=None, derandomize=task.seed is None,
                      deadline=None, verbosity=Verbosity.quiet, suppress_health_check=list(HealthCheck))
    test = chosen(given(strategy)(play_one))
    if task.seed is not None:
        test = seed(task.seed)(test)
    test()


def _shrink_first(first: Example, plan: SweepPlan, drive: Drive, events: SweepEvents) -> None:
    """The task's first difference, shrunk within the plan's budget replaying what can still show
    it, and its cause named where the drive can show one. A drive that stops at its first shrinks
    only the run's first (the one claimed first)."""
    if plan.shrink_budget_s is None or (not drive.counts_all and not events.claim("first difference")):
        return
    replay = drive.replayer(first.found)
    smallest: dict[Any, Played] = {}

    def fails(candidate: Any) -> bool:
        smallest[candidate] = replay(candidate)
        return drive.same(smallest[candidate], first.found)

    first.shrunk = minimize(first.found.scenario, fails, budget_s=plan.shrink_budget_s, max_tried=plan.shrink_tries,
                            progress=events.shrinking, candidates=drive.candidates)
    first.shrunk_played = first.found if first.shrunk.scenario == first.found.scenario \
        else drive.play(first.shrunk.scenario)  # every world or player, for the report
    first.cause = drive.explain(first.shown)


def _shrink_findings(row: Row, plan: SweepPlan, drive: Drive, events: SweepEvents) -> None:
    """Each finding's first example, shrunk to what still reaches it (once per run, by the process
    that claims it first)."""
    if plan.finding_budget_s <= 0 or plan.shrink_budget_s is None:
        return
    for label, example in row.finding_examples.items():
        if events.cancelled() or not events.claim(f"finding: {label}"):
            continue
        finding = next(f for f in example.found.findings if f.label == label)
        replay, reaches = drive.finding_replayer(finding), finding_reached(label)
        found: dict[Any, Played] = {}

        def keeps(candidate: Any) -> bool:
            found[candidate] = replay(candidate)  # noqa: B023 - called before the loop moves on
            return reaches(found[candidate])  # noqa: B023

        shrunk = minimize(example.found.scenario, keeps, budget_s=min(plan.finding_budget_s, plan.shrink_budget_s),
                          max_tried=plan.shrink_tries,
                          candidates=drive.candidates)
        if shrunk.scenario != example.found.scenario:
            example.shrunk, example.shrunk_played = shrunk, found[shrunk.scenario]
