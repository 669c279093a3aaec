"""``kvparity check`` without a candidate: this repository's refactored path against the legacy
reference, over every scenario template, in the worlds this machine can run.

Scenarios are drawn per template (so every family of situations gets its share); the first
failure is shrunk by Hypothesis and returned as a readable report.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hypothesis import Verbosity, given, seed, settings

from kvparity.model.classes import REQUIRED
from kvparity.model.scenario import Scenario
from kvparity.model.strategies import TEMPLATES, scenarios
from kvparity.model.worlds import WorldId
from kvparity.report.failure import format_failure
from kvparity.run.minimize import failure_kind, minimize
from kvparity.run.runner import RunResult, run_scenario


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
    failure: RunResult | None = None  # the shrunk counterexample's result (``counterexample`` is its report)
    seconds: float = 0.0
    per_device: Counter = field(default_factory=Counter)  # GPU -> scenarios its jobs played (parallel runs)
    kernels: dict[str, dict[str, str]] = field(default_factory=dict)  # real world -> the kernels it ran (0.5.22+)

    @property
    def required_reached(self) -> list[str]:
        return [c for c in REQUIRED if c in self.classes]


class Progress:
    """A progress bar on stderr once a run has taken a few seconds: redrawn in place on a
    terminal, a plain line every ten seconds otherwise (logs stay readable)."""

    def __init__(self, total: int, after_seconds: float = 2.0, unit: str = "scenarios") -> None:
        self.total, self.after, self.start, self.shown = total, after_seconds, time.monotonic(), False
        self.unit = unit
        self.tty = sys.stderr.isatty()
        self.last_line = 0.0
        self.done = 0

    def step(self) -> None:
        """One more scenario played."""
        self.done += 1
        self.update(self.done)

    def update(self, done: int) -> None:
        elapsed = time.monotonic() - self.start
        if elapsed < self.after:
            return
        if not self.tty:
            if elapsed - self.last_line >= 10 or done == self.total:
                self.last_line = elapsed
                sys.stderr.write(f"kvparity: {done}/{self.total} {self.unit}, {elapsed:.0f} s\n")
            return
        width = 30
        filled = min(width, width * done // max(self.total, 1))
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{self.total} {self.unit}, {elapsed:.0f} s")
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
    jobs: int = 1,
    lane_factory: Callable[[], Any] | None = None,
    shard_size: int | None = None,
) -> HarnessVerdict:
    """Play about ``examples`` scenarios (split over the templates) in ``worlds``; the first world
    is the reference. ``random_seed`` None means derandomized (the same scenarios every run).
    ``lane`` adds real SGLang worlds; with ``real_reference`` its first world is the reference
    (``kvparity.run.runner.run_scenario``).

    ``jobs`` > 1 shares the (template, shard) tasks out over that many worker processes (each with
    its own real-SGLang workers, from ``lane_factory``, and, on a GPU run, pinned to one visible
    GPU, round-robin). A template of more than ``shard_size`` scenarios is played as several
    shards of its own seeds. The verdict, the scenario count and the counterexample are those of
    ``jobs=1``: tasks are merged in their order, and those after the first failing one are
    discarded, as a single process would never have played them."""
    names = tuple(str(WorldId.modelled(v, b)) for v, b in worlds)
    real_names = tuple(lane.names) if lane is not None else ()
    if lane is not None:
        names = real_names if real_reference else names + real_names
    verdict = HarnessVerdict(names)
    per_template = max(1, examples // len(TEMPLATES))
    progress = Progress(per_template * len(TEMPLATES))
    started = time.monotonic()
    plan = TemplatePlan(worlds, per_template, random_seed, real_reference, shard_size or SHARD_SIZE)
    try:
        if jobs <= 1:
            outcomes = play_templates(plan.tasks(), plan, lane, progress.step)
        else:
            outcomes = _play_in_jobs(jobs, plan, lane_factory, progress)
    finally:
        progress.close()
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
    finding_examples: dict[str, str] = field(default_factory=dict)
    kernels: dict[str, dict[str, str]] = field(default_factory=dict)
    failure: tuple[Scenario, RunResult] | None = None  # minimal, with its result
    device: str = ""  # the GPU a parallel job played it on (CUDA_VISIBLE_DEVICES), else ""


def play_templates(
    tasks: list[tuple[int, int]], plan: TemplatePlan, lane: Any, tick: Callable[[], None]
) -> list[TemplateOutcome]:
    """Play the (template, shard) ``tasks`` in order, stopping after the first that fails."""
    play_one = functools.partial(run_scenario, worlds=plan.worlds, lane=lane, real_reference=plan.real_reference)
    outcomes = []
    for index, shard in tasks:
        outcome = TemplateOutcome(index, shard)
        failing: list[tuple[Scenario, RunResult]] = []
        noting = _noting_kernels(play_one, outcome)
        _play_template(TEMPLATES[index], noting, plan.examples(shard), plan.seed(index, shard), outcome, failing, tick)
        if failing:
            outcome.failure = _minimal(*_preferred(failing), play_one)
        outcomes.append(outcome)
        if failing:
            break
    return outcomes


def _noting_kernels(play_one: Callable[[Scenario], RunResult], outcome: TemplateOutcome) -> Callable[[Scenario], RunResult]:
    """``play_one``, keeping which kernels each real world ran. (A wrapper, not a line in
    ``_play_template``'s ``play``: Hypothesis derives a derandomized run's draws from that
    function's source, so editing it would change every default run's scenarios.)"""

    def play(scenario: Scenario) -> RunResult:
        result = play_one(scenario)
        for world, kernels in result.kernels.items():
            outcome.kernels.setdefault(world, kernels)
        return result

    return play


def _merge(verdict: HarnessVerdict, outcomes: list[TemplateOutcome]) -> None:
    for outcome in sorted(outcomes, key=lambda o: (o.index, o.shard)):
        verdict.scenarios += outcome.scenarios
        if outcome.device:
            verdict.per_device[outcome.device] += outcome.scenarios
        verdict.classes |= outcome.classes
        verdict.findings.update(outcome.findings)
        for defect, example in outcome.finding_examples.items():
            verdict.finding_examples.setdefault(defect, example)
        for world, kernels in outcome.kernels.items():
            verdict.kernels.setdefault(world, kernels)
        if outcome.failure is not None:
            scenario, result = outcome.failure
            verdict.verdict = "divergence"
            verdict.scenario = scenario
            verdict.counterexample = format_failure(result)
            verdict.failure = result
            verdict.diverged = {d.world for d in result.divergences} | {v.world for v in result.violations}
            verdict.worlds = result.worlds
            return  # a single process would have stopped here


def _play_in_jobs(jobs: int, plan: TemplatePlan, lane_factory: Callable[[], Any] | None, progress: Progress) -> list[TemplateOutcome]:
    """One task per template, taken by ``jobs`` spawned processes as they come free (templates
    differ in cost); progress ticks come back through a queue. Once a template fails, the tasks
    after it that have not started are cancelled: the merge would discard them anyway."""
    import multiprocessing
    import threading
    from concurrent.futures import ProcessPoolExecutor, as_completed

    context = multiprocessing.get_context("spawn")  # no fork of a process holding torch's threads
    env = {k: v for k, v in os.environ.items() if k.startswith(("KVPARITY_", "HYPOTHESIS_", "TRITON_"))}
    with context.Manager() as manager:
        ticks = manager.Queue()
        gpus = manager.Queue()  # each job takes one: the visible GPUs round-robin
        visible = visible_gpus()
        for i in range(jobs):
            gpus.put(visible[i % len(visible)] if visible else "")
        done = threading.Event()

        def drain() -> None:
            while not done.is_set() or not ticks.empty():
                try:
                    ticks.get(timeout=0.2)
                except Exception:  # queue.Empty, or the manager going away at the end
                    continue
                progress.step()

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        outcomes: list[TemplateOutcome] = []
        with ProcessPoolExecutor(max_workers=jobs, mp_context=context, initializer=_job_init,
                                 initargs=(env, lane_factory, ticks, gpus)) as pool:
            # Longest first, so that no long task starts last while the other jobs idle.
            by_cost = sorted(plan.tasks(), key=lambda task: -_COST_HINT.get(TEMPLATES[task[0]].name, _COST_DEFAULT))
            futures = {pool.submit(_job_template, task, plan): task for task in by_cost}
            for future in as_completed(futures):
                if future.cancelled():
                    continue  # after a failing task: the merge would discard it
                outcome = future.result()
                outcomes.append(outcome)
                if outcome.failure is not None:
                    for other, task in futures.items():
                        if task > (outcome.index, outcome.shard):
                            other.cancel()
        done.set()
        reader.join()
    return outcomes


# Seconds each template's 80 default scenarios took in one process (CPU, Triton's interpreter,
# 2026-12-01): only the order parallel jobs take tasks in, never what they play.
_COST_HINT = {
    "logprobs": 25.1, "shared prefixes": 22.4, "free form": 20.4, "decode pressure": 19.0, "chunked rounds": 16.3,
    "retract and re-admit": 15.9, "long lengths": 10.5, "near out of memory": 8.1, "row reuse": 8.0,
    "free-page churn": 7.0,
}
_COST_DEFAULT = 30.0  # a template not measured yet goes first


# One process of a parallel run: its real-SGLang lane (made on first use, closed at exit) and the
# queue its progress ticks go to.
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


def _job_init(env: dict[str, str], lane_factory: Callable[[], Any] | None, ticks: Any, gpus: Any) -> None:
    import atexit

    os.environ.update(env)
    gpu = gpus.get()
    if gpu:  # pinned before anything touches CUDA (torch starts it lazily)
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu
        _JOB["device"] = gpu
    from kvparity.kernels import runtime  # noqa: F401  (the device and Triton's mode, as in the parent)
    from kvparity.model import profiles

    profiles.load(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
    _JOB.update(lane_factory=lane_factory, lane=None, ticks=ticks)
    atexit.register(lambda: _JOB["lane"] is not None and _JOB["lane"].close())


def _job_template(task: tuple[int, int], plan: TemplatePlan) -> TemplateOutcome:
    if _JOB["lane"] is None and _JOB["lane_factory"] is not None:
        _JOB["lane"] = _JOB["lane_factory"]()
    ticks = _JOB["ticks"]
    outcome = play_templates([task], plan, _JOB["lane"], lambda: ticks.put(1))[0]
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


def _minimal(scenario: Scenario, result: RunResult, play_one) -> tuple[Scenario, RunResult]:
    """Remove what plays no part (``kvparity.run.minimize``), keeping the kind of failure."""
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
