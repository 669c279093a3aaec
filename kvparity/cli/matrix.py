"""``kvparity matrix [VERSION ...] [--base V] [--drive harness|scheduler] [--shard I/N]``: real SGLang
releases, each against the one before it (or every one against ``--base``), either drive, on one
scenario set: each pair is a sweep that counts every differing scenario (``kvparity.run.matrix``).
Per pair the label (exact, renumbered, divergent), the verdict, what differs first, its cause where
shown, and the changes the release wheels show between the two releases; per release what its own
runs found. ``--shard I/N`` plays the I-th of N shares of the pairs (``kvparity.run.matrix_shards``);
``kvparity matrix merge SHARD.json ...`` joins the shares' JSON into the table, Markdown and picture
of the whole matrix. Exit 0 only when every pair is exact or renumbered, 1 when one diverges, 2 for
a usage or install error."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kvparity.cli.check_plan import caches_option, per_task, power_problem, registered_caches
from kvparity.cli.paths import output_path_problem
from kvparity.judge.power import CONFIDENCE, percent, rules_out
from kvparity.run import matrix_shards as shards

USAGE_ERROR = 2
DEFAULT_VERSIONS = ("0.5.3", "0.5.3.post1", "0.5.3.post2", "0.5.4")
DEFAULT_PER_TEMPLATE = 10  # harness-driven: scenarios per template
DEFAULT_TRAFFIC = 10  # scheduler-driven: traffic scenarios per policy and loop
PROFILE = "ci"
MERGE = "merge"
RUN_ONLY = ("base", "backend", "examples", "traffic_examples", "power", "jobs", "shard", "seed", "caches")  # refused by merge


def add(commands: argparse._SubParsersAction, parser_class: type) -> None:
    text = "compare real SGLang releases pairwise, exactly or up to renumbering"
    usage = ("%(prog)s [VERSION ...|all] [--base V] [--backend {triton,torch,all}] [--examples N | --power P%%] [--jobs N]\n"
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
                     help="accepted for older command lines; pairs play one after another (each release's worker "
                          "serves two pairs)")
    sub.add_argument("--seed", type=int, default=None, help="random seed (default: derandomized, same every run)")
    sub.add_argument("--shard", metavar="I/N",
                     help="play only the I-th of N shares of the pairs (1-based), starting only the releases "
                          "they need; 'kvparity matrix merge' joins the shards' --json files")
    sub.add_argument("--drive", choices=("harness", "scheduler"), default="harness",
                     help="harness (the default): step scenarios, the memory path compared under identical decisions; "
                          "scheduler: traffic scenarios through each release's own scheduler, both event loops, the "
                          "decisions, the memory under them, the canary and the in-flight oracle")
    sub.add_argument("--traffic-examples", type=int, default=None, metavar="N",
                     help=f"with --drive scheduler: traffic scenarios per policy and loop (default {DEFAULT_TRAFFIC})")
    sub.add_argument("--caches", type=caches_option, default=None, metavar="C[,C...]",
                     help="with --drive scheduler: the models the tasks serve, of full, swa, mamba and hicache (default: "
                          "full attention alone; a hybrid model's or host tier's tasks are played where both releases "
                          "serve it)")
    sub.add_argument("--power", metavar="P%",
                     help="scenarios per task (template, or schedule policy and event loop) enough to rule out, with "
                          "95%% probability, a difference reached by more than P%% of them (2%%: 149); instead of "
                          "--examples and --traffic-examples")
    sub.add_argument("--json", metavar="PATH", help="write the matrix as JSON")
    sub.add_argument("--markdown", metavar="PATH", help="write the matrix as a Markdown table")
    sub.add_argument("--png", metavar="PATH", help="draw releases by verdict (needs matplotlib)")
    sub.set_defaults(func=run)


def _versions(given: list[str]) -> list[str]:
    """The releases named, oldest first as given; 'all': every release kvparity drives."""
    if given == ["all"]:
        from kvparity.engine.real.door import SUPPORTED
        from kvparity.engine.release_order import version_key

        return sorted(SUPPORTED, key=version_key)
    return list(given or DEFAULT_VERSIONS)


def _pairs(versions: list[str], base: str | None) -> list[tuple[str, str]]:
    if base is not None:
        return [(base, v) for v in versions if v != base]
    return list(zip(versions, versions[1:]))


def _problem(args: argparse.Namespace) -> str | None:
    if args.examples is not None and not 1 <= args.examples <= 10_000:
        return f"--examples must be from 1 to 10000 (got {args.examples})"
    if args.traffic_examples is not None and not 1 <= args.traffic_examples <= 10_000:
        return f"--traffic-examples must be from 1 to 10000 (got {args.traffic_examples})"
    for option, attr, applies in (("--examples", "examples", "harness"), ("--backend", "backend", "harness"),
                                  ("--traffic-examples", "traffic_examples", "scheduler"),
                                  ("--caches", "caches", "scheduler")):
        if getattr(args, attr) is not None and args.drive != applies:
            return f"{option} is an option of the {applies}-driven matrix, not of --drive {args.drive}"
    problem = power_problem(args)
    if problem:
        return problem
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


def run(args: argparse.Namespace) -> int:
    if args.versions[:1] == [MERGE]:
        return merge(args)
    problem = _problem(args)
    versions = _versions(args.versions)
    if not problem and len(versions) + (args.base is not None and args.base not in versions) < 2:
        problem = "give at least two releases (or one and --base)"
    if problem:
        print(f"kvparity matrix: {problem}", file=sys.stderr)
        return USAGE_ERROR
    from kvparity.engine.errors import RealSGLangError, WorkerStartError
    from kvparity.engine.real.door import resolve
    from kvparity.kernels import runtime  # noqa: F401  (the device and Triton's mode first)
    from kvparity.model import profiles
    from kvparity.model.strategies import TEMPLATES
    from kvparity.run.harness_drive import per_template
    from kvparity.run.matrix import run_matrix
    from kvparity.run.minimize import DEFAULT_BUDGET_S

    profiles.load(PROFILE)
    backends = ("torch", "triton") if args.backend in (None, "all") else (args.backend,)
    power = per_task(args)
    if args.drive == "harness":
        examples = (power or args.examples or DEFAULT_PER_TEMPLATE) * len(TEMPLATES)
        assert per_template(examples) == (power or args.examples or DEFAULT_PER_TEMPLATE)
    else:
        examples = power or args.traffic_examples or DEFAULT_TRAFFIC
    releases = versions + ([args.base] if args.base and args.base not in versions else [])
    pairs = _pairs(versions, args.base)
    shard = shards.parse_shard(args.shard) if args.shard else shards.WHOLE
    mine = shards.share(pairs, shard)
    try:  # every release of the run, not only this shard's: a bad one is refused by every shard
        sources = {release: resolve(release) for release in releases}
    except RealSGLangError as exc:
        print(f"kvparity matrix: {exc}", file=sys.stderr)
        return USAGE_ERROR
    try:
        caches = registered_caches(args.caches) or ("full",)
    except ValueError as exc:
        print(f"kvparity matrix: {exc}", file=sys.stderr)
        return USAGE_ERROR
    plan = shards.plan(args.drive, releases, pairs, backends if args.drive == "harness" else (), examples, args.seed,
                       caches)
    doc: dict = {"pairs": [], "releases": []}
    if not mine:
        print(f"kvparity matrix: shard {shard} has no pairs to play (the run has {len(pairs)} in {shard.count} "
              f"shards)", file=sys.stderr)
    else:
        try:
            doc = run_matrix(args.drive, sources, mine, examples=examples, seed=args.seed, backends=backends,
                             shrink_budget_s=DEFAULT_BUDGET_S, caches=caches)
        except (RealSGLangError, WorkerStartError) as exc:  # a release that installs but does not import here
            print(f"kvparity matrix: {exc}", file=sys.stderr)
            return USAGE_ERROR
    return _report(args, shards.document(doc["pairs"], doc["releases"], plan, shard))


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
    """Print the table of ``doc``'s pairs, write the files asked for; the exit status."""
    print("\n" + markdown(doc))
    _write(args, doc)
    defective = any(rel.get("defects") for rel in doc["releases"])
    return 0 if all(row["label"] != "divergent" for row in doc["pairs"]) and not defective else 1


def power_note(doc: dict) -> list[str]:
    """What the matrix's parity rules out, from the task at parity with the fewest scenarios."""
    played = [r["scenarios"] for pair in doc["pairs"] for r in pair["rows"] if not r["differing"]]
    if not played:
        return []
    return [f"A task at parity would have shown, with {CONFIDENCE:.0%} probability, a difference reached by more "
            f"than {percent(rules_out(min(played)))} of its drawn scenarios (the fewest a task played: {min(played)})."]


def markdown(doc: dict) -> str:
    """The matrix as Markdown: the pairs (label, verdict, what differs first and why, the changes
    between the releases), then what each release's own runs found and what playing it cost."""
    drive = doc["plan"]["drive"]
    # The plan holds the drive's own count: the harness drive's in all (shared out over the templates).
    unit = "scenarios, shared out over the templates" if drive == "harness" else \
        "traffic scenarios per schedule policy and event loop"
    lines = [f"{drive.capitalize()}-driven matrix: {doc['plan']['examples']} {unit} (seed "
             f"{doc['plan']['seed'] if doc['plan']['seed'] is not None else 'derandomized'}).", *power_note(doc), "",
             "| reference | release | label | verdict | differing (task: n/played) | first difference | why | "
             "known differences met | release changes on this path |", "|---|---|---|---|---|---|---|---|---|"]
    for row in doc["pairs"]:
        differ = "; ".join(f"{r['task']}: {r['differing']}/{r['scenarios']}" for r in row["rows"] if r["differing"]) or "-"
        first = row["first_difference"] or {}
        shown = (first.get("shrunk") or first).get("line") or "-"
        changes = "; ".join(f"{c['kind']}: {c['what']}" + (f" ({c['pull_request']})" if c["pull_request"] else "")
                            for c in row["release_changes"]) or "-"
        players = (row["reference"], *row["checked"])
        known = "; ".join(f"{label} ({n['scenarios']})" for label, n in row["findings"].items()
                          if not label.startswith(players)) or "-"  # a player's own: in the table of releases
        lines.append(f"| {row['reference_release']} | {row['other_release']} | {row['label']} | {_cell(row['summary'])} | "
                     f"{_cell(differ)} | {_cell(shown)} | {_cell(first.get('cause') or '-')} | {_cell(known)} | "
                     f"{_cell(changes)} |")
    lines += ["", "What each release's own runs found (scenarios reaching each; a divergence only where the "
              "reference has none of it), and what playing it cost:", "",
              "| release | scenarios | findings | own defects | first of each | costs |", "|---|---|---|---|---|---|"]
    for rel in doc["releases"]:
        found = "; ".join(f"{k}: {n}" for k, n in rel["findings"].items()) or "none"
        defects = "; ".join(f"{k}: {v['scenarios']}" + (f" (known: {v['known']})" if v["known"] else "")
                            for k, v in rel.get("defects", {}).items()) or "none"
        firsts = "<br>".join(f"{k}: {v['line']}" for k, v in rel["findings_first"].items()) or "-"
        costs = ", ".join(f"{k} {v}" for k, v in rel["costs"].items()) or "-"
        lines.append(f"| {rel['release']} | {rel['scenarios']} | {_cell(found)} | {_cell(defects)} | {_cell(firsts)} | "
                     f"{_cell(costs)} |")
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return str(text).replace("|", "/").replace("\n", " ")


def _write(args: argparse.Namespace, doc: dict) -> None:
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    if args.markdown:
        Path(args.markdown).write_text(markdown(doc))
    if args.png:
        _plot(doc["pairs"], args.png)


def _plot(rows: list[dict], path: str) -> None:
    """Release pairs down, one cell each, coloured by label, with the differing count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    colours = {"exact": "#2e7d32", "renumbered": "#f9a825", "divergent": "#c62828"}
    fig, ax = plt.subplots(figsize=(4.2, 0.8 + 0.32 * len(rows)))
    for y, r in enumerate(rows):
        ax.add_patch(plt.Rectangle((0, y), 0.96, 0.9, color=colours[r["label"]]))
        text = r["label"] if r["label"] == "exact" else f"{r['label']} in {r['differing'] or '-'}/{r['scenarios']}"
        ax.text(0.48, y + 0.45, text, ha="center", va="center", fontsize=7, color="white")
    ax.set_xlim(0, 1)
    ax.set_ylim(len(rows), 0)
    ax.set_xticks([])
    ax.set_yticks([i + 0.45 for i in range(len(rows))])
    ax.set_yticklabels([f"{r['reference_release']} -> {r['other_release']}" for r in rows], fontsize=7)
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    ax.legend(handles=[Patch(color=c, label=v) for v, c in colours.items()], loc="upper center",
              bbox_to_anchor=(0.5, 1.0 + 0.9 / (0.8 + 0.32 * len(rows))), ncol=3, fontsize=7, frameon=False)
    ax.set_title("kvparity matrix: SGLang releases by label", fontsize=9, pad=18)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
