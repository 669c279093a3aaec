"""Memory under a scheduler's own decisions (scheduler-driven): the oracles on every iteration's
snapshot of one run, and two runs' memory compared iteration by iteration while their decisions
agree, exactly where both are the same version (kvparity's model against the release it models, a
release against itself) and up to a renumbering of rows and pages between releases (the release
matrix's rule, ``kvparity.judge.renumber``). The snapshots are the harness drive's
(``kvparity.engine.snapshot``), and so are the comparisons and the release differences they name."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from kvparity.caches import pool_problems, pools_difference
from kvparity.engine.snapshot import Snapshot
from kvparity.judge.compare import RENUMBERED_BETWEEN_RELEASES, compare, known_between
from kvparity.judge.oracles import conservation
from kvparity.judge.renumber import DIVERGENT, renumbering_verdict
from kvparity.model.worlds import Geometry, WorldId

LIVE = ("running", "chunked")


@dataclass(frozen=True)
class MemoryProblem:
    """An oracle that failed on one run's snapshot after ``iteration`` (``oracle``: which one)."""

    iteration: int
    oracle: str
    message: str

    @property
    def identity(self) -> tuple[int, str]:
        """What makes two runs' problems the same (the message names slots, which releases number
        otherwise)."""
        return self.iteration, self.oracle

    def line(self) -> str:
        return f"iteration {self.iteration}: {self.oracle}: {self.message}"


def rows_conserved(snap: Snapshot) -> list[str]:
    """Every row is free or held by exactly one live request (a live request holds one)."""
    owners = Counter(v.req_pool_idx for v in snap.requests.values() if v.status in LIVE)
    problems = []
    rowless = sorted(rid for rid, v in snap.requests.items() if v.status in LIVE and v.req_pool_idx is None)
    if rowless:
        problems.append(f"live requests without a row: {rowless[:6]}")
    twice = sorted(row for row, n in owners.items() if row is not None and n > 1)
    if twice:
        problems.append(f"rows held by two live requests: {twice[:6]}")
    free_and_held = sorted(row for row in owners if row is not None and row in set(snap.free_rows))
    if free_and_held:
        problems.append(f"rows both free and held: {free_and_held[:6]}")
    if len(set(snap.free_rows)) != len(snap.free_rows):
        problems.append(f"rows free twice: {sorted(r for r, n in Counter(snap.free_rows).items() if n > 1)[:6]}")
    return problems


def batch_slots_distinct(geometry: Geometry, snap: Snapshot) -> list[str]:
    """The batch's new slots are distinct real slots. (Whether they were free: within an iteration a
    slot can be freed and handed out again, or handed out and freed by a finish; conservation after
    the iteration sees what is left of either.)"""
    new = list(snap.record.out_cache_loc or ())
    problems = []
    twice = [s for s, n in Counter(new).items() if n > 1]
    if twice:
        problems.append(f"new slots handed out twice: {twice[:6]}")
    bad = [s for s in new if not 1 <= s < geometry.kv_slots + geometry.page_size]
    if bad:
        problems.append(f"new slots that are no slots of the pool: {bad[:6]}")
    return problems


def iteration_problems(geometry: Geometry, after: Snapshot) -> list[MemoryProblem]:
    """The oracles on the snapshot after one iteration: the player's own checks (cells written past
    every sequence), KV slots and pages conserved, rows conserved, the batch's new slots distinct."""
    record = after.record
    found = [("table", p) for p in record.contract_violations]
    found += [("slots conserved", p) for p in conservation(geometry, after)]
    found += [("rows conserved", p) for p in rows_conserved(after)]
    found += [("new slots distinct", p) for p in batch_slots_distinct(geometry, after)]
    found += pool_problems(after.pools, after.tree)
    return [MemoryProblem(record.step, oracle, message) for oracle, message in found]


def run_problems(geometry: Geometry, memory: Sequence[Snapshot]) -> list[MemoryProblem]:
    return [problem for snap in memory for problem in iteration_problems(geometry, snap)]


@dataclass(frozen=True)
class MemoryDifference:
    """The first iteration after which two runs' memory differs, under the same decisions."""

    iteration: int
    what: str
    detail: str

    def line(self) -> str:
        return f"iteration {self.iteration}: memory differs: {self.what}: {self.detail}"


def hybrid_difference(ref: Snapshot, got: Snapshot, exact: bool) -> tuple[str, str] | None:
    """The pools a cache kind adds beside the device's KV, compared pool by pool as registered
    (``kvparity.caches.pool``): a window pool, a state pool, a host tier's."""
    return pools_difference(ref.pools, got.pools, exact)


def first_memory_difference(ref_id: WorldId, ref: Sequence[Snapshot], world: WorldId, got: Sequence[Snapshot],
                            page_size: int) -> tuple[MemoryDifference | None, set[str]]:
    """Over the iterations both runs have (the caller cuts them where decisions first differ): the
    first memory difference, and the known release differences met (including a renumbering).
    Exactly, unless the two are different releases; then a difference an exact comparison finds is
    one only if no consistent renumbering of rows and pages explains every iteration."""
    known: set[str] = set()
    n = min(len(ref), len(got))
    same_release = not (ref_id.real and world.real and ref_id.release != world.release)
    for i in range(n):
        hybrid = hybrid_difference(ref[i], got[i], exact=same_release)
        if hybrid is not None:
            return MemoryDifference(ref[i].record.step, *hybrid), known
        diffs = compare(ref_id, ref[i], world, got[i])
        known |= {d.known_defect for d in diffs if d.known_defect}
        bad = [d for d in diffs if not d.known_defect]
        if not bad:
            continue
        if same_release:
            return MemoryDifference(ref[i].record.step, bad[0].what, bad[0].detail[:300]), known
        verdict = renumbering_verdict(list(ref[:n]), list(got[:n]), page_size, exact=False,
                                      known=known_between(ref_id, world), per_iteration=True)
        if verdict.verdict == DIVERGENT:
            at = ref[verdict.stage or 0].record.step
            return MemoryDifference(at, verdict.what or "memory", verdict.detail or ""), known | verdict.findings
        return None, known | verdict.findings | {RENUMBERED_BETWEEN_RELEASES}
    return None, known
