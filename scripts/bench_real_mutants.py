"""How fast ``kvparity check`` answers on real SGLang: each of the project's real-SGLang mutants
(``kvparity.teeth.real_zoo``: the faithfulness lane's copies of 0.5.3.post1 and the 0.5.22 ones)
planted in a copy of its release and checked as an engineer would, plus parity runs on untouched
copies and the default ``kvparity check --sglang 0.5.3.post1 --against 0.5.3``.

Per run it prints, in seconds from the command's start: the first scenario judged, the first
divergence shown, the shrunk counterexample shown, the exit; and the shrunk scenario's size.
``--kvparity ROOT`` runs another checkout's kvparity (a worktree of an older commit: the "before"
of a change); ``--before ROOT`` runs both, that one then this one, run by run, so that a machine
whose speed drifts (a shared VM) slows both alike; the copies are always made by this checkout's zoo.

    python scripts/bench_real_mutants.py [--before ROOT] [--examples 200] [--seed 0] [--only NAME ...]
                                         [--markdown OUT]

Times are read from the command's own output as it streams (the line that shows the first
divergence, the one that shows the shrunk counterexample: on a kvparity that reports only at
the end, both are the verdict line), and from a ``sitecustomize`` hook that notes when each
scenario's ``run_scenario`` returns, in every process of the run. Not a test: figures only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# Lines (their start) that show a divergence, and the shrunk one; the verdict line shows both on a
# kvparity that prints nothing before its verdict ("verdict (harness-driven): ..." now, "verdict: ..."
# on an older kvparity).
FIRST_SHOWN = ("first divergence", "verdict:", "verdict (")
SHRUNK_SHOWN = ("shrunk counterexample", "smallest counterexample found", "verdict:", "verdict (")

_HOOK = '''
import importlib.util, os, sys, time

_MARKS = os.environ.get("KVPARITY_BENCH_MARKS")


class _NoteScenarios:
    """Wraps kvparity.run.runner.run_scenario, once imported, to note when each call returns."""

    def find_spec(self, name, path, target=None):
        if name != "kvparity.run.runner":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run_module = spec.loader.exec_module

        def exec_module(module):
            run_module(module)
            play = module.run_scenario

            def noted(*args, **kwargs):
                result = play(*args, **kwargs)
                with open(_MARKS, "a") as marks:
                    marks.write(f"{time.time()}\\n")
                return result

            module.run_scenario = noted

        spec.loader.exec_module = exec_module
        return spec


if _MARKS:
    sys.meta_path.insert(0, _NoteScenarios())
'''


@dataclass
class Run:
    name: str
    what: str
    exit_code: int = -1
    first_scenario_s: float | None = None
    first_shown_s: float | None = None
    shrunk_shown_s: float | None = None
    total_s: float = 0.0
    scenarios: int | None = None
    shrunk_size: tuple[int, int] | None = None  # requests, steps
    unshrunk_size: tuple[int, int] | None = None


def _size(scenario: dict | None) -> tuple[int, int] | None:
    return None if scenario is None else (len(scenario["requests"]), len(scenario["steps"]))


def play(name: str, what: str, args: list[str], kvparity_root: Path, hook_dir: Path) -> Run:
    """Run ``python -m kvparity check ARGS`` in ``kvparity_root``, timing its output as it comes."""
    run = Run(name, what)
    with tempfile.TemporaryDirectory(prefix="kvp-bench-") as tmp:
        marks, verdict = Path(tmp) / "marks", Path(tmp) / "verdict.json"
        env = dict(os.environ, KVPARITY_BENCH_MARKS=str(marks),
                   PYTHONPATH=os.pathsep.join([str(hook_dir), str(kvparity_root)]))
        command = [sys.executable, "-m", "kvparity", "check", *args, "--json", str(verdict)]
        start = time.time()
        proc = subprocess.Popen(command, cwd=kvparity_root, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True, bufsize=1)
        assert proc.stdout is not None
        for line in proc.stdout:
            now = time.time() - start
            if run.first_shown_s is None and line.startswith(FIRST_SHOWN):
                run.first_shown_s = now
            if run.shrunk_shown_s is None and line.startswith(SHRUNK_SHOWN):
                run.shrunk_shown_s = now
        run.exit_code = proc.wait()
        run.total_s = time.time() - start
        if marks.exists():
            run.first_scenario_s = min(float(t) for t in marks.read_text().split()) - start
        if verdict.exists():
            data = json.loads(verdict.read_text())
            run.scenarios = data.get("scenarios")
            if "first_difference" in data:  # the one verdict schema (kvparity.judge.verdict.to_json)
                first = data["first_difference"] or {}
                run.shrunk_size = _size((first.get("shrunk") or first).get("scenario"))
                run.unshrunk_size = _size(first.get("scenario"))
            else:  # an older kvparity's (--kvparity/--before ROOT)
                run.shrunk_size = _size((data.get("counterexample") or {}).get("scenario"))
                run.unshrunk_size = _size((data.get("first_divergence") or {}).get("scenario"))
    if run.exit_code == 0:  # parity: nothing was shown but the verdict
        run.first_shown_s = run.shrunk_shown_s = None
    return run


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _sized(size: tuple[int, int] | None) -> str:
    return "-" if size is None else f"{size[0]} req, {size[1]} steps"


def table(runs: list[Run]) -> str:
    lines = ["| run | exit | first scenario s | first divergence shown s | shrunk shown s | exit s "
             "| scenarios | unshrunk | shrunk |", "|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        lines.append(f"| {r.name} | {r.exit_code} | {_cell(r.first_scenario_s)} | {_cell(r.first_shown_s)} | "
                     f"{_cell(r.shrunk_shown_s)} | {r.total_s:.1f} | {r.scenarios if r.scenarios is not None else '-'} "
                     f"| {_sized(r.unshrunk_size)} | {_sized(r.shrunk_size)} |")
    return "\n".join(lines)


def summary(runs: list[Run]) -> str:
    caught = [r for r in runs if r.exit_code == 1 and r.first_shown_s is not None]
    if not caught:
        return "no divergence runs"
    firsts = sorted(r.first_shown_s for r in caught)  # type: ignore[misc]
    shrink = [r.shrunk_shown_s - r.first_shown_s for r in caught if r.shrunk_shown_s is not None]  # type: ignore[operator]
    median = firsts[len(firsts) // 2] if len(firsts) % 2 else (firsts[len(firsts) // 2 - 1] + firsts[len(firsts) // 2]) / 2
    return (f"{len(caught)} mutants caught; first divergence shown: median {median:.1f} s, worst {max(firsts):.1f} s; "
            f"shrinking after it: worst {max(shrink):.1f} s")


def plan(examples: int, seed: int, copies: Path) -> list[tuple[str, str, list[str]]]:
    """(name, what, check arguments) per run: every real mutant, then the parity runs."""
    from kvparity.engine.real.install import resolve
    from kvparity.teeth.real_zoo import REAL_MUTANTS, REAL_MUTANTS_PREFIX_LEN, make_mutated_copy

    sized = ["--examples", str(examples), "--seed", str(seed)]
    runs = []
    for mutant in REAL_MUTANTS + REAL_MUTANTS_PREFIX_LEN:  # harness-driven: the in-flight mutant needs the overlap loop
        copy = make_mutated_copy(resolve(mutant.version), mutant, copies / mutant.name)
        against = ["--against", mutant.against] if mutant.against else []
        runs.append((mutant.name, mutant.what, ["--sglang", str(copy), *against, *sized]))
    for version, against in (("0.5.3.post1", "0.5.3"), ("0.5.22", "0.5.22"), ("0.5.22", None)):
        copy = copies / f"untouched-{version}-{against}"
        (copy / "sglang").parent.mkdir(parents=True)
        (copy / "sglang").symlink_to(Path(resolve(version).path) / "sglang")
        name = f"parity: copy of {version} " + (f"vs {against}" if against else "(Python vs Rust tree core)")
        runs.append((name, "untouched", ["--sglang", str(copy), *(["--against", against] if against else []), *sized]))
    runs.append(("parity: default --sglang 0.5.3.post1 --against 0.5.3", "the default run",
                 ["--sglang", "0.5.3.post1", "--against", "0.5.3"]))
    return runs


def ratios(before: list[Run], after: list[Run]) -> str:
    lines = ["| run | first scenario s, before -> after | first divergence shown s | shrunk shown s | exit s |",
             "|---|---|---|---|---|"]
    for b, a in zip(before, after):
        cells = [f"{_cell(x)} -> {_cell(y)}" for x, y in ((b.first_scenario_s, a.first_scenario_s),
                 (b.first_shown_s, a.first_shown_s), (b.shrunk_shown_s, a.shrunk_shown_s), (b.total_s, a.total_s))]
        lines.append(f"| {a.name} | " + " | ".join(cells) + " |")
    firsts = [(b.first_scenario_s, a.first_scenario_s) for b, a in zip(before, after)
              if b.first_scenario_s and a.first_scenario_s]
    if firsts:
        mean = sum(y / x for x, y in firsts) / len(firsts)
        lines.append(f"\nfirst scenario, after / before: mean {mean:.2f} over {len(firsts)} runs")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kvparity", type=Path, default=ROOT, help="the kvparity checkout to run (default this one)")
    parser.add_argument("--before", type=Path, help="also run this checkout, before each run of --kvparity")
    parser.add_argument("--examples", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", nargs="*", help="run only these (names, or a prefix such as 'parity')")
    parser.add_argument("--markdown", type=Path, help="also write the tables here")
    args = parser.parse_args()
    roots = ([("before", args.before.resolve())] if args.before else []) + [("after", args.kvparity.resolve())]
    runs: dict[str, list[Run]] = {label: [] for label, _ in roots}
    with tempfile.TemporaryDirectory(prefix="kvp-bench-copies-") as tmp:
        hook_dir = Path(tmp) / "hook"
        hook_dir.mkdir()
        (hook_dir / "sitecustomize.py").write_text(textwrap.dedent(_HOOK))
        for name, what, check_args in plan(args.examples, args.seed, Path(tmp) / "copies"):
            if args.only and not any(name.startswith(o) for o in args.only):
                continue
            for label, root in roots:
                run = play(name, what, check_args, root, hook_dir)
                runs[label].append(run)
                print(f"{label}: {name}: exit {run.exit_code}, first scenario {_cell(run.first_scenario_s)} s, first "
                      f"divergence shown {_cell(run.first_shown_s)} s, shrunk shown {_cell(run.shrunk_shown_s)} s, "
                      f"exit {run.total_s:.1f} s, shrunk {_sized(run.shrunk_size)}", flush=True)
    parts = []
    for label, _ in roots:
        parts += [f"### {label}", "", table(runs[label]), "", summary(runs[label]), ""]
    if args.before:
        parts += ["### before -> after", "", ratios(runs["before"], runs["after"]), ""]
    text = "\n".join(parts)
    print("\n" + text)
    if args.markdown:
        args.markdown.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
