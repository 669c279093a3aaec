"""The release matrix, either drive: real SGLang releases compared pairwise, each pair a sweep of
the drive (``kvparity.run.sweep``) that counts every differing scenario, with the reference release's
worlds or scheduler as the reference. Each release plays every scenario once (its results are kept
while a pair still needs them: ``CachingLane`` for the harness drive, ``CachingPlayer`` for the
scheduler drive), so a release in two pairs costs one play.

A pair's row is its verdict (``kvparity.judge.verdict.to_json``, the one schema) with the pair's
names, its label and the changes the release wheels show between its two releases
(``kvparity.engine.releases``): "exact" (every scenario alike), "renumbered" (alike up to one
consistent renumbering of rows and pages somewhere) or "divergent". Per release: what its own runs
found (the scheduler drive's in-flight findings, split by harm, its canary reads, its memory
oracles), which of those are defects (each named where SGLang is known to have it) and what playing
it cost."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable
from typing import Any

from kvparity.engine.releases import changes_between
from kvparity.judge.compare import RENUMBERED_BETWEEN_RELEASES
from kvparity.run.events import QuietEvents
from kvparity.run.plan import FINDING_BUDGET_S, SweepPlan

# Shrinking in the matrix is bounded by candidates played, so that two runs (any machine, any
# --jobs) write the same JSON apart from times; the time budgets stay only as a far cap.
SHRINK_TRIES = 60
TIME_CAP = 10
from kvparity.judge.verdict import Verdict, to_json
from kvparity.run.sweep import sweep

EXACT, RENUMBERED, DIVERGENT = "exact", "renumbered", "divergent"


class CachingLane:
    """Real worlds of several releases, each a ``RealLane`` of its own, played once per scenario:
    the matrix plays a release in two pairs, and shrinking replays candidates."""

    def __init__(self, lanes: list[Any]) -> None:
        self.lanes = lanes
        self.ids = tuple(w for lane in lanes for w in lane.ids)
        self.names = tuple(n for lane in lanes for n in lane.names)
        self.kernels: dict[str, dict[str, str]] = {}

    def play(self, scenario: Any, stop_before: int | None = None, *, only: frozenset[str] | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for lane in self.lanes:
            cache = lane.__dict__.setdefault("_kvp_played", {})
            if (scenario, stop_before) not in cache:
                cache[(scenario, stop_before)] = lane.play(scenario, stop_before)
            out.update(cache[(scenario, stop_before)])
            self.kernels.update(lane.kernels)
        return out if only is None else {name: got for name, got in out.items() if name in only}

    def close(self) -> None:
        pass  # the matrix closes each release's lane after its last pair


def label(verdict: Verdict) -> str:
    """How the pair compares (a defect both releases' runs share is the releases' own, not the pair's)."""
    if verdict.verdict == "divergence":
        return DIVERGENT
    return RENUMBERED if verdict.findings[RENUMBERED_BETWEEN_RELEASES] else EXACT


class Releases:
    """Each release's worlds (harness) or scheduler (scheduler drive), started on first use and
    closed after the last pair that needs them."""

    def __init__(self, drive: str, sources: dict[str, Any], backends: tuple[str, ...]) -> None:
        self.drive, self.sources, self.backends = drive, sources, backends
        self.open: dict[str, Any] = {}

    def get(self, release: str) -> Any:
        if release not in self.open:
            if self.drive == "harness":
                from kvparity.engine.real.door import RealLane

                self.open[release] = RealLane([self.sources[release]], self.backends, tree_core_variants=False)
            else:
                from kvparity.engine.real.door import RealTrafficPlayer
                from kvparity.engine.traffic_players import CachingPlayer

                self.open[release] = CachingPlayer(RealTrafficPlayer(self.sources[release]))
        return self.open[release]

    def close(self, release: str | None = None) -> None:
        for name in [release] if release is not None else list(self.open):
            if name in self.open:
                self.open.pop(name).close()


def pair_drive(drive: str, releases: Releases, ref: str, other: str, caches: tuple[str, ...] = ("full",)) -> Any:
    """The drive that judges ``other`` against ``ref``, on their kept results (``caches``: the models
    the scheduler drive's tasks serve)."""
    if drive == "harness":
        from kvparity.run.harness_drive import HarnessDrive, HarnessSpec

        spec = HarnessSpec((("legacy", "torch"),), (releases.sources[ref], releases.sources[other]), releases.backends,
                           real_reference=True, counts_all=True)
        return HarnessDrive(spec, lane=CachingLane([releases.get(ref), releases.get(other)]))
    from kvparity.run.scheduler_drive import PlayerSpec, SchedulerDrive, SchedulerSpec

    pair = SchedulerSpec(PlayerSpec("real", ref), PlayerSpec("real", other), caches=caches)
    return SchedulerDrive(pair, players=(releases.get(ref), releases.get(other)))


def run_matrix(drive: str, sources: dict[str, Any], pairs: list[tuple[str, str]], *, examples: int,
               seed: int | None = None, backends: tuple[str, ...] = ("torch", "triton"),
               shrink_budget_s: float | None = None, say: Callable[[str], None] = print,
               caches: tuple[str, ...] = ("full",)) -> dict[str, Any]:
    """``sources``: release -> ``SGLangSource``; ``pairs``: (reference, release), played in order.
    ``examples``: the drive's own count (harness: scenarios in all; scheduler: per policy and loop).
    Returns the rows of the pairs and the releases' own findings and costs (plain data)."""
    releases = Releases(drive, sources, backends)
    last_use = {release: i for i, pair in enumerate(pairs) for release in pair}
    rows: list[dict[str, Any]] = []
    found: dict[str, dict[str, Any]] = {}
    try:
        for i, (ref, other) in enumerate(pairs):
            judge = pair_drive(drive, releases, ref, other, caches)
            plan = SweepPlan(None, tuple(judge.tasks(examples, seed)),
                             None if shrink_budget_s is None else shrink_budget_s * TIME_CAP,
                             FINDING_BUDGET_S * TIME_CAP, shrink_tries=SHRINK_TRIES)
            verdict = sweep(judge, plan, events=QuietEvents())
            rows.append(pair_row(ref, other, verdict, judge))
            say(f"{ref} -> {other}: {rows[-1]['label']}: {verdict.summary_line} ({verdict.scenarios} scenarios, "
                f"{verdict.seconds:.0f} s)")
            for release, name in ((ref, judge.reference), (other, judge.checked[0])):
                found.setdefault(release, release_row(release, name, verdict, releases.open.get(release)))
            for release in (ref, other):
                if last_use[release] == i:
                    releases.close(release)
    finally:
        releases.close()
    order = list(dict.fromkeys(r for pair in pairs for r in pair))
    return {"pairs": rows, "releases": [found[r] for r in order if r in found]}


def pair_row(ref: str, other: str, verdict: Verdict, drive: Any) -> dict[str, Any]:
    return dict(to_json(verdict, drive), reference_release=ref, other_release=other, label=label(verdict),
                release_changes=[dataclasses.asdict(c) for c in changes_between(ref, other)])


def release_row(release: str, name: str, verdict: Verdict, played: Any) -> dict[str, Any]:
    """What ``release``'s own runs found in the pair ``verdict`` judged it in (findings labelled
    with its player's name), and its costs (the scheduler drive's: plays, ms per iteration)."""
    prefix = f"{name}: "
    own = {label.removeprefix(prefix): n for label, n in sorted(verdict.findings.items()) if label.startswith(prefix)}
    firsts = {}
    for label_ in own:
        example = verdict.finding_example(prefix + label_)
        if example is not None:
            firsts[label_] = {"line": example.line(prefix + label_), "python": example.shown.scenario.to_python()}
    defects = {label_.removeprefix(prefix): {"scenarios": verdict.findings[label_],
                                             "known": None if finding.known is None else finding.known.name,
                                             "known_line": None if finding.known is None else finding.known.line}
               for label_, finding in verdict.defects.items() if label_.startswith(prefix)}
    return {"release": release, "scenarios": verdict.scenarios, "findings": own, "findings_first": firsts,
            "defects": defects, "costs": costs(played)}


def costs(played: Any) -> dict[str, Any]:
    results = list(getattr(played, "results", {}).values())
    if not results:
        return {}
    iterations = sum(len(r.decisions) for r in results)
    return {"plays": len(results), "iterations": iterations,
            "build_s_median": round(statistics.median(r.build_s for r in results), 4),
            "ms_per_iteration": round(1000 * sum(r.loop_s for r in results) / max(iterations, 1), 3),
            "record_ms_per_iteration": round(1000 * sum(r.record_s for r in results) / max(iterations, 1), 3)}
