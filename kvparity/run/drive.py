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
from typing import Any, Protocol, TypeVar

from kvparity.judge.drive_parts import Reporting
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


# A drive's scenario form, where a part both takes and gives scenarios (invariant) or only takes them.
S = TypeVar("S")
S_contra = TypeVar("S_contra", contravariant=True)


class Generator(Protocol):
    """What a sweep draws: the tasks of a run, each task's strategy, and where Hypothesis is steered."""

    def tasks(self, examples: int, seed: int | None) -> list[Task]:
        """The tasks of a run of about ``examples`` scenarios (the drive's own unit: in all, or per task)."""
        ...

    def strategy(self, task: Task) -> Any:
        """The Hypothesis strategy ``task``'s scenarios are drawn from."""
        ...

    def targets(self, played: Played) -> dict[str, float]:
        """What the sweep asks Hypothesis to steer toward (``hypothesis.target``): a score per label,
        higher for a scenario nearer the rare shapes the drive wants reached."""
        ...


class Player(Protocol[S_contra]):
    """Who plays a scenario, in every world or by every player, and judges it."""

    def play(self, scenario: S_contra) -> Played:
        """Play ``scenario`` and judge it."""
        ...

    def refuses(self, scenario: S_contra) -> str | None:
        """Why this drive cannot play ``scenario`` (a replayed one), or None."""
        ...

    def close(self) -> None:
        """Stop what the drive started (real SGLang workers)."""
        ...


class Checker(Protocol):
    """Whether another play shows what the first showed, and whether a play could be judged at all."""

    def same(self, played: Played, first: Played) -> bool:
        """Whether a candidate keeps the first difference (the same kind of it: what shrinking keeps)."""
        ...

    def identical(self, played: Played, first: Played) -> bool:
        """Whether ``played`` differs as ``first`` does, to the detail (what explain's hybrids must
        reproduce: a world that fails to run would pass ``same`` for any difference)."""
        ...

    def broken(self, played: Played) -> str | None:
        """Why the checked world or player could not be judged (its SGLang raised, its world
        failed), even where another symptom shows first; None when it ran."""
        ...


class Reducer(Protocol[S]):
    """How a scenario is made smaller, and the cheapest replay that can still show its failure."""

    def candidates(self, scenario: S) -> Iterator[S]:
        """Smaller scenarios, big cuts first (``kvparity.run.minimize``)."""
        ...

    def replayer(self, played: Played) -> Callable[[S], Played]:
        """How to replay candidates while shrinking ``played``'s difference: the cheapest play that
        can still show it (the reference and one world that failed, say)."""
        ...

    def finding_replayer(self, finding: Finding) -> Callable[[S], Played]:
        """How to replay candidates while shrinking a finding's first example."""
        ...


class Explainer(Protocol):
    """The cause of a difference, where the drive can show one."""

    def explain(self, played: Played) -> str | None:
        """The cause of a (shrunk) difference; None where it cannot be shown."""
        ...


class Drive(Generator, Player[S], Checker, Reducer[S], Explainer, Reporting[S], Protocol[S]):
    """A drive, as the sweep, the shrinker, the verdict and the reports use it: its parts (each a
    protocol of a few typed methods, so that a caller can ask for the part it uses: explain a
    ``Player`` and a ``Checker``, the reports ``Reporting``) and what names it."""

    name: str  # one of DRIVES
    counts_all: bool  # play every scenario and count the differing ones (else: stop at the first)
    reference: str  # the reference world or player, by name
    checked: tuple[str, ...]  # what is checked against it
    required: tuple[str, ...]  # the classes a run should reach


def finding_reached(label: str) -> Callable[[Played], bool]:
    """Whether a play met the finding ``label`` (what shrinking a finding's example keeps)."""
    return lambda played: any(f.label == label for f in played.findings)
