"""The seam every drive plugs into: what decides which requests a batch admits, and so what is
drawn, played, judged, shrunk and reported.

A ``Drive`` owns its scenario form, its strategy, its loop and its worker plugin; the sweep
(``kvparity.run.sweep``), the shrinker (``kvparity.run.minimize``), the verdict and its JSON
(``kvparity.judge.verdict``), the reports (``kvparity.report``) and the matrix (``kvparity.run.matrix``)
are written once, over this interface. Two drives implement it:

- ``kvparity.run.harness_drive.HarnessDrive``: step scenarios played by kvparity's own scheduler
  loop in every world at once (identical decisions: the memory path alone), one task per scenario
  template (and shard); the first failure ends the run.
- ``kvparity.run.scheduler_drive.SchedulerDrive``: traffic scenarios played by two schedulers
  (real releases' own, or kvparity's model of it), one task per schedule policy and event loop;
  every scenario is played, differences are counted.

What one scenario's play comes to is a ``Played``: whether the worlds or players agree, the first
difference in one line and its kind (what shrinking keeps), the classes reached, and the findings
(what is reported: a known difference between releases, counted only; or a defect of a player's
own run, an oracle it broke, a read of wrong KV, SGLang raising, which fails the check whether or
not the reference shares it: "a defect in both").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from kvparity.judge.verdict import Finding, Played

DRIVES = ("harness", "scheduler")


@dataclass(frozen=True)
class Task:
    """What a sweep draws together: one template's scenarios (harness) or one schedule policy
    under one event loop (scheduler); a large one is played as several shards, each from its own seed."""

    name: str  # as reports name it: "chunked rounds", "lpm, overlap loop"
    key: tuple[Any, ...]  # the drive's own: (template index,) or (policy, loop)
    examples: int  # scenarios to draw in this shard
    seed: int | None  # None: derandomized
    shard: int = 0


class Drive(Protocol):
    """A drive, as the sweep, the shrinker, the verdict and the reports use it."""

    name: str  # one of DRIVES
    counts_all: bool  # play every scenario and count the differing ones (else: stop at the first)
    reference: str  # the reference world or player, by name
    checked: tuple[str, ...]  # what is checked against it
    required: tuple[str, ...]  # the classes a run should reach

    def tasks(self, examples: int, seed: int | None) -> list[Task]:
        """The tasks of a run of about ``examples`` scenarios (the drive's own unit: in all, or per task)."""
        ...

    def strategy(self, task: Task) -> Any:
        """The Hypothesis strategy ``task``'s scenarios are drawn from."""
        ...

    def play(self, scenario: Any) -> Played:
        """Play ``scenario`` in every world or by every player, and judge it."""
        ...

    def replayer(self, played: Played) -> Callable[[Any], Played]:
        """How to replay candidates while shrinking ``played``'s difference: the cheapest play that
        can still show it (the reference and one world that failed, say)."""
        ...

    def finding_replayer(self, finding: Finding) -> Callable[[Any], Played]:
        """How to replay candidates while shrinking a finding's first example."""
        ...

    def same(self, played: Played, first: Played) -> bool:
        """Whether a candidate keeps the first difference (the same kind of it)."""
        ...

    def targets(self, played: Played) -> dict[str, float]:
        """What the sweep asks Hypothesis to steer toward (``hypothesis.target``): a score per label,
        higher for a scenario nearer the rare shapes the drive wants reached."""
        ...

    def candidates(self, scenario: Any) -> Iterator[Any]:
        """Smaller scenarios, big cuts first (``kvparity.run.minimize``)."""
        ...

    def explain(self, played: Played) -> str | None:
        """The cause of a (shrunk) difference, where it can be shown; None otherwise."""
        ...

    def refuses(self, scenario: Any) -> str | None:
        """Why this drive cannot play ``scenario`` (a replayed one), or None."""
        ...

    def report(self, played: Played, replay: str | None = None) -> str:
        """A failure in words: the first difference, what differs, the scenario, how to replay it."""
        ...

    def header(self, verdict: Any) -> list[str]:
        """The drive's table of a verdict (the world pairs; the schedule policies under each loop)."""
        ...

    def summary(self, verdict: Any) -> str:
        """A verdict in one line: what differs where, or parity."""
        ...

    def finding_kind(self, label: str) -> str:
        """What a finding is, in words ("known defect reported", ...)."""
        ...

    def size(self, scenario: Any) -> str:
        """A scenario's size in words ("3 requests, 4 steps")."""
        ...

    def to_dict(self, scenario: Any) -> dict[str, Any]:
        """A scenario as JSON-ready data (``--replay`` reads it back)."""
        ...

    def close(self) -> None:
        """Stop what the drive started (real SGLang workers)."""
        ...


def finding_reached(label: str) -> Callable[[Played], bool]:
    """Whether a play met the finding ``label`` (what shrinking a finding's example keeps)."""
    return lambda played: any(f.label == label for f in played.findings)
