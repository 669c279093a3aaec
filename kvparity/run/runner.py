"""Play one scenario in several worlds in lockstep, snapshot every stage, compare every world with
the reference (the first world: legacy on torch) and run the oracles on each world."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvparity.engine.scheduler import Scheduler, StageRecord
from kvparity.engine.snapshot import Snapshot, take_snapshot
from kvparity.engine.world import build_world
from kvparity.judge.compare import RENUMBERED_BETWEEN_RELEASES, Difference, compare, known_between
from kvparity.judge.memory import hybrid_difference
from kvparity.judge.oracles import (
    FAILED_DECODE_KEEPS_PAGE,
    STALE_ROW_DEFECT,
    check_stage,
    pages_a_failed_decode_kept,
    stale_row_defects,
    violations,
)
from kvparity.judge.order import order_classes
from kvparity.judge.renumber import DIVERGENT, renumbering_verdict
from kvparity.judge.run_result import RunResult
from kvparity.kernels import runtime
from kvparity.model.classes import classify
from kvparity.model.scenario import Scenario, Step
from kvparity.model.worlds import VERSIONS, WorldId

SGLANG_WORLDS: tuple[tuple[str, str], ...] = tuple((v, b) for v in VERSIONS for b in ("torch", "triton"))
# Plus the extra world: the refactored path on the linear-time write kernel (Triton only: on torch
# it is the refactored torch twin, already a world).
EXTRA_WORLDS: tuple[tuple[str, str], ...] = (("refactored-linear", "triton"),)
ALL_WORLDS: tuple[tuple[str, str], ...] = SGLANG_WORLDS + EXTRA_WORLDS
REAL_FAILED = "real SGLang failed"  # what a difference says when a real world raised or died


Observer = Callable[[str, Scheduler, Snapshot], None]


def _start_record() -> StageRecord:
    return StageRecord(step=-1, kind="start")


class Lockstep:
    """Several worlds fed the same steps. After every stage each world is snapshotted and checked
    by the oracles; then every world is compared with the reference (the first), stage by stage.
    ``result`` accumulates divergences, known legacy defects, violations and the reference's
    records. Used by ``run_scenario`` (steps known up front) and by the stateful test (steps
    chosen one at a time)."""

    def __init__(
        self,
        scenario: Scenario,
        worlds: tuple[tuple[str, str], ...] = ALL_WORLDS,
        *,
        oracles: bool = True,
        observe: Observer | None = None,
    ):
        # ``observe(name, scheduler, snapshot)`` runs after every stage's snapshot, while the world is
        # still in that stage: the golden recorder reads there what a snapshot leaves out (the type
        # of a prefix, of the tree's values).
        self.observe = observe
        self.ids = tuple(WorldId.modelled(v, b) for v, b in worlds)
        self.names = tuple(str(world) for world in self.ids)
        self.schedulers = {
            name: Scheduler(build_world(v, b, scenario.geometry, scenario.cache_kind, device=runtime.DEVICE), scenario)
            for name, (v, b) in zip(self.names, worlds)
        }
        self.oracles = oracles
        self.result = RunResult(scenario, self.names)
        self.last = {name: take_snapshot(s, _start_record()) for name, s in self.schedulers.items()}
        self.reference_stages: list[Snapshot] = [self.last[self.names[0]]]  # the start, then every stage
        self._compare([self.last])

    @property
    def halted(self) -> bool:
        return any(s.halted for s in self.schedulers.values())

    @property
    def failed(self) -> bool:
        return not self.result.ok

    def play(self, index: int, step: Step) -> list[StageRecord]:
        """Play ``step`` in every world; returns the reference world's stage records."""
        stages: dict[str, list[Snapshot]] = {}
        for name, scheduler in self.schedulers.items():
            stages[name] = []
            for record in scheduler.apply(index, step):
                snap = take_snapshot(scheduler, record)
                if self.observe is not None:
                    self.observe(name, scheduler, snap)
                if self.oracles:
                    problems = check_stage(self.result.scenario, self.last[name], snap)
                    self.result.violations += violations(name, problems)
                if name == self.names[0]:
                    self._upstream_defects(name, self.last[name], snap)
                self.last[name] = snap
                stages[name].append(snap)
        reference = stages[self.names[0]]
        records = [s.record for s in reference]
        self.result.records += records
        self.reference_stages += reference
        counts = {name: len(stages[name]) for name in self.names}
        if len(set(counts.values())) != 1:
            self.result.divergences.append(
                Difference(self.names[0], self.names[0], "stages", f"step {index}: the worlds ran {counts} stages")
            )
            self.result.first_difference = records[0] if records else None
            return records
        self._compare([{n: stages[n][i] for n in self.names} for i in range(len(reference))])
        return records

    def _upstream_defects(self, name: str, before: Snapshot, snap: Snapshot) -> None:
        """Known SGLang defects every world shares (the reference's are reported, once)."""
        where = f"step {snap.record.step} {snap.record.kind}"
        for line in stale_row_defects(self.result.scenario, snap):
            self.result.findings.append(Difference(name, name, where, line, known_defect=STALE_ROW_DEFECT))
        kept = pages_a_failed_decode_kept(self.result.scenario.geometry, before, snap)
        if kept:
            line = f"pages {sorted(kept)} taken by the decode that ran out of window pages (the server stops here)"
            self.result.findings.append(Difference(name, name, where, line, known_defect=FAILED_DECODE_KEEPS_PAGE))

    def _compare(self, per_stage: list[dict[str, Snapshot]]) -> None:
        for snaps in per_stage:
            ref = snaps[self.names[0]]
            self.result.stages += 1
            for world in self.ids[1:]:
                for diff in compare(self.ids[0], ref, world, snaps[str(world)]):
                    (self.result.findings if diff.known_defect else self.result.divergences).append(diff)
            if self.result.divergences:
                self.result.first_difference = ref.record
                return


def run_scenario(
    scenario: Scenario,
    worlds: tuple[tuple[str, str], ...] = ALL_WORLDS,
    *,
    oracles: bool = True,
    lane: Any = None,
    real_reference: bool = False,
    only: frozenset[str] | None = None,
) -> RunResult:
    """Play ``scenario`` in ``worlds`` until its end, the first divergence or violation, or a
    halt (an allocation failure ends a scenario: after it the versions differ by design).

    ``lane`` (a ``kvparity.engine.real.lane.RealLane``) adds real SGLang worlds, compared with the same
    reference once the modelled worlds have played. With ``real_reference`` the lane's first world
    is the reference instead, and ``worlds`` (then usually just one) only decide where the
    scenario leaves the server's path: real SGLang is never compared after a prefill runs out of
    memory (SPEC 6), where its kernels may even crash. ``only`` limits the lane's worlds to those
    named (the reference always plays): a shrinker replays just the worlds that failed."""
    lockstep = Lockstep(scenario, worlds, oracles=oracles and not real_reference)
    for index, step in enumerate(scenario.steps):
        if lockstep.failed or lockstep.halted:
            break
        lockstep.play(index, step)
    result = lockstep.result
    ordered = lockstep.reference_stages
    if lane is not None and (result.ok or real_reference):
        real_stages = compare_real(lockstep, lane, oracles=oracles, real_reference=real_reference, only=only)
        ordered = real_stages if real_stages is not None else ordered
    # Order classes from the reference's snapshots: the real reference's when there is one.
    result.classes = classify(scenario, result.records) | order_classes(ordered, scenario.geometry.page_size)
    return result


def off_path_step(records: list[StageRecord]) -> int | None:
    """The first step whose stage did not end "ok" (a prefill out of memory: off SGLang's path)."""
    return next((r.step for r in records if r.outcome != "ok"), None)


def compare_real(lockstep: Lockstep, lane: Any, *, oracles: bool, real_reference: bool,
                 only: frozenset[str] | None = None) -> list[Snapshot] | None:
    """Play the lane's real worlds (those in ``only``, and the reference) up to the off-path step
    and compare them, stage by stage, with the reference (the modelled reference, or the lane's
    first world). Returns the real reference's stages (None: the reference is modelled, or failed)."""
    result = lockstep.result
    stop = off_path_step(result.records)
    ids = [w for i, w in enumerate(lane.ids) if only is None or str(w) in only or (real_reference and i == 0)]
    played = lane.play(result.scenario, stop, only=frozenset(str(w) for w in ids))
    result.kernels = {name: dict(k) for name, k in getattr(lane, "kernels", {}).items() if "n/a" not in k.get("alloc", "")}
    if real_reference:
        result.worlds = tuple(lane.names)
        result.divergences, result.violations, result.findings = [], [], []
        ref_id = lane.ids[0]
        ref = played[str(ref_id)]
        if not isinstance(ref, list):
            result.divergences.append(Difference(str(ref_id), str(ref_id), REAL_FAILED, ref.line()))
            return None
        for before, snap in zip(ref, ref[1:]):  # the first is the start, before any stage
            lockstep._upstream_defects(str(ref_id), before, snap)
    else:
        result.worlds = result.worlds + tuple(lane.names)
        ref_id = lockstep.ids[0]
        ref = [s for s in lockstep.reference_stages if s.record.step < (stop if stop is not None else 1 << 30)]
    for world in ids:
        name, got = str(world), played[str(world)]
        if not isinstance(got, list):
            result.divergences.append(Difference(name, str(ref_id), REAL_FAILED, got.line()))
            continue
        if oracles:
            for before, after in zip(got, got[1:]):
                result.violations += violations(name, check_stage(result.scenario, before, after))
        if world != ref_id:
            _compare_stages(result, ref_id, ref, world, got)
    return ref if real_reference else None


def _first_hybrid_difference(ref_id: WorldId, ref: list[Snapshot], world: WorldId,
                             got: list[Snapshot]) -> tuple[int, tuple[str, str]] | None:
    """The first stage whose hybrid pool (a window's, the states') differs, and how: in numbers no
    renumbering changes between releases, exactly within one (None: none differs, or no hybrid)."""
    same_release = not (ref_id.real and world.real and ref_id.release != world.release)
    for i, (r_snap, g_snap) in enumerate(zip(ref, got)):
        found = hybrid_difference(r_snap, g_snap, exact=same_release)
        if found is not None:
            return i, found
    return None


def _renumbered_between_releases(result: RunResult, ref_id: WorldId, ref: list[Snapshot], world: WorldId,
                                 got: list[Snapshot]) -> bool:
    """Two real releases that hand out other rows or pages to the same tokens (one consistent map
    of rows and pages explains every stage, as ``kvparity matrix`` judges them): a named finding,
    with the known release differences the renumbering met, not a divergence."""
    if not (ref_id.real and world.real and ref_id.release != world.release):
        return False
    verdict = renumbering_verdict(ref, got, result.scenario.geometry.page_size, exact=False,
                                  known=known_between(ref_id, world))
    if verdict.verdict == DIVERGENT:
        return False
    maps = f"rows {_moved(verdict.rows)}, pages {_moved(verdict.pages)}"
    result.findings.append(Difference(str(world), str(ref_id), "renumbering", maps, known_defect=RENUMBERED_BETWEEN_RELEASES))
    result.findings += [Difference(str(world), str(ref_id), "release difference", key, known_defect=key)
                        for key in sorted(verdict.findings)]
    return True


def _moved(mapping: dict[int, int]) -> str:
    moved = {a: b for a, b in sorted(mapping.items()) if a != b}
    return str(moved) if moved else "unchanged"


def _compare_stages(result: RunResult, ref_id: WorldId, ref: list[Snapshot], world: WorldId, got: list[Snapshot]) -> None:
    name, ref_name = str(world), str(ref_id)
    hybrid = _first_hybrid_difference(ref_id, ref, world, got)
    for i, (r_snap, g_snap) in enumerate(zip(ref, got)):
        diffs = compare(ref_id, r_snap, world, g_snap)
        result.findings += [d for d in diffs if d.known_defect]
        bad = [d for d in diffs if not d.known_defect]
        renumbered = bool(bad) and _renumbered_between_releases(result, ref_id, ref, world, got)
        if hybrid is not None and (hybrid[0] == i or renumbered):
            result.divergences.append(Difference(name, ref_name, *hybrid[1]))  # renumbering does not excuse it
            result.first_difference = ref[hybrid[0]].record
            return
        if renumbered:
            return
        if bad:
            result.divergences += bad
            result.first_difference = r_snap.record
            return
    if len(ref) != len(got):
        steps = f"{len(got) - 1} stages against the reference's {len(ref) - 1}"
        result.divergences.append(Difference(name, ref_name, "stages", steps))
        result.first_difference = (ref[min(len(ref), len(got)) - 1]).record
