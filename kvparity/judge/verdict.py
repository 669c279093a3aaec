"""What a sweep of either drive tells its caller, below the runs that make it and the reports that
read it: what one scenario's play came to (``Played``, its ``Finding``s), what shrinking made of one
(``Shrunk``), one ``Verdict``, its rows (one per task: a scenario template, or a schedule policy
under an event loop), the first difference of each row as found and shrunk (``Example``), the
classes reached and the findings; and its one JSON schema (``to_json``), which ``kvparity check
--json`` writes for either drive."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kvparity.judge.power import CONFIDENCE, rules_out

if TYPE_CHECKING:  # the registry's record, read only; the drive's part that writes a scenario
    from kvparity.engine.real.door import KnownDefect
    from kvparity.judge.drive_parts import ScenarioForm


@dataclass(frozen=True)
class Finding:
    """Something a play met that is reported, not a divergence by itself: its ``label`` (what is
    counted: a known defect, an in-flight finding's kind and class of one player, ...), where it
    was seen (a world or player) and what was seen there."""

    label: str
    where: str
    line: str
    # A defect of the player's own run (an oracle it broke, a read of wrong KV, SGLang raising):
    # it fails the check whether or not the reference shares it. Else a difference that is known
    # and named (a renumbering, a release difference), reported and counted only.
    defect: bool = False
    known: KnownDefect | None = None  # a defect SGLang is known to have, as its registry holds it
    detail: str = ""  # what else a report shows of it (SGLang's traceback, where it raised)
    kind: str = ""  # what was met, without where (the label names both, and the known defect it is)


@dataclass
class Played:
    """One scenario, played by every world or player of a drive, and judged."""

    scenario: Any
    agree: bool
    kind: str | None  # the first difference's kind, what shrinking keeps (None when they agree)
    line: str  # the first difference in one line ("" when they agree)
    classes: frozenset[str] = frozenset()
    findings: tuple[Finding, ...] = ()
    result: Any = None  # the drive's own record of the play, for its report
    facts: dict[str, Any] = field(default_factory=dict)  # what the run learnt of its worlds (their kernels)

    @property
    def defects(self) -> tuple[Finding, ...]:
        """The findings that fail the check on their own (``Finding.defect``)."""
        return tuple(f for f in self.findings if f.defect)


@dataclass(frozen=True)
class Shrunk:
    """What shrinking made of a failing scenario."""

    scenario: Any  # the smallest failing scenario found (a Scenario, or a TrafficScenario)
    tried: int  # smaller candidates played
    complete: bool  # True: nothing one removal smaller fails; False: the budget ran out first
    seconds: float


# A verdict's values, the worst first: the two differ; they agree but a run had a defect of its
# own; they agree and every oracle held.
VERDICTS = ("divergence", "defect", "parity")


@dataclass
class Example:
    """A scenario that showed something (a difference, or a finding), as first found and, when
    shrinking ran, shrunk: ``shown`` is what a report shows."""

    found: Played
    task: str = ""
    where: str = ""  # for a finding: the world or player it was seen in
    shrunk: Shrunk | None = None
    shrunk_played: Played | None = None
    cause: str | None = None  # for a difference: what causes it, where that was shown
    found_after_s: float | None = None  # seconds into the run it was found

    @property
    def shown(self) -> Played:
        return self.shrunk_played if self.shrunk_played is not None else self.found

    def detail(self, label: str) -> str:
        """What else the shown play's finding ``label`` says (SGLang's traceback), or ""."""
        return next((f.detail for f in self.shown.findings if f.label == label and f.detail), "")

    def line(self, label: str | None = None) -> str:
        """For a difference, its line; for a finding, what was seen (``label``'s)."""
        played = self.shown
        if label is None:
            return played.line
        return next((f.line for f in played.findings if f.label == label), played.line)


@dataclass
class Row:
    """One task of a sweep (its shards merged)."""

    task: str
    key: tuple[Any, ...] = ()  # the task's key (the drive's own: (template index,), (loop index, policy index))
    scenarios: int = 0
    differing: int = 0
    kinds: Counter[str] = field(default_factory=Counter)  # differing scenarios by their first difference's kind
    first: Example | None = None
    # The first differing scenario of each other kind (the row's first is its own kind's).
    kind_examples: dict[str, Example] = field(default_factory=dict)
    classes: Counter[str] = field(default_factory=Counter)  # scenarios reaching each class
    findings: Counter[str] = field(default_factory=Counter)  # scenarios meeting each finding
    finding_examples: dict[str, Example] = field(default_factory=dict)
    defective: int = 0  # scenarios in which a player's own run had a defect (``Finding.defect``)
    seconds: float = 0.0
    cancelled: bool = False  # stopped early: another task's failure ended the run

    @property
    def verdict(self) -> str:
        """"divergence" where a scenario differs, else "defect" where a run had a defect of its own
        (a defect in both counts: the two agree on a defect), else "parity"."""
        return "divergence" if self.differing else "defect" if self.defective else "parity"

    @property
    def rules_out(self) -> float:
        """A difference reached by more than this fraction of the task's drawn scenarios would have
        been seen (``kvparity.judge.power``)."""
        return rules_out(self.scenarios)

    def count(self, played: Played, task: str) -> None:
        """One scenario's share: counted, its classes and findings, the row's first difference."""
        self.scenarios += 1
        self.classes.update(played.classes)
        self.defective += bool(played.defects)
        for label in dict.fromkeys(f.label for f in played.findings):
            self.findings[label] += 1
            if label not in self.finding_examples:
                where = next(f.where for f in played.findings if f.label == label)
                self.finding_examples[label] = Example(played, task, where)
        if not played.agree:
            self.differing += 1
            kind = played.kind or "?"
            self.kinds[kind] += 1
            if self.first is None:
                self.first = Example(played, task)
            elif kind != self.first.found.kind and kind not in self.kind_examples:
                self.kind_examples[kind] = Example(played, task)

    def merge(self, other: Row) -> None:
        """Another shard of the same task, played after this one."""
        self.scenarios += other.scenarios
        self.differing += other.differing
        self.defective += other.defective
        self.kinds.update(other.kinds)
        self.classes.update(other.classes)
        self.findings.update(other.findings)
        for label, example in other.finding_examples.items():
            self.finding_examples.setdefault(label, example)
        self.first = self.first or other.first
        for kind, example in other.kind_examples.items():
            if self.first is None or kind != self.first.found.kind:
                self.kind_examples.setdefault(kind, example)
        self.seconds += other.seconds
        self.cancelled = self.cancelled or other.cancelled


@dataclass
class Verdict:
    drive: str
    reference: str
    checked: tuple[str, ...]
    rows: list[Row]
    required: tuple[str, ...]  # the classes a run should reach
    seconds: float = 0.0
    counts_all: bool = False  # every scenario played (else the run stopped at its first difference)
    facts: dict[str, Any] = field(default_factory=dict)  # what the run learnt of its worlds (kernels, GPUs)
    summary_line: str = ""  # the drive's one-line summary (``kvparity.report.console.summary``)

    @property
    def verdict(self) -> str:
        """"divergence", "defect" (the runs agree, but one had a defect of its own: a failure all the
        same) or "parity" (they agree, and every oracle held)."""
        verdicts = {r.verdict for r in self.rows}
        return next((v for v in VERDICTS if v in verdicts), "parity")

    @property
    def defective(self) -> int:
        return sum(r.defective for r in self.rows)

    @property
    def defects(self) -> dict[str, Finding]:
        """Each defect's label, with its first finding (``Finding.known`` names a known SGLang defect)."""
        out: dict[str, Finding] = {}
        for row in self.rows:
            for label, example in row.finding_examples.items():
                found = next((f for f in example.found.findings if f.label == label and f.defect), None)
                if found is not None:
                    out.setdefault(label, found)
        return dict(sorted(out.items()))

    @property
    def scenarios(self) -> int:
        return sum(r.scenarios for r in self.rows)

    @property
    def differing(self) -> int:
        return sum(r.differing for r in self.rows)

    @property
    def classes(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for row in self.rows:
            total.update(row.classes)
        return total

    @property
    def fewest_at_parity(self) -> int | None:
        """The fewest scenarios a task at parity played (the weakest claim); ``None`` when no task is
        at parity or the run stopped at its first difference (its counts say nothing)."""
        parity = [r.scenarios for r in self.rows if r.differing == 0]
        if not parity or (self.first is not None and not self.counts_all):
            return None
        return min(parity)

    @property
    def rules_out(self) -> float | None:
        """What the parity of its tasks rules out: the weakest task's claim."""
        fewest = self.fewest_at_parity
        return None if fewest is None else rules_out(fewest)

    @property
    def required_reached(self) -> list[str]:
        return [c for c in self.required if self.classes[c]]

    @property
    def findings(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for row in self.rows:
            total.update(row.findings)
        return total

    def finding_example(self, label: str) -> Example | None:
        """The first example of ``label``: a shrunk one where there is one."""
        examples = [r.finding_examples[label] for r in self.rows if label in r.finding_examples]
        return next((e for e in examples if e.shrunk is not None), examples[0] if examples else None)

    @property
    def first(self) -> Example | None:
        """The run's first difference: the one found first in time (in one process, the first task's)."""
        found = [r.first for r in self.rows if r.first is not None]
        timed = [e for e in found if e.found_after_s is not None]
        return min(timed, key=lambda e: e.found_after_s or 0.0) if timed else (found[0] if found else None)

    @property
    def shrunk(self) -> Example | None:
        """The first difference that was shrunk, else the first."""
        return next((r.first for r in self.rows if r.first is not None and r.first.shrunk is not None), self.first)


def example_json(example: Example | None, drive: ScenarioForm[Any]) -> dict[str, Any] | None:
    if example is None:
        return None
    shown = example.shown
    return {
        "task": example.task, "line": example.found.line, "scenario": drive.to_dict(example.found.scenario),
        "found_after_s": None if example.found_after_s is None else round(example.found_after_s, 1),
        "shrunk": None if example.shrunk is None else {
            "line": shown.line, "scenario": drive.to_dict(shown.scenario), "tried": example.shrunk.tried,
            "complete": example.shrunk.complete, "seconds": round(example.shrunk.seconds, 1)},
        "cause": example.cause, "where": example.where or None,
    }


def to_json(verdict: Verdict, drive: ScenarioForm[Any]) -> dict[str, Any]:
    """The verdict as JSON-ready data: the one schema of ``kvparity check --json``, either drive."""
    defects = verdict.defects
    return {
        "drive": verdict.drive,
        "verdict": verdict.verdict,
        "summary": verdict.summary_line,
        "reference": verdict.reference,
        "checked": list(verdict.checked),
        "scenarios": verdict.scenarios,
        "differing": verdict.differing,
        "defective": verdict.defective,
        "power": {"confidence": CONFIDENCE,
                  "rules_out_above": None if verdict.rules_out is None else round(verdict.rules_out, 4)},
        "stopped_at_first_difference": not verdict.counts_all and verdict.verdict == "divergence",
        "rows": [{
            "task": r.task, "scenarios": r.scenarios, "differing": r.differing, "defective": r.defective,
            "verdict": r.verdict,
            "kinds": dict(sorted(r.kinds.items())), "classes": dict(sorted(r.classes.items())),
            "first": example_json(r.first, drive),
            "first_of_each_kind": {k: example_json(e, drive) for k, e in sorted(r.kind_examples.items())},
            "rules_out_above": round(r.rules_out, 4), "seconds": round(r.seconds, 1),
        } for r in verdict.rows],
        "classes": {c: verdict.classes[c] for c in verdict.required},
        "classes_reached": verdict.required_reached,
        "classes_required": len(verdict.required),
        "findings": {label: _finding_json(verdict, drive, label, n, defects.get(label))
                     for label, n in sorted(verdict.findings.items())},
        "first_difference": example_json(verdict.first, drive),
        "facts": verdict.facts,
        "seconds": round(verdict.seconds, 1),
    }



def _finding_json(verdict: Verdict, drive: ScenarioForm[Any], label: str, scenarios: int, defect: Finding | None) -> dict[str, Any]:
    """A finding's entry: how many scenarios met it, whether it is a defect (and a known one), its
    first example and what else that example says (SGLang's traceback)."""
    example = verdict.finding_example(label)
    known = None if defect is None or defect.known is None else defect.known.line
    return {"scenarios": scenarios, "defect": defect is not None, "known": known,
            "line": example.line(label) if example else None,  # what was seen, in the example shown
            "first": example_json(example, drive), "detail": (example.detail(label) or None) if example else None}
