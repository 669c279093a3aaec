"""A ``kvparity check --candidate`` result as Markdown (``--markdown PATH``): the candidate's row,
and its fault and shrunk batch if any (the report helpers are ``kvparity.report.markdown``'s)."""

from __future__ import annotations

from kvparity.candidate.check import CheckResult
from kvparity.report.markdown import block, code


def candidate_markdown(result: CheckResult, *, title: str = "kvparity check") -> str:
    """The report of ``kvparity check --candidate``: the candidate's row, and its fault if any."""
    lines = [f"### {title}: {result.verdict.upper()}", "",
             "| target | candidate | batches played | verdict |", "|---|---|---:|---|",
             f"| {code(result.target)} | {code(result.spec)} | {result.batches_run} of {result.drawn} drawn | "
             f"{'**DIVERGENCE**' if result.verdict != 'parity' else 'parity'} |"]
    if result.fault is not None:
        lines += ["", f"**Fault: {result.fault.kind}**", "", *block(result.fault.describe())]
    if result.counterexample is not None:
        lines += ["", "<details><summary>The shrunk batch</summary>", "",
                  *block(result.counterexample.describe()), "", "</details>"]
    return "\n".join(lines) + "\n"
