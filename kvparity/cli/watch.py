"""What ``kvparity check`` shows while its sweep runs (``kvparity.run.sweep.SweepEvents``): the
progress of the planned scenarios; the first failure the moment it is found, with a command that
replays it; then shrinking's progress. The scenarios it shows are saved as JSON for ``--replay``.
"""

from __future__ import annotations

import json
import shlex
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from kvparity.model.scenario import Scenario, scenario_to_dict
from kvparity.model.traffic import TrafficScenario, traffic_to_dict
from kvparity.report.failure import format_failure
from kvparity.report.progress import Progress
from kvparity.run.events import FirstFailure, QuietEvents


def size(scenario: Scenario) -> str:
    return f"{len(scenario.requests)} requests, {len(scenario.steps)} steps"


class ScenarioFiles:
    """Scenarios saved for replay, in one temporary folder per run (made on first use)."""

    def __init__(self) -> None:
        self.folder: Path | None = None

    def save(self, name: str, scenario: Scenario | TrafficScenario) -> Path:
        if self.folder is None:
            self.folder = Path(tempfile.mkdtemp(prefix="kvparity-check-"))
        path = self.folder / f"{name}.json"
        data = traffic_to_dict(scenario) if isinstance(scenario, TrafficScenario) else scenario_to_dict(scenario)
        path.write_text(json.dumps(data, sort_keys=True) + "\n")
        return path


class ConsoleEvents(QuietEvents):
    """Prints a sweep's events. ``replay(path)`` is the command line that replays a saved scenario
    in this run's worlds; ``budget_s`` is shrinking's budget (None: no shrinking)."""

    def __init__(self, total: int, replay: Callable[[Path], list[str]], budget_s: float | None,
                 files: ScenarioFiles, out: TextIO | None = None) -> None:
        self.progress = Progress(total)
        self.replay, self.budget_s, self.files = replay, budget_s, files
        self.out = out or sys.stdout
        self.start = time.monotonic()
        self.first: FirstFailure | None = None
        self.found_after_s: float | None = None
        super().__init__()  # one process: known defects claimed in a set

    def played(self) -> None:
        if self.first is None:  # after a failure the bar gives way to shrinking's line
            self.progress.step()

    def found(self, first: FirstFailure) -> None:
        if self.first is not None:
            return
        self.first, self.found_after_s = first, time.monotonic() - self.start
        self.progress.interrupt()
        command = self.command_for("first-divergence", first.scenario)
        print(f"first divergence found after {self.progress.done} scenarios, {self.found_after_s:.0f} s "
              f"(template {first.template!r}; {size(first.scenario)}, not shrunk yet):", file=self.out)
        print(format_failure(first.result, replay=command), file=self.out)
        if self.budget_s is not None:
            print(f"\nshrinking it, for at most {self.budget_s:g} s (--shrink-budget S changes that, --no-shrink "
                  "skips it) ...", file=self.out)
        self.out.flush()

    def shrinking(self, tried: int, smallest: Scenario) -> None:
        self.progress.say(f"shrinking: {tried} smaller scenarios tried, now {size(smallest)}")

    def command_for(self, name: str, scenario: Scenario) -> str:
        """Save ``scenario`` and give the command line that replays it."""
        return shlex.join(self.replay(self.files.save(name, scenario)))

    def close(self) -> None:
        self.progress.close()
