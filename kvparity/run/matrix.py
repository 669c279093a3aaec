"""The release matrix: real SGLang releases compared pairwise on one scenario set, exactly or up to
renumbering (``kvparity.judge.renumber``).

Each release plays every scenario once per backend (one worker process per release, the same
scheduler loop); a pair's verdict is "exact" when every scenario's stages are equal, "renumbered"
when every one is equal or equal up to one consistent renumbering of rows and pages, else
"divergent", with the fields that differed, the scenario classes of the divergent scenarios and
the first counterexample in one line. Known intended changes between releases
(``kvparity.judge.compare.KNOWN_VERSION_DIFFERENCES``) are counted as findings.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from kvparity.engine.snapshot import Snapshot
from kvparity.judge.compare import ALLOWED, compare, known_between
from kvparity.judge.renumber import DIVERGENT, EXACT, RENUMBERED, RenumberVerdict, renumbering_verdict
from kvparity.model.scenario import Scenario
from kvparity.model.worlds import WorldId
from kvparity.run.runner import Lockstep, off_path_step

ORDER = {EXACT: 0, RENUMBERED: 1, DIVERGENT: 2}


@dataclass
class PairResult:
    reference: str  # world name, e.g. sglang-0.5.3/torch
    other: str
    reference_release: str = ""  # e.g. "0.5.3"
    other_release: str = ""
    backend: str = ""  # "torch" or "triton"
    verdict: str = EXACT
    scenarios: int = 0
    renumbered: int = 0
    divergent: int = 0
    fields: Counter = field(default_factory=Counter)  # what failed first, per divergent scenario
    classes: Counter = field(default_factory=Counter)  # scenario classes of the divergent scenarios
    findings: Counter = field(default_factory=Counter)  # known intended changes met
    counterexample: str | None = None  # the first divergent scenario, in one line, and why
    scenario: Scenario | None = None

    def add(self, verdict: str, detail: str | None, scenario: Scenario, classes: set[str],
            field: str | None = None) -> None:
        """One scenario's verdict; for a divergence, ``detail`` says what differed first and
        ``field`` (counted in ``fields``) the kind of it."""
        self.scenarios += 1
        if ORDER[verdict] > ORDER[self.verdict]:
            self.verdict = verdict
        if verdict == RENUMBERED:
            self.renumbered += 1
        if verdict == DIVERGENT:
            self.divergent += 1
            self.fields[field or "?"] += 1
            self.classes.update(classes)
            if self.counterexample is None:
                self.counterexample = f"{detail} [{_summary(scenario)}]"
                self.scenario = scenario


def _summary(scenario: Scenario) -> str:
    g = scenario.geometry
    chunk = f" chunk {scenario.chunk_size}" if scenario.chunk_size else ""
    return f"{scenario.cache_kind}, page {g.page_size}{chunk}, {len(scenario.requests)} requests, {len(scenario.steps)} steps"


def pair_verdict(
    ref: list[Snapshot], got: list[Snapshot], ref_id: WorldId, world: WorldId, page_size: int
) -> tuple[RenumberVerdict, set[str]]:
    """(the verdict, the known intended changes met) of one scenario for one pair."""
    diffs = [d for a, b in zip(ref, got) for d in compare(ref_id, a, world, b)] if len(ref) == len(got) else [None]
    known = {d.known_defect for d in diffs if d is not None and d.known_defect}
    # Exact up to what ALLOWED excuses (legacy's alias): the differences of the refactor itself.
    exact = all(d is not None and d.known_defect in ALLOWED for d in diffs)
    verdict = renumbering_verdict(ref, got, page_size, exact=exact, known=known_between(ref_id, world))
    identity = all(a == b for a, b in verdict.rows.items()) and all(a == b for a, b in verdict.pages.items())
    if verdict.verdict == RENUMBERED and identity and all(d is not None and d.known_defect for d in diffs):
        # Nothing was renumbered: every difference is a named one (counted below), none a number.
        verdict = RenumberVerdict(EXACT, findings=verdict.findings)
    return verdict, known | verdict.findings


def play_pilot(scenario: Scenario) -> tuple[int | None, set[str]]:
    """Where ``scenario`` leaves SGLang's path, and its classes, from kvparity's legacy model."""
    from kvparity.model.classes import classify

    lockstep = Lockstep(scenario, (("legacy", "torch"),), oracles=False)
    for index, step in enumerate(scenario.steps):
        if lockstep.halted:
            break
        lockstep.play(index, step)
    return off_path_step(lockstep.result.records), classify(scenario, lockstep.result.records)


def run_matrix(
    scenarios: list[Scenario],
    lanes: dict[str, Any],
    pairs: list[tuple[str, str]],
    *,
    tick: Callable[[], None] = lambda: None,
    pool: Executor | None = None,
) -> list[PairResult]:
    """``lanes``: release -> a ``RealLane`` of that release alone (started here, when its turn
    comes, and closed when it has played); ``pairs``: (reference release, release). Every release
    plays every scenario once, release by release (one worker per release, ``pool``'s threads
    playing that many releases at once); a pair is judged as soon as both its releases have played,
    while the next ones play, and a release's snapshots are dropped once no pair left needs them.
    ``tick`` is called once per scenario a release played."""
    pilots = [play_pilot(scenario) for scenario in scenarios]
    ids = {(a, b, backend): (lanes[a].ids[i], lanes[b].ids[i])
           for a, b in pairs for i, backend in enumerate(lanes[a].backends)}
    results = {key: PairResult(str(ref_id), str(world), key[0], key[1], key[2]) for key, (ref_id, world) in ids.items()}
    order = [release for release in lanes if any(release in pair for pair in pairs)]

    def play_release(release: str) -> list[dict[str, Any]]:
        lane = lanes[release]
        try:
            lane.start()
            played = []
            for scenario, (stop, _) in zip(scenarios, pilots):
                played.append(lane.play(scenario, stop))
                tick()
            return played
        finally:
            lane.close()

    played: dict[str, list[dict[str, Any]]] = {}
    waiting = list(pairs)
    if pool is None:
        done = ((release, play_release(release)) for release in order)
    else:
        futures = {release: pool.submit(play_release, release) for release in order}
        done = ((release, futures[release].result()) for release in order)
    for release, snapshots in done:
        played[release] = snapshots
        for pair in [p for p in waiting if p[0] in played and p[1] in played]:
            waiting.remove(pair)
            _judge_pair(pair, scenarios, pilots, played, ids, results)
        for gone in [r for r in played if not any(r in p for p in waiting)]:
            del played[gone]
    return list(results.values())


def _judge_pair(pair: tuple[str, str], scenarios: list[Scenario], pilots: list[tuple[int | None, set[str]]],
                played: dict[str, list[dict[str, Any]]], ids: dict, results: dict) -> None:
    """Every scenario's verdict for ``pair``, on each backend, in scenario order."""
    for key, result in results.items():
        if key[:2] != pair:
            continue
        ref_id, world = ids[key]
        for index, scenario in enumerate(scenarios):
            classes = pilots[index][1]
            ref, got = played[pair[0]][index][result.reference], played[pair[1]][index][result.other]
            if not isinstance(ref, list) or not isinstance(got, list):
                failed = ref if not isinstance(ref, list) else got
                result.add(DIVERGENT, f"real SGLang failed: {failed.line()}", scenario, classes, "real SGLang failed")
                continue
            verdict, known = pair_verdict(ref, got, ref_id, world, scenario.geometry.page_size)
            result.findings.update(known)
            result.add(verdict.verdict, verdict.detail, scenario, classes, verdict.what)
