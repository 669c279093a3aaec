"""A verdict of either drive, as ``kvparity check`` prints it: the drive's table (the world pairs, or
the schedule policies under each event loop), what the run learnt of its worlds (their kernels),
the classes reached, each finding with its first example, each first difference (as found, shrunk,
with its cause and a replay command), and the verdict line. Built from the verdict's structures,
never from printed text."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvparity.judge.drive_parts import Reporting
from kvparity.judge.power import CONFIDENCE, percent, rules_out
from kvparity.judge.verdict import Example, Verdict

# A drive whose required classes are at most this many lists each with its rate; a longer list
# (the harness drive's) shows the ones not reached.
RATES_SHOWN = 8


def console_lines(verdict: Verdict, drive: Reporting[Any], replay: Callable[[str, Any], str]) -> list[str]:
    """The report's lines. ``replay(name, scenario)`` saves a scenario and gives the command that
    replays it in this run's worlds."""
    lines = list(drive.header(verdict))
    for world, kernels in sorted(verdict.facts.get("kernels", {}).items()):
        lines.append(f"kernels: {world}: allocation {kernels['alloc']}, req_to_token writes {kernels['write']}, "
                     f"radix-tree core {kernels['tree_core']}")
    lines += class_lines(verdict)
    lines += model_class_lines(verdict, getattr(drive, "model_classes", ()))
    lines += finding_lines(verdict, drive)
    for row in verdict.rows:
        if row.first is not None and (verdict.counts_all or row.first is verdict.shrunk):
            lines += ["", *difference_lines(row.first, drive, replay, f"{row.task}: {row.differing} of "
                                            f"{row.scenarios} scenarios differ" if verdict.counts_all else None)]
        for kind, example in sorted(row.kind_examples.items()):
            if example.shrunk is not None:  # the run's first of that kind (shrunk once per run)
                lines += ["", *difference_lines(example, drive, replay, f"{row.task}: {row.kinds[kind]} scenarios "
                                                f"differ first in {kind}", kind)]
    for gpu, count in sorted(verdict.facts.get("scenarios_per_gpu", {}).items()):
        lines.append(f"GPU {gpu}: {count} scenarios")
    lines += power_lines(verdict)
    lines.append(verdict_line(verdict))
    return lines


def class_lines(verdict: Verdict) -> list[str]:
    reached = f"scenario classes reached: {len(verdict.required_reached)}/{len(verdict.required)}"
    if verdict.first is not None and not verdict.counts_all:  # cut short at its first difference: says nothing
        return [f"{reached} (the run stopped at its first divergence)"]
    lines = [reached]
    total = max(verdict.scenarios, 1)
    for cls in verdict.required:
        n = verdict.classes[cls]
        if len(verdict.required) <= RATES_SHOWN:
            lines.append(f"  {cls}: {n} of {verdict.scenarios} scenarios ({100 * n / total:.1f}%)")
        elif not n:
            lines.append(f"  not reached: {cls}")
    return lines


def model_class_lines(verdict: Verdict, shown: tuple[str, ...]) -> list[str]:
    """The classes of a served model's own (``shown``: a hybrid model's), task by task, where a
    task reached any: counted, not required."""
    lines = []
    for row in verdict.rows:
        reached = [(cls, row.classes[cls]) for cls in shown if row.classes.get(cls)]
        if reached:
            lines.append(f"  {row.task}: " + "; ".join(f"{cls.removeprefix('traffic: ')} {n} of {row.scenarios}"
                                                         for cls, n in reached))
    return ["classes of the hybrid models and the nemesis, by task:", *lines] if lines else []


def finding_lines(verdict: Verdict, drive: Reporting[Any]) -> list[str]:
    """Each finding, with the scenarios reaching it and its first example: a defect of a run's own
    (it fails the check, shared or not; named where SGLang is known to have it; with SGLang's
    traceback where it raised), or a known difference (reported, not a divergence)."""
    lines = []
    defects = verdict.defects
    for label, count in sorted(verdict.findings.items()):
        example = verdict.finding_example(label)
        if label in defects:
            known = defects[label].known
            lines.append(f"DEFECT in a run's own: {label}, in {count} scenarios; "
                         + (f"a known SGLang defect: {known.line}" if known else "not a known SGLang defect"))
        else:
            lines.append(f"{drive.finding_kind(label)}: {label}, in {count} scenarios; not a divergence")
        if example is not None:
            lines.append("  " + first_seen(example, drive, label).replace("\n", "\n    "))
            detail = example.detail(label)
            if detail:
                lines.append("    " + detail.rstrip().replace("\n", "\n    "))
    return lines


def first_seen(example: Example, drive: Reporting[Any], label: str) -> str:
    """A finding's first example: what was seen, and the scenario (shrunk when it could be)."""
    shrunk = "" if example.shrunk is None else \
        f" (shrunk from {drive.size(example.found.scenario)} to {drive.size(example.shown.scenario)})"
    where = f" in {example.where}" if example.where else ""
    return f"first seen{shrunk}{where}: {example.line(label)}\n{example.shown.scenario.to_python()}"


def difference_lines(example: Example, drive: Reporting[Any], replay: Callable[[str, Any], str], title: str | None,
                     kind: str = "") -> list[str]:
    """A first difference (the first of ``kind``, when given): as found (or, counting, in one line),
    then shrunk, its cause, the scenario and the command that replays it."""
    shown, shrink = example.shown, example.shrunk
    name = f"counterexample-{example.task}{'-' + kind if kind else ''}".replace(" ", "-").replace(",", "")
    if title is None:  # a drive that stops: the whole report of the shrunk counterexample, then its cause
        why = ["why: " + example.cause.replace("\n", "\n     ")] if example.cause else []
        return [shrink_head(example, drive), drive.report(shown, replay=replay(name, shown.scenario)), *why]
    lines = [f"{title}; the first: {example.found.line}"]
    if shrink is not None:
        state = "nothing one removal smaller differs" if shrink.complete else "the shrinking budget ran out"
        lines.append(f"  shrunk ({shrink.tried} smaller scenarios tried in {shrink.seconds:.0f} s; {state}): {shown.line}")
    if example.cause:
        lines.append("  why: " + example.cause.replace("\n", "\n       "))
    lines.append("  " + shown.scenario.to_python().replace("\n", "\n  "))
    lines.append(f"  replay: {replay(name, shown.scenario)}")
    return lines


def shrink_head(example: Example, drive: Reporting[Any]) -> str:
    """How shrinking went, above the shrunk counterexample's report."""
    shrink, found = example.shrunk, example.found.scenario
    if shrink is None:
        return "counterexample, not shrunk (--no-shrink):"
    if shrink.scenario == found:
        return (f"shrunk counterexample: none of {shrink.tried} smaller scenarios fails ({shrink.seconds:.0f} s); "
                "it is the failure as found:")
    if shrink.complete:
        return (f"shrunk counterexample: {drive.size(found)} down to {drive.size(shrink.scenario)}; "
                f"{shrink.tried} smaller scenarios tried in {shrink.seconds:.0f} s, and nothing one removal smaller fails:")
    return (f"smallest counterexample found when the shrinking budget ran out ({shrink.seconds:.0f} s, "
            f"{shrink.tried} smaller scenarios tried): {drive.size(found)} down to {drive.size(shrink.scenario)}; "
            "it may not be minimal (--shrink-budget S gives it longer):")


def power_lines(verdict: Verdict) -> list[str]:
    """What the tasks at parity rule out: a parity verdict claims no more than it sampled."""
    fewest = verdict.fewest_at_parity
    if fewest is None:
        return []
    return [f"power: each task at parity would have shown, with {CONFIDENCE:.0%} probability, a difference "
            f"reached by more than {percent(rules_out(fewest))} of its drawn scenarios "
            f"(the fewest a task played: {fewest})"]


def verdict_line(verdict: Verdict) -> str:
    rate = verdict.scenarios / verdict.seconds if verdict.seconds > 0 else 0.0
    return (f"verdict ({verdict.drive}-driven): {verdict.summary_line} ({verdict.scenarios} scenarios in "
            f"{verdict.seconds:.0f} s, {rate:.1f} per second)")
