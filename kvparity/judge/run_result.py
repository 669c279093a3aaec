"""What one scenario played in lockstep comes to (the harness drive's record of a play): the worlds,
the stages, the divergences, the known findings, the oracles' violations, the reference's records
and the classes reached. Below the runner that makes it and the reports that read it."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvparity.engine.scheduler import StageRecord
from kvparity.judge.compare import Difference
from kvparity.judge.oracles import Violation
from kvparity.model.scenario import Scenario


@dataclass
class RunResult:
    scenario: Scenario
    worlds: tuple[str, ...]
    stages: int = 0
    divergences: list[Difference] = field(default_factory=list)
    findings: list[Difference] = field(default_factory=list)  # known defects (legacy's, SGLang's)
    violations: list[Violation] = field(default_factory=list)  # oracle failures
    first_difference: StageRecord | None = None
    records: list[StageRecord] = field(default_factory=list)  # the reference world's stages
    classes: set[str] = field(default_factory=set)
    # Real world -> which kernels it ran, as SGLang chose them (0.5.22+ report it; page size 1 has no
    # allocation kernel, so the first paged scenario's report is the telling one).
    kernels: dict[str, dict[str, str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.divergences and not self.violations
