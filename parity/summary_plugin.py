"""pytest plugin used by the main job: a closing summary per area of the suite."""

from __future__ import annotations

from collections import Counter


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    from kernels import runtime

    by_area: Counter[tuple[str, str]] = Counter()
    for outcome in ("passed", "failed", "error", "skipped"):
        for report in terminalreporter.stats.get(outcome, []):
            if getattr(report, "when", "call") in ("call", "setup") and report.nodeid:
                area = report.nodeid.split("::")[0].rsplit("/", 1)[-1]
                by_area[(area, outcome)] += 1
    areas = sorted({area for area, _ in by_area})
    write = terminalreporter.write_line
    write("")
    write(f"kvparity summary: {runtime.describe()}; backends {', '.join(runtime.BACKENDS)}")
    for area in areas:
        counts = ", ".join(f"{by_area[(area, o)]} {o}" for o in ("passed", "failed", "error", "skipped") if by_area[(area, o)])
        write(f"  {area:<40} {counts}")
    write(f"  verdict: {'PASS' if exitstatus == 0 else 'FAIL'}")
