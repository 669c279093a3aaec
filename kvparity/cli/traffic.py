"""``kvparity check --drive scheduler`` (and the scheduler half of ``--drive both``): traffic
scenarios through a scheduler, the checked one's decisions against the reference's
(``kvparity.run.traffic_sweep``), printed as a table per policy and loop, with the first difference
shrunk and its cause, the traffic classes reached, and the in-flight oracle's findings per player.

Who plays: without ``--sglang``, kvparity's own legacy (reference) and refactored models of
SGLang's normal loop; ``--sglang A --against B``, the real releases' own schedulers, both loops;
``--sglang A`` alone, for a release kvparity models, A's own scheduler against kvparity's model of
it (the normal loop: the model has no overlap loop).
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvparity.cli.watch import ScenarioFiles
from kvparity.engine.traffic_players import ModelTrafficPlayer, RealTrafficPlayer, TrafficPlayer
from kvparity.judge.admission import TrafficJudgement, judge_traffic
from kvparity.model.classes import TRAFFIC_REQUIRED
from kvparity.model.traffic import TrafficScenario, traffic_to_dict
from kvparity.model.worlds import MODELLED_RELEASES
from kvparity.run.traffic_sweep import TrafficRow, TrafficVerdict, check_traffic, finding_label


def players(real: Any) -> tuple[TrafficPlayer, TrafficPlayer] | str:
    """(reference, checked) for this run, or why it has no scheduler-driven check."""
    pair: tuple[TrafficPlayer, TrafficPlayer]
    version = None if real is None else real.checked.version
    if real is None:
        pair = ModelTrafficPlayer("legacy"), ModelTrafficPlayer("refactored")
        return pair
    if real.reference is not None:
        pair = RealTrafficPlayer(real.reference), RealTrafficPlayer(real.checked)
        return pair
    if version in MODELLED_RELEASES:
        pair = ModelTrafficPlayer(MODELLED_RELEASES[version]), RealTrafficPlayer(real.checked)
        return pair
    return (f"--sglang {version} alone has no scheduler to be checked against (kvparity models the scheduler of "
            f"{' and '.join(MODELLED_RELEASES)} only): give --against RELEASE")


def check_scheduler(args: argparse.Namespace, pair: tuple[TrafficPlayer, TrafficPlayer],
                    replay: Callable[[Path], list[str]]) -> tuple[int, dict[str, Any]]:
    """The scheduler-driven sweep, printed; (exit status, the verdict as JSON-ready data)."""
    reference, checked = pair
    examples = args.traffic_examples
    budget = None if args.no_shrink else args.shrink_budget_s
    print(f"\nscheduler-driven: {checked.name} against {reference.name} (reference); {examples} traffic scenarios "
          "per policy and event loop", flush=True)
    print(f"{'policy':<11} {'loop':<8} {'scenarios':>9} {'differ':>7} {'admission':>9}  verdict", flush=True)
    verdict = check_traffic(reference, checked, examples=examples, seed_value=args.seed, shrink_budget_s=budget,
                            progress=_print_row)
    files = ScenarioFiles()
    _print_classes(verdict)
    for row in verdict.rows:
        _print_first_difference(row, files, replay)
    _print_inflight(verdict, files, replay)
    _print_findings(verdict)
    print(f"verdict (scheduler-driven): {verdict.summary()} ({verdict.scenarios} traffic scenarios in "
          f"{verdict.seconds:.0f} s)", flush=True)
    return (0 if verdict.verdict == "parity" else 1), to_json(verdict)


def _print_row(row: TrafficRow) -> None:
    print(f"{row.policy:<11} {row.loop:<8} {row.scenarios:>9} {row.differing:>7} {row.admission:>9}  "
          f"{'parity' if row.verdict == 'parity' else 'DIVERGENCE'}", flush=True)


def _print_classes(verdict: TrafficVerdict) -> None:
    total = verdict.scenarios
    reached = [c for c in TRAFFIC_REQUIRED if verdict.classes[c]]
    print(f"traffic classes reached: {len(reached)}/{len(TRAFFIC_REQUIRED)}")
    for cls in TRAFFIC_REQUIRED:
        n = verdict.classes[cls]
        print(f"  {cls}: {n} of {total} scenarios ({100 * n / max(total, 1):.1f}%)")


def _print_first_difference(row: TrafficRow, files: ScenarioFiles, replay: Callable[[Path], list[str]]) -> None:
    first = row.first
    if first is None:
        return
    print(f"\n{row.policy}, {row.loop} loop: {row.differing} of {row.scenarios} scenarios differ; the first: "
          f"{first.judgement.line()}")
    scenario = first.scenario
    if first.shrunk is not None and first.shrunk_judgement is not None:
        s = first.shrunk
        state = "nothing one removal smaller differs" if s.complete else "the shrinking budget ran out"
        print(f"  shrunk ({s.tried} smaller scenarios tried in {s.seconds:.0f} s; {state}): "
              f"{first.shrunk_judgement.line()}")
        scenario = s.scenario
    if first.cause:
        print(f"  cause: {first.cause}")
    print("  " + scenario.to_python().replace("\n", "\n  "))
    print(f"  replay: {shlex.join(replay(files.save(f'traffic-{row.policy}-{row.loop}', scenario)))}")


def _print_inflight(verdict: TrafficVerdict, files: ScenarioFiles, replay: Callable[[Path], list[str]]) -> None:
    overlap = [r for r in verdict.rows if r.loop == "overlap"]
    if not overlap:
        return
    print("\nin-flight oracle (overlap loop: while batch N's forward is in flight, the cells its requests read "
          "and its rows must not change):")
    for name in overlap[0].inflight:
        totals = verdict.inflight(name)
        print(f"  {name}: findings in {totals.scenarios_with} of {totals.scenarios} scenarios"
              + ("" if totals.counts else " (none)"))
        for key, n in sorted(totals.counts.items()):
            example = totals.first[key]
            finding, scenario = example.shown
            print(f"    {finding_label(key)}: {n} findings; the first{' (shrunk)' if example.shrunk else ''}: "
                  f"{finding.line()}")
            print("      " + scenario.to_python().replace("\n", "\n      "))


def _print_findings(verdict: TrafficVerdict) -> None:
    """What each player's runs found that is a property of the player (both may have it): reads of
    wrong KV at a launch, memory oracles failed."""
    totals = verdict.findings()
    if not any(counts for counts, _ in totals.values()):
        return
    print("\nfound in the players' own runs (a divergence only where the reference has none of it):")
    for name, (counts, examples) in totals.items():
        for label, n in sorted(counts.items()):
            scenario, line = examples[label]
            print(f"  {name}: {label}: in {n} scenarios; the first: {line}")
            print("      " + scenario.to_python().replace("\n", "\n      "))


def to_json(verdict: TrafficVerdict) -> dict[str, Any]:
    rows = []
    for row in verdict.rows:
        first = row.first
        shown, judgement = (None, None) if first is None else first.shown
        rows.append({
            "policy": row.policy, "loop": row.loop, "scenarios": row.scenarios, "differing": row.differing,
            "admission": row.admission, "verdict": row.verdict, "seconds": round(row.seconds, 1),
            "classes": dict(sorted(row.classes.items())),
            "first_difference": None if first is None else {
                "line": _line(judgement), "cause": first.cause,
                "scenario": None if shown is None else traffic_to_dict(shown), "shrunk": first.shrunk is not None},
            "inflight": {name: {finding_label(key): n for key, n in sorted(counts.items())}
                         for name, counts in row.inflight.items()},
            "findings": {name: dict(sorted(counts.items())) for name, counts in row.findings.items()},
            "inflight_scenarios": dict(row.inflight_scenarios),
        })
    return {"verdict": verdict.verdict, "reference": verdict.reference, "checked": verdict.checked,
            "summary": verdict.summary(), "scenarios": verdict.scenarios,
            "classes": {c: verdict.classes[c] for c in TRAFFIC_REQUIRED}, "rows": rows,
            "seconds": round(verdict.seconds, 1)}


def _line(judgement: TrafficJudgement | None) -> str | None:
    return None if judgement is None else judgement.line()


def replay_traffic(scenario: TrafficScenario, pair: tuple[TrafficPlayer, TrafficPlayer], source: str) -> int:
    """``--replay FILE`` of a traffic scenario: played by both schedulers, judged."""
    reference, checked = pair
    if scenario.config.loop not in reference.loops or scenario.config.loop not in checked.loops:
        print(f"kvparity check: --replay {source}: the {scenario.config.loop} loop is not played by "
              f"{reference.name if scenario.config.loop not in reference.loops else checked.name}")
        return 2
    judgement = judge_traffic(scenario, reference.play(scenario), checked.play(scenario), reference.world_id,
                              checked.world_id)
    print(f"kvparity check: replayed {source} (a traffic scenario) in {checked.name} against {reference.name}")
    if judgement.agree:
        print("verdict: PARITY (the same decisions, outputs and in-flight findings)")
        return 0
    print(judgement.line())
    print("verdict: DIVERGENCE")
    return 1
