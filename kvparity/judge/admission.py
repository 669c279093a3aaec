"""Scheduler decisions compared (issue 26): two runs of the same traffic scenario, iteration by
iteration, on what each scheduler decided: the batch formed (forward mode, request ids in order,
prefix and extend lengths, the chunked request) and the waiting queue's order after it."""

from __future__ import annotations

from collections import Counter
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


def inflight_kinds(result: dict[str, Any]) -> Counter[tuple[str, str]]:
    """The in-flight oracle's findings of a run (``run_traffic``'s ``inflight_violations``), counted
    by kind ("cell": a cell an in-flight batch reads changed; "row": its row given to another
    request) and class ("live", "finished": the request had finished and its token is dropped,
    "retracted")."""
    return Counter((f["kind"], f["class"]) for f in result.get("inflight_violations", ()))


@dataclass(frozen=True)
class TrafficJudgement:
    """Two runs of one traffic scenario judged: the first decision that differs, the first request
    whose outputs differ, the in-flight findings the other run has and the reference has not, and
    an error the other run stopped on (a scheduler that raised: SGLang's own leak check, say) that
    the reference did not."""

    decision: DecisionDifference | None
    outputs: tuple[str, Any, Any] | None  # (rid, reference's output ids, other's)
    inflight_only_other: tuple[dict[str, Any], ...]  # the other run's live findings the reference has not
    error: dict[str, Any] | None = None  # {"iteration", "message"}

    @property
    def agree(self) -> bool:
        return self.decision is None and self.outputs is None and not self.inflight_only_other and self.error is None

    @property
    def admission(self) -> bool:
        return self.decision is not None and self.decision.admission

    @property
    def kind(self) -> str:
        """What is shown first: the earliest symptom ("inflight", "decision", "error" or "outputs")."""
        seen: list[tuple[int, int, str]] = []
        if self.inflight_only_other:
            seen.append((self.inflight_only_other[0]["detected"]["iteration"], 0, "inflight"))
        if self.decision is not None:
            seen.append((self.decision.iteration, 1, "decision"))
        if self.error is not None:
            seen.append((self.error["iteration"], 2, "error"))
        return min(seen)[2] if seen else "outputs"

    def line(self) -> str:
        kind = self.kind
        if kind == "inflight":
            return (f"in-flight oracle: {len(self.inflight_only_other)} finding(s) the reference does not have; the "
                    f"first: {finding_line(self.inflight_only_other[0])}")
        if kind == "decision" and self.decision is not None:
            return self.decision.line()
        if kind == "error" and self.error is not None:
            return f"iteration {self.error['iteration']}: the scheduler raised {self.error['message']}"
        rid, ref, got = self.outputs or ("?", None, None)
        return f"request {rid}: output ids {ref!r} != {got!r}"


def judge_traffic(reference: dict[str, Any], other: dict[str, Any]) -> TrafficJudgement:
    outputs = None
    for rid in sorted(set(reference["outputs"]) | set(other["outputs"])):
        if reference["outputs"].get(rid) != other["outputs"].get(rid):
            outputs = (rid, reference["outputs"].get(rid), other["outputs"].get(rid))
            break
    # Only a live request's findings can diverge: a finished or retracted request's token of the
    # batch in flight is dropped by SGLang itself (they are counted and shown per release, apart).
    theirs = {_identity(f) for f in reference.get("inflight_violations", ())}
    extra = tuple(f for f in other.get("inflight_violations", ()) if f["class"] == "live" and _identity(f) not in theirs)
    error = other.get("error")
    if error is not None and reference.get("error") is not None and error["message"] == reference["error"]["message"]:
        error = None  # both stopped alike
    return TrafficJudgement(first_decision_difference(reference["iterations"], other["iterations"]), outputs, extra,
                            error)


def _identity(finding: dict[str, Any]) -> tuple[Any, ...]:
    return (finding["kind"], finding["class"], finding["batch_iteration"], finding["rid"], finding["row"],
            tuple(finding.get("columns", ())), finding.get("taken_by"))


def finding_line(finding: dict[str, Any]) -> str:
    """One in-flight finding in words: which batch, request, row and cells, and when it was seen."""
    where = f"batch of iteration {finding['batch_iteration']}, request {finding['rid']}, row {finding['row']}"
    seen = f"seen at iteration {finding['detected']['iteration']} in {finding['detected']['step']}"
    if finding["kind"] == "row":
        return f"{finding['class']}: row given to {finding['taken_by']} while in flight ({where}; {seen})"
    return (f"{finding['class']}: cells {finding['columns']} changed {finding['old']} -> {finding['new']} while in flight "
            f"({where}; {seen})")
