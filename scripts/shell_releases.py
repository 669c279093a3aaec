"""SGLang's own scheduler loops on every release kvparity drives (issue 26, measuring): a small fixed
set of traffic scenarios played through ``kvparity.engine.real.scheduler_shell.run_traffic`` in the
normal and the overlap loop, one worker per release; per release a table of what it cost and what
the in-flight oracle found.

    python scripts/shell_releases.py [--releases 0.5.3 0.5.22 ...] [--loops normal overlap] [--json PATH]

Scenarios (``SCENARIOS``):
- ``radix-chunked``: a prompt is cached, then two requests extend it (a radix hit) by more than the
  16-token chunk (chunked prefill), with a third, unrelated one;
- ``retract``: eight requests of 20 tokens, 40 outputs each, 200 KV slots, schedule
  conservativeness 0.3: admission reserves too little and ``retract_decode`` runs;
- ``lpm-burst``: two prompts are cached, then six requests sharing their prefixes to different
  depths arrive together under ``lpm`` and a prefill budget that admits a few at a time;
- ``chunked-few-rows``: six requests over eight iterations, chunked prefill, three rows (where 0.5.3
  hands a chunked request's row to another while its previous chunk is in flight).

Per release: the scheduler generation and its adapter (``shell_adapters``), the KV-path state model
(``versions.GENERATIONS``), the cache (``tree``), the worker's start time,
then per scenario and loop: build_s (building the shell and the world), iterations, mean ms per
iteration, retractions, whether every request finished with all its outputs, and the in-flight
oracle's findings counted by kind (cell / row), class (live / finished / retracted) and harm (wrong
KV / table only, the KV canary's reading), with the first finding of each (iteration of the batch,
request, row, columns or taker). A
release that cannot be driven is reported (which one, and why) and the rest go on.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvparity.engine.errors import RealSGLangError
from kvparity.engine.real.install import resolve  # noqa: E402
from kvparity.engine.real.shell_adapters import adapter_for  # noqa: E402
from kvparity.engine.real.versions import SUPPORTED  # noqa: E402
from kvparity.engine.real.worker import RealWorker, RemoteError  # noqa: E402
from kvparity.engine.release_order import version_key  # noqa: E402
from kvparity.engine.traffic_run import TrafficRun  # noqa: E402
from kvparity.model.traffic import LOOPS, Arrival, ServerConfig, TrafficScenario  # noqa: E402
from kvparity.model.traffic_records import InflightFinding  # noqa: E402

PLUGINS = ("kvparity.engine.real.scheduler_shell",)
KINDS = ("cell", "row")
CLASSES = ("live", "finished", "retracted")


def _tokens(start: int, n: int) -> tuple[int, ...]:
    return tuple(range(start, start + n))


def _radix_chunked() -> TrafficScenario:
    cached = _tokens(1000, 48)
    return TrafficScenario(
        ServerConfig(schedule_policy="fcfs", pool_rows=4, max_running_requests=4, kv_slots=512, max_prefill_tokens=64,
                     chunked_prefill_size=16),
        ((Arrival("a", cached, 1),), (), (),
         (Arrival("b", cached[:40] + _tokens(5000, 40), 4), Arrival("c", cached + _tokens(6000, 8), 4),
          Arrival("d", _tokens(7000, 30), 3))))


def _retract() -> TrafficScenario:
    return TrafficScenario(
        ServerConfig(schedule_policy="fcfs", pool_rows=8, max_running_requests=8, kv_slots=200, max_prefill_tokens=4096,
                     schedule_conservativeness=0.3),
        (tuple(Arrival(f"q{i}", _tokens(2000 + 100 * i, 20), 40) for i in range(8)),))


def _lpm_burst() -> TrafficScenario:
    p, q = _tokens(3000, 32), _tokens(4000, 24)
    burst = (Arrival("u", _tokens(8000, 12), 2), Arrival("p8", p[:8] + _tokens(8100, 10), 2),
             Arrival("q20", q[:20] + _tokens(8200, 6), 2), Arrival("p31", p[:31] + _tokens(8300, 4), 2),
             Arrival("p32", p + _tokens(8400, 2), 2), Arrival("q24", q + _tokens(8500, 9), 2))
    return TrafficScenario(
        ServerConfig(schedule_policy="lpm", pool_rows=8, max_running_requests=8, kv_slots=512, max_prefill_tokens=24),
        ((Arrival("p", p, 1), Arrival("q", q, 1)), (), burst))


def _chunked_few_rows() -> TrafficScenario:
    arrivals: list[list[Arrival]] = [[] for _ in range(8)]
    for i in range(6):
        tokens = _tokens(3000 + 100 * i, 24) + _tokens(7000 + 50 * i, 5 + 7 * i)
        arrivals[2 * i if i < 3 else i + 2].append(Arrival(f"q{i}", tokens, 3 + 2 * i))
    return TrafficScenario(
        ServerConfig(schedule_policy="fcfs", pool_rows=3, max_running_requests=3, kv_slots=1024, max_prefill_tokens=64,
                     chunked_prefill_size=16),
        tuple(tuple(group) for group in arrivals))


SCENARIOS = {"radix-chunked": _radix_chunked, "retract": _retract, "lpm-burst": _lpm_burst,
             "chunked-few-rows": _chunked_few_rows}


def _first_line(finding: InflightFinding) -> str:
    where = f"cols {_span(finding.columns)}" if finding.kind == "cell" else f"taken by {finding.taken_by}"
    return f"it {finding.batch_iteration} {finding.rid} row {finding.row} {where}"


def _span(columns: tuple[int, ...]) -> str:
    return str(columns[0]) if len(columns) == 1 else f"{columns[0]}-{columns[-1]}"


def summarize(scenario: TrafficScenario, result: TrafficRun) -> dict[str, Any]:
    """One run's costs and the oracle's findings, as plain data."""
    records = result.decisions
    expected = {a.rid: a.max_new_tokens for group in scenario.arrivals for a in group}
    got = {rid: len(out) for rid, out in result.outputs.items()}
    counts: Counter[str] = Counter()
    first: dict[str, str] = {}
    for finding in result.inflight:
        key = f"{finding.kind}/{finding.cls}/{finding.harm}"
        counts[key] += 1
        first.setdefault(key, _first_line(finding))
    ms = [rec.ms for rec in records]
    return {
        "build_s": result.build_s, "loop_s": result.loop_s, "iterations": len(records),
        "mean_ms": round(sum(ms) / len(ms), 3) if ms else None,
        "retractions": sum(rec.retracted for rec in records),
        "complete": got == expected, "findings": dict(sorted(counts.items())), "first": dict(sorted(first.items())),
    }


def play_release(release: str, loops: list[str]) -> dict[str, Any]:
    """Every scenario in every loop on one release; an error names the release and the step."""
    out: dict[str, Any] = {"release": release, "runs": []}
    worker = None
    try:
        adapter = adapter_for(SUPPORTED[release]) if release in SUPPORTED else None
        if adapter is not None:
            out.update(adapter=adapter.name, scheduler_generation=adapter.generation)
        t0 = time.monotonic()
        worker = RealWorker(resolve(release), plugins=PLUGINS)
        info = worker.start()
        out["start_s"] = info.get("start_s", round(time.monotonic() - t0, 3))
        out["generation"] = info.get("generation")
        for name, make in SCENARIOS.items():
            scenario = make()
            config, arrivals = scenario.to_plain()
            for loop in loops:
                run: dict[str, Any] = {"scenario": name, "loop": loop}
                try:
                    result = TrafficRun.from_plain(
                        worker.call("run_traffic", config=dict(config, loop=loop), arrivals=arrivals))
                except RemoteError as exc:
                    run["error"] = f"{exc.type}: {exc.remote_message}"
                    run["traceback"] = exc.remote_traceback
                else:
                    out.update(adapter=result.player["adapter"],
                               scheduler_generation=result.player["scheduler_generation"])
                    out.setdefault("tree", result.player["tree"])
                    run.update(summarize(scenario, result))
                out["runs"].append(run)
    except RealSGLangError as exc:  # the worker would not start, died or hung
        out["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        if worker is not None:
            worker.close()
    return out


def table(report: dict[str, Any]) -> str:
    head = (f"== sglang {report['release']}: scheduler generation/adapter {report.get('scheduler_generation', '?')}/"
            f"{report.get('adapter', '?')}, KV state model {report.get('generation', '?')}, tree "
            f"{report.get('tree', '?')}, worker start {report.get('start_s', '?')} s")
    lines = [head]
    if "error" in report:
        lines.append(f"   CANNOT DRIVE sglang {report['release']}: {report['error']}")
    cols = "   {:<17} {:<8} {:>7} {:>5} {:>8} {:>7} {:>8}  {}"
    if report["runs"]:
        lines.append(cols.format("scenario", "loop", "build_s", "iter", "ms/iter", "retract", "complete",
                                 "in-flight findings (kind/class/harm: count; first)"))
    for run in report["runs"]:
        if "error" in run:
            lines.append(f"   {run['scenario']:<17} {run['loop']:<8} FAILED on sglang {report['release']}: {run['error']}")
            continue
        found = "; ".join(f"{k}: {n} (first: {run['first'][k]})" for k, n in run["findings"].items()) or "-"
        lines.append(cols.format(run["scenario"], run["loop"], f"{run['build_s']:.3f}", run["iterations"],
                                 f"{run['mean_ms']:.2f}", run["retractions"], "yes" if run["complete"] else "NO", found))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--releases", nargs="+", default=sorted(SUPPORTED, key=version_key),
                        help="releases to play (default: every release kvparity drives)")
    parser.add_argument("--loops", nargs="+", choices=LOOPS, default=list(LOOPS))
    parser.add_argument("--json", metavar="PATH", help="also write the reports as JSON")
    args = parser.parse_args(argv)
    reports = []
    for release in args.releases:
        report = play_release(release, args.loops)
        reports.append(report)
        print(table(report), flush=True)
    failed = [r["release"] for r in reports if "error" in r or any("error" in run for run in r["runs"])]
    print(f"\n{len(reports) - len(failed)} of {len(reports)} releases driven in {', '.join(args.loops)}"
          + (f"; not driven: {', '.join(failed)}" if failed else ""))
    if args.json:
        Path(args.json).write_text(json.dumps(reports, indent=1) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
