"""``kvparity explain``: which source change of B makes it differ from A on a scenario.

    kvparity explain --sglang B --against A --replay FILE [--backend B] [--json OUT]
    kvparity explain --matrix MATRIX.json [--json OUT] [--markdown OUT]

The first takes two SGLang folders or releases and a replayable scenario (any drive: a traffic
scenario replays scheduler-driven, a step scenario harness-driven) on which they differ, and
delta-debugs hybrids of A with B's changes to the smallest set that carries the difference
(``kvparity.run.explain``). The second explains every differing pair of a ``kvparity matrix --json``
(scheduler- or harness-driven) from the first difference it saved.

Exit status: 0 a culprit found (for ``--matrix``: for every pair), 1 none found (the report says
why), 2 usage (an unreadable scenario, A and B agreeing on it, an unknown release).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvparity.cli.paths import output_path_problem

USAGE_ERROR = 2


def add(commands: argparse._SubParsersAction, parser_class: type) -> None:
    sub = commands.add_parser("explain", help="the source change of B that makes it differ from A on a scenario")
    sub.add_argument("--sglang", metavar="B", help="the SGLang (release or folder) that differs")
    sub.add_argument("--against", metavar="A", help="the reference SGLang (release or folder)")
    sub.add_argument("--replay", metavar="FILE", help="the scenario they differ on (as check --repro or --json saves it)")
    sub.add_argument("--backend", choices=("torch", "triton"), default="torch",
                     help="harness-driven scenarios: the backend the worlds play on (default torch)")
    sub.add_argument("--tree-class", choices=("unified", "radix"), default=None)
    sub.add_argument("--matrix", metavar="FILE", help="explain every differing pair of a kvparity matrix --json")
    sub.add_argument("--json", metavar="PATH", help="write the explanation(s) as JSON")
    sub.add_argument("--fresh", action="store_true",
                     help="play every hybrid again (by default a hybrid an earlier run of the same search "
                          "played, on the same scenario with the same kvparity, is read back: a stopped run resumes)")
    sub.add_argument("--markdown", metavar="PATH", help="with --matrix: write the explanations as Markdown")
    sub.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    problem = _usage_problem(args)
    if problem:
        print(f"kvparity explain: {problem}", file=sys.stderr)
        return USAGE_ERROR
    if args.matrix is not None:
        return _explain_matrix(args)
    from kvparity.cli.check import scenario_and_drive

    try:
        scenario, drive = scenario_and_drive(json.loads(Path(args.replay).read_text()))
    except (OSError, ValueError, TypeError, KeyError) as exc:
        print(f"kvparity explain: --replay {args.replay}: no scenario can be read from it ({exc!r})", file=sys.stderr)
        return USAGE_ERROR
    found = _explain_one(args.against, args.sglang, scenario, drive, args.backend, args.tree_class, args.fresh)
    if isinstance(found, str):
        print(f"kvparity explain: {found}", file=sys.stderr)
        return USAGE_ERROR
    print("\n".join(found.lines()))
    if args.json:
        Path(args.json).write_text(json.dumps(found.to_dict(), indent=1) + "\n")
    from kvparity.run.explain import CULPRIT

    return 0 if found.status == CULPRIT else 1


def _usage_problem(args: argparse.Namespace) -> str | None:
    if args.matrix is not None:
        if args.sglang or args.against or args.replay:
            return "--matrix explains the pairs of a matrix: give it alone, not with --sglang, --against or --replay"
    elif not (args.sglang and args.against and args.replay):
        return "give --sglang B --against A --replay FILE (or --matrix FILE)"
    elif args.markdown:
        return "--markdown is for --matrix"
    return output_path_problem("--json", args.json) or output_path_problem("--markdown", args.markdown)


def _explain_one(a_spec: str, b_spec: str, scenario: Any, drive: str, backend: str, tree_class: str | None,
                 fresh: bool = False) -> Any:
    """The explanation, or why it cannot be sought (a sentence)."""
    from kvparity.engine.errors import RealSGLangError
    from kvparity.engine.real.door import resolve
    from kvparity.run.explain import NO_DIFFERENCE, explain
    from kvparity.run.hybrid_outcomes import HybridOutcomes

    try:
        a, b = resolve(a_spec), resolve(b_spec)
    except RealSGLangError as exc:
        return str(exc)
    replayer = (_scheduler_replaying(a, scenario) if drive == "scheduler"
                else _harness_replaying(a, scenario, backend, tree_class))
    replayer.b_entry = b.entry.version
    outcomes = HybridOutcomes(None) if fresh else HybridOutcomes.for_search(
        str(a.path), str(b.path), drive, backend, str(tree_class), repr(scenario))
    try:
        found = explain(a.path, b.path, replayer, say=lambda line: print(line, file=sys.stderr, flush=True),
                        outcomes=outcomes)
    except RealSGLangError as exc:
        return f"{b_spec} against {a_spec} cannot be replayed: {exc}"
    finally:
        replayer.close()
    if found.status == NO_DIFFERENCE:
        return f"{b_spec} and {a_spec} agree on this scenario: nothing to explain"
    found.reference, found.checked = a_spec, b_spec  # as the user named them: a release's cache folder is this machine's
    return found


class _Replaying:
    """One scenario replayed by a drive of A against a folder (B, or a hybrid): the drive's player
    plays it and its checker judges it (``Checker.identical``, ``Checker.broken``). A hybrid is
    driven by A's adapter (its version file is A's), and again by B's when that one cannot drive it
    (a hybrid holding B's ``global_config.py`` lacks what A's adapter reads there): an adapter is
    kvparity's, not the code under search."""

    b_entry = ""  # the release whose adapter entry drives B (set before the first play)

    def __init__(self, scenario: Any, drive_for: Callable[[Any], tuple[Any, Callable[[], None]]],
                 close: Callable[[], None] = lambda: None) -> None:
        """``drive_for(source)``: a drive of A against ``source`` and what to close after its one
        play besides the drive (the caller's players it was given)."""
        self.scenario, self.drive_for, self._close = scenario, drive_for, close
        self.drive: Any = None

    def play(self, folder: str) -> Any:
        import dataclasses

        from kvparity.engine.errors import RealSGLangError
        from kvparity.engine.real.door import resolve

        source = resolve(folder)
        if source.entry.version == self.b_entry:
            return self._play(source)
        try:
            played = self._play(source)
            if self.broken(played) is None:
                return played
        except RealSGLangError:
            pass
        return self._play(dataclasses.replace(source, entry_release=self.b_entry))

    def _play(self, source: Any) -> Any:
        self.drive, done = self.drive_for(source)
        try:
            return self.drive.play(self.scenario)
        finally:
            self.drive.close()
            done()

    def same(self, played: Any, first: Any) -> bool:
        return bool(self.drive.identical(played, first))

    def broken(self, played: Any) -> str | None:
        broke: str | None = self.drive.broken(played)
        return broke

    def close(self) -> None:
        self._close()


def _scheduler_replaying(a: Any, scenario: Any) -> _Replaying:
    """A traffic scenario, scheduler-driven: A's own scheduler (played once) against the folder's."""
    from kvparity.engine.real.door import RealTrafficPlayer
    from kvparity.engine.traffic_players import CachingPlayer
    from kvparity.run.scheduler_drive import PlayerSpec, SchedulerDrive, SchedulerSpec

    reference = CachingPlayer(RealTrafficPlayer(a))

    def drive_for(source: Any) -> tuple[Any, Callable[[], None]]:
        player = RealTrafficPlayer(source)  # the drive's caller's: closed after the play, A's at the end
        spec = SchedulerSpec(PlayerSpec("real", a.path), PlayerSpec("real", source.path))
        return SchedulerDrive(spec, players=(reference, player)), player.close

    return _Replaying(scenario, drive_for, reference.close)


def _harness_replaying(a: Any, scenario: Any, backend: str, tree_class: str | None) -> _Replaying:
    """A step scenario, harness-driven: kvparity's loop over A's world and the folder's."""
    from kvparity.run.harness_drive import HarnessSpec

    def drive_for(source: Any) -> tuple[Any, Callable[[], None]]:
        spec = HarnessSpec((("legacy", "torch"),), (a, source), (backend,), tree_class, real_reference=True)
        return spec.build(), lambda: None

    return _Replaying(scenario, drive_for)


# ---- a whole matrix --------------------------------------------------------------------------------


def _explain_matrix(args: argparse.Namespace) -> int:
    from kvparity.cli.check import scenario_and_drive

    try:
        pairs = differing_pairs(json.loads(Path(args.matrix).read_text()))
    except (OSError, ValueError, TypeError, KeyError) as exc:
        print(f"kvparity explain: --matrix {args.matrix}: not a matrix's JSON ({exc!r})", file=sys.stderr)
        return USAGE_ERROR
    explained = _already_explained(args, pairs)
    if explained:
        print(f"explain: {len(explained)} pair(s) already explained in {args.json}, kept", flush=True)
    for pair in pairs:
        if _pair_key(pair) in explained:
            continue
        print(f"\nexplain: {pair['other_release']} against {pair['reference_release']} ({pair['drive']}-driven"
              f"{', ' + pair['backend'] if pair.get('backend') else ''})", flush=True)
        scenario, drive = scenario_and_drive(pair["scenario"])
        found = _explain_one(pair["reference_release"], pair["other_release"], scenario, drive,
                             pair.get("backend") or "torch", None, args.fresh)
        if isinstance(found, str):
            print(f"  no culprit: {found}")
            pair = pair | {"explanation": {"status": "unexplained", "why": found}}
        else:
            print("\n".join(found.lines()))
            pair = pair | {"explanation": found.to_dict()}
        explained[_pair_key(pair)] = pair
        _write_matrix_outputs(args, pairs, explained)  # kept current: a long run may be stopped
    _write_matrix_outputs(args, pairs, explained)
    return 0 if all(e["explanation"]["status"] == "culprit" for e in explained.values()) else 1


PairKey = tuple[str, str, str]


def _pair_key(pair: dict[str, Any]) -> PairKey:
    return pair["reference_release"], pair["other_release"], pair["drive"]


def _already_explained(args: argparse.Namespace, pairs: list[dict[str, Any]]) -> dict[PairKey, dict[str, Any]]:
    """What an earlier run of the same matrix wrote to ``--json`` (it was stopped, or is resumed, or
    several runs shared the pairs out and their explanations were put together): its explained
    pairs that are this matrix's, wherever they stand in it."""
    try:
        earlier = json.loads(Path(args.json).read_text()) if args.json else {}
    except (OSError, ValueError):
        return {}
    done = earlier.get("explained", []) if earlier.get("matrix") == Path(args.matrix).name else []
    wanted = {_pair_key(p) for p in pairs}
    return {_pair_key(e): e for e in done if _pair_key(e) in wanted}


def _write_matrix_outputs(args: argparse.Namespace, pairs: list[dict[str, Any]],
                          explained: dict[PairKey, dict[str, Any]]) -> None:
    """The explained pairs and the pending ones, both in the matrix's order."""
    pending = [p for p in pairs if _pair_key(p) not in explained]
    result = {"matrix": Path(args.matrix).name,
              "explained": [explained[_pair_key(p)] for p in pairs if _pair_key(p) in explained],
              "pending": [{k: v for k, v in p.items() if k != "scenario"} for p in pending]}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    if args.markdown:
        Path(args.markdown).write_text(explained_markdown(result))


def differing_pairs(matrix: dict[str, Any]) -> list[dict[str, Any]]:
    """The pairs of a matrix's JSON that differ, each with the scenario its first difference was
    saved with: the scheduler matrix's ``first_difference``, the harness matrix's shrunk
    counterexample (one backend per release pair: the first that differs)."""
    pairs, seen = [], set()
    for pair in matrix["pairs"]:
        releases = (pair["reference_release"], pair["other_release"])
        if pair.get("drive") == "scheduler":
            first = pair.get("first_difference")
            if pair.get("label") == "divergent" and first and first.get("scenario"):
                pairs.append({"reference_release": releases[0], "other_release": releases[1], "drive": "scheduler",
                              "difference": first.get("line", ""), "scenario": first["scenario"]})
        elif pair.get("verdict") == "divergent" and pair.get("scenario") and releases not in seen:
            seen.add(releases)
            pairs.append({"reference_release": releases[0], "other_release": releases[1], "drive": "harness",
                          "backend": pair.get("backend"), "difference": pair.get("counterexample", ""),
                          "scenario": pair["scenario"]})
    return pairs


def explained_markdown(result: dict[str, Any]) -> str:
    """The culprits of a matrix, a row per differing pair, then each culprit's diff."""
    lines = [f"# Culprits of `{result['matrix']}`", "",
             "Each differing pair's first difference, replayed on hybrids of the reference release with some of "
             "the newer release's changes (`kvparity explain`): the smallest set of changes that still differs.", "",
             "| pair | drive | culprit | hybrids (unresolved) | seconds |", "|---|---|---|---|---|"]
    for e in result["explained"]:
        x = e["explanation"]
        culprit = "; ".join(f"`{f['path'].removeprefix('sglang/srt/')}`: {f['name']}" for f in x.get("functions", [])) \
            if x["status"] == "culprit" else f"none: {x['why']}"
        lines.append(f"| {e['reference_release']} -> {e['other_release']} | {e['drive']} | {culprit} | "
                     f"{x.get('hybrids', 0)} ({x.get('unresolved', 0)}) | {x.get('seconds', 0):.0f} |")
    for p in result.get("pending", []):
        lines.append(f"| {p['reference_release']} -> {p['other_release']} | {p['drive']} | not explained: the run "
                     "stopped before it had explained this pair | | |")
    for e in result["explained"]:
        x = e["explanation"]
        if x["status"] == "culprit":
            lines += ["", f"## {e['reference_release']} -> {e['other_release']} ({e['drive']}-driven)", "",
                      f"First difference: {e['difference'].splitlines()[0] if e['difference'] else ''}", ""]
            if x.get("companions"):
                lines += [f"Taken with it, because the hybrids needed them to run: {', '.join(x['companions'])}.", ""]
            lines += ["```diff", x["diff"].rstrip("\n"), "```"]
    return "\n".join(lines) + "\n"
