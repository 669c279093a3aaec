"""``kvparity check``: the main job.

Without ``--candidate``: this repository's refactored path against the legacy reference, over
every scenario template, in every world this machine can run (or those ``--backend`` names).
With ``--candidate SPEC``: the candidate function, in SGLang's own signature, against the
legacy reference on inputs that satisfy SPEC section 8 (``kvparity.candidate.check``).

Exit status: 0 parity, 1 a divergence, 2 a usage or loading error.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvparity.candidate.targets import CHECK_TARGETS, REGISTRY, WHOLE_PATH
from kvparity.cli.paths import output_path_problem
from kvparity.model.scenario import scenario_to_dict

USAGE_ERROR = 2
DEFAULT_EXAMPLES = 800  # scenarios, 80 per template
DEFAULT_CANDIDATE_EXAMPLES = 200  # kernel-level batches (kvparity.candidate.check.default_examples: 2000 in nightly)
DEFAULT_REAL_EXAMPLES = 400  # scenarios with real SGLang worlds, 40 per template


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
    sub.add_argument("--json", metavar="PATH", help="write the verdict as JSON")
    sub.add_argument("--repro", metavar="PATH", help="write a script that replays the counterexample")
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
    problem = _option_problem(args)
    if problem:
        print(f"kvparity check: {problem}", file=sys.stderr)
        return USAGE_ERROR
    args.backend = args.backend or "all"
    args.jobs = args.jobs or usable_cores()
    print(f"kvparity check: target {args.target}; {runtime.describe()}; profile {args.profile}"
          + (f", seed {args.seed}" if args.seed is not None else ", derandomized"))
    if args.sglang is not None or args.against is not None:
        return _check_real(args)
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
    if args.jobs is not None and args.jobs < 1:
        return f"--jobs must be at least 1 (got {args.jobs})"
    if args.candidate is not None:
        for option, value in (("--backend", args.backend), ("--jobs", args.jobs)):
            if value is not None:
                return f"{option} does not apply to --candidate (the candidate runs as it is, in one sandbox)"
    for option in ("json", "repro", "markdown"):
        problem = output_path_problem(f"--{option}", getattr(args, option))
        if problem:
            return problem
    return None


def _worlds(backend: str) -> tuple[tuple[str, str], ...]:
    from kvparity.run.runner import EXTRA_WORLDS  # after the device is chosen: it imports the kernels

    backends = ("torch", "triton") if backend == "all" else (backend,)
    reference = ("legacy", backends[0])
    others = [(v, b) for v in ("legacy", "refactored") for b in backends if (v, b) != reference]
    others += [w for w in EXTRA_WORLDS if w[1] in backends]
    return (reference, *others)


# The version kvparity's own model implements, per SGLang release it models.
MODELLED = {"0.5.3": "legacy", "0.5.3.post1": "refactored"}


def _real_usage_problem(args: argparse.Namespace) -> str | None:
    if args.sglang is None:
        return "--against needs --sglang (the real SGLang to check against it)"
    if args.candidate is not None:
        return "--sglang checks a real SGLang's whole path and takes no --candidate"
    if args.target != WHOLE_PATH:
        return f"--sglang checks the whole prepare_for_extend path; --target {args.target} does not apply"
    return None


def _check_real(args: argparse.Namespace) -> int:
    """``--sglang A [--against B]``: real SGLang A against real B, or against kvparity's model."""
    problem = _real_usage_problem(args)
    if problem:
        print(f"kvparity check: {problem}", file=sys.stderr)
        return USAGE_ERROR
    from kvparity.engine.real import RealSGLangError
    from kvparity.engine.real.install import resolve
    from kvparity.engine.real.lane import RealLane

    backends = ("torch", "triton") if args.backend == "all" else (args.backend,)
    try:
        checked = resolve(args.sglang)
        reference = resolve(args.against) if args.against is not None else None
        # Without --against: a release kvparity models is checked against its model; a release with
        # two radix-tree cores, its Python core against its Rust one (the server's, the reference).
        tree_cores = reference is None and len(checked.entry.tree_cores) > 1
        if reference is None and checked.version not in MODELLED and not tree_cores:
            print(f"kvparity check: --sglang {args.sglang}: kvparity models only {', '.join(MODELLED)}; "
                  f"give the reference with --against (e.g. --against 0.5.3.post1)", file=sys.stderr)
            return USAGE_ERROR
        specs = [checked] if reference is None else [reference, checked]
        lane = RealLane(specs, backends, tree_class=args.tree_class)  # a worker starts on first use: in each job when jobs > 1
    except RealSGLangError as exc:
        print(f"kvparity check: {exc}", file=sys.stderr)
        return USAGE_ERROR
    with lane:
        if reference is None and not tree_cores:
            worlds: tuple[tuple[str, str], ...] = ((MODELLED[checked.version], backends[0]),)
        else:
            worlds = (("legacy", "torch"),)  # only decides where a scenario leaves the server's path
        return _check_repository(args, worlds=worlds, lane=lane, real_reference=reference is not None or tree_cores,
                                 default_examples=DEFAULT_REAL_EXAMPLES,
                                 lane_factory=functools.partial(RealLane, specs, backends, tree_class=args.tree_class))


def _check_repository(
    args: argparse.Namespace,
    *,
    worlds: tuple[tuple[str, str], ...] | None = None,
    lane: object = None,
    real_reference: bool = False,
    default_examples: int = DEFAULT_EXAMPLES,
    lane_factory: Callable[[], Any] | None = None,
) -> int:
    from kvparity.model.classes import REQUIRED
    from kvparity.report.markdown import check_markdown
    from kvparity.run.sweep import check_repository

    worlds = worlds or _worlds(args.backend)
    examples = args.examples or default_examples
    print(f"kvparity check: {examples} scenarios ({max(1, examples // 10)} per template), {args.jobs} jobs")
    verdict = check_repository(worlds, examples, args.seed, lane=lane, real_reference=real_reference,
                               jobs=args.jobs, lane_factory=lane_factory)
    names = verdict.worlds
    width = max(42, *(len(f"{names[0]} vs {n}") for n in names[1:]))
    print(f"{'world pair':<{width}} {'scenarios':>9}  verdict")
    diverged = verdict.diverged
    for name in names[1:]:
        pair = f"{names[0]} vs {name}"
        print(f"{pair:<{width}} {verdict.scenarios:>9}  {'DIVERGENCE' if name in diverged else 'parity'}")
    for world, kernels in sorted(verdict.kernels.items()):
        print(f"kernels: {world}: allocation {kernels['alloc']}, req_to_token writes {kernels['write']}, "
              f"radix-tree core {kernels['tree_core']}")
    print(f"scenario classes reached: {len(verdict.required_reached)}/{len(REQUIRED)}")
    for missing in (c for c in REQUIRED if c not in verdict.classes):
        print(f"  not reached: {missing}")
    from kvparity.judge.compare import KNOWN_VERSION_DIFFERENCES, RENUMBERED_BETWEEN_RELEASES

    for defect, count in sorted(verdict.findings.items()):
        between_releases = defect in KNOWN_VERSION_DIFFERENCES or defect == RENUMBERED_BETWEEN_RELEASES
        kind = "known difference between releases" if between_releases else "known defect reported"
        print(f"{kind}: {defect}, in {count} scenarios; not a divergence")
        if defect in verdict.finding_examples:
            example = verdict.finding_examples[defect].replace("\n", "\n    ")
            print(f"  first seen: {example}")
    if verdict.counterexample:
        print("\n" + verdict.counterexample)
    rate = verdict.scenarios / verdict.seconds if verdict.seconds > 0 else 0.0
    for gpu, count in sorted(verdict.per_device.items()):
        print(f"GPU {gpu}: {count} scenarios")
    print(f"verdict: {verdict.verdict.upper()} ({verdict.scenarios} scenarios in {verdict.seconds:.0f} s, "
          f"{rate:.1f} per second)")
    _write_json(args.json, {
        "target": args.target,
        "verdict": verdict.verdict,
        "worlds": list(names),
        "scenarios": verdict.scenarios,
        "classes_reached": verdict.required_reached,
        "classes_required": len(REQUIRED),
        "known_defects": {d: {"scenarios": n, "first_seen": verdict.finding_examples.get(d)}
                          for d, n in sorted(verdict.findings.items())},
        "counterexample": None if verdict.scenario is None else {
            "scenario": scenario_to_dict(verdict.scenario), "report": verdict.counterexample},
        "seconds": round(verdict.seconds, 1),
        "scenarios_per_second": round(rate, 2),
        "scenarios_per_gpu": dict(sorted(verdict.per_device.items())),
        "kernels": dict(sorted(verdict.kernels.items())),
    })
    if args.repro and verdict.scenario is not None:
        Path(args.repro).write_text(_repro_script(verdict.scenario))
        print(f"wrote {args.repro}")
    _write_markdown(args.markdown, lambda: check_markdown(verdict))
    return 0 if verdict.verdict == "parity" else 1


def _write_json(path: str | None, payload: dict) -> None:
    if path:
        Path(path).write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
        print(f"wrote {path}")


def _write_markdown(path: str | None, text: Callable[[], str]) -> None:
    if path:
        Path(path).write_text(text())
        print(f"wrote {path}")


def _repro_script(scenario) -> str:
    return f'''"""Replays a kvparity counterexample in every world (run from a kvparity checkout, or with
kvparity installed): exit 1 and a report while the worlds disagree, 0 once they agree."""

import sys

from kvparity.kernels import runtime  # noqa: F401  (fixes the Triton mode first)
from kvparity.report.failure import format_failure
from kvparity.run.runner import run_scenario
from kvparity.model.scenario import Decode, Evict, Extend, RequestSpec, Retract, Scenario  # noqa: F401
from kvparity.model.worlds import Geometry

scenario = {scenario.to_python()}

result = run_scenario(scenario)
print("parity" if result.ok else format_failure(result))
sys.exit(0 if result.ok else 1)
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
    print(f"verdict: {result.verdict.upper()}")
    _write_json(args.json, result.to_dict())
    _write_markdown(args.markdown, lambda: candidate_markdown(result))
    if args.repro and result.counterexample is not None:
        Path(args.repro).write_text(result.repro_script())
        print(f"wrote {args.repro}")
    return 0 if result.verdict == "parity" else 1
