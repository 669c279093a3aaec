"""What a sweep tells its caller while it runs (``SweepEvents``): each scenario played, the first
difference the moment it is found (the report comes first), shrinking's progress. In a parallel run
the jobs' events come back to the calling process, in the order they happened."""

from __future__ import annotations

import time
from typing import Any, Protocol

from kvparity.judge.verdict import Example


class SweepEvents(Protocol):
    def played(self) -> None:
        """One planned scenario played."""

    def found(self, first: Example, *, stop: bool) -> bool:
        """A task's first difference, before it is shrunk; ``stop``: it ends the run (every other
        task stops). Returns whether it was the run's first (a later one is not shown as found)."""

    def shrinking(self, tried: int, smallest: Any) -> None:
        """Another smaller candidate played; ``smallest`` is the smallest failing one so far."""

    def cancelled(self) -> bool:
        """Whether this task should stop now (another task's difference ended the run)."""

    def claim(self, key: str) -> bool:
        """Whether this process shrinks the first example of ``key`` (once per run)."""

    def elapsed(self) -> float:
        """Seconds since the run started."""


class QuietEvents:
    """Events of a run nobody watches (tests, library calls): one process, nothing printed."""

    def __init__(self) -> None:
        self.claimed: set[str] = set()
        self.stopped = False
        self.first_found = False
        self.start = time.monotonic()

    def played(self) -> None:
        pass

    def found(self, first: Example, *, stop: bool) -> bool:
        was_first = not self.first_found
        self.first_found = True
        self.stopped = self.stopped or stop
        return was_first

    def shrinking(self, tried: int, smallest: Any) -> None:
        pass

    def cancelled(self) -> bool:
        return False  # one process: the task that found the difference is the one that stops

    def claim(self, key: str) -> bool:
        fresh = key not in self.claimed
        self.claimed.add(key)
        return fresh

    def elapsed(self) -> float:
        return time.monotonic() - self.start
