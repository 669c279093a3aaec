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

from kvparity.engine.snapshot import HostState, MambaState, Snapshot, WindowState
from kvparity.judge.compare import RENUMBERED_BETWEEN_RELEASES, compare, known_between
from kvparity.judge.oracles import conservation, host_tier_problems, states_conserved, window_conserved
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
    if after.window is not None:
        found += [("window slots conserved", p) for p in window_conserved(after.window)]
    if after.states is not None:
        found += [("state slots conserved", p) for p in states_conserved(after.states)]
    found += [("host tier", p) for p in host_tier_problems(after)]
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


def _pool_difference(pool: str, a: WindowState | MambaState | HostState | None,
                     b: WindowState | MambaState | HostState | None,
                     sizes: tuple[str, ...] = ("available_size", "evictable_size", "protected_size")) -> tuple[str, str] | None:
    """A second pool present in one run only, or its ``sizes`` apart."""
    if a is None or b is None:
        return None if a is b else (f"{pool} pool", f"{'none' if b is None else 'one'} against the reference's "
                                                   f"{'none' if a is None else 'one'}")
    for attr in sizes:
        if getattr(a, attr) != getattr(b, attr):
            return f"{pool} {attr}", f"{getattr(b, attr)} != {getattr(a, attr)}"
    return None


def window_difference(ref: Snapshot, got: Snapshot, exact: bool) -> tuple[str, str] | None:
    """The first way two runs' window pools differ after an iteration: their sizes and how many
    full slots hold a window slot (numbers no renumbering changes), and, ``exact`` (the same
    release), which ones and what is free."""
    a, b = ref.window, got.window
    sizes = _pool_difference("window", a, b)
    if sizes is not None or a is None or b is None:
        return sizes
    if len(a.mapped) != len(b.mapped):
        return "window slots held", f"{len(b.mapped)} full slots hold one, against the reference's {len(a.mapped)}"
    if exact and a.mapped != b.mapped:
        return "window mapping", f"{list(b.mapped)[:8]} != {list(a.mapped)[:8]}"
    if exact and sorted(a.free) != sorted(b.free):
        return "window free pages", f"{sorted(b.free)[:8]} != {sorted(a.free)[:8]}"
    return None


def states_difference(ref: Snapshot, got: Snapshot, exact: bool) -> tuple[str, str] | None:
    """The first way two runs' state pools differ after an iteration: their sizes and how many slots
    rows and the tree hold (numbers no renumbering changes), and, ``exact`` (the same release),
    which ones and what is free."""
    a, b = ref.states, got.states
    sizes = _pool_difference("state", a, b)
    if sizes is not None or a is None or b is None:
        return sizes
    if (len(a.rows), len(a.tree)) != (len(b.rows), len(b.tree)):
        return "state slots held", (f"{len(b.rows)} rows and the tree's {len(b.tree)}, against the reference's "
                                    f"{len(a.rows)} and {len(a.tree)}")
    if exact and (a.rows, a.tree, sorted(a.free)) != (b.rows, b.tree, sorted(b.free)):
        return "state slots", f"rows {list(b.rows)[:6]}, tree {list(b.tree)[:6]} != {list(a.rows)[:6]}, {list(a.tree)[:6]}"
    return None


def host_difference(ref: Snapshot, got: Snapshot, exact: bool) -> tuple[str, str] | None:
    """The first way two runs' host tiers differ after an iteration (the KV's, then a Mamba
    model's states'): present in one only, the free host slots, the paths the host keeps and which
    the device evicted (no renumbering changes these), and, ``exact`` (the same release), which
    host slots back what."""
    return (_host_pool_difference("host", ref.host, got.host, exact)
            or _host_pool_difference("state host", ref.state_host, got.state_host, exact))


def _host_pool_difference(name: str, a: HostState | None, b: HostState | None,
                          exact: bool) -> tuple[str, str] | None:
    sizes = _pool_difference(name, a, b, sizes=("available_size",))
    if sizes is not None or a is None or b is None:
        return sizes
    shape_a = [(n.extra_key, n.path, len(n.host), n.device is None) for n in a.nodes]
    shape_b = [(n.extra_key, n.path, len(n.host), n.device is None) for n in b.nodes]
    if shape_a != shape_b:
        return f"{name} nodes", (f"{len(shape_b)} nodes, {b.host_only_tokens} tokens on the host alone, against the "
                              f"reference's {len(shape_a)} and {a.host_only_tokens}")
    if exact and (a.nodes, sorted(a.free)) != (b.nodes, sorted(b.free)):
        return f"{name} slots", "the same nodes back other host slots"
    return None


def hybrid_difference(ref: Snapshot, got: Snapshot, exact: bool) -> tuple[str, str] | None:
    """A hybrid model's second pool, compared: a window pool or a state pool; and a host tier."""
    return window_difference(ref, got, exact) or states_difference(ref, got, exact) or host_difference(ref, got, exact)


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
