"""What a sweep plays (``TemplatePlan``: the worlds, the (template, shard) tasks and their seeds,
the shrinking budgets) and what one task brings back (``TemplateOutcome``). Plain data: both
cross between the calling process and its jobs."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from kvparity.model.scenario import Scenario
from kvparity.model.strategies import TEMPLATES
from kvparity.run.events import FindingExample, FirstFailure
from kvparity.run.minimize import DEFAULT_BUDGET_S, Shrunk
from kvparity.run.runner import RunResult


def per_template(examples: int) -> int:
    """Scenarios each template plays when a run asks for about ``examples`` (at least one)."""
    return max(1, examples // len(TEMPLATES))


# Seconds each known defect's first example may be shrunk for (in the job that first met it).
FINDING_BUDGET_S = 4.0

# Scenarios per task: a template with more is played as several shards, each from its own seed,
# so that many processes share one template's scenarios. The shards depend on the plan only,
# never on the number of jobs, so one job and many play the same scenarios.
SHARD_SIZE = 100


@dataclass(frozen=True)
class TemplatePlan:
    """What every job plays (plain data: it crosses into worker processes)."""

    worlds: tuple[tuple[str, str], ...]
    per_template: int
    random_seed: int | None
    real_reference: bool
    shard_size: int = SHARD_SIZE
    shrink_budget_s: float | None = DEFAULT_BUDGET_S
    finding_budget_s: float = FINDING_BUDGET_S

    def tasks(self) -> list[tuple[int, int]]:
        """(template index, shard) in the order one process plays them."""
        shards = -(-self.per_template // self.shard_size)
        return [(index, shard) for index in range(len(TEMPLATES)) for shard in range(shards)]

    def examples(self, shard: int) -> int:
        return min(self.shard_size, self.per_template - shard * self.shard_size)

    def seed(self, index: int, shard: int) -> int | None:
        """A template played whole keeps the run's seed (None: derandomized, as always); its
        shards each take a seed of their own, derived from the run's seed (0 when derandomized)."""
        if self.per_template <= self.shard_size:
            return self.random_seed
        return ((self.random_seed or 0) * 1_000_003 + index * 10_007 + shard) % (1 << 32)


@dataclass
class TemplateOutcome:
    index: int
    shard: int = 0
    scenarios: int = 0
    classes: set[str] = field(default_factory=set)
    findings: Counter = field(default_factory=Counter)
    finding_examples: dict[str, str] = field(default_factory=dict)  # kept by _play_template's play; unused
    examples: dict[str, FindingExample] = field(default_factory=dict)  # known defect -> its first example here
    kernels: dict[str, dict[str, str]] = field(default_factory=dict)
    first_failure: FirstFailure | None = None  # as found
    failure: tuple[Scenario, RunResult] | None = None  # shrunk, with its result
    shrink: Shrunk | None = None
    cancelled: bool = False  # stopped early: another task failed
    reported: bool = False  # its failure was the run's first, handed over as found (and shrunk)
    device: str = ""  # the GPU a parallel job played it on (CUDA_VISIBLE_DEVICES), else ""
