"""Progress on stderr, phase by phase: a bar redrawn in place on a terminal, a plain line every ten
seconds otherwise (logs stay readable).

A phase with a total (playing 400 planned scenarios) never shows a count past it: work beyond the
plan (a shrinker's replays) is a phase of its own, with its own words. The first line waits a few
seconds, so a quick run prints none.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    def __init__(self, total: int, after_seconds: float = 2.0, unit: str = "scenarios", *,
                 stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.total, self.after, self.unit = total, after_seconds, unit
        self.start = time.monotonic()
        self.tty = self.stream.isatty()
        self.shown = False  # a bar is on the terminal's current line
        self.last_line = 0.0
        self.done = 0
        self.words: str | None = None  # the current phase's own line, when it has no total
        self.final_shown = False  # the line of a finished total is printed once

    def step(self) -> None:
        """One more planned item done (past the total it stays at the total)."""
        self.done = min(self.done + 1, self.total)
        self.update(self.done)

    def update(self, done: int) -> None:
        self.done = min(done, self.total)
        self._draw(f"{self.done}/{self.total} {self.unit}", self.done == self.total, self.done)

    def say(self, words: str) -> None:
        """The state of a phase that has no total (``shrinking: 14 smaller scenarios tried, ...``)."""
        self.words = words
        self._draw(words, False, None)

    def interrupt(self) -> None:
        """End the bar's line before something else is printed."""
        if self.shown and self.tty:
            self.stream.write("\n")
            self.stream.flush()
        self.shown = False

    def close(self) -> None:
        self.interrupt()

    def _draw(self, text: str, final: bool, done: int | None) -> None:
        elapsed = time.monotonic() - self.start
        if elapsed < self.after:
            return
        if not self.tty:
            if elapsed - self.last_line >= 10 or (final and not self.final_shown):
                self.last_line, self.final_shown = elapsed, final
                self.stream.write(f"kvparity: {text}, {elapsed:.0f} s\n")
            return
        if done is not None:
            width = 30
            filled = width * done // max(self.total, 1)
            text = f"[{'#' * filled}{'.' * (width - filled)}] {text}"
        self.stream.write(f"\r\033[K{text}, {elapsed:.0f} s")
        self.stream.flush()
        self.shown = True
