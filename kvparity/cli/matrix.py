"""``kvparity matrix [VERSION ...] [--base V] [--shard I/N]``: real SGLang releases, each against
the one before it (or every one against ``--base``), on one scenario set, on both backends; per
pair the verdict (exact, renumbered, divergent), the scenarios played, the fields and classes where
they differ and the first counterexample in one line. ``--shard I/N`` plays the I-th of N shares of
the pairs (``kvparity.run.matrix_shards``); ``kvparity matrix merge SHARD.json ...`` joins the
shares' JSON into the table, Markdown and picture of the whole matrix. Exit 0 only when every pair
is exact or renumbered, 1 when one diverges, 2 for a usage or install error.

``--drive scheduler``: the matrix of decisions instead (``kvparity.run.traffic_matrix``): traffic
scenarios through each release's own scheduler, both event loops, every pair judged per schedule
policy and loop, and per release the in-flight oracle's findings in the overlap loop and the
shell's costs. Exit 0 when no pair's decisions differ, 1 when one does."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kvparity.cli.paths import output_path_problem
from kvparity.model.scenario import scenario_to_dict
from kvparity.run import matrix_shards as shards

USAGE_ERROR = 2
DEFAULT_VERSIONS = ("0.5.3", "0.5.3.post1", "0.5.3.post2", "0.5.4")
DEFAULT_PER_TEMPLATE = 10
DEFAULT_TRAFFIC = 10  # traffic scenarios per policy and loop, per pair, with --drive scheduler
PROFILE = "ci"
MERGE = "merge"
RUN_ONLY = ("base", "backend", "examples", "jobs", "shard")  # options of a run, refused by merge


def add(commands: argparse._SubParsersAction, parser_class: type) -> None:
    text = "compare real SGLang releases pairwise, exactly or up to renumbering"
    usage = ("%(prog)s [VERSION ...|all] [--base V] [--backend {triton,torch,all}] [--examples N] [--jobs N]\n"
             "       [--shard I/N] [--json PATH] [--markdown PATH] [--png PATH]\n"
             "       %(prog)s merge SHARD.json ... [--json PATH] [--markdown PATH] [--png PATH]")
    sub = commands.add_parser("matrix", help=text, description=text, usage=usage)
    sub.add_argument("versions", nargs="*", metavar="VERSION",
                     help=f"releases, oldest first, or 'all' for every release kvparity drives "
                          f"(default: {' '.join(DEFAULT_VERSIONS)}); or 'merge SHARD.json ...': join the "
                          f"JSON of the shards of one run into the whole matrix")
    sub.add_argument("--base", metavar="V", help="compare every release against V instead of the one before it")
    sub.add_argument("--backend", choices=("triton", "torch", "all"), default=None, help="(default: all)")
    sub.add_argument("--examples", type=int, default=None, help=f"scenarios per template (default {DEFAULT_PER_TEMPLATE})")
    sub.add_argument("--jobs", type=int, default=None, metavar="N",
                     help="releases played at once, each in its own worker process (default: the usable cores)")
    sub.add_argument("--shard", metavar="I/N",
                     help="play only the I-th of N shares of the pairs (1-based), starting only the releases "
                          "they need; 'kvparity matrix merge' joins the shards' --json files")
    sub.add_argument("--drive", choices=("harness", "scheduler"), default="harness",
                     help="harness (the default): step scenarios, the memory path compared under identical decisions; "
                          "scheduler: traffic scenarios through each release's own scheduler, both event loops, the "
                          "decisions and the in-flight oracle")
    sub.add_argument("--traffic-examples", type=int, default=None, metavar="N",
                     help=f"with --drive scheduler: traffic scenarios per policy and loop (default {DEFAULT_TRAFFIC})")
    sub.add_argument("--json", metavar="PATH", help="write the matrix as JSON")
    sub.add_argument("--markdown", metavar="PATH", help="write the matrix as a Markdown table")
    sub.add_argument("--png", metavar="PATH", help="draw releases by verdict (needs matplotlib)")
    sub.set_defaults(func=run)


def _versions(given: list[str]) -> list[str]:
    """The releases named, oldest first as given; 'all': every release kvparity drives."""
    if given == ["all"]:
        from kvparity.engine.real.versions import SUPPORTED, version_key

        return sorted(SUPPORTED, key=version_key)
    return list(given or DEFAULT_VERSIONS)


def _pairs(versions: list[str], base: str | None) -> list[tuple[str, str]]:
    if base is not None:
        return [(base, v) for v in versions if v != base]
    return list(zip(versions, versions[1:]))


def _problem(args: argparse.Namespace) -> str | None:
    if args.examples is not None and not 1 <= args.examples <= 10_000:
        return f"--examples must be from 1 to 10000 (got {args.examples})"
    if args.jobs is not None and not 1 <= args.jobs <= 256:
        return f"--jobs must be from 1 to 256 (got {args.jobs})"
    if args.shard is not None:
        try:
            shards.parse_shard(args.shard)
        except ValueError as exc:
            return str(exc)
    return _output_problem(args)


def _output_problem(args: argparse.Namespace) -> str | None:
    for option in ("json", "markdown", "png"):
        problem = output_path_problem(f"--{option}", getattr(args, option))
        if problem:
            return problem
    if args.png:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            return "--png needs matplotlib (pip install matplotlib)"
    return None


def _scenarios(per_template: int) -> list:
    from hypothesis import HealthCheck, Phase, given, settings

    from kvparity.model.strategies import TEMPLATES, scenarios

    drawn: list = []
    for template in TEMPLATES:
        @settings(max_examples=per_template, derandomize=True, database=None, deadline=None,
                  phases=(Phase.generate,), suppress_health_check=list(HealthCheck))
        @given(scenarios(templates=(template,)))
        def collect(scenario) -> None:
            drawn.append(scenario)

        collect()
    return drawn


def run(args: argparse.Namespace) -> int:
    if args.versions[:1] == [MERGE]:
        return merge(args)
    problem = _problem(args)
    versions = _versions(args.versions)
    if not problem and len(versions) + (args.base is not None and args.base not in versions) < 2:
        problem = "give at least two releases (or one and --base)"
    if not problem and args.drive == "scheduler":
        problem = _scheduler_problem(args)
    if problem:
        print(f"kvparity matrix: {problem}", file=sys.stderr)
        return USAGE_ERROR
    if args.drive == "scheduler":
        return _run_scheduler(args, versions)
    from kvparity.engine.real import RealSGLangError
    from kvparity.engine.real.lane import RealLane
    from kvparity.engine.real.versions import entry
    from kvparity.engine.real.worker import WorkerStartError
    from kvparity.kernels import runtime  # noqa: F401  (the device and Triton's mode first)
    from kvparity.model import profiles
    from kvparity.report.progress import Progress
    from kvparity.run.matrix import run_matrix

    profiles.load(PROFILE)
    backends = ("torch", "triton") if args.backend in (None, "all") else (args.backend,)
    per_template = args.examples or DEFAULT_PER_TEMPLATE
    releases = versions + ([args.base] if args.base and args.base not in versions else [])
    pairs = _pairs(versions, args.base)
    shard = shards.parse_shard(args.shard) if args.shard else shards.WHOLE
    mine = shards.share(pairs, shard)
    try:  # every release of the run, not only this shard's: a bad one is refused by every shard
        for release in releases:
            entry(release)
    except RealSGLangError as exc:
        print(f"kvparity matrix: {exc}", file=sys.stderr)
        return USAGE_ERROR
    scenarios = _scenarios(per_template)
    plan = shards.plan(releases, pairs, backends, shards.scenario_set(
        PROFILE, per_template, [scenario_to_dict(s) for s in scenarios]))
    results: list = []
    if not mine:
        print(f"kvparity matrix: shard {shard} has no pairs to play (the run has {len(pairs)} in {shard.count} "
              f"shards)", file=sys.stderr)
    else:
        playing = shards.releases_of(mine, releases)  # only the releases this shard's pairs need
        jobs = args.jobs or len(os.sched_getaffinity(0))
        lanes: dict = {}
        with ThreadPoolExecutor(max_workers=jobs) as pool:  # each lane waits on its own worker process
            try:  # each lane's worker starts when its release's turn comes (run_matrix)
                lanes = {v: RealLane([v], backends, tree_core_variants=False) for v in playing}
            except RealSGLangError as exc:
                print(f"kvparity matrix: {exc}", file=sys.stderr)
                return USAGE_ERROR
            progress = Progress(len(scenarios) * len(lanes), unit="release scenarios")
            try:
                results = run_matrix(scenarios, lanes, mine, tick=progress.step, pool=pool)
            except WorkerStartError as exc:  # a release that installs but does not import here
                print(f"kvparity matrix: {exc}", file=sys.stderr)
                return USAGE_ERROR
            finally:
                progress.close()
                for lane in lanes.values():
                    lane.close()
    return _report(args, shards.document(_rows(results), plan, shard))


def _scheduler_problem(args: argparse.Namespace) -> str | None:
    for option in ("shard", "backend", "examples", "png"):
        if getattr(args, option) is not None:
            return f"--{option} is an option of the harness-driven matrix, not of --drive scheduler"
    if args.traffic_examples is not None and not 1 <= args.traffic_examples <= 10_000:
        return f"--traffic-examples must be from 1 to 10000 (got {args.traffic_examples})"
    return None


def _run_scheduler(args: argparse.Namespace, versions: list[str]) -> int:
    from kvparity.engine.real import RealSGLangError
    from kvparity.engine.real.install import resolve
    from kvparity.engine.real.worker import WorkerStartError
    from kvparity.run.minimize import DEFAULT_BUDGET_S
    from kvparity.run.traffic_matrix import markdown, traffic_matrix

    releases = versions + ([args.base] if args.base and args.base not in versions else [])
    try:
        sources = {release: resolve(release) for release in releases}
        doc = traffic_matrix(sources, _pairs(versions, args.base), examples=args.traffic_examples or DEFAULT_TRAFFIC,
                             shrink_budget_s=DEFAULT_BUDGET_S)
    except (RealSGLangError, WorkerStartError) as exc:
        print(f"kvparity matrix: {exc}", file=sys.stderr)
        return USAGE_ERROR
    text = markdown(doc)
    print("\n" + text)
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    if args.markdown:
        Path(args.markdown).write_text(text)
    return 0 if all(pair["verdict"] == "parity" for pair in doc["pairs"]) else 1


def merge(args: argparse.Namespace) -> int:
    """``kvparity matrix merge SHARD.json ...``: the shards' documents joined, then reported as an
    unsharded run reports."""
    given = [f"--{option}" for option in RUN_ONLY if getattr(args, option) is not None]
    problem = f"{given[0]} is an option of a run, not of merge" if given else _output_problem(args)
    try:
        if problem:
            raise shards.MergeError(problem)
        whole = shards.merge([(path, shards.load(path)) for path in args.versions[1:]])
    except shards.MergeError as exc:
        print(f"kvparity matrix merge: {exc}", file=sys.stderr)
        return USAGE_ERROR
    return _report(args, whole)


def _report(args: argparse.Namespace, doc: dict) -> int:
    """Print the table of ``doc``'s rows, write the files asked for; the exit status."""
    rows = doc["pairs"]
    _print(rows)
    _write(args, doc)
    return 0 if all(row["verdict"] != "divergent" for row in rows) else 1


def _print(rows: list[dict]) -> None:
    width = max((len(f"{r['reference']} vs {r['other']}") for r in rows), default=len("pair"))
    print(f"{'pair':<{width}}  {'scenarios':>9}  {'verdict':<10}  renumbered  divergent")
    for r in rows:
        print(f"{r['reference'] + ' vs ' + r['other']:<{width}}  {r['scenarios']:>9}  {r['verdict']:<10}  "
              f"{r['renumbered']:>10}  {r['divergent']:>9}")
        for name, n in sorted(r["known_changes"].items()):
            print(f"  known difference: {name} (in {n} scenarios)")
        for change in r["release_changes"]:
            pr = f", {change['pull_request']}" if change["pull_request"] else ""
            print(f"  release change ({change['kind']}, {change['release']}{pr}): {change['what']}")
        if r["fields"]:
            fields, classes = Counter(r["fields"]), Counter(r["classes"])
            print(f"  differs first in: {', '.join(f'{k} ({n})' for k, n in fields.most_common())}")
            print(f"  classes of the divergent scenarios: {', '.join(k for k, _ in classes.most_common(6))}")
            print(f"  first counterexample: {r['counterexample']}")


def _release_changes(r) -> list:
    """The recorded changes on this path between the pair's two releases."""
    from kvparity.engine.real.changes import changes_between

    return changes_between(r.reference_release, r.other_release)


def _rows(results) -> list[dict]:
    """One row per ``PairResult``: plain data, what ``--json`` writes and every report is drawn from."""
    return [{"reference": r.reference, "other": r.other, "reference_release": r.reference_release,
             "other_release": r.other_release, "backend": r.backend, "verdict": r.verdict, "scenarios": r.scenarios,
             "renumbered": r.renumbered, "divergent": r.divergent, "fields": dict(r.fields),
             "classes": dict(r.classes), "known_changes": dict(r.findings), "counterexample": r.counterexample,
             "release_changes": [dataclasses.asdict(c) for c in _release_changes(r)],
             "scenario": None if r.scenario is None else scenario_to_dict(r.scenario)} for r in results]


def _markdown(rows: list[dict]) -> str:
    lines = ["| reference | release | scenarios | verdict | renumbered | divergent | known changes | "
             "release changes on this path | first counterexample |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        known = "; ".join(f"{k} ({n})" for k, n in sorted(r["known_changes"].items())) or "-"
        notes = "; ".join(f"{c['kind']}: {c['what']}" + (f" ({c['pull_request']})" if c["pull_request"] else "")
                          for c in r["release_changes"]) or "-"
        lines.append(f"| {r['reference']} | {r['other']} | {r['scenarios']} | {r['verdict']} | {r['renumbered']} "
                     f"| {r['divergent']} | {known} | {notes.replace('|', '/')} "
                     f"| {(r['counterexample'] or '-').replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def _write(args: argparse.Namespace, doc: dict) -> None:
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    if args.markdown:
        Path(args.markdown).write_text(_markdown(doc["pairs"]))
    if args.png:
        _plot(doc["pairs"], args.png)


def _plot(rows: list[dict], path: str) -> None:
    """Releases down, backends across: one cell per pair, coloured by verdict, with its counts."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    colours = {"exact": "#2e7d32", "renumbered": "#f9a825", "divergent": "#c62828"}
    pairs = list(dict.fromkeys((r["reference_release"], r["other_release"]) for r in rows))
    backends = list(dict.fromkeys(r["backend"] for r in rows))
    fig, ax = plt.subplots(figsize=(2.2 + 2.0 * len(backends), 0.8 + 0.32 * len(pairs)))
    for r in rows:
        y = pairs.index((r["reference_release"], r["other_release"]))
        x = backends.index(r["backend"])
        ax.add_patch(plt.Rectangle((x, y), 0.96, 0.9, color=colours[r["verdict"]]))
        count = r["divergent"] if r["verdict"] == "divergent" else r["renumbered"]
        label = r["verdict"] if r["verdict"] == "exact" else f"{r['verdict']} in {count}/{r['scenarios']}"
        ax.text(x + 0.48, y + 0.45, label, ha="center", va="center", fontsize=7, color="white")
    ax.set_xlim(0, len(backends))
    ax.set_ylim(len(pairs), 0)
    ax.set_xticks([i + 0.48 for i in range(len(backends))])
    ax.set_xticklabels(backends, fontsize=8)
    ax.set_yticks([i + 0.45 for i in range(len(pairs))])
    ax.set_yticklabels([f"{a} -> {b}" for a, b in pairs], fontsize=7)
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    ax.legend(handles=[Patch(color=c, label=v) for v, c in colours.items()], loc="upper center",
              bbox_to_anchor=(0.5, 1.0 + 0.9 / (0.8 + 0.32 * len(pairs))), ncol=3, fontsize=7, frameon=False)
    ax.set_title("kvparity matrix: SGLang releases by verdict", fontsize=9, pad=18)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
