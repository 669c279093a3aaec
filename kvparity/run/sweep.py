"""``kvparity check`` without a candidate: this repository's refactored path against the legacy
reference, over every scenario template, in the worlds this machine can run.

Scenarios are drawn per template (so every family of situations gets its share). The first
failing scenario ends the sweep at once: it is handed to the caller as found (``SweepEvents.found``:
the report comes first), every other task is cancelled, and then it is shrunk
(``kvparity.run.minimize``) within a time budget, replaying only the worlds that failed. Hypothesis
draws the scenarios but never shrinks them: the first failure leaves it as a ``FoundFailure``.
"""

from __future__ import annotations

import functools
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from hypothesis import Verbosity, given, seed, settings

from kvparity.engine import processes
from kvparity.model.classes import REQUIRED
from kvparity.model.scenario import Scenario
from kvparity.model.strategies import TEMPLATES, scenarios
from kvparity.model.worlds import WorldId
from kvparity.report.failure import format_failure
from kvparity.run.minimize import DEFAULT_BUDGET_S, Shrunk, failure_kind, minimize
from kvparity.run.runner import RunResult, run_scenario

# Seconds each known defect's first example may be shrunk for (in the job that first met it).
FINDING_BUDGET_S = 4.0


@dataclass(frozen=True)
class FirstFailure:
    """A sweep's first failing scenario, as found (before shrinking), and its template."""

    scenario: Scenario
    result: RunResult
    template: str


@dataclass(frozen=True)
class FindingExample:
    """The first scenario that reached a known defect, and what was seen there; shrunk when its
    job had the time (``original`` is then the scenario as drawn)."""

    scenario: Scenario
    what: str
    detail: str
    world: str  # where it was seen
    original: Scenario | None = None


class SweepEvents(Protocol):
    """What a sweep tells its caller while it runs (the command line prints it). In a parallel
    run the jobs' events come back to the calling process, in the order they happened."""

    def played(self) -> None:
        """One planned scenario played."""

    def found(self, first: FirstFailure) -> None:
        """The first failure, before it is shrunk."""

    def shrinking(self, tried: int, smallest: Scenario) -> None:
        """Another smaller candidate played; ``smallest`` is the smallest failing one so far."""

    def cancelled(self) -> bool:
        """Whether this task should stop now (some other task failed)."""

    def claim(self, defect: str) -> bool:
        """Whether this process shrinks the first example of known defect ``defect`` (once per run)."""


class QuietEvents:
    """Events of a run nobody watches (tests, library calls): one process, nothing printed."""

    def __init__(self) -> None:
        self.claimed: set[str] = set()

    def played(self) -> None:
        pass

    def found(self, first: FirstFailure) -> None:
        pass

    def shrinking(self, tried: int, smallest: Scenario) -> None:
        pass

    def cancelled(self) -> bool:
        return False

    def claim(self, defect: str) -> bool:
        fresh = defect not in self.claimed
        self.claimed.add(defect)
        return fresh


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
    per_template = max(1, examples // len(TEMPLATES))
    events = events or QuietEvents()
    started = time.monotonic()
    plan = TemplatePlan(worlds, per_template, random_seed, real_reference, shard_size or SHARD_SIZE,
                        shrink_budget_s, finding_budget_s)
    if jobs <= 1:
        outcomes = play_templates(plan.tasks(), plan, lane, events)
    else:
        outcomes = _play_in_jobs(jobs, plan, lane_factory, events)
    _merge(verdict, outcomes)
    verdict.seconds = time.monotonic() - started
    return verdict


# Scenarios per task: a template with more is played as several shards, each from its own seed,
# so that many processes share one template's scenarios. The shards depend on the plan only,
# never on the number of jobs, so one job and many play the same scenarios.
SHARD_SIZE = 100


@dataclass(frozen=True)
class TemplatePlan:
    """What every job plays (plain data: it crosses into worker processes)."""

    worlds: tuple[tuple[str, str], ...]
    per_template: int
    random_seed: int | None
    real_reference: bool
    shard_size: int = SHARD_SIZE
    shrink_budget_s: float | None = DEFAULT_BUDGET_S
    finding_budget_s: float = FINDING_BUDGET_S

    def tasks(self) -> list[tuple[int, int]]:
        """(template index, shard) in the order one process plays them."""
        shards = -(-self.per_template // self.shard_size)
        return [(index, shard) for index in range(len(TEMPLATES)) for shard in range(shards)]

    def examples(self, shard: int) -> int:
        return min(self.shard_size, self.per_template - shard * self.shard_size)

    def seed(self, index: int, shard: int) -> int | None:
        """A template played whole keeps the run's seed (None: derandomized, as always); its
        shards each take a seed of their own, derived from the run's seed (0 when derandomized)."""
        if self.per_template <= self.shard_size:
            return self.random_seed
        return ((self.random_seed or 0) * 1_000_003 + index * 10_007 + shard) % (1 << 32)


@dataclass
class TemplateOutcome:
    index: int
    shard: int = 0
    scenarios: int = 0
    classes: set[str] = field(default_factory=set)
    findings: Counter = field(default_factory=Counter)
    finding_examples: dict[str, str] = field(default_factory=dict)  # kept by _play_template's play; unused
    examples: dict[str, FindingExample] = field(default_factory=dict)  # known defect -> its first example here
    kernels: dict[str, dict[str, str]] = field(default_factory=dict)
    first_failure: FirstFailure | None = None  # as found
    failure: tuple[Scenario, RunResult] | None = None  # shrunk, with its result
    shrink: Shrunk | None = None
    cancelled: bool = False  # stopped early: another task failed
    reported: bool = False  # its failure was the run's first, handed over as found (and shrunk)
    device: str = ""  # the GPU a parallel job played it on (CUDA_VISIBLE_DEVICES), else ""


class FoundFailure(BaseException):
    """A failing scenario, raised through Hypothesis the moment it is played. A BaseException, so
    Hypothesis neither shrinks it nor replays it: the sweep reports it, then shrinks it itself."""

    def __init__(self, scenario: Scenario, result: RunResult) -> None:
        super().__init__("a failing scenario")
        self.scenario, self.result = scenario, result


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
                outcome.failure, outcome.shrink = _shrunk(found.scenario, found.result, plan, lane, events)
            else:
                outcome.failure = (found.scenario, found.result)
            break
        except Cancelled:
            outcome.cancelled = True
            break
        _shrink_examples(outcome, plan, lane, events)
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
        result = play_one(scenario)
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


def replay_worlds(result: RunResult) -> frozenset[str] | None:
    """The worlds a shrinker replays to keep a failure: the reference and one world that failed in
    the same way, a torch one where there is one (several times cheaper than Triton's interpreter); None (every
    world) when only the reference is named, as in a stage-count mismatch."""
    reference = result.worlds[0]
    # A world that fails in the same way: a disagreement is kept by a world that disagreed (one
    # that only broke an oracle would turn it into an oracle failure).
    same_way = {d.world for d in result.divergences} if result.divergences else _failed_worlds(result)
    failed = [w for w in result.worlds if w != reference and w in same_way]
    if not failed:
        return frozenset({reference}) if not result.divergences else None
    cheapest = min(failed, key=lambda w: not w.rpartition("/")[2].startswith("torch"))
    return frozenset({reference, cheapest})


def _failed_worlds(result: RunResult) -> set[str]:
    return {d.world for d in result.divergences} | {v.world for v in result.violations}


def _player(plan: TemplatePlan, lane: Any, only: frozenset[str] | None) -> Callable[[Scenario], RunResult]:
    """``run_scenario`` in the plan's worlds, the real ones limited to ``only`` (the modelled ones
    too, but for the reference and, when the lane is the reference, the one that bounds its path;
    None: every world)."""
    modelled = plan.worlds
    if only is not None and not plan.real_reference:
        modelled = tuple(w for i, w in enumerate(plan.worlds) if i == 0 or str(WorldId.modelled(*w)) in only)
    return functools.partial(run_scenario, worlds=modelled, lane=lane, real_reference=plan.real_reference, only=only)


def _shrunk(scenario: Scenario, result: RunResult, plan: TemplatePlan, lane: Any,
            events: SweepEvents) -> tuple[tuple[Scenario, RunResult], Shrunk | None]:
    """The failure shrunk within the plan's budget, replaying only the worlds it involves; the
    smallest is played once more in every world, for the report."""
    if plan.shrink_budget_s is None:
        return (scenario, result), None
    kind = failure_kind(result)
    replay = _player(plan, lane, replay_worlds(result))
    shrunk = minimize(scenario, lambda c: failure_kind(replay(c)) == kind, budget_s=plan.shrink_budget_s,
                      progress=events.shrinking)
    if shrunk.scenario == scenario:
        return (scenario, result), shrunk
    final = run_scenario(shrunk.scenario, plan.worlds, lane=lane, real_reference=plan.real_reference)
    return (shrunk.scenario, final), shrunk


def _shrink_examples(outcome: TemplateOutcome, plan: TemplatePlan, lane: Any, events: SweepEvents) -> None:
    """Each known defect's first example, shrunk to what still reaches the defect (once per run,
    by the process that claims it first)."""
    if plan.finding_budget_s <= 0:
        return
    for defect, example in list(outcome.examples.items()):
        if not events.cancelled() and events.claim(defect):
            outcome.examples[defect] = _shrunk_example(defect, example, plan, lane)


def _shrunk_example(defect: str, example: FindingExample, plan: TemplatePlan, lane: Any) -> FindingExample:
    """``example`` shrunk within the plan's budget, replaying the reference and the world it was seen in."""
    replay = _player(plan, lane, frozenset({example.world}))
    found: dict[Scenario, RunResult] = {}

    def reaches(candidate: Scenario) -> bool:
        found[candidate] = replay(candidate)
        return any(d.known_defect == defect for d in found[candidate].findings)

    shrunk = minimize(example.scenario, reaches, budget_s=plan.finding_budget_s)
    if shrunk.scenario == example.scenario:
        return example
    seen = next(d for d in found[shrunk.scenario].findings if d.known_defect == defect)
    return FindingExample(shrunk.scenario, seen.what, seen.detail, seen.world, example.scenario)


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
        verdict.diverged = _failed_worlds(result)
        verdict.worlds = result.worlds


def _play_in_jobs(jobs: int, plan: TemplatePlan, lane_factory: Callable[[], Any] | None,
                  events: SweepEvents) -> list[TemplateOutcome]:
    """The (template, shard) tasks, taken by ``jobs`` spawned processes as they come free
    (templates differ in cost). The jobs' events come back through a queue and are handed to
    ``events`` here, in order. A failure in any job stops them all: the others stop between two
    scenarios, the tasks not started are cancelled."""
    import threading
    from concurrent.futures import Future, ProcessPoolExecutor, as_completed

    context = processes.context()
    env = {k: v for k, v in os.environ.items() if k.startswith(("KVPARITY_", "HYPOTHESIS_", "TRITON_"))}
    with context.Manager() as manager:
        messages = manager.Queue()
        gpus = manager.Queue()  # each job takes one: the visible GPUs round-robin
        stop, claims = manager.Event(), manager.dict()
        visible = visible_gpus()
        for i in range(jobs):
            gpus.put(visible[i % len(visible)] if visible else "")
        futures: dict[Future, tuple[int, int]] = {}
        done = threading.Event()

        def drain() -> None:
            while not done.is_set() or not messages.empty():
                try:
                    message = messages.get(timeout=0.2)
                except Exception:  # queue.Empty, or the manager going away at the end
                    continue
                _hand_on(message, events, futures)

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        outcomes: list[TemplateOutcome] = []
        with ProcessPoolExecutor(max_workers=jobs, mp_context=context, initializer=_job_init,
                                 initargs=(env, lane_factory, messages, gpus, stop, claims)) as pool:
            # Longest first, so that no long task starts last while the other jobs idle.
            by_cost = sorted(plan.tasks(), key=lambda task: -_COST_HINT.get(TEMPLATES[task[0]].name, _COST_DEFAULT))
            futures.update({pool.submit(_job_template, task, plan): task for task in by_cost})
            for future in as_completed(list(futures)):
                if not future.cancelled():
                    outcomes.append(future.result())
        done.set()
        reader.join()
    return outcomes


def _hand_on(message: tuple, events: SweepEvents, futures: dict) -> None:
    """One job's event, handed to the caller's ``events``; a failure cancels the tasks not started."""
    kind, *payload = message
    if kind == "played":
        events.played()
    elif kind == "found":
        for future in list(futures):
            future.cancel()  # a task already running stops at its next scenario (the stop event)
        events.found(*payload)
    elif kind == "shrinking":
        events.shrinking(*payload)


class _JobEvents:
    """A job's events, sent to the calling process; ``stop`` is shared by every job of the run."""

    def __init__(self, messages: Any, stop: Any, claims: Any) -> None:
        self.messages, self.stop, self.claims = messages, stop, claims
        self.finder = False  # this job found the failure: it is not cancelled while it shrinks it

    def played(self) -> None:
        self.messages.put(("played",))

    def found(self, first: FirstFailure) -> None:
        already = self.stop.is_set()
        self.stop.set()
        self.finder = not already
        if self.finder:
            self.messages.put(("found", first))

    def shrinking(self, tried: int, smallest: Scenario) -> None:
        if self.finder:
            self.messages.put(("shrinking", tried, smallest))

    def cancelled(self) -> bool:
        return self.stop.is_set() and not self.finder

    def claim(self, defect: str) -> bool:
        return self.claims.setdefault(defect, os.getpid()) == os.getpid()


# Seconds each template's 80 default scenarios took in one process (CPU, Triton's interpreter,
# 2026-12-01): only the order parallel jobs take tasks in, never what they play.
_COST_HINT = {
    "logprobs": 25.1, "shared prefixes": 22.4, "free form": 20.4, "decode pressure": 19.0, "chunked rounds": 16.3,
    "retract and re-admit": 15.9, "long lengths": 10.5, "near out of memory": 8.1, "row reuse": 8.0,
    "free-page churn": 7.0,
}
_COST_DEFAULT = 30.0  # a template not measured yet goes first


# One process of a parallel run: its real-SGLang lane (made on first use, closed at exit) and the
# events it sends back.
_JOB: dict[str, Any] = {}


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES names them (none on a CPU run)."""
    from kvparity.kernels import runtime

    if runtime.DEVICE.type != "cuda":
        return []
    import torch

    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    names = [n.strip() for n in listed.split(",") if n.strip()] if listed else []
    return names or [str(i) for i in range(torch.cuda.device_count())]


def _job_init(env: dict[str, str], lane_factory: Callable[[], Any] | None, messages: Any, gpus: Any, stop: Any,
              claims: Any) -> None:
    import atexit

    os.environ.update(env)
    gpu = gpus.get()
    if gpu:  # pinned before anything touches CUDA (torch starts it lazily)
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu
        _JOB["device"] = gpu
    from kvparity.kernels import runtime  # noqa: F401  (the device and Triton's mode, as in the parent)
    from kvparity.model import profiles

    profiles.load(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
    _JOB.update(lane_factory=lane_factory, lane=None, events=_JobEvents(messages, stop, claims))
    atexit.register(lambda: _JOB["lane"] is not None and _JOB["lane"].close())


def _job_template(task: tuple[int, int], plan: TemplatePlan) -> TemplateOutcome:
    if _JOB["events"].stop.is_set():  # another task failed while this one waited
        return TemplateOutcome(*task, cancelled=True)
    if _JOB["lane"] is None and _JOB["lane_factory"] is not None:
        _JOB["lane"] = _JOB["lane_factory"]()
    outcome = play_templates([task], plan, _JOB["lane"], _JOB["events"])[0]
    outcome.device = _JOB.get("device", "")
    return outcome


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
