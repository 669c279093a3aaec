"""What a sweep tells its caller while it runs (``SweepEvents``), and the failures it hands over:
the first failing scenario as found (``FirstFailure``) and each known defect's first example
(``FindingExample``). Plain data: in a parallel run they cross from the jobs to the caller."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from kvparity.model.scenario import Scenario
from kvparity.run.runner import RunResult


@dataclass(frozen=True)
class FirstFailure:
    """A sweep's first failing scenario, as found (before shrinking), and its template."""

    scenario: Scenario
    result: RunResult
    template: str


@dataclass(frozen=True)
class FindingExample:
    """The first scenario that reached a known defect, and what was seen there; shrunk when its
    job had the time (``original`` is then the scenario as drawn)."""

    scenario: Scenario
    what: str
    detail: str
    world: str  # where it was seen
    original: Scenario | None = None


class SweepEvents(Protocol):
    """What a sweep tells its caller while it runs (the command line prints it). In a parallel
    run the jobs' events come back to the calling process, in the order they happened."""

    def played(self) -> None:
        """One planned scenario played."""

    def found(self, first: FirstFailure) -> None:
        """The first failure, before it is shrunk."""

    def shrinking(self, tried: int, smallest: Scenario) -> None:
        """Another smaller candidate played; ``smallest`` is the smallest failing one so far."""

    def cancelled(self) -> bool:
        """Whether this task should stop now (some other task failed)."""

    def claim(self, defect: str) -> bool:
        """Whether this process shrinks the first example of known defect ``defect`` (once per run)."""


class QuietEvents:
    """Events of a run nobody watches (tests, library calls): one process, nothing printed."""

    def __init__(self) -> None:
        self.claimed: set[str] = set()

    def played(self) -> None:
        pass

    def found(self, first: FirstFailure) -> None:
        pass

    def shrinking(self, tried: int, smallest: Scenario) -> None:
        pass

    def cancelled(self) -> bool:
        return False

    def claim(self, defect: str) -> bool:
        fresh = defect not in self.claimed
        self.claimed.add(defect)
        return fresh
