"""``kvparity mutants``: the mutant zoo (``kvparity.teeth.zoo``) against the ``ci``-profile properties.

Each mutant is applied to its own copy of the repository and the properties run there in a
child process (several at once, up to the number of CPUs). For each it prints whether it was
killed, how many scenarios were played until the first failing one (from the child's ledger),
the time, and a one-line counterexample (from the first failure, which the child hands back as
data: ``kvparity.teeth.results``). Exit status: 0 every mutant killed, 1 a mutant survived
(or its run could not be judged), 2 usage.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvparity.teeth.results import RunFailure
    from kvparity.teeth.zoo import Mutant

from kvparity.cli.paths import output_path_problem, positive_number_problem

USAGE_ERROR = 2


@dataclass(frozen=True)
class MutantOutcome:
    name: str
    bug_class: str
    killed: bool
    scenarios: int | None  # played up to and including the first failing one; None: none failed
    seconds: float
    counterexample: str
    timed_out: bool = False  # the properties did not finish within --timeout


def add(commands: argparse._SubParsersAction, parser_class: type) -> None:
    text = "run the ci-profile properties against every mutant of the zoo (each must be killed)"
    sub = commands.add_parser("mutants", help=text, description=text)
    sub.add_argument("--only", metavar="NAME", action="append", help="run this mutant only (repeatable)")
    sub.add_argument("--json", metavar="PATH", help="write the table as JSON")
    sub.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="mutants run at once (default: CPUs)")
    sub.add_argument("--no-examples", action="store_true",
                     help="leave out the permanent @examples: generated scenarios alone")
    sub.add_argument("--timeout", type=float, default=600, help="seconds per mutant (default 600)")
    sub.set_defaults(func=run)


def scenarios_until_failure(entries: list[dict]) -> int | None:
    """Ledger lines up to and including the first with ``ok`` false; None when none failed."""
    for index, entry in enumerate(entries):
        if not entry.get("ok", True):
            return index + 1
    return None


def _scenario_summary(data: dict) -> str:
    geometry = data.get("geometry", {})
    steps = [s.get("step", "?").lower() for s in data.get("steps", [])]
    chunk = f" chunk {data['chunk_size']}" if data.get("chunk_size") else ""
    return (f"[{data.get('cache_kind')} cache, page {geometry.get('page_size')}{chunk}, "
            f"{len(data.get('requests', []))} reqs, steps {'/'.join(steps)}]")


def counterexample_line(failure: RunFailure | None) -> str:
    """What went wrong (the first difference, the first oracle violation, or the error), plus a
    compact summary of the shrunk scenario."""
    if failure is None:
        return "(no report found)"
    what = failure.what or failure.error
    if failure.replay is not None:
        what += " " + _scenario_summary(failure.replay)
    return what[:240]


def judge(done: subprocess.CompletedProcess | None, entries: list[dict],
          failure: RunFailure | None = None) -> tuple[bool, int | None, str]:
    """Killed when pytest failed (status 1) on a property: a parity report, or an exception the
    property raised while playing a scenario (``failure``: the first failing test, as data)."""
    if done is None:
        return False, scenarios_until_failure(entries), "timed out"
    failed = scenarios_until_failure(entries)
    if done.returncode != 1:
        return False, failed, f"pytest exit status {done.returncode}" if done.returncode else "survived"
    if failed is None:  # the property raised before recording its scenario
        failed = len(entries) + 1
    return True, failed, counterexample_line(failure)


def run_one(mutant: Mutant, timeout: float, examples: bool) -> MutantOutcome:
    from kvparity.model import ledger
    from kvparity.teeth import results as zoo_results
    from kvparity.teeth.zoo import run_properties

    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"kvparity-ledger-{mutant.name}-") as directory:
        result_file = Path(directory) / "first-failure.json"  # not *.jsonl: the ledger's lines are those
        try:
            done = run_properties(mutant, "ci", timeout, examples=examples, ledger_dir=Path(directory),
                                  result_file=result_file)
        except subprocess.TimeoutExpired:
            done = None
        entries = ledger.read(directory)
        failure = zoo_results.read(result_file)
    killed, scenarios, line = judge(done, entries, failure)
    return MutantOutcome(mutant.name, mutant.bug_class, killed, scenarios, time.monotonic() - start, line,
                         timed_out=done is None)


def _status(outcome: MutantOutcome) -> str:
    """A mutant whose run timed out was neither killed nor seen to survive."""
    return "killed" if outcome.killed else "TIMED OUT" if outcome.timed_out else "SURVIVED"


def format_table(outcomes: list[MutantOutcome]) -> str:
    rows = [f"{'mutant':<32} {'killed':<6} {'scen':>5} {'time':>6}  bug class / counterexample"]
    for o in outcomes:
        scenarios = "-" if o.scenarios is None else str(o.scenarios)
        mark = "yes" if o.killed else "TIME" if o.timed_out else "NO"
        rows.append(f"{o.name:<32} {mark:<6} {scenarios:>5} {o.seconds:>5.1f}s  {o.bug_class}")
        rows.append(f"{'':<54}{o.counterexample}")
    killed = sum(o.killed for o in outcomes)
    rows.append(f"mutants killed: {killed}/{len(outcomes)}")
    return "\n".join(rows)


def _selected(only: list[str] | None) -> list[Mutant] | None:
    from kvparity.teeth.zoo import BY_NAME, MUTANTS

    if not only:
        return list(MUTANTS)
    unknown = [n for n in only if n not in BY_NAME]
    if unknown:
        print(f"kvparity mutants: unknown mutant {', '.join(map(repr, unknown))}; known: {', '.join(BY_NAME)}",
              file=sys.stderr)
        return None
    return [BY_NAME[n] for n in only]


def _run_all(mutants: list[Mutant], jobs: int, timeout: float, examples: bool) -> list[MutantOutcome]:
    """Every mutant in its own child process, ``jobs`` at a time; a line as each one ends, the
    outcomes in the zoo's order."""
    outcomes: dict[str, MutantOutcome] = {}
    with ThreadPoolExecutor(max_workers=jobs) as pool:  # threads: each waits on its own child process
        futures = [pool.submit(run_one, m, timeout, examples) for m in mutants]
        for future in as_completed(futures):
            outcome = future.result()
            outcomes[outcome.name] = outcome
            print(f"  {outcome.name}: {_status(outcome)} in {outcome.seconds:.1f} s", flush=True)
    return [outcomes[m.name] for m in mutants]


def run(args: argparse.Namespace) -> int:
    mutants = _selected(args.only)
    if mutants is None:
        return USAGE_ERROR
    problem = (
        ("--jobs must be at least 1" if args.jobs < 1 else None)
        or positive_number_problem("--timeout", args.timeout)
        or output_path_problem("--json", args.json)
    )
    if problem:
        print(f"kvparity mutants: {problem}", file=sys.stderr)
        return USAGE_ERROR
    mode = "generated scenarios only" if args.no_examples else "permanent examples first"
    print(f"kvparity mutants: {len(mutants)} mutants, ci profile, {mode}, {args.jobs} at a time", flush=True)
    start = time.monotonic()
    outcomes = _run_all(mutants, args.jobs, args.timeout, not args.no_examples)
    print(format_table(outcomes))
    print(f"total: {time.monotonic() - start:.0f} s")
    if args.json:
        payload = {"mutants": [asdict(o) for o in outcomes], "examples": not args.no_examples}
        Path(args.json).write_text(json.dumps(payload, indent=2) + "\n")
        print(f"wrote {args.json}")
    # The plain closing line CI logs are read by: a killed mutant is a passed check.
    killed = sum(1 for o in outcomes if o.killed)
    timed_out = sum(1 for o in outcomes if o.timed_out)
    if timed_out:
        print(f"{timed_out} mutants timed out (--timeout {args.timeout:g} s): not a verdict, run them with a longer one")
    print(f"mutants: {killed} passed, {len(outcomes) - killed} failed")
    return 0 if all(o.killed for o in outcomes) else 1
