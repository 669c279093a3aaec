"""The harness drive: step scenarios (``kvparity.model.scenario``, drawn per template by
``kvparity.model.strategies``) played by kvparity's own scheduler loop in every world at once
(``kvparity.run.runner``: kvparity's worlds in this process, real SGLang's in worker processes through
a ``RealLane`` and the worker plugin ``kvparity.engine.real.play``), so that every world gets
identical decisions and the memory path is compared alone, stage by stage, with the oracles. One task
per template (and shard); the first failure ends the run."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from kvparity import caches
from kvparity.engine.release_order import version_key
from kvparity.engine.releases import changes_between
from kvparity.judge.compare import KNOWN_VERSION_DIFFERENCES, RENUMBERED_BETWEEN_RELEASES
from kvparity.judge.run_result import RunResult
from kvparity.judge.verdict import Finding, Played, Verdict
from kvparity.model.classes import REQUIRED
from kvparity.model.scenario import Scenario, scenario_to_dict
from kvparity.model.strategies import TEMPLATES, hybrid_templates, scenarios
from kvparity.model.worlds import WorldId
from kvparity.report.failure import first_difference_line, format_failure
from kvparity.run.candidates import step_candidates
from kvparity.run.drive import Task
from kvparity.run.minimize import DEFAULT_BUDGET_S, failure_kind
from kvparity.run.plan import FINDING_BUDGET_S, SweepPlan, shards
from kvparity.run.runner import REAL_FAILED, run_scenario


def per_template(examples: int) -> int:
    """Scenarios each template plays when a run asks for about ``examples`` (at least one)."""
    return max(1, examples // len(TEMPLATES))


@dataclass(frozen=True)
class HarnessSpec:
    """A harness drive as plain data. ``worlds``: kvparity's worlds (version, backend), the first the
    reference; ``real``: real SGLang sources (``RealLane`` specs) played on ``backends``; with
    ``real_reference`` the lane's first world is the reference and ``worlds`` only decide where a
    scenario leaves the server's path (SPEC 6)."""

    worlds: tuple[tuple[str, str], ...]
    real: tuple[Any, ...] = ()
    backends: tuple[str, ...] = ("triton", "torch")
    tree_class: str | None = None
    real_reference: bool = False
    counts_all: bool = False  # play every scenario and count the differing ones (the release matrix)
    # The cache kind the real worlds serve (``kvparity.caches``): a hybrid one is played by
    # real releases only (``real_reference``), on the templates its worlds take.
    model: str = "full"

    def build(self) -> HarnessDrive:
        return HarnessDrive(self)


class HarnessDrive:
    name = "harness"
    counts_all = False
    required: tuple[str, ...] = REQUIRED

    def __init__(self, spec: HarnessSpec, lane: Any = None) -> None:
        """``lane``: a running ``RealLane`` of ``spec.real`` to use (the caller's); without one, the
        drive makes its own when ``spec.real`` names any (its workers start on first use)."""
        self.spec = spec
        self.counts_all = spec.counts_all
        self.owns_lane = lane is None and bool(spec.real)
        if self.owns_lane:
            from kvparity.engine.real.door import RealLane

            lane = RealLane(list(spec.real), spec.backends, tree_class=spec.tree_class, model=spec.model)
        self.lane = lane
        names = tuple(str(WorldId.modelled(v, b)) for v, b in spec.worlds)
        real = tuple(lane.names) if lane is not None else ()
        self.worlds = real if spec.real_reference else names + real
        self.reference, self.checked = self.worlds[0], self.worlds[1:]
        # A hybrid model's worlds: the radix cache, page sizes their pools take (a window pool's
        # above 1 where every release's takes them; a Mamba tree's 1 only; a host tier's any).
        self.kind = caches.get(spec.model)
        paged = self.kind.hybrid and self.kind.harness_paged(  # (a full-attention lane may be a stand-in)
            lane is not None and all(s.entry.paged_swa for s in lane.sources))
        self.templates = hybrid_templates(paged) if self.kind.hybrid else TEMPLATES
        self.page_sizes = None if paged or not self.kind.hybrid else (1,)

    # ---- drawing ----------------------------------------------------------------------------------
    def tasks(self, examples: int, seed: int | None) -> list[Task]:
        """One task per template, ``examples`` shared out evenly (at least one each)."""
        n = per_template(examples)
        if not self.kind.hybrid:
            return [task for index, template in enumerate(TEMPLATES)
                    for task in shards(template.name, (index,), n, seed, index)]
        offset = len(TEMPLATES) * caches.names().index(self.kind.name)  # other draws than full attention's
        return [task for index, template in enumerate(self.templates)
                for task in shards(f"{template.name}, {self.kind.label}", (index,), n, seed, offset + index)]

    def strategy(self, task: Task) -> Any:
        return scenarios(templates=(self.templates[task.key[0]],), page_sizes=self.page_sizes,
                         radix_only=self.kind.hybrid)

    # ---- playing and judging ----------------------------------------------------------------------
    def play(self, scenario: Scenario) -> Played:
        return self._played(run_scenario(scenario, self.spec.worlds, lane=self.lane,
                                         real_reference=self.spec.real_reference))

    def _played(self, result: RunResult) -> Played:
        kind = failure_kind(result)
        return Played(result.scenario, kind is None, kind, "" if kind is None else _first_line(result),
                      frozenset(result.classes),
                      tuple(Finding(d.known_defect, d.world, f"{d.what}: {d.detail}") for d in result.findings
                            if d.known_defect),
                      result, {"kernels": dict(result.kernels)} if result.kernels else {})

    def _replaying(self, only: frozenset[str] | None) -> Callable[[Scenario], Played]:
        """``run_scenario`` in this drive's worlds, the real ones limited to ``only`` (the modelled
        ones too, but for the reference and, when the lane is the reference, the one that bounds its
        path; None: every world)."""
        modelled = self.spec.worlds
        if only is not None and not self.spec.real_reference:
            modelled = tuple(w for i, w in enumerate(modelled) if i == 0 or str(WorldId.modelled(*w)) in only)
        play = functools.partial(run_scenario, worlds=modelled, lane=self.lane, real_reference=self.spec.real_reference,
                                 only=only)
        return lambda scenario: self._played(play(scenario))

    def replayer(self, played: Played) -> Callable[[Scenario], Played]:
        return self._replaying(replay_worlds(played.result))

    def finding_replayer(self, finding: Finding) -> Callable[[Scenario], Played]:
        return self._replaying(frozenset({finding.where}))

    def same(self, played: Played, first: Played) -> bool:
        return played.kind == first.kind

    def identical(self, played: Played, first: Played) -> bool:
        return played.line == first.line and _first_divergence(played) == _first_divergence(first)

    def broken(self, played: Played) -> str | None:
        failed = [d for d in played.result.divergences if d.what == REAL_FAILED and d.world != d.reference]
        return failed[0].line() if failed else None

    def targets(self, played: Played) -> dict[str, float]:
        return {}  # the templates steer by construction (warm start, chunked rounds, ...)

    def candidates(self, scenario: Scenario) -> Iterator[Scenario]:
        return step_candidates(scenario)

    def explain(self, played: Played) -> str | None:
        """Between two real releases: the named change whose undoing in the checked world's adapter
        (``Change.adapter_undo``, a rule of the scheduler's that kvparity's loop plays, such as a
        refusal's) makes the replay agree. Else nothing: the worlds get identical decisions, so a
        difference is the memory path's own."""
        if self.lane is None or not self.spec.real_reference or played.kind != "disagree":
            return None
        reference = self.lane.ids[0]
        differing = {d.world for d in played.result.divergences}
        for world in self.lane.ids[1:]:
            name = str(world)
            # Only a release's own changes are undone: those of a release newer than the reference.
            if name not in differing or not world.release or not reference.release \
                    or version_key(world.release) <= version_key(reference.release):
                continue
            for change in changes_between(str(reference.release), str(world.release)):
                lane = self.lane.undone(name, [change])
                if lane is not None and not run_scenario(played.scenario, self.spec.worlds, lane=lane, real_reference=True,
                                                         only=frozenset({str(reference), name})).divergences:
                    return f"cause: {change.what} (undone in {name}'s adapter, the replay no longer differs so)"
        return None

    def refuses(self, scenario: Scenario) -> str | None:
        return None

    # ---- reporting --------------------------------------------------------------------------------
    def report(self, played: Played, replay: str | None = None) -> str:
        return format_failure(played.result, replay=replay)

    def diverged(self, verdict: Verdict) -> set[str]:
        """The worlds that differed from the reference or broke an oracle (in the shrunk failure)."""
        shown = verdict.shrunk
        return failed_worlds(shown.shown.result) if shown is not None else set()

    def header(self, verdict: Verdict) -> list[str]:
        """One row per world pair, the reference against each other world."""
        diverged = self.diverged(verdict)
        width = max(42, *(len(f"{self.reference} vs {n}") for n in self.checked)) if self.checked else 42
        lines = [f"the real worlds serve a {self.kind.label} model"] if self.kind.hybrid else []
        lines.append(f"{'world pair':<{width}} {'scenarios':>9}  verdict")
        for name in self.checked:
            pair = f"{self.reference} vs {name}"
            lines.append(f"{pair:<{width}} {verdict.scenarios:>9}  {'DIVERGENCE' if name in diverged else 'parity'}")
        return lines

    def summary(self, verdict: Verdict) -> str:
        served = f", serving a {self.kind.label} model" if self.kind.hybrid else ""
        if verdict.verdict == "parity":
            return f"PARITY{served}"
        first = verdict.shrunk
        kind = first.shown.kind if first is not None else None
        what = "an oracle failed" if kind == "oracle" else "the worlds disagree"
        return f"DIVERGENCE{served}: {what} ({', '.join(sorted(self.diverged(verdict))) or 'the reference'})"

    def finding_kind(self, label: str) -> str:
        between_releases = label in KNOWN_VERSION_DIFFERENCES or label == RENUMBERED_BETWEEN_RELEASES
        return "known difference between releases" if between_releases else "known defect reported"

    def size(self, scenario: Scenario) -> str:
        return f"{len(scenario.requests)} requests, {len(scenario.steps)} steps"

    def to_dict(self, scenario: Scenario) -> dict[str, Any]:
        return scenario_to_dict(scenario)

    def close(self) -> None:
        if self.owns_lane and self.lane is not None:
            self.lane.close()


def _first_divergence(played: Played) -> tuple[str, str] | None:
    divergences = played.result.divergences if played.result is not None else []
    return (divergences[0].what, divergences[0].detail) if divergences else None


def _first_line(result: RunResult) -> str:
    if result.first_difference is not None:
        return first_difference_line(result)
    if result.violations:
        return f"oracle: {result.violations[0].line()}"
    return result.divergences[0].line() if result.divergences else ""


def replay_worlds(result: RunResult) -> frozenset[str] | None:
    """The worlds a shrinker replays to keep a failure: the reference and one world that failed in
    the same way, a torch one where there is one (several times cheaper than Triton's interpreter);
    None (every world) when only the reference is named, as in a stage-count mismatch."""
    reference = result.worlds[0]
    # A world that fails in the same way: a disagreement is kept by a world that disagreed (one
    # that only broke an oracle would turn it into an oracle failure).
    same_way = {d.world for d in result.divergences} if result.divergences else failed_worlds(result)
    failed = [w for w in result.worlds if w != reference and w in same_way]
    if not failed:
        return frozenset({reference}) if not result.divergences else None
    cheapest = min(failed, key=lambda w: not w.rpartition("/")[2].startswith("torch"))
    return frozenset({reference, cheapest})


def failed_worlds(result: RunResult) -> set[str]:
    return {d.world for d in result.divergences} | {v.world for v in result.violations}


def check_harness(worlds: tuple[tuple[str, str], ...], examples: int, seed: int | None = None, *, jobs: int = 1,
                  lane: Any = None, real_reference: bool = False, events: Any = None,
                  shrink_budget_s: float | None = DEFAULT_BUDGET_S, finding_budget_s: float = FINDING_BUDGET_S,
                  counts_all: bool = False) -> Verdict:
    """A harness-driven sweep of about ``examples`` scenarios in ``worlds`` (and ``lane``'s real
    worlds) in one call, as ``kvparity check`` runs it (tests and scripts use it)."""
    from kvparity.run.sweep import sweep

    spec = HarnessSpec(worlds, real_reference=real_reference, counts_all=counts_all)
    drive = HarnessDrive(spec, lane=lane)
    plan = SweepPlan(spec, tuple(drive.tasks(examples, seed)), shrink_budget_s, finding_budget_s)
    try:
        return sweep(drive, plan, jobs=jobs, events=events)
    finally:
        drive.close()
