"""A ``kvparity check`` verdict as Markdown (``--markdown PATH``), either drive: the drive's table
the console prints, the scenario count and, on a divergence, the first difference as the drive
reports it (the differing cells, the oracle violations) and the shrunk scenario. Made for a CI job
summary (GitHub's ``$GITHUB_STEP_SUMMARY``, written by ``scripts/action_check.sh``). Built from the
result objects, never from printed text. A candidate check's report is its own
(``kvparity.candidate.markdown``), on these helpers."""

from __future__ import annotations

from typing import Any

from kvparity.judge.drive_parts import Reporting
from kvparity.judge.verdict import Verdict


def code(text: str) -> str:
    """``text`` as an inline code span (a backtick inside widens the fence)."""
    fence = "``" if "`" in text else "`"
    return f"{fence}{text}{fence}"


def block(text: str, language: str = "text") -> list[str]:
    """``text`` as a fenced block (a fence inside widens the fence)."""
    fence = "````" if "```" in text else "```"
    return [f"{fence}{language}", text, fence]


def check_markdown(verdict: Verdict, drive: Reporting[Any], *, title: str = "kvparity check") -> str:
    """The whole report of one drive of a ``kvparity check`` (kvparity's worlds or real SGLang's):
    the drive's table, the classes reached, the findings, the first difference (shrunk)."""
    lines = [f"### {title} ({verdict.drive}-driven): {verdict.verdict.upper()}", "",
             f"{verdict.summary_line}", "", "```text", *drive.header(verdict), "```", ""]
    lines.append(f"{verdict.scenarios} scenarios in {verdict.seconds:.0f} s; classes reached: "
                 f"{len(verdict.required_reached)}/{len(verdict.required)}.")
    missing = [c for c in verdict.required if not verdict.classes[c]]
    if missing:
        lines += ["", "<details><summary>Classes not reached</summary>", "", *(f"- {c}" for c in missing), "",
                  "</details>"]
    defects = verdict.defects
    for label, count in sorted(verdict.findings.items()):
        if label not in defects:
            lines += ["", f"{drive.finding_kind(label).capitalize()}, not a divergence: {label}, in {count} scenarios."]
            continue
        known = defects[label].known
        lines += ["", f"**Defect** in a run's own: {label}, in {count} scenarios; "
                      + (f"a known SGLang defect: {known.line}." if known else "not a known SGLang defect.")]
        example = verdict.finding_example(label)
        if example is not None:
            detail = example.detail(label)
            lines += ["", *block(f"{example.line(label)}\n{example.shown.scenario.to_python()}"
                                  + (f"\n\n{detail.rstrip()}" if detail else ""))]
    example = verdict.shrunk
    if example is not None:
        shown = example.shown
        lines += ["", f"**First difference** ({example.task}): {code(shown.line)}", ""]
        if example.cause:
            lines += [f"Why: {example.cause}", ""]
        lines += block(drive.report(shown))
        lines += ["", "<details><summary>The shrunk scenario (Python) and how to replay it</summary>", "",
                  *block(shown.scenario.to_python(), "python"), "",
                  *block(f"kvparity check --drive {verdict.drive} --replay FILE  # FILE: the --json verdict", "sh"),
                  "", "</details>"]
    return "\n".join(lines).rstrip("\n") + "\n"
