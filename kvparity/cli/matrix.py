"""``kvparity matrix [VERSION ...] [--base V]``: real SGLang releases, each against the one before
it (or every one against ``--base``), on one scenario set, on both backends; per pair the
verdict (exact, renumbered, divergent), the scenarios played, the fields and classes where they
differ and the first counterexample in one line. Exit 0 only when every pair is exact or
renumbered, 1 when one diverges, 2 for a usage or install error."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kvparity.cli.paths import output_path_problem
from kvparity.model.scenario import scenario_to_dict

USAGE_ERROR = 2
DEFAULT_VERSIONS = ("0.5.3", "0.5.3.post1", "0.5.3.post2", "0.5.4")
DEFAULT_PER_TEMPLATE = 10


def add(commands: argparse._SubParsersAction, parser_class: type) -> None:
    text = "compare real SGLang releases pairwise, exactly or up to renumbering"
    sub = commands.add_parser("matrix", help=text, description=text)
    sub.add_argument("versions", nargs="*", metavar="VERSION",
                     help=f"releases, oldest first, or 'all' for every release kvparity drives "
                          f"(default: {' '.join(DEFAULT_VERSIONS)})")
    sub.add_argument("--base", metavar="V", help="compare every release against V instead of the one before it")
    sub.add_argument("--backend", choices=("triton", "torch", "all"), default="all")
    sub.add_argument("--examples", type=int, default=DEFAULT_PER_TEMPLATE, help="scenarios per template (default 10)")
    sub.add_argument("--jobs", type=int, default=None, metavar="N",
                     help="releases played at once, each in its own worker process (default: the usable cores)")
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
    if not 1 <= args.examples <= 10_000:
        return f"--examples must be from 1 to 10000 (got {args.examples})"
    if args.jobs is not None and not 1 <= args.jobs <= 256:
        return f"--jobs must be from 1 to 256 (got {args.jobs})"
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
    problem = _problem(args)
    versions = _versions(args.versions)
    if not problem and len(versions) + (args.base is not None and args.base not in versions) < 2:
        problem = "give at least two releases (or one and --base)"
    if problem:
        print(f"kvparity matrix: {problem}", file=sys.stderr)
        return USAGE_ERROR
    from kvparity.engine.real import RealSGLangError
    from kvparity.engine.real.lane import RealLane
    from kvparity.kernels import runtime  # noqa: F401  (the device and Triton's mode first)
    from kvparity.model import profiles
    from kvparity.run.matrix import run_matrix
    from kvparity.run.sweep import Progress

    profiles.load("ci")
    backends = ("torch", "triton") if args.backend == "all" else (args.backend,)
    releases = versions + ([args.base] if args.base and args.base not in versions else [])
    jobs = args.jobs or len(os.sched_getaffinity(0))
    lanes: dict = {}
    with ThreadPoolExecutor(max_workers=jobs) as pool:  # each lane waits on its own worker process
        try:
            lanes = {v: RealLane([v], backends) for v in releases}
            list(pool.map(lambda lane: lane.start(), lanes.values()))
        except RealSGLangError as exc:
            for lane in lanes.values():
                lane.close()
            print(f"kvparity matrix: {exc}", file=sys.stderr)
            return USAGE_ERROR
        scenarios = _scenarios(args.examples)
        progress = Progress(len(scenarios))
        try:
            results = run_matrix(scenarios, lanes, _pairs(versions, args.base), tick=progress.step, pool=pool)
        finally:
            progress.close()
            for lane in lanes.values():
                lane.close()
    _print(results)
    _write(args, results)
    return 0 if all(r.verdict != "divergent" for r in results) else 1


def _print(results) -> None:
    width = max(len(f"{r.reference} vs {r.other}") for r in results)
    print(f"{'pair':<{width}}  {'scenarios':>9}  {'verdict':<10}  renumbered  divergent")
    for r in results:
        print(f"{r.reference + ' vs ' + r.other:<{width}}  {r.scenarios:>9}  {r.verdict:<10}  {r.renumbered:>10}  {r.divergent:>9}")
        for name, n in sorted(r.findings.items()):
            print(f"  known difference: {name} (in {n} scenarios)")
        for change in _release_changes(r):
            pr = f", {change.pull_request}" if change.pull_request else ""
            print(f"  release change ({change.kind}, {change.release}{pr}): {change.what}")
        if r.fields:
            print(f"  differs first in: {', '.join(f'{k} ({n})' for k, n in r.fields.most_common())}")
            print(f"  classes of the divergent scenarios: {', '.join(k for k, _ in r.classes.most_common(6))}")
            print(f"  first counterexample: {r.counterexample}")


def _release_changes(r) -> list:
    """The recorded changes on this path between the pair's two releases."""
    from kvparity.engine.real.changes import changes_between

    return changes_between(r.reference_release, r.other_release)


def _rows(results) -> list[dict]:
    return [{"reference": r.reference, "other": r.other, "verdict": r.verdict, "scenarios": r.scenarios,
             "renumbered": r.renumbered, "divergent": r.divergent, "fields": dict(r.fields),
             "classes": dict(r.classes), "known_changes": dict(r.findings), "counterexample": r.counterexample,
             "release_changes": [dataclasses.asdict(c) for c in _release_changes(r)],
             "scenario": None if r.scenario is None else scenario_to_dict(r.scenario)} for r in results]


def _write(args: argparse.Namespace, results) -> None:
    if args.json:
        Path(args.json).write_text(json.dumps({"pairs": _rows(results)}, indent=2) + "\n")
    if args.markdown:
        lines = ["| reference | release | scenarios | verdict | renumbered | divergent | known changes | "
                 "release changes on this path | first counterexample |",
                 "|---|---|---|---|---|---|---|---|---|"]
        for r in results:
            known = "; ".join(f"{k} ({n})" for k, n in sorted(r.findings.items())) or "-"
            notes = "; ".join(f"{c.kind}: {c.what}" + (f" ({c.pull_request})" if c.pull_request else "")
                              for c in _release_changes(r)) or "-"
            lines.append(f"| {r.reference} | {r.other} | {r.scenarios} | {r.verdict} | {r.renumbered} | {r.divergent} "
                         f"| {known} | {notes.replace('|', '/')} | {(r.counterexample or '-').replace('|', '/')} |")
        Path(args.markdown).write_text("\n".join(lines) + "\n")
    if args.png:
        _plot(results, args.png)


def _plot(results, path: str) -> None:
    """Releases down, backends across: one cell per pair, coloured by verdict, with its counts."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    colours = {"exact": "#2e7d32", "renumbered": "#f9a825", "divergent": "#c62828"}
    pairs = list(dict.fromkeys((r.reference_release, r.other_release) for r in results))
    backends = list(dict.fromkeys(r.backend for r in results))
    fig, ax = plt.subplots(figsize=(2.2 + 2.0 * len(backends), 0.8 + 0.32 * len(pairs)))
    for r in results:
        y = pairs.index((r.reference_release, r.other_release))
        x = backends.index(r.backend)
        ax.add_patch(plt.Rectangle((x, y), 0.96, 0.9, color=colours[r.verdict]))
        count = r.divergent if r.verdict == "divergent" else r.renumbered
        label = r.verdict if r.verdict == "exact" else f"{r.verdict} in {count}/{r.scenarios}"
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
