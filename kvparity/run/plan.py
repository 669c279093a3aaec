"""What a sweep plays (``SweepPlan``: the drive, built anew in every job from its ``spec``; the tasks
and their seeds; the shrinking budgets) and what one task brings back (``TaskOutcome``). Plain data:
both cross between the calling process and its jobs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from kvparity.judge.verdict import Row
from kvparity.run.drive import Drive, Task
from kvparity.run.minimize import DEFAULT_BUDGET_S

# Seconds each finding's first example may be shrunk for (in the job that first met it).
FINDING_BUDGET_S = 4.0

# Scenarios per task: a task with more is played as several shards, each from its own seed, so
# that many processes share one task's scenarios. The shards depend on the plan only, never on the
# number of jobs, so one job and many play the same scenarios.
SHARD_SIZE = 100


class DriveSpec(Protocol):
    """What a drive is made of, as plain data (it crosses into job processes): ``build`` makes it."""

    def build(self) -> Drive: ...


def shards(name: str, key: tuple[Any, ...], examples: int, seed: int | None, index: int,
           size: int | None = None) -> list[Task]:
    """A task of ``examples`` scenarios, as shards of at most ``size`` (``SHARD_SIZE`` unless
    given): a task played whole keeps the run's seed (None: derandomized, as always); its shards
    each take a seed of their own, derived from the run's seed (0 when derandomized) and the task's
    ``index``."""
    size = size or SHARD_SIZE
    if examples <= size:
        return [Task(name, key, examples, seed)]
    count = -(-examples // size)
    return [Task(name, key, min(size, examples - shard * size),
                 ((seed or 0) * 1_000_003 + index * 10_007 + shard) % (1 << 32), shard) for shard in range(count)]


@dataclass(frozen=True)
class SweepPlan:
    """What every job plays."""

    spec: Any  # a DriveSpec
    tasks: tuple[Task, ...]
    shrink_budget_s: float | None = DEFAULT_BUDGET_S
    finding_budget_s: float = FINDING_BUDGET_S
    # Candidates a shrink may play (None: its time budget alone). The release matrix bounds shrinking
    # by count, with time only as a far cap, so that its JSON is the same on any machine and --jobs.
    shrink_tries: int | None = None


@dataclass
class TaskOutcome:
    """One task (shard) played: its row, and where."""

    task: Task
    row: Row
    device: str = ""  # the GPU a parallel job played it on (CUDA_VISIBLE_DEVICES), else ""
    facts: dict[str, Any] = field(default_factory=dict)
