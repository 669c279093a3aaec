"""``kvparity check``: the main job.

Without ``--candidate``: one validated plan (``kvparity.cli.check_plan``), a drive or two
(``--drive harness|scheduler|both``), each swept by the one sweep (``kvparity.run.sweep``) and
reported by the one report (``kvparity.report.console``): ``harness`` plays step scenarios through
kvparity's own loop in every world (identical decisions: the memory path alone); ``scheduler``
plays traffic scenarios through two schedulers, SGLang's own or kvparity's model of it (the
decisions, and the memory under them, compared per schedule policy and event loop); ``both`` runs
the scheduler-driven half, then the harness-driven one (what the main job runs). The first
difference is printed the moment it is found, with a command that replays it (``--replay FILE``),
then shrunk within ``--shrink-budget`` seconds and printed again.

With ``--candidate SPEC``: the candidate function, in SGLang's own signature, against the legacy
reference on inputs that satisfy SPEC section 8 (``kvparity.candidate.check``).

Exit status: 0 parity, 1 a divergence (in any drive), 2 a usage or loading error (or an output file
that could not be written after all: the verdict has been printed first).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvparity.candidate.targets import CHECK_TARGETS, REGISTRY, WHOLE_PATH
from kvparity.cli.check_plan import (
    DEFAULT_EXAMPLES,
    DEFAULT_TRAFFIC_EXAMPLES,
    DRIVES,
    CheckPlan,
    cache_kinds,
    caches_option,
    check_plans,
    drive_option_problem,
    power_problem,
    registered_caches,
)
from kvparity.cli.paths import output_path_problem, positive_number_problem, write_problem
from kvparity.model.worlds import MODELLED_RELEASES

USAGE_ERROR = 2
DEFAULT_CANDIDATE_EXAMPLES = 200  # kernel-level batches (kvparity.candidate.check.default_examples: 2000 in nightly)
MAX_EXAMPLES = 1_000_000


def add(commands: argparse._SubParsersAction, parser_class: type) -> None:
    text = "check a refactor (this repository's, or a candidate function) against the legacy reference"
    sub = commands.add_parser("check", help=text, description=text)
    sub.add_argument("--target", choices=CHECK_TARGETS, default=WHOLE_PATH)
    sub.add_argument("--candidate", metavar="SPEC", help="package.module:name or path/to/file.py:name")
    sub.add_argument("--backend", choices=("triton", "torch", "all"), default=None,
                     help="the worlds' backends (default all; harness-driven); not for --candidate, which runs as it is")
    sub.add_argument("--jobs", type=int, default=None, metavar="N",
                     help="processes the tasks are shared out over (default: the usable cores); not for --candidate")
    sub.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda when available, else cpu")
    sub.add_argument("--examples", type=int, default=None, metavar="N",
                     help=f"harness-driven scenarios to play (default {DEFAULT_EXAMPLES}); with --candidate, batches to "
                          f"draw (default {DEFAULT_CANDIDATE_EXAMPLES}, 2000 in the nightly profile), about one in 32 of "
                          "them (at least one per size range) wide batches past the kernels' request blocks; Hypothesis "
                          "draws some batches twice and a repeat is played once, so the report says how many "
                          "distinct batches were played of how many drawn")
    sub.add_argument("--drive", choices=DRIVES, default=None,
                     help="what decides admission: harness (kvparity's loop, identical decisions in every world: the "
                          "memory path alone), scheduler (traffic scenarios through SGLang's own scheduler, or "
                          "kvparity's model of it: the decisions and the memory under them, per schedule policy and "
                          "event loop) or both (what the main job runs); default harness, or both for --sglang A "
                          "--against B with a hybrid model in --caches or with --nemesis")
    sub.add_argument("--traffic-examples", type=int, default=None, metavar="N",
                     help=f"scheduler-driven traffic scenarios per schedule policy and event loop "
                          f"(default {DEFAULT_TRAFFIC_EXAMPLES})")
    sub.add_argument("--caches", type=caches_option, default=None, metavar="C[,C...]",
                     help="the models scheduler-driven tasks serve, of full (full attention), swa (a sliding-window "
                          "model), mamba (a hybrid linear model), hicache (full attention with a host tier) and "
                          "hicache-mamba (a Mamba model with a host tier, 0.5.16+); default: full, swa and mamba "
                          "where both releases serve them (the hybrid ones and the host tiers real release against "
                          "real release only)")
    sub.add_argument("--undo-changes", action="store_true", default=None,
                     help="play --sglang B with its own changes that kvparity names since --against A undone "
                          "(kvparity/engine/releases.py: those that say how); parity then says the two releases "
                          "differ by those changes alone (scheduler-driven, real against real)")
    sub.add_argument("--nemesis", action="store_true", default=None,
                     help="draw client aborts into the traffic scenarios (after a delay, or on a state of the "
                          "request's life), sent through each release's own Scheduler.abort_request; retraction "
                          "forced by SGLang's test switch (0.5.4+); fewer request rows than the burst; with a host "
                          "tier, its storage tier always, whose calls fail (SGLang's failure injector from 0.5.23, "
                          "kvparity's faulty backend before) (scheduler-driven, real against real; issue 48's nemesis)")
    sub.add_argument("--power", metavar="P%",
                     help="play as many scenarios per task (template, or schedule policy and event loop) as rule out, "
                          "with 95%% probability, any difference reached by more than P%% of them (2%%: 149 a task); "
                          "instead of --examples and --traffic-examples")
    sub.add_argument("--seed", type=int, default=None, help="random seed (default: derandomized, same every run)")
    sub.add_argument("--profile", default=None,
                     help="Hypothesis profile (harness-driven and --candidate): ci (the default), dev, nightly, "
                          "mutation. It sizes scenarios and candidate batches (ci: up to 560 requests, rows past 1,024 "
                          "tokens, slots up to 2**31 - 1, page sizes 1-256; nightly: up to 8,192 requests, rows past "
                          "8,192 tokens); mutation does not shrink")
    sub.add_argument("--sglang", metavar="A", help="check real SGLang A (a version such as 0.5.3, or a folder holding "
                     "the sglang package): against kvparity's model of the same version, or against --against B")
    sub.add_argument("--against", metavar="B", help="the reference for --sglang: another real SGLang (version or folder)")
    sub.add_argument("--tree-class", choices=("unified", "radix"), default=None,
                     help="the radix cache real SGLang 0.5.19+ builds (harness-driven): unified (UnifiedRadixCache, "
                          "what a server builds; the default) or radix (RadixCache, which those releases still ship)")
    sub.add_argument("--shrink-budget", type=float, default=None, metavar="S",
                     help="seconds a first difference may be shrunk for (default 45: enough for every real-SGLang "
                          "mutant of kvparity's zoo on 2 cores); when they run out, the smallest failing scenario "
                          "found so far is reported, and says so")
    sub.add_argument("--no-shrink", action="store_true", help="report the first difference as found, unshrunk")
    sub.add_argument("--replay", metavar="FILE",
                     help="play one scenario (JSON: as a run saves it, or the --json verdict of a run) in this run's "
                          "worlds or schedulers instead of a sweep; exit 0 when they agree, 1 when not")
    sub.add_argument("--json", metavar="PATH", help="write the verdict as JSON")
    sub.add_argument("--repro", metavar="PATH", help="write a script that replays the counterexample (shrunk, or as "
                     "first found with --first)")
    sub.add_argument("--markdown", metavar="PATH",
                     help="write the verdict table, and the first difference if any, as Markdown (a CI job summary)")
    sub.set_defaults(func=run)


def _choose_device(device: str | None) -> str | None:
    """Fix the device before the kernels are imported; None when that is no longer possible."""
    if device is None:
        return "auto"
    if "kvparity.kernels.runtime" in sys.modules:
        from kvparity.kernels import runtime

        return device if runtime.DEVICE.type == device else None
    os.environ["KVPARITY_DEVICE"] = device
    return device


def run(args: argparse.Namespace) -> int:
    if _choose_device(args.device) is None:
        print(f"kvparity check: --device {args.device}: the kernels were already loaded for another device",
              file=sys.stderr)
        return USAGE_ERROR
    try:
        args.caches = registered_caches(args.caches)
    except ValueError as exc:
        print(f"kvparity check: {exc}", file=sys.stderr)
        return USAGE_ERROR
    problem = _option_problem(args)
    if problem:
        print(f"kvparity check: {problem}", file=sys.stderr)
        return USAGE_ERROR
    if args.candidate is None and args.replay is None and (args.jobs or usable_cores()) > 1:
        from kvparity.engine.processes import start_early

        start_early(real_sglang=args.sglang is not None)  # the jobs' fork server imports while this process does
    real: RealRun | None = None
    if args.sglang is not None or args.against is not None:
        found = _resolve_real(args)
        if isinstance(found, int):
            return found
        real = found
    # The real releases start importing now, in zygotes that every worker of the run (either drive's)
    # is forked from, while this process imports the kernels and the jobs start (kvparity.engine.real.zygote).
    with _zygotes(real):
        return _run(args, real)


def _zygotes(real: RealRun | None) -> Any:
    if real is None:
        return contextlib.nullcontext()
    from kvparity.engine.real.door import WORKER_PLUGINS, Zygotes

    return Zygotes(real.specs, WORKER_PLUGINS)


def _run(args: argparse.Namespace, real: RealRun | None) -> int:
    try:
        from kvparity.kernels import runtime
    except RuntimeError as exc:  # e.g. --device cuda without CUDA
        print(f"kvparity check: {exc}", file=sys.stderr)
        return USAGE_ERROR
    from kvparity.model import profiles

    profile = args.profile or "ci"
    try:
        profiles.load(profile)
    except ValueError as exc:
        where = "" if isinstance(exc, profiles.MaxExamplesError) else "--profile: "
        print(f"kvparity check: {where}{exc}", file=sys.stderr)
        return USAGE_ERROR
    args.jobs = args.jobs or usable_cores()
    print(f"kvparity check: target {args.target}; {runtime.describe()}; profile {profile}"
          + (f", seed {args.seed}" if args.seed is not None else ", derandomized"), flush=True)
    if args.candidate is not None:
        return _check_candidate(args)
    from kvparity.run.minimize import DEFAULT_BUDGET_S

    budget = None if args.no_shrink else (args.shrink_budget or DEFAULT_BUDGET_S)
    plans = check_plans(args, real, args.jobs, budget)
    if isinstance(plans, str):
        print(f"kvparity check: {plans}", file=sys.stderr)
        return USAGE_ERROR
    if args.replay is not None:
        return _replay(args, plans)
    return _sweeps(args, plans)


# ---- sweeping -----------------------------------------------------------------------------------


@dataclass
class Swept:
    """One drive of the run, swept: its verdict, the drive and what the report saved."""

    plan: CheckPlan
    verdict: Any  # kvparity.judge.verdict.Verdict
    drive: Any
    status: int


def _sweeps(args: argparse.Namespace, plans: list[CheckPlan]) -> int:
    from kvparity.engine.errors import RealSGLangError

    done: list[Swept] = []
    for plan in plans:
        try:
            done.append(_sweep(args, plan))
        except RealSGLangError as exc:  # a release the shell cannot drive, a worker that cannot start or died
            print(f"kvparity check: {plan.drive}-driven: {exc}", file=sys.stderr)
            return USAGE_ERROR
    if len(done) > 1:
        print()
        for swept in done:
            print(f"verdict, {_DRIVE_WORDS[swept.plan.drive]}: {swept.verdict.summary_line}")
    status = max(s.status for s in done)
    return _write_outputs(args, done, status)


_DRIVE_WORDS = {"harness": "memory path (harness-driven, identical decisions in every world)",
                "scheduler": "admission and memory under it (scheduler-driven)"}


def _sweep(args: argparse.Namespace, plan: CheckPlan) -> Swept:
    from kvparity.cli.watch import ConsoleEvents, ScenarioFiles
    from kvparity.report.console import console_lines
    from kvparity.run.plan import SweepPlan
    from kvparity.run.sweep import sweep

    drive = plan.spec.build()
    try:
        tasks = drive.tasks(plan.examples, plan.seed)
        planned = sum(t.examples for t in tasks)
        unit = "scenarios" if plan.drive == "harness" else "traffic scenarios per policy and loop"
        print(f"\n{plan.drive}-driven: {plan.examples} {unit}, {planned} in all ({len(tasks)} tasks), {plan.jobs} jobs",
              flush=True)
        files = ScenarioFiles()
        events = ConsoleEvents(drive, planned, lambda path: replay_argv(args, path, plan.drive, _model(plan)), plan.shrink_budget_s,
                               files)
        try:
            verdict = sweep(drive, SweepPlan(plan.spec, tuple(tasks), plan.shrink_budget_s), jobs=plan.jobs,
                            events=events)
        finally:
            events.close()
        print("\n".join(console_lines(verdict, drive, events.command_for)), flush=True)
        return Swept(plan, verdict, drive, 0 if verdict.verdict == "parity" else 1)
    finally:
        drive.close()


def replay_argv(args: argparse.Namespace, path: Path, drive: str, model: str = "full") -> list[str]:
    """The command line that replays the scenario in ``path`` in this run's worlds or schedulers
    (``model``: the one a harness plan's worlds serve; a traffic scenario names its own)."""
    argv = ["kvparity", "check"]
    options: tuple[tuple[str, str | None], ...] = (("--sglang", args.sglang), ("--against", args.against),
                                                   ("--drive", None if drive == "harness" else drive))
    if drive == "harness":
        options += (("--backend", args.backend), ("--tree-class", args.tree_class), ("--device", args.device),
                    ("--caches", model if cache_kinds().get(model).hybrid else None))
    for option, value in options:
        if value is not None:
            argv += [option, value]
    if drive == "scheduler" and getattr(args, "undo_changes", None):
        argv.append("--undo-changes")
    return argv + ["--replay", str(path)]


def _model(plan: CheckPlan) -> str:
    """The model a plan's harness worlds serve (full attention for any other plan)."""
    return str(getattr(plan.spec, "model", "full"))


# ---- replaying one scenario ---------------------------------------------------------------------


def _replay(args: argparse.Namespace, plans: list[CheckPlan]) -> int:
    """``--replay FILE``: one scenario, played by the drive its form belongs to and reported as a
    sweep reports a difference."""
    from kvparity.engine.errors import RealSGLangError

    plan = next((p for p in plans if p.drive == args.replay_drive), None)
    if plan is None:
        print(f"kvparity check: --replay {args.replay}: this run has no {args.replay_drive}-driven check", file=sys.stderr)
        return USAGE_ERROR
    drive = plan.spec.build()
    try:
        refusal = drive.refuses(args.replay_scenario) if hasattr(drive, "refuses") else None
        if refusal:
            print(f"kvparity check: --replay {args.replay}: {refusal}", file=sys.stderr)
            return USAGE_ERROR
        played = drive.play(args.replay_scenario)
    except RealSGLangError as exc:
        print(f"kvparity check: --replay {args.replay}: {exc}", file=sys.stderr)
        return USAGE_ERROR
    finally:
        drive.close()
    print(f"kvparity check: replayed {args.replay} ({plan.drive}-driven) in {', '.join(drive.checked)} against "
          f"{drive.reference}")
    for finding in dict.fromkeys(f for f in played.findings if not f.defect):
        print(f"finding (not a divergence): {finding.label}: {finding.line}")
    for finding in dict.fromkeys(played.defects):
        known = f" [a known SGLang defect: {finding.known.line}]" if finding.known else ""
        print(f"DEFECT in a run's own: {finding.label}: {finding.line}{known}")
        if finding.detail:
            print("  " + finding.detail.rstrip().replace("\n", "\n  "))
    if played.agree and not played.defects:
        print("verdict: PARITY (they agree, and every oracle holds)")
        return 0
    if played.agree:
        print("verdict: DEFECT (they agree, but a run broke on its own: above)")
        return 1
    print(drive.report(played, replay=shlex.join(replay_argv(args, Path(args.replay), plan.drive, _model(plan)))))
    print("verdict: DIVERGENCE")
    return 1


# ---- options ------------------------------------------------------------------------------------


def usable_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def _option_problem(args: argparse.Namespace) -> str | None:
    """The first option that is wrong, or does not apply to this run, in one sentence."""
    if args.examples is not None and not 1 <= args.examples <= MAX_EXAMPLES:
        return f"--examples must be from 1 to {MAX_EXAMPLES:,} (got {args.examples})"
    if args.traffic_examples is not None and not 1 <= args.traffic_examples <= MAX_EXAMPLES:
        return f"--traffic-examples must be from 1 to {MAX_EXAMPLES:,} (got {args.traffic_examples})"
    if args.candidate is not None and args.drive not in (None, "harness"):
        return f"--drive {args.drive} does not apply to --candidate (a candidate function is checked harness-driven)"
    if args.jobs is not None and args.jobs < 1:
        return f"--jobs must be at least 1 (got {args.jobs})"
    if args.candidate is not None:
        for option, value in (("--backend", args.backend), ("--jobs", args.jobs)):
            if value is not None:
                return f"{option} does not apply to --candidate (the candidate runs as it is, in one sandbox)"
    if args.candidate is None and args.target != WHOLE_PATH and args.sglang is not None:  # no candidate fits it either
        return f"--sglang checks the whole prepare_for_extend path; --target {args.target} does not apply"
    if args.candidate is None and args.target != WHOLE_PATH:
        return (f"--target {args.target} needs --candidate (without one, kvparity checks this repository's whole "
                "prepare_for_extend path)")
    problem = (drive_option_problem(args) or power_problem(args)
               or positive_number_problem("--shrink-budget", args.shrink_budget))
    if problem:
        return problem
    if args.no_shrink and args.shrink_budget is not None:
        return "--no-shrink and --shrink-budget contradict each other: give one"
    if args.candidate is not None and (args.no_shrink or args.shrink_budget is not None or args.replay):
        return "--shrink-budget, --no-shrink and --replay are for scenario runs, not --candidate"
    if args.tree_class is not None and args.sglang is None:
        return "--tree-class chooses the radix cache of real SGLang: it needs --sglang"
    for option in ("json", "repro", "markdown"):
        problem = output_path_problem(f"--{option}", getattr(args, option))
        if problem:
            return problem
    return _replay_problem(args)


def _replay_problem(args: argparse.Namespace) -> str | None:
    """Read ``--replay FILE`` into ``args.replay_scenario`` (and the drive its form belongs to,
    ``args.replay_drive``); why it cannot be read, or replayed by the chosen drive, if so."""
    args.replay_scenario = args.replay_drive = None
    if args.replay is None:
        return None
    try:
        data = json.loads(Path(args.replay).read_text())
        if isinstance(data, dict) and "verdict" in data:  # a --json verdict: its (shrunk) first difference
            data = _verdict_scenario(data)
            if data is None:
                return f"--replay {args.replay}: the verdict it holds has no difference to replay"
        args.replay_scenario, args.replay_drive = scenario_and_drive(data)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        return f"--replay {args.replay}: no scenario can be read from it ({exc!r})"
    chosen = args.drive or args.replay_drive
    if chosen not in ("both", args.replay_drive):
        form = "a traffic scenario" if args.replay_drive == "scheduler" else "a step scenario"
        return f"--replay {args.replay} holds {form}: it replays {args.replay_drive}-driven, not --drive {chosen}"
    if args.drive is None:
        args.drive = args.replay_drive
    return None


def scenario_and_drive(data: Any) -> tuple[Any, str]:
    """A saved scenario read back, and the drive its form belongs to ("scheduler" for a traffic
    scenario, "harness" for a step scenario)."""
    # Here, not at the top: the traffic model imports the shared caches, which fix the device.
    from kvparity.model.scenario import scenario_from_dict
    from kvparity.model.traffic import is_traffic_dict, traffic_from_dict

    if is_traffic_dict(data):
        return traffic_from_dict(data), "scheduler"
    return scenario_from_dict(data), "harness"


def _verdict_scenario(data: dict[str, Any]) -> dict[str, Any] | None:
    """A --json verdict's first difference, shrunk where it was (a run of both drives: the first
    verdict with one)."""
    for verdict in data.get("verdicts", [data]):
        first = verdict.get("first_difference")
        if first:
            return (first.get("shrunk") or first)["scenario"]
    return None


# ---- real SGLang --------------------------------------------------------------------------------


@dataclass(frozen=True)
class RealRun:
    """The real SGLang a run checks: the sources, resolved (installed) before anything else."""

    checked: Any  # install.SGLangSource
    reference: Any  # the --against source, or None
    tree_cores: bool  # no --against: the checked release's Python tree core against its Rust one

    @property
    def specs(self) -> list[Any]:
        return [self.checked] if self.reference is None else [self.reference, self.checked]


def _real_usage_problem(args: argparse.Namespace) -> str | None:
    if args.sglang is None:
        return "--against needs --sglang (the real SGLang to check against it)"
    if args.candidate is not None:
        return "--sglang checks a real SGLang's whole path and takes no --candidate"
    return None


def _resolve_real(args: argparse.Namespace) -> RealRun | int:
    """``--sglang A [--against B]`` resolved (installing a release on first use), or exit 2."""
    problem = _real_usage_problem(args)
    if problem:
        print(f"kvparity check: {problem}", file=sys.stderr)
        return USAGE_ERROR
    from kvparity.engine.errors import RealSGLangError
    from kvparity.engine.real.door import resolve

    try:
        checked = resolve(args.sglang)
        reference = resolve(args.against) if args.against is not None else None
    except RealSGLangError as exc:
        print(f"kvparity check: {exc}", file=sys.stderr)
        return USAGE_ERROR
    # Without --against: a release kvparity models is checked against its model; a release with
    # two radix-tree cores, its Python core against its Rust one (the server's, the reference).
    tree_cores = reference is None and len(checked.entry.tree_cores) > 1
    if reference is None and checked.version not in MODELLED_RELEASES and not tree_cores:
        print(f"kvparity check: --sglang {args.sglang}: kvparity models only {', '.join(MODELLED_RELEASES)}; "
              f"give the reference with --against (e.g. --against 0.5.3.post1)", file=sys.stderr)
        return USAGE_ERROR
    return RealRun(checked, reference, tree_cores)


# ---- what is written ----------------------------------------------------------------------------


def _write_outputs(args: argparse.Namespace, done: list[Swept], status: int) -> int:
    """The verdict's files (--json, --repro, --markdown), once it has been printed. A file that
    cannot be written after all is exit 2 with one sentence; the others are still written."""
    from kvparity.judge.verdict import VERDICTS, to_json
    from kvparity.report.markdown import check_markdown

    texts: dict[str, Callable[[], str]] = {}
    if args.json:
        def verdict_json() -> str:
            docs = [dict(to_json(s.verdict, s.drive), target=args.target, examples=s.plan.examples, seed=s.plan.seed)
                    for s in done]
            doc = docs[0] if len(docs) == 1 else {
                "drive": "both", "verdict": next(v for v in VERDICTS if any(d["verdict"] == v for d in docs)),
                "summary": "; ".join(f"{d['drive']}-driven: {d['summary']}" for d in docs), "verdicts": docs}
            return json.dumps(doc, indent=2, sort_keys=True) + "\n"

        texts["json"] = verdict_json
    failing = next((s for s in done if s.verdict.shrunk is not None), None)
    if args.repro and failing is not None:
        texts["repro"] = lambda: _repro_script(args, failing)
    if args.markdown:
        texts["markdown"] = lambda: "\n".join(check_markdown(s.verdict, s.drive) for s in done)
    return _write_files(args, texts, status)


def _write_files(args: argparse.Namespace, texts: dict[str, Callable[[], str]], status: int) -> int:
    for option, text in texts.items():
        path = getattr(args, option)
        try:
            Path(path).write_text(text())
        except OSError as exc:
            print(f"kvparity check: {write_problem('--' + option, path, exc)}", file=sys.stderr)
            status = USAGE_ERROR
            continue
        print(f"wrote {path}")
    return status


def _repro_script(args: argparse.Namespace, swept: Swept) -> str:
    example = swept.verdict.shrunk
    check = replay_argv(args, Path("SCENARIO"), swept.plan.drive, _model(swept.plan))[2:-2]  # the options naming the worlds or schedulers
    shown = swept.drive.to_dict(example.shown.scenario)
    found = swept.drive.to_dict(example.found.scenario)
    return f'''"""Replays a kvparity counterexample ({swept.plan.drive}-driven) in the worlds or schedulers of the run
that found it (run from a kvparity checkout, or with kvparity installed): exit 1 and a report while they
differ, 0 once they agree.

    python {Path(args.repro).name}            the counterexample (shrunk)
    python {Path(args.repro).name} --first    the difference as first found, before shrinking
"""

import json
import sys
import tempfile

from kvparity.cli.main import main

CHECK = {check!r}  # `kvparity check` options naming the worlds or schedulers

scenario = {shown!r}

first_found = {found!r}

chosen = first_found if "--first" in sys.argv[1:] else scenario
with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as saved:
    json.dump(chosen, saved)
sys.exit(main(["check", *CHECK, "--replay", saved.name]))
'''


# ---- a candidate function -----------------------------------------------------------------------


def _lifted(spec: str, target: str) -> str:
    """``sglang[==V]:BACKEND``: SGLang's own function for the target, lifted into a file kept beside
    the installed releases (so that a repro script finds it again); any other spec as it is."""
    from kvparity.candidate.lift import is_lift_spec, lift

    if not is_lift_spec(spec):
        return spec
    from kvparity.engine.real.door import cache_root

    folder = cache_root().parent / "lifted"
    folder.mkdir(parents=True, exist_ok=True)
    return lift(spec, target, folder)


def _check_candidate(args: argparse.Namespace) -> int:
    """The candidate, in a sandboxed child process, against this repository's reference."""
    from kvparity.candidate.check import check_candidate
    from kvparity.candidate.loader import CandidateLoadError
    from kvparity.candidate.markdown import candidate_markdown

    if args.target not in REGISTRY:  # the whole path: no plug-in target
        print("kvparity check: --target prepare_for_extend takes no candidate (SPEC section 9 gives SGLang's "
              "signatures of write_cache_indices, get_last_loc and alloc_extend_kernel): choose one of those targets",
              file=sys.stderr)
        return USAGE_ERROR
    try:
        spec = _lifted(args.candidate, args.target)
        result = check_candidate(args.target, spec, args.examples, args.seed, profile=args.profile or "ci")
    except (CandidateLoadError, ValueError) as exc:
        print(f"kvparity check: {exc}", file=sys.stderr)
        return USAGE_ERROR
    print(result.report())
    print(f"verdict: {result.verdict.upper()}", flush=True)
    texts: dict[str, Callable[[], str]] = {}
    if args.json:
        texts["json"] = lambda: json.dumps(result.to_dict(), indent=2, sort_keys=True) + "\n"
    if args.markdown:
        texts["markdown"] = lambda: candidate_markdown(result)
    if args.repro and result.counterexample is not None:
        texts["repro"] = result.repro_script
    return _write_files(args, texts, 0 if result.verdict == "parity" else 1)
