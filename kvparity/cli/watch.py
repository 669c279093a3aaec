"""What ``kvparity check`` shows while its sweep runs (``kvparity.run.events.SweepEvents``), for
either drive: the progress of the planned scenarios; the run's first difference the moment it is
found, with a command that replays it; then shrinking's progress. The scenarios it shows are saved as
JSON for ``--replay``.
"""

from __future__ import annotations

import json
import shlex
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from kvparity.judge.verdict import Example
from kvparity.report.progress import Progress
from kvparity.run.events import QuietEvents


class ScenarioFiles:
    """Scenarios saved for replay, in one temporary folder per run (made on first use)."""

    def __init__(self) -> None:
        self.folder: Path | None = None

    def save(self, name: str, data: dict[str, Any]) -> Path:
        if self.folder is None:
            self.folder = Path(tempfile.mkdtemp(prefix="kvparity-check-"))
        path = self.folder / f"{name}.json"
        path.write_text(json.dumps(data, sort_keys=True) + "\n")
        return path


class ConsoleEvents(QuietEvents):
    """Prints a sweep's events. ``replay(path)`` is the command line that replays a saved scenario
    in this run's worlds; ``budget_s`` is shrinking's budget (None: no shrinking)."""

    def __init__(self, drive: Any, total: int, replay: Callable[[Path], list[str]], budget_s: float | None,
                 files: ScenarioFiles, out: TextIO | None = None) -> None:
        super().__init__()  # one process: claims kept in a set
        self.drive = drive
        self.progress = Progress(total)
        self.replay, self.budget_s, self.files = replay, budget_s, files
        self.out = out or sys.stdout
        self.first: Example | None = None
        self.found_after_s: float | None = None

    def played(self) -> None:
        if self.first is None or self.drive.counts_all:  # after a difference that stops, shrinking's line
            self.progress.step()

    def found(self, first: Example, *, stop: bool) -> bool:
        if self.first is not None:
            return False
        super().found(first, stop=stop)
        self.first, self.found_after_s = first, time.monotonic() - self.start
        self.progress.interrupt()
        command = self.command_for("first-divergence", first.found.scenario)
        print(f"first divergence found after {self.progress.done} scenarios, {self.found_after_s:.0f} s "
              f"({first.task}; {self.drive.size(first.found.scenario)}, not shrunk yet):", file=self.out)
        print(self.drive.report(first.found, replay=command), file=self.out)
        if stop and self.budget_s is not None:
            print(f"\nshrinking it, for at most {self.budget_s:g} s (--shrink-budget S changes that, --no-shrink "
                  "skips it) ...", file=self.out)
        elif not stop:
            print("\nplaying the rest, counting what differs; each task's first difference is shrunk as it ends ...",
                  file=self.out)
        self.out.flush()
        return True

    def shrinking(self, tried: int, smallest: Any) -> None:
        self.progress.say(f"shrinking: {tried} smaller scenarios tried, now {self.drive.size(smallest)}")

    def command_for(self, name: str, scenario: Any) -> str:
        """Save ``scenario`` and give the command line that replays it."""
        return shlex.join(self.replay(self.files.save(name, self.drive.to_dict(scenario))))

    def close(self) -> None:
        self.progress.close()
