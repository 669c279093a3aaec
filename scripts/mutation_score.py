"""Mutation score of the kernels and of ``refactored/``, measured with cosmic-ray.

    python scripts/mutation_score.py                      # every file of FILES, both stages
    python scripts/mutation_score.py --files kernels/last_loc.py --stages fast
    python scripts/mutation_score.py --output docs/mutation-output.txt --json mutation.json

cosmic-ray enumerates the mutants (``cosmic_ray.commands.init`` into a session database) and applies
each one by rewriting the file on disk (``cosmic_ray.mutating.use_mutation``), so Triton kernel
bodies are mutated too: the interpreter reads the rewritten source. This script only drives it:

- it copies the repository into a temporary directory, one copy per worker, and mutates only those
  copies, so a checkout is never left mutated, even when the run is killed;
- a parent process imports torch, Triton (interpreter), Hypothesis and pytest once, then forks one
  child per mutant and stage; the child imports the project fresh from the mutated copy, so a
  mutant costs its tests, not a Python start-up;
- each mutant goes through staged, fail-fast tests: stage ``fast`` is the unit tests and kernel
  properties of the mutated module (FAST_TESTS), stage ``scenario`` (only for mutants that
  survive ``fast``) is the parity properties in every world (SCENARIO_TESTS), each with ``-x`` under
  the fixed ``mutation`` Hypothesis profile (derandomized, no database, no shrinking);
- a baseline run of every test set on the unmutated copy comes first, and then one known-bad
  mutant per file (KNOWN_BAD) must be killed: if either fails the script exits 2 and reports no
  score, so a harness that cannot run its tests never reports "0 survivors";
- a stage that runs past its timeout (a multiple of its baseline) is killed and the mutant counted
  as timed out, separately from killed;
- survivors named in the triage file (EQUIVALENT_FILE, keyed by file, function, operator and the
  source line before and after, never by cosmic-ray's occurrence index alone) are counted as
  equivalent. A mutant whose edit does not compile (e.g. ``*,`` of a keyword-only marker
  "replaced" by ``+,``) is "incompetent": no test can judge it, so it is reported but not scored.
  Score = killed / (total - equivalent - incompetent).

Exit status: 0 the run finished (whatever the score), 2 the baseline or a known-bad check failed or
the arguments were wrong.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections import Counter, deque
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

# The files whose mutants are scored. Add a kernel here (e.g. kernels/linear_write.py) and, if it
# needs other tests than the other kernels, an entry in FAST_TESTS and one in KNOWN_BAD.
FILES: tuple[str, ...] = (
    "kernels/legacy_write.py",
    "kernels/refactored_write.py",
    "kernels/last_loc.py",
    "kernels/alloc_extend.py",
    "kernels/linear_write.py",
    "refactored/__init__.py",
    "refactored/chunk_cache.py",
    "refactored/req.py",
    "refactored/schedule_batch.py",
)

# Stage "fast": per directory prefix, the cheap tests with hand-derived expectations, cheapest first.
FAST_TESTS: dict[str, tuple[str, ...]] = {
    "kernels/linear_write.py": (
        "tests/unit/test_linear_write.py",
        "tests/unit/test_kernel_properties.py",
        "tests/unit/test_race_lane.py",
        "tests/unit/test_mutation_kills.py",
    ),
    "kernels/": ("tests/unit/test_kernels.py", "tests/unit/test_kernel_properties.py", "tests/unit/test_mutation_kills.py"),
    "refactored/": (
        "tests/unit/test_req.py",
        "tests/unit/test_chunk_cache.py",
        "tests/unit/test_prepare_for_extend.py",
        "tests/unit/test_kernel_properties.py",
        "tests/unit/test_mutation_kills.py",
    ),
}
# Stage "scenario": the parity properties in every world, only for mutants that survive stage "fast".
SCENARIO_TESTS: tuple[str, ...] = ("tests/properties/test_parity.py",)

# One mutant per file that any working harness kills: (operator, the source line it changes).
KNOWN_BAD: dict[str, tuple[str, str]] = {
    "kernels/legacy_write.py": ("core/ReplaceBinaryOperator_Sub_Add", "new_len = seq_len - prefix_len"),
    "kernels/refactored_write.py": ("core/ReplaceBinaryOperator_Sub_Add", "new_len = seq_len - prefix_len"),
    "kernels/last_loc.py": ("core/ReplaceComparisonOperator_Gt_GtE", "has_prefix = prefix_len > 0"),
    "kernels/alloc_extend.py": ("core/ReplaceBinaryOperator_Add_Sub", "last_loc + 1 + in_page"),
    "kernels/linear_write.py": ("core/ReplaceBinaryOperator_Sub_Add", "starts = torch.cumsum(lens, 0) - lens"),
    "refactored/req.py": (
        "core/ReplaceBinaryOperator_Sub_Add",
        "self.extend_input_len = len(self.fill_ids) - len(self.prefix_indices)",
    ),
    "refactored/schedule_batch.py": ("core/ReplaceComparisonOperator_Gt_LtE", "if self.page_size > 1 else None"),
}

EQUIVALENT_FILE = "docs/mutation-equivalent.toml"
PROFILE = "mutation"
# A stage's timeout: this many times its baseline, plus a margin for a busy machine.
TIMEOUT_FACTOR = 4.0
TIMEOUT_MARGIN_S = 15.0
PYTEST_ARGS = ("-x", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "-rfE", "--no-header")
COPY_IGNORE = shutil.ignore_patterns(
    ".git", ".venv", "venv", "__pycache__", "*.pyc", ".hypothesis", ".pytest_cache", "*.sqlite", "*.egg-info"
)


class Refused(Exception):
    """The run cannot be trusted (baseline failed, known-bad mutant survived, bad arguments)."""


# ---- mutants ------------------------------------------------------------------------------------
@dataclasses.dataclass
class Mutant:
    job_id: str
    file: str
    function: str
    operator: str
    occurrence: int
    line: int
    before: str
    after: str
    outcome: str = "pending"  # killed | survived | timeout | equivalent | incompetent
    stage: str = ""
    killer: str = ""
    seconds: float = 0.0
    reason: str = ""

    def key(self) -> tuple[str, str, str, str, str]:
        return (self.file, self.function, self.operator, self.before, self.after)


def _changed_lines(original: str, mutated: str) -> tuple[int, str, str]:
    """First changed line number and the changed lines before and after, whitespace-trimmed."""
    a, b = original.splitlines(), mutated.splitlines()
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if tag != "equal":
            return i1 + 1, " / ".join(s.strip() for s in a[i1:i2]), " / ".join(s.strip() for s in b[j1:j2])
    return 0, "", ""


def _compiles(source: str) -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(source, "<mutant>", "exec")
        return True
    except SyntaxError:
        return False


def enumerate_mutants(copy: Path, files: Iterable[str], session: Path) -> list[Mutant]:
    """Every mutant cosmic-ray makes of ``files`` (default operators), stored in its session DB."""
    import parso  # noqa: F401  (cosmic-ray's operator plugins fail to load if parso is imported later)
    from cosmic_ray.commands.init import init
    from cosmic_ray.mutating import mutate_code
    from cosmic_ray.plugins import get_operator
    from cosmic_ray.work_db import WorkDB, use_db

    cwd = os.getcwd()
    os.chdir(copy)  # module paths relative to the repository, as they appear in the report
    try:
        with use_db(str(session), WorkDB.Mode.create) as db:
            init([Path(f) for f in files], db, {})
            items = list(db.work_items)
    finally:
        os.chdir(cwd)
    sources = {f: (copy / f).read_text() for f in files}
    mutants = []
    for item in items:
        spec = item.mutations[0]
        path = Path(spec.module_path).as_posix()
        mutated = mutate_code(sources[path], get_operator(spec.operator_name)(), spec.occurrence)
        line, before, after = _changed_lines(sources[path], mutated or "")
        m = Mutant(item.job_id, path, spec.definition_name or "<module>", spec.operator_name,
                   spec.occurrence, line, before, after)
        if mutated is None or not _compiles(mutated):
            # Not a program (e.g. the keyword-only marker ``*,`` "replaced" by ``+,``): no test can
            # judge it, so it is neither killed nor survived.
            m.outcome, m.killer = "incompetent", "does not compile"
        mutants.append(m)
    order = {f: i for i, f in enumerate(files)}
    mutants.sort(key=lambda m: (order[m.file], m.line, m.operator, m.occurrence))
    return mutants


# ---- triage -------------------------------------------------------------------------------------
def _load_toml(path: Path) -> dict[str, Any]:
    try:
        import tomllib  # Python >= 3.11
        return tomllib.loads(path.read_text())
    except ModuleNotFoundError:
        import toml  # a cosmic-ray dependency

        return toml.loads(path.read_text())


def load_equivalents(path: Path) -> dict[tuple[str, str, str, str, str], str]:
    """``{(file, function, operator, before, after): reason}`` from the triage file."""
    if not path.exists():
        return {}
    table = {}
    for entry in _load_toml(path).get("equivalent", []):
        key = (entry["file"], entry["function"], entry["operator"], entry["before"].strip(), entry["after"].strip())
        if not entry.get("reason"):
            raise Refused(f"{path}: an equivalent mutant needs a reason: {key}")
        table[key] = entry["reason"]
    return table


# ---- running tests in forked children -----------------------------------------------------------
def preload() -> None:
    """Import the heavy libraries once, in the parent, so every forked child starts warm. The project
    itself is never imported here: each child imports it from its (mutated) copy."""
    os.environ["KVPARITY_DEVICE"] = "cpu"  # the score is measured with Triton's interpreter
    os.environ["TRITON_INTERPRET"] = "1"
    sys.dont_write_bytecode = True  # a same-size mutant must never be served a stale .pyc
    import hypothesis  # noqa: F401
    import numpy  # noqa: F401
    import pytest  # noqa: F401
    import torch  # noqa: F401
    import triton  # noqa: F401
    import triton.language  # noqa: F401


def _child(copy: Path, tests: tuple[str, ...], log: Path) -> None:
    """In the forked child: run pytest on ``tests`` in ``copy``; never returns."""
    code = 3
    try:
        os.setpgid(0, 0)
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.chdir(copy)
        sys.path[:] = [str(copy)] + [p for p in sys.path if p not in ("", str(ROOT), str(ROOT / "scripts"))]
        import pytest

        code = int(pytest.main([*tests, *PYTEST_ARGS]))
    except BaseException:  # noqa: BLE001  (the exit code says it; the traceback goes to the log)
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


@dataclasses.dataclass
class Run:
    pid: int
    log: Path
    deadline: float
    started: float


def start_tests(copy: Path, tests: tuple[str, ...], log: Path, timeout: float) -> Run:
    pid = os.fork()
    if pid == 0:
        _child(copy, tests, log)
    return Run(pid, log, time.monotonic() + timeout, time.monotonic())


def poll(run: Run) -> tuple[str, int] | None:
    """``None`` while running; else ``("done", pytest exit code)`` or ``("timeout", -1)``."""
    pid, status = os.waitpid(run.pid, os.WNOHANG)
    if pid:
        return "done", os.waitstatus_to_exitcode(status)
    if time.monotonic() > run.deadline:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.pid, signal.SIGKILL)
        os.waitpid(run.pid, 0)
        return "timeout", -1
    return None


def run_blocking(copy: Path, tests: tuple[str, ...], log: Path, timeout: float) -> tuple[str, int, float]:
    run = start_tests(copy, tests, log, timeout)
    while (result := poll(run)) is None:
        time.sleep(0.05)
    return result[0], result[1], time.monotonic() - run.started


def first_failure(log: Path) -> str:
    """The first ``FAILED``/``ERROR`` line pytest printed, else the last non-empty line."""
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    for line in lines:
        if line.startswith(("FAILED ", "ERROR ")):
            return line.split(" - ")[0][:160]
    tail = [ln for ln in lines if ln.strip()]
    return tail[-1][:160] if tail else "(no output)"


# ---- the driver ---------------------------------------------------------------------------------
def fast_tests_for(path: str) -> tuple[str, ...]:
    for prefix, tests in FAST_TESTS.items():
        if path.startswith(prefix):
            return tests
    raise Refused(f"{path}: no FAST_TESTS entry covers it")


def make_copies(n: int, base: Path) -> list[Path]:
    copies = []
    for i in range(n):
        dest = base / f"repo-{i}"
        shutil.copytree(ROOT, dest, ignore=COPY_IGNORE, symlinks=True)
        copies.append(dest)
    return copies


def child_env(base: Path) -> None:
    """Environment every child inherits: one thread each, the fixed profile, scratch dirs under
    ``base`` (conftest would otherwise make a fresh temporary directory per child)."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
        os.environ[var] = "1"
    os.environ["HYPOTHESIS_PROFILE"] = PROFILE
    os.environ.pop("KVPARITY_MAX_EXAMPLES", None)  # the profile is fixed: no overrides
    os.environ.pop("CI", None)
    os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
    os.environ["KVPARITY_TRITON_CACHE_BASE"] = str(base / "triton-cache")
    os.environ["KVPARITY_LEDGER"] = str(base / "ledger")
    (base / "ledger").mkdir(exist_ok=True)


def baseline(copy: Path, test_sets: list[tuple[str, ...]], logs: Path) -> dict[tuple[str, ...], float]:
    """Run every test set unmutated; refuse unless each passes and really ran tests."""
    times = {}
    for i, tests in enumerate(test_sets):
        log = logs / f"baseline-{i}.log"
        state, code, seconds = run_blocking(copy, tests, log, timeout=1800)
        text = log.read_text(errors="replace")
        if state != "done" or code != 0 or " passed" not in text:
            raise Refused(f"baseline of {' '.join(tests)} did not pass (exit {code}, {state}); see {log}:\n"
                          + "\n".join(text.splitlines()[-15:]))
        times[tests] = seconds
        print(f"baseline {seconds:6.1f} s  {' '.join(tests)}", flush=True)
    return times


def check_known_bad(copy: Path, mutants: list[Mutant], files: list[str], timeouts: dict, logs: Path) -> None:
    """One deliberately wrong mutant per file must be killed by that file's fast tests."""
    from cosmic_ray.mutating import use_mutation
    from cosmic_ray.plugins import get_operator

    for path in files:
        if path not in KNOWN_BAD:
            if any(m.file == path for m in mutants):
                print(f"warning: no KNOWN_BAD mutant for {path}; its test wiring is not checked", flush=True)
            continue
        operator, text = KNOWN_BAD[path]
        chosen = [m for m in mutants if m.file == path and m.operator == operator and text in m.before]
        if not chosen:
            raise Refused(f"KNOWN_BAD for {path}: no {operator} mutant on a line containing {text!r}")
        m = chosen[0]
        tests = fast_tests_for(path)
        log = logs / f"known-bad-{m.job_id}.log"
        with use_mutation(copy / m.file, get_operator(m.operator)(), m.occurrence):
            state, code, seconds = run_blocking(copy, tests, log, timeouts[tests])
        if state != "done" or code == 0:
            raise Refused(f"known-bad mutant survived ({state}, exit {code}): {m.file}:{m.line} "
                          f"{m.before!r} -> {m.after!r}; the tests do not see this file. See {log}")
        print(f"known-bad killed in {seconds:4.1f} s: {m.file}:{m.line} {m.before} -> {m.after}", flush=True)


@dataclasses.dataclass
class Slot:
    copy: Path
    mutant: Mutant | None = None
    run: Run | None = None
    stage: str = ""
    stack: contextlib.ExitStack | None = None
    t0: float = 0.0


def run_mutants(mutants: list[Mutant], copies: list[Path], stages: str, timeouts: dict, logs: Path,
                progress_every: int = 25) -> None:
    from cosmic_ray.mutating import use_mutation
    from cosmic_ray.plugins import get_operator

    queue = deque(m for m in mutants if m.outcome == "pending")
    slots = [Slot(c) for c in copies]
    done = 0
    todo = len(queue)
    t_start = time.monotonic()

    def launch(slot: Slot, stage: str) -> None:
        m = slot.mutant
        tests = fast_tests_for(m.file) if stage == "fast" else SCENARIO_TESTS
        slot.stage = stage
        slot.run = start_tests(slot.copy, tests, logs / f"{m.job_id}-{stage}.log", timeouts[tests])

    def finish(slot: Slot, outcome: str, killer: str = "") -> None:
        nonlocal done
        m = slot.mutant
        slot.stack.close()  # cosmic-ray puts the original source back
        m.outcome, m.stage, m.killer = outcome, slot.stage, killer
        m.seconds = time.monotonic() - slot.t0
        slot.mutant = slot.run = slot.stack = None
        done += 1
        if done % progress_every == 0 or done == todo:
            counts = Counter(x.outcome for x in mutants if x.outcome != "pending")
            rate = (time.monotonic() - t_start) / done
            print(f"[{done}/{todo}] {dict(counts)}  {rate:.2f} s/mutant, "
                  f"~{rate * (todo - done) / 60:.0f} min left", flush=True)

    try:
        while queue or any(s.mutant for s in slots):
            for slot in slots:
                if slot.mutant is None and queue:
                    m = slot.mutant = queue.popleft()
                    slot.t0 = time.monotonic()
                    slot.stack = contextlib.ExitStack()
                    _, mutated = slot.stack.enter_context(
                        use_mutation(slot.copy / m.file, get_operator(m.operator)(), m.occurrence))
                    if mutated is None:
                        finish(slot, "incompetent", "cosmic-ray made no mutation")
                        continue
                    launch(slot, "fast")
            busy = False
            for slot in slots:
                if slot.run is None:
                    continue
                result = poll(slot.run)
                if result is None:
                    busy = True
                    continue
                state, code = result
                if state == "timeout":
                    finish(slot, "timeout", f"stage {slot.stage} ran past {timeouts_for(slot, timeouts):.0f} s")
                elif code != 0:
                    finish(slot, "killed", first_failure(slot.run.log))
                elif slot.stage == "fast" and stages == "all":
                    launch(slot, "scenario")
                else:
                    finish(slot, "survived")
            if busy:
                time.sleep(0.02)
    finally:
        for slot in slots:  # interrupted: stop the children, restore the copies
            if slot.run is not None:
                with contextlib.suppress(ProcessLookupError, ChildProcessError):
                    os.killpg(slot.run.pid, signal.SIGKILL)
                    os.waitpid(slot.run.pid, 0)
            if slot.stack is not None:
                slot.stack.close()


def timeouts_for(slot: Slot, timeouts: dict) -> float:
    return timeouts[fast_tests_for(slot.mutant.file) if slot.stage == "fast" else SCENARIO_TESTS]


def apply_triage(mutants: list[Mutant], equivalents: dict) -> list[str]:
    """Mark listed survivors equivalent; return warnings for stale or contradicted entries."""
    warnings = []
    seen = set()
    for m in mutants:
        reason = equivalents.get(m.key())
        if reason is None:
            continue
        seen.add(m.key())
        if m.outcome == "survived":
            m.outcome, m.reason = "equivalent", reason
        else:
            warnings.append(f"listed as equivalent but {m.outcome}: {m.file}:{m.line} {m.operator} "
                            f"{m.before!r} -> {m.after!r}")
    for key in equivalents.keys() - seen:
        if key[0] in {m.file for m in mutants}:
            warnings.append(f"triage entry matches no mutant of this run: {key}")
    return warnings


def carry_over(mutants: list[Mutant], previous: Path) -> int:
    """Keep the outcome of every mutant an earlier run killed (matched by key, so only when the
    sources are unchanged); the rest stay pending and are run again."""
    data = json.loads(previous.read_text())
    killed = {tuple(d["key"]): d for d in data["mutants"] if d["outcome"] == "killed"}
    n = 0
    for m in mutants:
        d = killed.get(m.key())
        if d is not None and m.outcome == "pending":
            m.outcome, m.stage, m.killer, m.seconds = "killed", d["stage"], d["killer"], d["seconds"]
            n += 1
    return n


# ---- report -------------------------------------------------------------------------------------
OUTCOMES = ("killed", "survived", "timeout", "equivalent", "incompetent")


def score(counts: Counter) -> float:
    judged = sum(counts.values()) - counts["equivalent"] - counts["incompetent"]
    return 100.0 * counts["killed"] / judged if judged else 0.0


def table(rows: list[tuple[str, Counter]]) -> list[str]:
    head = f"{'':32} {'total':>6} " + " ".join(f"{o:>11}" for o in OUTCOMES) + f" {'score':>7}"
    out = [head, "-" * len(head)]
    for name, counts in rows:
        out.append(f"{name:32} {sum(counts.values()):>6} " + " ".join(f"{counts[o]:>11}" for o in OUTCOMES)
                   + f" {score(counts):>6.1f}%")
    return out


def report(mutants: list[Mutant], header: list[str], warnings: list[str]) -> str:
    lines = list(header) + [""]
    per_file: dict[str, Counter] = {}
    for m in mutants:
        per_file.setdefault(m.file, Counter())[m.outcome] += 1
    total = sum(per_file.values(), Counter())
    lines += ["Per file (score = killed / (total - equivalent - incompetent)):"]
    lines += table(list(per_file.items()) + [("TOTAL", total)])
    per_op: dict[str, Counter] = {}
    for m in mutants:
        per_op.setdefault(m.operator.removeprefix("core/").split("_")[0], Counter())[m.outcome] += 1
    lines += ["", "Per operator family:"]
    lines += table(sorted(per_op.items()))
    stage = Counter((m.stage or "-") for m in mutants if m.outcome == "killed")
    lines += ["", "Killed by stage: " + ", ".join(f"{k} {v}" for k, v in sorted(stage.items()))]
    for title, outcome in (("Survived (not triaged)", "survived"), ("Timed out", "timeout"),
                           ("Incompetent", "incompetent")):
        chosen = [m for m in mutants if m.outcome == outcome]
        if chosen:
            lines += ["", f"{title}: {len(chosen)}"]
            lines += [f"  {m.file}:{m.line} [{m.function}] {m.operator}: {m.before}  ->  {m.after}" for m in chosen]
    equivalent = [m for m in mutants if m.outcome == "equivalent"]
    if equivalent:
        lines += ["", f"Equivalent (docs/mutation.md, {EQUIVALENT_FILE}): {len(equivalent)}"]
        lines += [f"  {m.file}:{m.line} [{m.function}] {m.operator}: {m.before}  ->  {m.after}   # {m.reason}"
                  for m in equivalent]
    if warnings:
        lines += ["", "Triage warnings:"] + [f"  {w}" for w in warnings]
    lines += ["", f"SCORE {score(total):.1f}% ({total['killed']} killed of {sum(total.values()) - total['equivalent'] - total['incompetent']}"
                  f" non-equivalent compiling mutants; {total['timeout']} timed out, {total['survived']} survived)"]
    return "\n".join(lines) + "\n"


def _git_revision() -> str:
    try:
        rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", *FILES, "tests"],
                               capture_output=True, text=True).stdout.strip()
        return rev + (" + uncommitted changes" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--files", nargs="+", default=list(FILES), help="subset of FILES (repository-relative)")
    p.add_argument("--stages", choices=("fast", "all"), default="all",
                   help="'fast': unit tests and kernel properties only; 'all': survivors then run the parity properties")
    p.add_argument("--workers", type=int, default=2, help="parallel children, one repository copy each (default 2)")
    p.add_argument("--update", help="JSON of an earlier run (--json) over the same sources: keep its killed "
                   "mutants (new tests cannot un-kill them) and re-run only the others")
    p.add_argument("--limit", type=int, help="first N mutants only (a smoke run)")
    p.add_argument("--equivalent", default=EQUIVALENT_FILE, help="triage file (repository-relative)")
    p.add_argument("--output", help="also write the report here")
    p.add_argument("--json", help="write every mutant and its outcome here")
    p.add_argument("--session", help="keep cosmic-ray's session database here (default: discarded)")
    p.add_argument("--keep", action="store_true", help="keep the temporary copies and logs")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    unknown = [f for f in args.files if not (ROOT / f).is_file()]
    if unknown:
        print(f"error: no such file: {', '.join(unknown)}", file=sys.stderr)
        return 2
    # A terminated run unwinds like an interrupted one: children killed, copies restored and removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    base = Path(tempfile.mkdtemp(prefix="kvparity-mutation-"))
    t0 = time.monotonic()
    try:
        child_env(base)
        preload()
        logs = base / "logs"
        logs.mkdir()
        copies = make_copies(max(1, args.workers), base)
        session = Path(args.session).resolve() if args.session else base / "session.sqlite"
        mutants = every_mutant = enumerate_mutants(copies[0], args.files, session)
        carried = carry_over(mutants, Path(args.update)) if args.update else 0
        if args.limit:
            mutants = mutants[: args.limit]
        equivalents = load_equivalents(ROOT / args.equivalent)
        print(f"{len(mutants)} mutants in {len(args.files)} files ({carried} killed in the earlier run); profile {PROFILE}; "
              f"{len(copies)} workers; stages {args.stages}", flush=True)

        needed = sorted({fast_tests_for(m.file) for m in mutants} | {fast_tests_for(f) for f in args.files})
        if args.stages == "all":
            needed.append(SCENARIO_TESTS)
        base_times = baseline(copies[0], needed, logs)
        timeouts = {t: TIMEOUT_FACTOR * s + TIMEOUT_MARGIN_S for t, s in base_times.items()}
        check_known_bad(copies[0], every_mutant, args.files, timeouts, logs)

        run_mutants(mutants, copies, args.stages, timeouts, logs)
        warnings = apply_triage(mutants, equivalents)
        elapsed = time.monotonic() - t0
        header = [
            "kvparity mutation score (scripts/mutation_score.py), cosmic-ray operators: all defaults",
            f"revision {_git_revision()}; Hypothesis profile '{PROFILE}'; stages: {args.stages}; "
            f"workers: {len(copies)}; Triton interpreter on CPU",
            "files: " + " ".join(args.files),
            "baseline: " + "; ".join(f"{' '.join(t)} {s:.1f} s (timeout {timeouts[t]:.0f} s)"
                                     for t, s in base_times.items()),
            *([f"updated from an earlier run: {carried} mutants it killed were kept, the others re-run"]
              if args.update else []),
            f"known-bad mutants killed: {sum(1 for f in args.files if f in KNOWN_BAD)}; "
            f"wall time {elapsed / 60:.1f} min",
        ]
        text = report(mutants, header, warnings)
        print(text, end="")
        if args.output:
            Path(args.output).write_text(text)
        if args.json:
            Path(args.json).write_text(json.dumps(
                {"header": header, "mutants": [dict(dataclasses.asdict(m), key=m.key()) for m in mutants]},
                indent=1))
        return 0
    except Refused as exc:
        print(f"mutation_score: refusing to report a score: {exc}", file=sys.stderr)
        return 2
    finally:
        if args.keep:
            print(f"kept: {base}", file=sys.stderr)
        else:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
