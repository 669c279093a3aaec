"""``kvparity check``: the main job.

Without ``--candidate``: this repository's refactored path against the legacy reference, over
every scenario template, in every world this machine can run (or those ``--backend`` names).
With ``--candidate SPEC``: the candidate function, in SGLang's own signature, against the
legacy reference on inputs that satisfy SPEC section 8 (``kvparity.candidate.check``).

Without a candidate, the first failing scenario is printed the moment it is found, with a command
that replays it (``--replay FILE``); then it is shrunk within ``--shrink-budget`` seconds and
printed again, shrunk.

``--drive`` chooses what decides: ``harness`` (kvparity's scheduler loop plays step scenarios, so
every world gets identical decisions and the memory path is compared alone), ``scheduler`` (traffic
scenarios through a scheduler, SGLang's own for real releases, kvparity's model of it otherwise:
the decisions are compared, ``kvparity.cli.traffic``) or ``both`` (the scheduler-driven half first,
then the harness-driven one, and both verdicts at the end; what the main job runs). The default is
``harness``, what ``check`` always did.

Exit status: 0 parity, 1 a divergence (in either half), 2 a usage or loading error (or an output
file that could not be written after all: the verdict has been printed first).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvparity.candidate.targets import CHECK_TARGETS, REGISTRY, WHOLE_PATH
from kvparity.cli.paths import output_path_problem, positive_number_problem, write_problem
from kvparity.model.scenario import scenario_from_dict, scenario_to_dict
from kvparity.model.worlds import MODELLED_RELEASES

USAGE_ERROR = 2
DEFAULT_EXAMPLES = 880  # scenarios, 80 per template
DEFAULT_CANDIDATE_EXAMPLES = 200  # kernel-level batches (kvparity.candidate.check.default_examples: 2000 in nightly)
DEFAULT_REAL_EXAMPLES = 440  # scenarios with real SGLang worlds, 40 per template
DRIVES = ("harness", "scheduler", "both")


def add(commands: argparse._SubParsersAction, parser_class: type) -> None:
    text = "check a refactor (this repository's, or a candidate function) against the legacy reference"
    sub = commands.add_parser("check", help=text, description=text)
    sub.add_argument("--target", choices=CHECK_TARGETS, default=WHOLE_PATH)
    sub.add_argument("--candidate", metavar="SPEC", help="package.module:name or path/to/file.py:name")
    sub.add_argument("--backend", choices=("triton", "torch", "all"), default=None,
                     help="the worlds' backends (default all); not for --candidate, which runs as it is")
    sub.add_argument("--jobs", type=int, default=None, metavar="N",
                     help="worker processes for scenarios (default: the usable cores); not for --candidate")
    sub.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda when available, else cpu")
    sub.add_argument("--examples", type=int, default=None, metavar="N",
                     help=f"scenarios to play (default {DEFAULT_EXAMPLES}); with --candidate, batches to draw (default "
                          f"{DEFAULT_CANDIDATE_EXAMPLES}, 2000 in the nightly profile), about one in 32 of them "
                          "(at least one per size range) wide batches past the kernels' request blocks; Hypothesis "
                          "draws some batches twice and a repeat is played once, so the report says how many "
                          "distinct batches were played of how many drawn")
    sub.add_argument("--drive", choices=DRIVES, default=None,
                     help="what decides admission: harness (kvparity's loop, identical decisions in every world: the "
                          "memory path alone), scheduler (traffic scenarios through SGLang's own scheduler, or "
                          "kvparity's model of it: the decisions compared, per schedule policy and event loop) or "
                          "both (what the main job runs); default harness")
    sub.add_argument("--traffic-examples", type=int, default=None, metavar="N",
                     help="traffic scenarios per schedule policy and event loop in the scheduler-driven check "
                          "(default 40)")
    sub.add_argument("--seed", type=int, default=None, help="random seed (default: derandomized, same every run)")
    sub.add_argument("--profile", default="ci",
                     help="Hypothesis profile: ci, dev, nightly, mutation. It sizes scenarios and candidate batches "
                          "(ci: up to 560 requests, rows past 1,024 tokens, slots up to 2**31 - 1, page sizes 1-256; "
                          "nightly: up to 8,192 requests, rows past 8,192 tokens); mutation does not shrink")
    sub.add_argument("--sglang", metavar="A", help="check real SGLang A (a version such as 0.5.3, or a folder holding "
                     "the sglang package): against kvparity's model of the same version, or against --against B")
    sub.add_argument("--against", metavar="B", help="the reference for --sglang: another real SGLang (version or folder)")
    sub.add_argument("--tree-class", choices=("unified", "radix"), default=None,
                     help="the radix cache real SGLang 0.5.19+ builds: unified (UnifiedRadixCache, what a server builds; "
                          "the default) or radix (RadixCache, which those releases still ship)")
    sub.add_argument("--shrink-budget", type=float, default=None, metavar="S",
                     help="seconds the first failure may be shrunk for (default 45: enough for every real-SGLang "
                          "mutant of kvparity's zoo on 2 cores); when they run out, the smallest failing scenario "
                          "found so far is reported, and says so")
    sub.add_argument("--no-shrink", action="store_true", help="report the first failure as found, unshrunk")
    sub.add_argument("--replay", metavar="FILE",
                     help="play one scenario (JSON: as a run saves it, or the --json verdict of a run) in this run's "
                          "worlds instead of a sweep; exit 0 when they agree, 1 when not")
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
    # The real releases start importing now, in zygotes that every worker of the run is forked
    # from, while this process imports the kernels and the jobs start (kvparity.engine.real.zygote).
    with _zygotes(real):
        return _run(args, real)


def _zygotes(real: RealRun | None) -> Any:
    if real is None:
        return contextlib.nullcontext()
    from kvparity.engine.real import PLAY_PLUGINS
    from kvparity.engine.real.zygote import Zygotes

    return Zygotes(real.specs, PLAY_PLUGINS)


def _run(args: argparse.Namespace, real: RealRun | None) -> int:
    try:
        from kvparity.kernels import runtime
    except RuntimeError as exc:  # e.g. --device cuda without CUDA
        print(f"kvparity check: {exc}", file=sys.stderr)
        return USAGE_ERROR
    from kvparity.model import profiles

    try:
        profiles.load(args.profile)
    except ValueError as exc:
        where = "" if isinstance(exc, profiles.MaxExamplesError) else "--profile: "
        print(f"kvparity check: {where}{exc}", file=sys.stderr)
        return USAGE_ERROR
    args.backend = args.backend or "all"
    args.jobs = args.jobs or usable_cores()
    print(f"kvparity check: target {args.target}; {runtime.describe()}; profile {args.profile}"
          + (f", seed {args.seed}" if args.seed is not None else ", derandomized"), flush=True)
    if args.replay_traffic is not None:
        return _replay_traffic(args, real)
    drive = args.drive or "harness"
    args.scheduler_json = None
    if drive == "harness":
        return _run_harness(args, real)
    from kvparity.cli.traffic import players

    pair = players(real)
    if isinstance(pair, str):
        if drive == "scheduler":
            print(f"kvparity check: --drive scheduler: {pair}", file=sys.stderr)
            return USAGE_ERROR
        print(f"kvparity check: scheduler-driven check not run: {pair}", flush=True)
        return _run_harness(args, real)
    from kvparity.engine.real import RealSGLangError

    try:
        status, args.scheduler_json = _scheduler_half(args, pair)
    except RealSGLangError as exc:  # a release the shell cannot drive, a worker that died or hung
        print(f"kvparity check: scheduler-driven: {exc}", file=sys.stderr)
        return USAGE_ERROR
    if drive == "scheduler":
        return _write_files(args, {"json": lambda: json.dumps(args.scheduler_json, indent=2, sort_keys=True) + "\n"}
                            if args.json else {}, status)
    harness = _run_harness(args, real)
    print(f"\nverdict, memory path (harness-driven, identical decisions in every world): "
          f"{_STATUS_WORDS.get(harness, f'ERROR (exit {harness})')}")
    print(f"verdict, admission (scheduler-driven): {args.scheduler_json['summary']}", flush=True)
    return harness if harness == USAGE_ERROR else max(harness, status)


_STATUS_WORDS = {0: "PARITY", 1: "DIVERGENCE"}


def _scheduler_half(args: argparse.Namespace, pair: tuple[Any, Any]) -> tuple[int, dict[str, Any]]:
    from kvparity.cli.traffic import check_scheduler
    from kvparity.run.minimize import DEFAULT_BUDGET_S
    from kvparity.run.traffic_sweep import DEFAULT_TRAFFIC_EXAMPLES

    args.traffic_examples = args.traffic_examples or DEFAULT_TRAFFIC_EXAMPLES
    args.shrink_budget_s = args.shrink_budget or DEFAULT_BUDGET_S
    try:
        return check_scheduler(args, pair, lambda path: replay_argv(args, path, drive="scheduler"))
    finally:
        for player in pair:
            player.close()


def _replay_traffic(args: argparse.Namespace, real: RealRun | None) -> int:
    from kvparity.cli.traffic import players, replay_traffic

    pair = players(real)
    if isinstance(pair, str):
        print(f"kvparity check: --replay {args.replay}: {pair}", file=sys.stderr)
        return USAGE_ERROR
    from kvparity.engine.real import RealSGLangError

    try:
        return replay_traffic(args.replay_traffic, pair, args.replay)
    except RealSGLangError as exc:
        print(f"kvparity check: --replay {args.replay}: {exc}", file=sys.stderr)
        return USAGE_ERROR
    finally:
        for player in pair:
            player.close()


def _run_harness(args: argparse.Namespace, real: RealRun | None) -> int:
    if real is not None:
        return _check_real(args, real)
    if args.tree_class is not None:
        print("kvparity check: --tree-class chooses the radix cache of real SGLang: it needs --sglang", file=sys.stderr)
        return USAGE_ERROR
    if args.candidate is None:
        if args.target != WHOLE_PATH:
            print(f"kvparity check: --target {args.target} needs --candidate (without one, kvparity checks this "
                  "repository's whole prepare_for_extend path)", file=sys.stderr)
            return USAGE_ERROR
        return _check_repository(args)
    return _check_candidate(args)


MAX_EXAMPLES = 1_000_000


def usable_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def _option_problem(args: argparse.Namespace) -> str | None:
    """The first option that is wrong, or does not apply to this mode, in one sentence."""
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
    problem = positive_number_problem("--shrink-budget", args.shrink_budget)
    if problem:
        return problem
    if args.no_shrink and args.shrink_budget is not None:
        return "--no-shrink and --shrink-budget contradict each other: give one"
    if args.candidate is not None and (args.no_shrink or args.shrink_budget is not None or args.replay):
        return "--shrink-budget, --no-shrink and --replay are for scenario runs, not --candidate"
    for option in ("json", "repro", "markdown"):
        problem = output_path_problem(f"--{option}", getattr(args, option))
        if problem:
            return problem
    return _replay_problem(args)


def _replay_problem(args: argparse.Namespace) -> str | None:
    """Read ``--replay FILE`` into ``args.replay_scenario``; why it cannot be read, if it cannot."""
    args.replay_scenario = args.replay_traffic = None
    if args.replay is None:
        return None
    # Here, not at the top: the traffic model imports the shared caches, which fix the device.
    from kvparity.model.traffic import is_traffic_dict, traffic_from_dict

    try:
        data = json.loads(Path(args.replay).read_text())
        if isinstance(data, dict) and "verdict" in data:  # a --json verdict: its counterexample
            data = (data.get("counterexample") or {}).get("scenario")
            if data is None:
                return f"--replay {args.replay}: the verdict it holds has no counterexample"
        if is_traffic_dict(data):
            args.replay_traffic = traffic_from_dict(data)
            return (None if args.drive in (None, "scheduler") else
                    f"--replay {args.replay} holds a traffic scenario: it replays scheduler-driven, not --drive {args.drive}")
        args.replay_scenario = scenario_from_dict(data)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        return f"--replay {args.replay}: no scenario can be read from it ({exc!r})"
    if args.drive == "scheduler":
        return f"--replay {args.replay} holds a step scenario: it replays harness-driven, not --drive scheduler"
    return None


def _worlds(backend: str) -> tuple[tuple[str, str], ...]:
    from kvparity.run.runner import EXTRA_WORLDS  # after the device is chosen: it imports the kernels

    backends = ("torch", "triton") if backend == "all" else (backend,)
    reference = ("legacy", backends[0])
    others = [(v, b) for v in ("legacy", "refactored") for b in backends if (v, b) != reference]
    others += [w for w in EXTRA_WORLDS if w[1] in backends]
    return (reference, *others)


# The version kvparity's own model implements, per SGLang release it models.
MODELLED = MODELLED_RELEASES


def _real_usage_problem(args: argparse.Namespace) -> str | None:
    if args.sglang is None:
        return "--against needs --sglang (the real SGLang to check against it)"
    if args.candidate is not None:
        return "--sglang checks a real SGLang's whole path and takes no --candidate"
    if args.target != WHOLE_PATH:
        return f"--sglang checks the whole prepare_for_extend path; --target {args.target} does not apply"
    return None


@dataclass(frozen=True)
class RealRun:
    """The real SGLang a run checks: the sources, resolved (installed) before anything else."""

    checked: Any  # install.SGLangSource
    reference: Any  # the --against source, or None
    tree_cores: bool  # no --against: the checked release's Python tree core against its Rust one

    @property
    def specs(self) -> list[Any]:
        return [self.checked] if self.reference is None else [self.reference, self.checked]


def _resolve_real(args: argparse.Namespace) -> RealRun | int:
    """``--sglang A [--against B]`` resolved (installing a release on first use), or exit 2."""
    problem = _real_usage_problem(args)
    if problem:
        print(f"kvparity check: {problem}", file=sys.stderr)
        return USAGE_ERROR
    from kvparity.engine.real import RealSGLangError
    from kvparity.engine.real.install import resolve

    try:
        checked = resolve(args.sglang)
        reference = resolve(args.against) if args.against is not None else None
    except RealSGLangError as exc:
        print(f"kvparity check: {exc}", file=sys.stderr)
        return USAGE_ERROR
    # Without --against: a release kvparity models is checked against its model; a release with
    # two radix-tree cores, its Python core against its Rust one (the server's, the reference).
    tree_cores = reference is None and len(checked.entry.tree_cores) > 1
    if reference is None and checked.version not in MODELLED and not tree_cores:
        print(f"kvparity check: --sglang {args.sglang}: kvparity models only {', '.join(MODELLED)}; "
              f"give the reference with --against (e.g. --against 0.5.3.post1)", file=sys.stderr)
        return USAGE_ERROR
    return RealRun(checked, reference, tree_cores)


def _check_real(args: argparse.Namespace, real: RealRun) -> int:
    """``--sglang A [--against B]``: real SGLang A against real B, or against kvparity's model."""
    from kvparity.engine.real import RealSGLangError
    from kvparity.engine.real.lane import RealLane

    backends = ("torch", "triton") if args.backend == "all" else (args.backend,)
    try:  # a worker starts on first use: in each job when jobs > 1
        lane = RealLane(real.specs, backends, tree_class=args.tree_class)
    except RealSGLangError as exc:
        print(f"kvparity check: {exc}", file=sys.stderr)
        return USAGE_ERROR
    with lane:
        if real.reference is None and not real.tree_cores:
            worlds: tuple[tuple[str, str], ...] = ((MODELLED[real.checked.version], backends[0]),)
        else:
            worlds = (("legacy", "torch"),)  # only decides where a scenario leaves the server's path
        return _check_repository(args, worlds=worlds, lane=lane, real_reference=real.reference is not None or real.tree_cores,
                                 default_examples=DEFAULT_REAL_EXAMPLES,
                                 lane_factory=functools.partial(RealLane, real.specs, backends, tree_class=args.tree_class))


def _check_repository(
    args: argparse.Namespace,
    *,
    worlds: tuple[tuple[str, str], ...] | None = None,
    lane: object = None,
    real_reference: bool = False,
    default_examples: int = DEFAULT_EXAMPLES,
    lane_factory: Callable[[], Any] | None = None,
) -> int:
    from kvparity.cli.watch import ConsoleEvents, ScenarioFiles
    from kvparity.model.strategies import TEMPLATES
    from kvparity.run.minimize import DEFAULT_BUDGET_S
    from kvparity.run.plan import per_template
    from kvparity.run.sweep import check_repository

    worlds = worlds or _worlds(args.backend)
    if args.replay_scenario is not None:
        return _replay(args, worlds, lane, real_reference)
    examples = args.examples or default_examples
    print(f"kvparity check: {examples} scenarios ({per_template(examples)} per template), {args.jobs} jobs", flush=True)
    budget = None if args.no_shrink else (args.shrink_budget or DEFAULT_BUDGET_S)
    files = ScenarioFiles()
    planned = per_template(examples) * len(TEMPLATES)
    events = ConsoleEvents(planned, lambda path: replay_argv(args, path), budget, files)
    from kvparity.engine.real.worker import WorkerStartError

    try:
        verdict = check_repository(worlds, examples, args.seed, lane=lane, real_reference=real_reference,
                                   jobs=args.jobs, lane_factory=lane_factory, events=events, shrink_budget_s=budget)
    except WorkerStartError as exc:  # a release or folder whose SGLang does not import here
        events.close()
        print(f"kvparity check: {exc}", file=sys.stderr)
        return USAGE_ERROR
    finally:
        events.close()
    shrunk_command = None
    if verdict.failure is not None:
        shrunk_command = events.command_for("counterexample", verdict.failure.scenario)
        verdict.counterexample = format_counterexample(verdict, shrunk_command)
    _print_verdict(verdict)
    first = verdict.first_failure
    return _write_outputs(args, verdict, {
        "first_divergence": None if first is None else {
            "scenario": scenario_to_dict(first.scenario), "template": first.template,
            "seconds": None if events.found_after_s is None else round(events.found_after_s, 1),
            "report": format_failure(first.result)},
        "shrinking": None if verdict.shrink is None else {
            "tried": verdict.shrink.tried, "complete": verdict.shrink.complete,
            "seconds": round(verdict.shrink.seconds, 1), "budget_s": budget},
        "replay": shrunk_command,
        "scheduler": getattr(args, "scheduler_json", None),
    })


def format_failure(result: Any, replay: str | None = None) -> str:
    from kvparity.report.failure import format_failure as report

    return report(result, replay=replay)


def format_counterexample(verdict: Any, replay: str) -> str:
    """The shrunk counterexample's report, headed by how shrinking went."""
    from kvparity.cli.watch import size

    shrink, first = verdict.shrink, verdict.first_failure
    if shrink is None:
        head = "counterexample, not shrunk (--no-shrink):"
    elif shrink.scenario == first.scenario:
        head = (f"shrunk counterexample: none of {shrink.tried} smaller scenarios fails "
                f"({shrink.seconds:.0f} s); it is the failure as found:")
    elif shrink.complete:
        head = (f"shrunk counterexample: {size(first.scenario)} down to {size(shrink.scenario)}; "
                f"{shrink.tried} smaller scenarios tried in {shrink.seconds:.0f} s, and nothing one removal smaller fails:")
    else:
        head = (f"smallest counterexample found when the shrinking budget ran out ({shrink.seconds:.0f} s, "
                f"{shrink.tried} smaller scenarios tried): {size(first.scenario)} down to {size(shrink.scenario)}; "
                "it may not be minimal (--shrink-budget S gives it longer):")
    return head + "\n" + format_failure(verdict.failure, replay=replay)


def replay_argv(args: argparse.Namespace, path: Path, drive: str | None = None) -> list[str]:
    """The command line that replays the scenario in ``path`` in this run's worlds (``drive``:
    "scheduler" for a traffic scenario)."""
    argv = ["kvparity", "check"]
    options: tuple[tuple[str, str | None], ...] = (("--sglang", args.sglang), ("--against", args.against),
                                                   ("--drive", drive))
    if drive is None:
        options += (("--backend", args.backend), ("--tree-class", args.tree_class), ("--device", args.device))
    for option, value in options:
        if value is not None:
            argv += [option, value]
    return argv + ["--replay", str(path)]


def _replay(args: argparse.Namespace, worlds: tuple[tuple[str, str], ...], lane: object, real_reference: bool) -> int:
    """``--replay FILE``: one scenario in this run's worlds, reported as a sweep reports a failure."""
    from kvparity.report.failure import format_findings
    from kvparity.run.runner import run_scenario

    result = run_scenario(args.replay_scenario, worlds, lane=lane, real_reference=real_reference)
    print(f"kvparity check: replayed {args.replay}: {result.stages} stages in {len(result.worlds)} worlds")
    if result.findings:
        print("known defects and release differences reached:\n" + format_findings(result))
    if result.ok:
        print("verdict: PARITY (all worlds agree and every oracle holds)")
        return 0
    print(format_failure(result, replay=shlex.join(replay_argv(args, Path(args.replay)))))
    print("verdict: DIVERGENCE")
    return 1


def _print_verdict(verdict: Any) -> None:
    from kvparity.judge.compare import KNOWN_VERSION_DIFFERENCES, RENUMBERED_BETWEEN_RELEASES
    from kvparity.model.classes import REQUIRED

    names = verdict.worlds
    width = max(42, *(len(f"{names[0]} vs {n}") for n in names[1:]))
    print(f"{'world pair':<{width}} {'scenarios':>9}  verdict")
    for name in names[1:]:
        pair = f"{names[0]} vs {name}"
        print(f"{pair:<{width}} {verdict.scenarios:>9}  {'DIVERGENCE' if name in verdict.diverged else 'parity'}")
    for world, kernels in sorted(verdict.kernels.items()):
        print(f"kernels: {world}: allocation {kernels['alloc']}, req_to_token writes {kernels['write']}, "
              f"radix-tree core {kernels['tree_core']}")
    reached = f"scenario classes reached: {len(verdict.required_reached)}/{len(REQUIRED)}"
    if verdict.failure is not None:  # a run cut short at its first failure: what it missed says nothing
        print(f"{reached} (the run stopped at its first divergence)")
    else:
        print(reached)
        for missing in (c for c in REQUIRED if c not in verdict.classes):
            print(f"  not reached: {missing}")
    for defect, count in sorted(verdict.findings.items()):
        between_releases = defect in KNOWN_VERSION_DIFFERENCES or defect == RENUMBERED_BETWEEN_RELEASES
        kind = "known difference between releases" if between_releases else "known defect reported"
        print(f"{kind}: {defect}, in {count} scenarios; not a divergence")
        if defect in verdict.finding_examples:
            print("  " + first_seen(verdict.finding_examples[defect]).replace("\n", "\n    "))
    if verdict.counterexample:
        print("\n" + verdict.counterexample)
    rate = verdict.scenarios / verdict.seconds if verdict.seconds > 0 else 0.0
    for gpu, count in sorted(verdict.per_device.items()):
        print(f"GPU {gpu}: {count} scenarios")
    print(f"verdict: {verdict.verdict.upper()} ({verdict.scenarios} scenarios in {verdict.seconds:.0f} s, "
          f"{rate:.1f} per second)", flush=True)


def first_seen(example: Any) -> str:
    """A known defect's first example: what was seen, and the scenario (shrunk when it could be)."""
    from kvparity.cli.watch import size

    shrunk = "" if example.original is None else f" (shrunk from {size(example.original)} to {size(example.scenario)})"
    return f"first seen{shrunk}: {example.what}: {example.detail}\n{example.scenario.to_python()}"


def _write_outputs(args: argparse.Namespace, verdict: Any, extra: dict) -> int:
    """The verdict's files (--json, --repro, --markdown), once it has been printed. A file that
    cannot be written after all is exit 2 with one sentence; the others are still written."""
    from kvparity.model.classes import REQUIRED
    from kvparity.report.markdown import check_markdown

    rate = verdict.scenarios / verdict.seconds if verdict.seconds > 0 else 0.0
    texts: dict[str, Callable[[], str]] = {}
    if args.json:
        texts["json"] = lambda: json.dumps({
            "target": args.target,
            "verdict": verdict.verdict,
            "worlds": list(verdict.worlds),
            "scenarios": verdict.scenarios,
            "classes_reached": verdict.required_reached,
            "classes_required": len(REQUIRED),
            "known_defects": {d: {"scenarios": n, "first_seen": _first_seen_or_none(verdict, d)}
                              for d, n in sorted(verdict.findings.items())},
            "counterexample": None if verdict.scenario is None else {
                "scenario": scenario_to_dict(verdict.scenario), "report": verdict.counterexample},
            **extra,
            "seconds": round(verdict.seconds, 1),
            "scenarios_per_second": round(rate, 2),
            "scenarios_per_gpu": dict(sorted(verdict.per_device.items())),
            "kernels": dict(sorted(verdict.kernels.items())),
        }, indent=2, sort_keys=True) + "\n"
    if args.repro and verdict.scenario is not None:
        texts["repro"] = lambda: _repro_script(args, verdict)
    if args.markdown:
        texts["markdown"] = lambda: check_markdown(verdict)
    return _write_files(args, texts, 0 if verdict.verdict == "parity" else 1)


def _first_seen_or_none(verdict: Any, defect: str) -> str | None:
    example = verdict.finding_examples.get(defect)
    return None if example is None else first_seen(example)


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


def _repro_script(args: argparse.Namespace, verdict: Any) -> str:
    check = replay_argv(args, Path("SCENARIO"))[2:-2]  # the world options: what `kvparity check` plays in
    first = verdict.first_failure.scenario if verdict.first_failure is not None else verdict.scenario
    return f'''"""Replays a kvparity counterexample in the worlds of the run that found it (run from a kvparity
checkout, or with kvparity installed): exit 1 and a report while the worlds disagree, 0 once they agree.

    python {Path(args.repro).name}            the counterexample (shrunk)
    python {Path(args.repro).name} --first    the failure as first found, before shrinking
"""

import json
import sys
import tempfile

from kvparity.cli.main import main
from kvparity.model.scenario import Decode, Evict, Extend, RequestSpec, Retract, Scenario, scenario_to_dict  # noqa: F401
from kvparity.model.worlds import Geometry  # noqa: F401

CHECK = {check!r}  # `kvparity check` options naming the worlds

scenario = {verdict.scenario.to_python()}

first_found = {first.to_python()}

chosen = first_found if "--first" in sys.argv[1:] else scenario
with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as saved:
    json.dump(scenario_to_dict(chosen), saved)
sys.exit(main(["check", *CHECK, "--replay", saved.name]))
'''


def _check_candidate(args: argparse.Namespace) -> int:
    """The candidate, in a sandboxed child process, against this repository's reference."""
    from kvparity.candidate.check import check_candidate
    from kvparity.candidate.loader import CandidateLoadError
    from kvparity.report.markdown import candidate_markdown

    if args.target not in REGISTRY:  # the whole path: no plug-in target
        print("kvparity check: --target prepare_for_extend takes no candidate (SPEC section 9 gives SGLang's "
              "signatures of write_cache_indices, get_last_loc and alloc_extend_kernel): choose one of those targets",
              file=sys.stderr)
        return USAGE_ERROR
    try:
        result = check_candidate(args.target, args.candidate, args.examples, args.seed, profile=args.profile)
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
