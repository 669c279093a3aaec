"""A failure, readable in a minute: the (shrunk) scenario as Python, the first stage where the
worlds differ, a compact table of the differing cells, and how to replay it."""

from __future__ import annotations

from kvparity.judge.compare import Difference
from kvparity.judge.differ import row_runs, short
from kvparity.judge.run_result import RunResult


def difference_table(diffs: list[Difference], limit: int = 20) -> str:
    w = max([18] + [len(d.world) for d in diffs])
    lines = [f"{'world':<{w}} {'row':>4} {'columns':<10} {'expected':<34} got"]
    for diff in diffs:
        if not diff.cells:
            lines.append(f"{diff.world:<{w}} {'':>4} {'':<10} {diff.what}: {diff.detail}")
            continue
        for row, cols, expected, got in row_runs(diff.cells):
            lines.append(f"{diff.world:<{w}} {row:>4} {cols:<10} {short(expected):<34} {short(got)}")
        if len(lines) > limit:
            lines.append("...")
            break
    return "\n".join(lines)


def first_difference_line(result: RunResult) -> str:
    """The line that names the first difference (``result.first_difference`` is set)."""
    assert result.first_difference is not None
    return f"first difference: {result.first_difference.describe()} (reference {result.worlds[0]})"


def format_failure(result: RunResult, replay: str | None = None) -> str:
    """The report; ``replay`` is the command that replays it (default: the modelled worlds' replay)."""
    parts = ["kvparity: the worlds disagree" if result.divergences else "kvparity: an oracle failed", ""]
    if result.first_difference is not None:
        parts.append(first_difference_line(result))
    if result.divergences:
        parts += ["", difference_table(result.divergences)]
    if result.violations:
        parts += ["", "oracle violations:"] + [f"  {v}" for v in result.violations[:12]]
    how = f"replay: {replay}" if replay is not None else replay_instructions(result)
    parts += ["", "scenario:", result.scenario.to_python(), "", how]
    return "\n".join(parts)


def format_findings(result: RunResult) -> str:
    """Known legacy defects the run reached (reported, not failures of the refactor)."""
    seen = sorted({f"{d.known_defect}: {d.what}: {d.detail}" for d in result.findings})
    return "\n".join(seen)


def replay_instructions(result: RunResult) -> str:
    return (
        "replay:\n"
        "  from kvparity.model.scenario import *; from kvparity.engine.world import Geometry\n"
        "  from kvparity.run.runner import run_scenario; from kvparity.report.failure import format_failure\n"
        "  result = run_scenario(<the scenario above>); print(format_failure(result))\n"
        f"or: python -m kvparity.run.replay '{result.scenario.to_json()}'"
    )
