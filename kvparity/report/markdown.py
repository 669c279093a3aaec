"""A ``kvparity check`` verdict as Markdown (``--markdown PATH``): the verdict table the console
prints, the scenario count and, on a divergence, the first difference, the differing cells, the
oracle violations and the shrunk scenario. Made for a CI job summary (GitHub's
``$GITHUB_STEP_SUMMARY``, written by ``scripts/action_check.sh``). Built from the result objects,
never from printed text."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvparity.model.classes import REQUIRED
from kvparity.report.failure import difference_table

if TYPE_CHECKING:  # a report only reads results; what makes them sits above it
    from kvparity.candidate.check import CheckResult
    from kvparity.run.sweep import HarnessVerdict

VIOLATIONS_SHOWN = 12


def _code(text: str) -> str:
    """``text`` as an inline code span (a backtick inside widens the fence)."""
    fence = "``" if "`" in text else "`"
    return f"{fence}{text}{fence}"


def _block(text: str, language: str = "text") -> list[str]:
    fence = "````" if "```" in text else "```"
    return [f"{fence}{language}", text, fence]


def verdict_table(verdict: HarnessVerdict) -> list[str]:
    """One row per world pair, the reference against each other world, as the console prints it."""
    names = verdict.worlds
    lines = ["| world pair | scenarios | verdict |", "|---|---:|---|"]
    for name in names[1:]:
        state = "**DIVERGENCE**" if name in verdict.diverged else "parity"
        lines.append(f"| {_code(names[0])} vs {_code(name)} | {verdict.scenarios} | {state} |")
    return lines


def check_markdown(verdict: HarnessVerdict, *, title: str = "kvparity check") -> str:
    """The whole report of a ``kvparity check`` over scenarios (kvparity's worlds or real SGLang)."""
    lines = [f"### {title}: {verdict.verdict.upper()}", "", *verdict_table(verdict), ""]
    lines.append(f"{verdict.scenarios} scenarios in {verdict.seconds:.0f} s; scenario classes reached: "
                 f"{len(verdict.required_reached)}/{len(REQUIRED)}.")
    missing = [c for c in REQUIRED if c not in verdict.classes]
    if missing:
        lines += ["", "<details><summary>Scenario classes not reached</summary>", "",
                  *(f"- {c}" for c in missing), "", "</details>"]
    for defect, count in sorted(verdict.findings.items()):
        lines += ["", f"Known defect reported, not a divergence: {defect}, in {count} scenarios."]
    result = verdict.failure
    if result is not None:
        lines.append("")
        if result.first_difference is not None:
            lines.append(f"**First difference:** {result.first_difference.describe()} "
                         f"(reference {_code(result.worlds[0])})")
            lines.append("")
        if result.divergences:
            lines += _block(difference_table(result.divergences))
            lines.append("")
        if result.violations:
            shown = [str(v) for v in result.violations[:VIOLATIONS_SHOWN]]
            more = len(result.violations) - len(shown)
            lines.append("Oracle violations:")
            lines.append("")
            lines += _block("\n".join(shown + ([f"... and {more} more"] if more > 0 else [])))
            lines.append("")
        lines += ["<details><summary>The shrunk scenario (Python) and how to replay it</summary>", "",
                  *_block(result.scenario.to_python(), "python"), "",
                  *_block(f"python -m kvparity.run.replay '{result.scenario.to_json()}'", "sh"),
                  "", "</details>"]
    return "\n".join(lines).rstrip("\n") + "\n"


def candidate_markdown(result: CheckResult, *, title: str = "kvparity check") -> str:
    """The report of ``kvparity check --candidate``: the candidate's row, and its fault if any."""
    lines = [f"### {title}: {result.verdict.upper()}", "",
             "| target | candidate | batches played | verdict |", "|---|---|---:|---|",
             f"| {_code(result.target)} | {_code(result.spec)} | {result.batches_run} of {result.drawn} drawn | "
             f"{'**DIVERGENCE**' if result.verdict != 'parity' else 'parity'} |"]
    if result.fault is not None:
        lines += ["", f"**Fault: {result.fault.kind}**", "", *_block(result.fault.describe())]
    if result.counterexample is not None:
        lines += ["", "<details><summary>The shrunk batch</summary>", "",
                  *_block(result.counterexample.describe()), "", "</details>"]
    return "\n".join(lines) + "\n"
