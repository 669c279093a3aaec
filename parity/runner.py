"""Play one scenario in several worlds in lockstep, snapshot every stage, compare every world with
the reference (the first world: legacy on torch) and run the oracles on each world."""

from __future__ import annotations

from dataclasses import dataclass, field

from kernels import runtime
from parity.classes import classify
from parity.compare import Difference, compare
from parity.oracles import check_stage
from parity.scenario import Scenario
from parity.scheduler import Scheduler, StageRecord
from parity.snapshot import Snapshot, take_snapshot
from parity.world import VERSIONS, build_world

ALL_WORLDS: tuple[tuple[str, str], ...] = tuple((v, b) for v in VERSIONS for b in ("torch", "triton"))


@dataclass
class RunResult:
    scenario: Scenario
    worlds: tuple[str, ...]
    stages: int = 0
    divergences: list[Difference] = field(default_factory=list)
    findings: list[Difference] = field(default_factory=list)  # known legacy defects
    violations: list[str] = field(default_factory=list)  # oracle failures, "world: ..."
    first_difference: StageRecord | None = None
    records: list[StageRecord] = field(default_factory=list)  # the reference world's stages
    classes: set[str] = field(default_factory=set)

    @property
    def ok(self) -> bool:
        return not self.divergences and not self.violations


def _start_record() -> StageRecord:
    return StageRecord(step=-1, kind="start")


def run_scenario(
    scenario: Scenario,
    worlds: tuple[tuple[str, str], ...] = ALL_WORLDS,
    *,
    oracles: bool = True,
) -> RunResult:
    names = tuple(f"{v}/{b}" for v, b in worlds)
    schedulers = {
        name: Scheduler(build_world(v, b, scenario.geometry, scenario.cache_kind, device=runtime.DEVICE), scenario)
        for name, (v, b) in zip(names, worlds)
    }
    result = RunResult(scenario, names)
    last = {name: take_snapshot(s, _start_record()) for name, s in schedulers.items()}
    if _compare_stage(result, names, [last]):
        return result
    for index, step in enumerate(scenario.steps):
        stages: dict[str, list[Snapshot]] = {}
        for name, scheduler in schedulers.items():
            stages[name] = []
            for record in scheduler.apply(index, step):
                snap = take_snapshot(scheduler, record)
                if oracles:
                    result.violations += [f"{name}: {v}" for v in check_stage(scenario, last[name], snap)]
                last[name] = snap
                stages[name].append(snap)
        reference = stages[names[0]]
        result.records += [s.record for s in reference]
        if any(len(stages[n]) != len(reference) for n in names):
            result.divergences.append(
                Difference(names[0], names[0], "stages", f"worlds ran different numbers of stages in step {index}")
            )
            break
        per_stage = [{n: stages[n][i] for n in names} for i in range(len(reference))]
        if _compare_stage(result, names, per_stage) or result.violations:
            break
        if any(s.halted for s in schedulers.values()):
            break
    result.classes = classify(scenario, result.records)
    return result


def _compare_stage(result: RunResult, names: tuple[str, ...], per_stage: list[dict[str, Snapshot]]) -> bool:
    """Compare every world with the reference, stage by stage; True at the first divergence."""
    for snaps in per_stage:
        ref = snaps[names[0]]
        result.stages += 1
        for name in names[1:]:
            for diff in compare(names[0], ref, name, snaps[name]):
                (result.findings if diff.known_defect else result.divergences).append(diff)
        if result.divergences:
            result.first_difference = ref.record
            return True
    return False
