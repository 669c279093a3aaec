"""The parts of a drive that the verdict's JSON and the reports read, below both (a drive is a record
of small parts, ``kvparity.run.drive``; the parts that draw, play, judge, shrink and explain sit with
the runs). Each part is a protocol of a few typed methods, so a report asks of a drive only what it
renders: a scenario in words and as data (``ScenarioForm``), a failure (``FailureRenderer``), a
verdict (``VerdictRenderer``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from kvparity.judge.verdict import Played, Verdict

# A drive's scenario form (``kvparity.model.scenario.Scenario``, ``kvparity.model.traffic.TrafficScenario``).
S_contra = TypeVar("S_contra", contravariant=True)


class ScenarioForm(Protocol[S_contra]):
    """A drive's scenario form: one scenario in words and as JSON-ready data."""

    def size(self, scenario: S_contra) -> str:
        """A scenario's size in words ("3 requests, 4 steps")."""
        ...

    def to_dict(self, scenario: S_contra) -> dict[str, Any]:
        """A scenario as JSON-ready data (``--replay`` reads it back)."""
        ...


class FailureRenderer(Protocol):
    """One play's failure, and a finding's kind, in words."""

    def report(self, played: Played, replay: str | None = None) -> str:
        """A failure in words: the first difference, what differs, the scenario, how to replay it."""
        ...

    def finding_kind(self, label: str) -> str:
        """What a finding is, in words ("known defect reported", ...)."""
        ...


class VerdictRenderer(Protocol):
    """A verdict in the drive's own terms."""

    def header(self, verdict: Verdict) -> list[str]:
        """The drive's table of a verdict (the world pairs; the schedule policies under each loop)."""
        ...

    def summary(self, verdict: Verdict) -> str:
        """A verdict in one line: what differs where, or parity."""
        ...


class Reporting(ScenarioForm[S_contra], FailureRenderer, VerdictRenderer, Protocol[S_contra]):
    """What the reports read of a drive: its scenario form and both renderers."""
