"""One validated plan per ``kvparity check`` run: which drives run (``--drive``), each with what it
plays (kvparity's worlds and real SGLang's, or two schedulers), how many scenarios, the seed, the
jobs and the shrinking budgets. An option that does not apply to the chosen drive is refused with
one sentence (exit 2), never silently ignored."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from kvparity.engine.releases import changes_between
from kvparity.judge.power import parse_reach, scenarios_for
from kvparity.model.worlds import MODELLED_RELEASES

DRIVES = ("harness", "scheduler", "both")
DEFAULT_EXAMPLES = 880  # harness-driven scenarios, 80 per template
DEFAULT_REAL_EXAMPLES = 440  # harness-driven scenarios with real SGLang worlds, 40 per template
DEFAULT_TRAFFIC_EXAMPLES = 40  # scheduler-driven traffic scenarios per schedule policy and event loop

# Options that apply to one drive only: (attribute, the option as typed, the drive it applies to).
DRIVE_OPTIONS = (
    ("examples", "--examples", "harness"),
    ("backend", "--backend", "harness"),
    ("tree_class", "--tree-class", "harness"),
    ("profile", "--profile", "harness"),
    ("target", "--target", "harness"),
    ("traffic_examples", "--traffic-examples", "scheduler"),
    ("undo_changes", "--undo-changes", "scheduler"),
    ("nemesis", "--nemesis", "scheduler"),
)


@dataclass(frozen=True)
class CheckPlan:
    """One drive of a run."""

    drive: str
    spec: Any  # kvparity.run.harness_drive.HarnessSpec or kvparity.run.scheduler_drive.SchedulerSpec
    examples: int  # harness: scenarios in all; scheduler: per schedule policy and event loop
    seed: int | None
    jobs: int
    shrink_budget_s: float | None


def cache_kinds() -> ModuleType:
    """The cache kinds' registry (``kvparity.caches``), imported when asked: it loads the kernels,
    and the device is chosen after the arguments are read."""
    from kvparity import caches

    return caches


def caches_option(text: str) -> tuple[str, ...]:
    """``--caches``'s value as given: names, comma-separated. They are checked against the registry
    (``registered_caches``) once the device is chosen: the registry loads the kernels, so asking it
    while the arguments are read would fix the device before ``--device`` says which."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names:
        raise argparse.ArgumentTypeError(f"{text!r}: expected cache kinds' names, comma-separated")
    return names


def registered_caches(names: tuple[str, ...] | None) -> tuple[str, ...] | None:
    """``--caches``'s names in the registry's order (None: not given); a ValueError names one the
    registry does not know, and the ones it does."""
    if names is None:
        return None
    known = cache_kinds().names()
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"--caches {','.join(names)}: {unknown[0]!r} is no cache kind; expected some of "
                         f"{', '.join(known)}, comma-separated")
    return tuple(c for c in known if c in names)


def chosen_drive(args: argparse.Namespace) -> str:
    """``--drive``, or its default: harness; both for real release against real release with a hybrid
    model in ``--caches`` or with ``--nemesis`` (issue 48: what only SGLang's own scheduler meets,
    its defects and failure paths, is played first; the harness drive beside it)."""
    if args.drive is not None:
        return str(args.drive)
    real_pair = bool(getattr(args, "sglang", None) and getattr(args, "against", None))
    # By name, not through the registry: it loads the kernels, and the drive is chosen before the device.
    hybrid = any(cache != "full" for cache in (getattr(args, "caches", None) or ()))
    return "both" if real_pair and (hybrid or getattr(args, "nemesis", None)) else "harness"


def drive_option_problem(args: argparse.Namespace) -> str | None:
    """An option of one drive given to a run of the other, in one sentence."""
    drive = chosen_drive(args)
    if drive == "both":
        return None
    for attr, option, applies in DRIVE_OPTIONS:
        value = getattr(args, attr, None)
        given = value is not None and not (attr == "target" and value == "prepare_for_extend")
        if given and applies != drive:
            return f"{option} is an option of the {applies}-driven check, not of --drive {drive}"
    return None


def power_problem(args: argparse.Namespace) -> str | None:
    """``--power`` that cannot be read, or given beside the counts it sets, in one sentence."""
    if args.power is None:
        return None
    if getattr(args, "candidate", None) is not None:
        return "--power is for scenario runs, not --candidate (give --examples)"
    if args.examples is not None or args.traffic_examples is not None:
        return "--power sets the scenarios per task: give --power or --examples / --traffic-examples, not both"
    try:
        parse_reach(args.power)
    except ValueError as exc:
        return str(exc)
    return None


def per_task(args: argparse.Namespace) -> int | None:
    """The scenarios per task ``--power`` asks for, or None without it."""
    return None if args.power is None else scenarios_for(parse_reach(args.power))


def harness_spec(args: argparse.Namespace, real: Any) -> tuple[Any, int]:
    """The harness drive's worlds, and its default scenario count."""
    from kvparity.run.harness_drive import HarnessSpec

    backend = args.backend or "all"
    if real is None:
        return HarnessSpec(modelled_worlds(backend)), DEFAULT_EXAMPLES
    backends = ("torch", "triton") if backend == "all" else (backend,)
    if real.reference is None and not real.tree_cores:
        worlds: tuple[tuple[str, str], ...] = ((MODELLED_RELEASES[real.checked.version], backends[0]),)
        return HarnessSpec(worlds, tuple(real.specs), backends, args.tree_class), DEFAULT_REAL_EXAMPLES
    # The reference is real; kvparity's legacy world only decides where a scenario leaves the server's path.
    return (HarnessSpec((("legacy", "torch"),), tuple(real.specs), backends, args.tree_class, real_reference=True),
            DEFAULT_REAL_EXAMPLES)


def scheduler_spec(real: Any, caches: tuple[str, ...] | None = None, undo_changes: bool = False) -> Any:
    """The scheduler drive's two players, or why this run has none (a sentence); ``caches``: the
    models its tasks serve (None: ``caches.default_names()``, those both players serve); ``undo_changes``: the
    checked release plays with its own named changes undone (real against real only)."""
    from kvparity.run.scheduler_drive import PlayerSpec, SchedulerSpec

    if undo_changes:
        problem = undo_problem(real)
        if problem is not None:
            return problem
    if caches is not None and (real is None or real.reference is None) and any(cache_kinds().get(c).hybrid for c in caches):
        return (f"--caches {','.join(caches)}: kvparity's model of a scheduler serves full attention only; the "
                f"hybrid caches are checked real release against real release (--sglang A --against B)")
    caches = caches or cache_kinds().default_names()
    if real is None:
        return SchedulerSpec(PlayerSpec("model", "legacy"), PlayerSpec("model", "refactored"))
    checked = PlayerSpec("real", real.checked.path if real.checked.origin == "path" else real.checked.version)
    if real.reference is not None:
        reference = real.reference
        if not any(_both_serve(real, c) for c in caches):
            return _none_served(real, caches)
        return SchedulerSpec(PlayerSpec("real", reference.path if reference.origin == "path" else reference.version),
                             checked, caches=caches, undo_changes=undo_changes)
    version = real.checked.version
    if version in MODELLED_RELEASES:
        return SchedulerSpec(PlayerSpec("model", MODELLED_RELEASES[version]), checked, caches=caches)
    return (f"--sglang {version} alone has no scheduler to be checked against (kvparity models the scheduler of "
            f"{' and '.join(MODELLED_RELEASES)} only): give --against RELEASE")


def undo_problem(real: Any) -> str | None:
    """Why ``--undo-changes`` cannot be played (a sentence), or None."""
    if real is None or real.reference is None:
        return "--undo-changes undoes a release's named changes: it needs --sglang B --against A, both real"
    reference, checked = real.reference.version, real.checked.version
    if real.checked.origin == "path" or not any(c.release == checked and c.undo for c in changes_between(reference,
                                                                                                         checked)):
        return (f"--undo-changes: kvparity names no change of {checked} after {reference} that it can undo (see "
                f"kvparity/engine/releases.py)")
    return None


def modelled_worlds(backend: str) -> tuple[tuple[str, str], ...]:
    from kvparity.run.runner import EXTRA_WORLDS  # after the device is chosen: it imports the kernels

    backends = ("torch", "triton") if backend == "all" else (backend,)
    reference = ("legacy", backends[0])
    others = [(v, b) for v in ("legacy", "refactored") for b in backends if (v, b) != reference]
    others += [w for w in EXTRA_WORLDS if w[1] in backends]
    return (reference, *others)


def harness_models(real: Any, caches: tuple[str, ...] | None) -> tuple[str, ...] | str:
    """The models the harness drive's worlds serve, one plan each: full attention unless
    ``--caches`` names others (a hybrid model: real against real, where both releases serve it;
    not by default, it multiplies the drive's time), or why not (a sentence)."""
    if caches is None:
        return ("full",)
    hybrid = [c for c in caches if cache_kinds().get(c).hybrid]
    if hybrid and (real is None or real.reference is None):
        return (f"--caches {','.join(caches)}: the harness drive plays a hybrid model real release against real "
                f"release only (--sglang A --against B)")
    served = tuple(c for c in caches if not cache_kinds().get(c).hybrid or _both_serve(real, c))
    return served or _none_served(real, caches)


def _both_serve(real: Any, cache: str) -> bool:
    """Whether kvparity drives both releases of ``real`` serving ``cache``."""
    served_by = cache_kinds().get(cache).served_by
    return bool(served_by(real.reference.entry) and served_by(real.checked.entry))


def _none_served(real: Any, caches: tuple[str, ...]) -> str:
    """Which kinds each release serves, from the registry: what the user may ask for instead."""
    kinds = cache_kinds().KINDS.values()
    serves = [f"{side.version}: {', '.join(k.name for k in kinds if k.served_by(side.entry))}"
              for side in (real.reference, real.checked)]
    return (f"--caches {','.join(caches)}: SGLang {real.reference.version} and {real.checked.version} do not both "
            f"serve any of them (they serve {'; '.join(serves)})")


def check_plans(args: argparse.Namespace, real: Any, jobs: int, budget: float | None) -> list[CheckPlan] | str:
    """The run's drives in the order they run (the scheduler-driven half first), or why the run
    cannot be made (a sentence, exit 2). ``--drive both`` without a scheduler to check drops that
    half, and says so."""
    drive = chosen_drive(args)
    plans = []
    if drive in ("scheduler", "both"):
        nemesis = bool(getattr(args, "nemesis", None))
        if nemesis and (real is None or real.reference is None):
            return "--nemesis: kvparity's model of a scheduler has no abort path (give --sglang A --against B)"
        spec = scheduler_spec(real, getattr(args, "caches", None), bool(getattr(args, "undo_changes", False)))
        if not isinstance(spec, str):
            spec = dataclasses.replace(spec, nemesis=nemesis)
        if isinstance(spec, str):
            if drive == "scheduler":
                return f"--drive scheduler: {spec}"
            print(f"kvparity check: scheduler-driven check not run: {spec}", flush=True)
        else:
            count = per_task(args) or args.traffic_examples or DEFAULT_TRAFFIC_EXAMPLES
            plans.append(CheckPlan("scheduler", spec, count, args.seed, jobs, budget))
    if drive in ("harness", "both"):
        spec, default = harness_spec(args, real)
        from kvparity.model.strategies import TEMPLATES

        power = per_task(args)  # the harness drive's count is in all, shared out over the templates
        count = power * len(TEMPLATES) if power else args.examples or default
        models = harness_models(real, getattr(args, "caches", None))
        if isinstance(models, str):
            return models
        plans += [CheckPlan("harness", dataclasses.replace(spec, model=model), count, args.seed, jobs, budget)
                  for model in models]
    return plans
