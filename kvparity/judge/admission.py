"""Scheduler decisions compared (issue 26): two runs of the same traffic scenario, iteration by
iteration, on what each scheduler decided: the batch formed (forward mode, request ids in order,
prefix and extend lengths, the chunked request) and the waiting queue's order after it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# What an iteration record of ``scheduler_shell.run_traffic`` holds that is a decision.
DECISIONS = ("mode", "rids", "prefix_lens", "extend_lens", "chunked", "waiting")


@dataclass(frozen=True)
class DecisionDifference:
    iteration: int
    field: str
    reference: Any
    other: Any

    def line(self) -> str:
        return f"iteration {self.iteration}: {self.field} {self.reference!r} != {self.other!r}"

    @property
    def admission(self) -> bool:
        """The two schedulers admitted (or kept waiting) different requests, or in another order."""
        return self.field in ("rids", "waiting")


def first_decision_difference(reference: list[dict[str, Any]], other: list[dict[str, Any]]) -> DecisionDifference | None:
    """The first iteration, and the first of ``DECISIONS``, where ``other`` decided otherwise than
    ``reference``; an iteration one run has and the other has not is a difference in "mode"."""
    for index in range(max(len(reference), len(other))):
        ref = reference[index] if index < len(reference) else {}
        got = other[index] if index < len(other) else {}
        for name in DECISIONS:
            if ref.get(name) != got.get(name):
                return DecisionDifference(index, name, ref.get(name), got.get(name))
    return None
