"""The release matrix, scheduler-driven (issue 26): every pair of releases plays the same traffic
scenarios through each release's own scheduler, both event loops, judged as ``check --drive
scheduler`` judges (``kvparity.run.traffic_sweep``); and, release by release, what the in-flight
oracle finds in the overlap loop and what the shell costs. Each release plays each scenario once
(``CachingPlayer``): a release is judged in two pairs. The result is plain data (the document
``kvparity matrix --drive scheduler --json`` writes)."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from kvparity.engine.traffic_players import CachingPlayer, RealTrafficPlayer
from kvparity.model.traffic import traffic_to_dict
from kvparity.run.traffic_sweep import TrafficRow, TrafficVerdict, check_traffic, finding_label

FINDING_BUDGET_S = 5.0  # shrinking a release's first in-flight finding of each kind (37 releases)


def traffic_matrix(sources: dict[str, Any], pairs: list[tuple[str, str]], *, examples: int,
                   shrink_budget_s: float | None, say: Callable[[str], None] = print) -> dict[str, Any]:
    """``sources``: release -> ``SGLangSource``; ``pairs``: (reference, checked) releases, played in
    order, each release's worker closed after its last pair."""
    last_use = {release: i for i, pair in enumerate(pairs) for release in pair}
    players: dict[str, CachingPlayer] = {}
    pair_docs: list[dict[str, Any]] = []
    release_docs: dict[str, dict[str, Any]] = {}
    try:
        for i, (ref, other) in enumerate(pairs):
            for release in (ref, other):
                if release not in players:
                    players[release] = CachingPlayer(RealTrafficPlayer(sources[release]))
            verdict = check_traffic(players[ref], players[other], examples=examples, shrink_budget_s=shrink_budget_s,
                                    finding_budget_s=FINDING_BUDGET_S)
            pair_docs.append(pair_document(ref, other, verdict))
            say(pair_line(pair_docs[-1]))
            for release in (ref, other):
                release_docs.setdefault(release, release_document(release, players[release], verdict))
                if last_use[release] == i:
                    players.pop(release).close()
    finally:
        for player in players.values():
            player.close()
    return {"drive": "scheduler", "examples_per_policy_and_loop": examples, "pairs": pair_docs,
            "releases": [release_docs[r] for r in dict.fromkeys(r for pair in pairs for r in pair)]}


def pair_document(ref: str, other: str, verdict: TrafficVerdict) -> dict[str, Any]:
    rows = []
    for row in verdict.rows:
        first = row.first
        shown, judgement = (None, None) if first is None else first.shown
        rows.append({"policy": row.policy, "loop": row.loop, "scenarios": row.scenarios, "differing": row.differing,
                     "admission": row.admission, "verdict": row.verdict,
                     "first": None if judgement is None else judgement.line(),
                     "cause": None if first is None else first.cause,
                     "scenario": None if shown is None else traffic_to_dict(shown),
                     "python": None if shown is None else shown.to_python()})
    return {"reference": ref, "other": other, "verdict": verdict.verdict, "summary": verdict.summary(),
            "scenarios": verdict.scenarios, "rows": rows, "seconds": round(verdict.seconds, 1)}


def release_document(release: str, player: CachingPlayer, verdict: TrafficVerdict) -> dict[str, Any]:
    """What the in-flight oracle found in ``release`` (overlap loop), and the shell's costs."""
    totals = verdict.inflight(player.name)
    examples: dict[str, dict[str, Any]] = {}
    for key, example in sorted(totals.first.items()):
        finding, scenario = example.shown
        examples[finding_label(key)] = {"line": finding.line(), "finding": finding.to_plain(),
                                        "python": scenario.to_python(), "scenario": traffic_to_dict(scenario)}
    results = list(player.results.values())
    iterations = sum(len(r.decisions) for r in results)
    counts, firsts = verdict.findings().get(player.name, ({}, {}))
    return {"release": release, "inflight": {finding_label(k): n for k, n in sorted(totals.counts.items())},
            "findings": dict(sorted(counts.items())),
            "findings_first": {label: {"line": line, "python": s.to_python()} for label, (s, line) in firsts.items()},
            "inflight_first": examples, "overlap_scenarios": totals.scenarios,
            "overlap_scenarios_with_findings": totals.scenarios_with,
            "costs": {"plays": len(results), "iterations": iterations,
                      "build_s_median": round(statistics.median(r.build_s for r in results), 4) if results else None,
                      "ms_per_iteration": round(1000 * sum(r.loop_s for r in results) / max(iterations, 1), 3),
                      "record_ms_per_iteration": round(1000 * sum(r.record_s for r in results) / max(iterations, 1), 3)}}


def pair_line(doc: dict[str, Any]) -> str:
    return (f"{doc['reference']} -> {doc['other']}: {doc['summary']} ({doc['scenarios']} traffic scenarios, "
            f"{doc['seconds']:.0f} s)")


def markdown(doc: dict[str, Any]) -> str:
    """The scheduler-driven matrix as Markdown: the pairs, then the releases' in-flight findings."""
    lines = [f"Scheduler-driven: {doc['examples_per_policy_and_loop']} traffic scenarios per schedule policy and "
             "event loop, each release through its own scheduler.", "",
             "| reference | release | verdict | rows that differ (policy, loop: differing/played) | first difference |",
             "|---|---|---|---|---|"]
    for pair in doc["pairs"]:
        differ = [r for r in pair["rows"] if r["verdict"] != "parity"]
        rows = "; ".join(f"{r['policy']}, {r['loop']}: {r['differing']}/{r['scenarios']}" for r in differ) or "-"
        first = next((r["first"] for r in differ), None) or "-"
        lines.append(f"| {pair['reference']} | {pair['other']} | {pair['summary']} | {rows} | {first} |")
    lines += ["", "In-flight oracle, overlap loop (findings by kind and class; scenarios with any):", "",
              "| release | scenarios with findings | findings | first of each (shrunk) | build (median s) | ms per iteration |",
              "|---|---|---|---|---|---|"]
    for rel in doc["releases"]:
        found = "; ".join(f"{k}: {n}" for k, n in rel["inflight"].items()) or "none"
        firsts = "<br>".join(f"{k}: {v['line']}" for k, v in rel["inflight_first"].items()) or "-"
        costs = rel["costs"]
        lines.append(f"| {rel['release']} | {rel['overlap_scenarios_with_findings']}/{rel['overlap_scenarios']} | "
                     f"{found} | {firsts} | {costs['build_s_median']} | {costs['ms_per_iteration']} |")
    return "\n".join(lines) + "\n"


__all__ = ["TrafficRow", "markdown", "pair_line", "traffic_matrix"]
