"""Two runs of one traffic scenario judged (scheduler-driven): what each scheduler decided,
iteration by iteration (the batch formed: forward mode, request ids in order, prefix and extend
lengths, the chunked request; the waiting queue's order after it), the memory after every
iteration while the decisions agree (``kvparity.judge.memory``), the oracles on each run's memory,
the KV canary's reads of wrong KV, the in-flight oracle's findings, the error a scheduler stopped
on, and the outputs. The earliest symptom is what a report shows first."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kvparity.engine.traffic_run import TrafficRun
from kvparity.judge.memory import MemoryDifference, MemoryProblem, first_memory_difference, run_problems
from kvparity.model.canary import CanaryRead
from kvparity.model.traffic import TrafficScenario, traffic_geometry
from kvparity.model.traffic_records import DECISIONS, WRONG_KV, Decision, InflightFinding, StopError
from kvparity.model.worlds import WorldId


@dataclass(frozen=True)
class DecisionDifference:
    iteration: int
    field: str
    reference: Any
    other: Any

    def line(self) -> str:
        if self.field == "iterations":
            return (f"iteration {self.iteration}: the reference ran {self.reference} iterations, the other run "
                    f"{self.other}")
        return f"iteration {self.iteration}: {self.field} {_shown(self.reference)!r} != {_shown(self.other)!r}"

    @property
    def admission(self) -> bool:
        """The two schedulers admitted (or kept waiting) different requests, or in another order."""
        return self.field in ("rids", "waiting")


def _shown(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def first_decision_difference(reference: Sequence[Decision], other: Sequence[Decision]) -> DecisionDifference | None:
    """The first iteration, and the first of ``DECISIONS``, where ``other`` decided otherwise than
    ``reference``; an iteration one run has and the other has not is a difference in "iterations"
    (how many each ran)."""
    for index in range(max(len(reference), len(other))):
        if index >= min(len(reference), len(other)):  # one run ended (or stopped) before the other
            return DecisionDifference(index, "iterations", len(reference), len(other))
        ref, got = reference[index], other[index]
        for name in DECISIONS:
            a, b = getattr(ref, name, None), getattr(got, name, None)
            if a != b:
                return DecisionDifference(index, name, a, b)
    return None


def diverging(finding: InflightFinding) -> bool:
    """An in-flight finding the checked run has and the reference has not is a divergence when
    its request's token is kept (live), or when a read through the changed table would see wrong
    KV whatever becomes of the token (SGLang treats a row reused under a forward that still reads
    it as a bug, sgl-project/sglang#18744)."""
    return finding.cls == "live" or finding.harm == WRONG_KV


@dataclass(frozen=True)
class TrafficJudgement:
    """Two runs of one traffic scenario judged: the first decision that differs; the first memory
    difference while decisions agree; what the other run has that the reference has not (memory
    oracles failed, canary reads of wrong KV, diverging in-flight findings, an error); the first
    request whose outputs differ; and the known release differences the memory comparison met."""

    decision: DecisionDifference | None
    outputs: tuple[str, Any, Any] | None  # (rid, reference's output ids, other's)
    inflight_only_other: tuple[InflightFinding, ...] = ()
    error: StopError | None = None
    memory: MemoryDifference | None = None
    problems: tuple[MemoryProblem, ...] = ()
    canary: tuple[CanaryRead, ...] = ()
    known: frozenset[str] = frozenset()
    reference_error: StopError | None = None  # the reference raised where the checked run did not so

    @property
    def agree(self) -> bool:
        return (self.decision is None and self.outputs is None and not self.inflight_only_other and self.error is None
                and self.memory is None and not self.problems and not self.canary)

    @property
    def admission(self) -> bool:
        return self.decision is not None and self.decision.admission

    def symptoms(self) -> list[tuple[int, int, str]]:
        """(iteration, rank, kind) of every symptom, earliest first. At one iteration: an oracle the
        checked run broke (it names what went wrong), a read of wrong KV, then the memory as
        compared, then what was found in flight, what the scheduler decided, an error."""
        seen: list[tuple[int, int, str]] = []
        if self.problems:
            seen.append((self.problems[0].iteration, 0, "oracle"))
        if self.canary:
            seen.append((self.canary[0].iteration, 1, "canary"))
        if self.memory is not None:
            seen.append((self.memory.iteration, 2, "memory"))
        if self.inflight_only_other:
            seen.append((self.inflight_only_other[0].detected_iteration, 3, "inflight"))
        if self.decision is not None and not self.stopped_short:
            seen.append((self.decision.iteration, 4, "decision"))
        if self.error is not None:
            seen.append((self.error.iteration, 5, "error"))
        elif self.stopped_short and self.decision is not None:  # the reference stopped (the checked run did not)
            seen.append((self.decision.iteration, 5, "error"))
        return sorted(seen)

    @property
    def stopped_short(self) -> bool:
        """The runs ran different numbers of iterations because one of them raised: the error is
        the symptom, not the count (a crash is not a decision)."""
        return (self.decision is not None and self.decision.field == "iterations"
                and (self.error is not None or self.reference_error is not None))

    @property
    def kind(self) -> str:
        """What is shown first: the earliest symptom ("memory", "oracle", "canary", "inflight",
        "decision", "error" or "outputs")."""
        seen = self.symptoms()
        return seen[0][2] if seen else "outputs"

    def line(self) -> str:
        kind = self.kind
        if kind == "memory" and self.memory is not None:
            return self.memory.line()
        if kind == "oracle":
            return f"memory oracle: {self.problems[0].line()}"
        if kind == "canary":
            read = self.canary[0]
            return f"KV canary: iteration {read.iteration}: {read.line()}"
        if kind == "inflight":
            return (f"in-flight oracle: {len(self.inflight_only_other)} finding(s) the reference does not have; the "
                    f"first: {self.inflight_only_other[0].line()}")
        if kind == "decision" and self.decision is not None:
            return self.decision.line()
        if kind == "error" and self.error is not None:
            return f"iteration {self.error.iteration}: the scheduler raised {self.error.message}"
        if kind == "error" and self.reference_error is not None:
            error = self.reference_error
            return f"iteration {error.iteration}: the reference's scheduler raised {error.message} (the other did not)"
        rid, ref, got = self.outputs or ("?", None, None)
        return f"request {rid}: output ids {_shown(ref)!r} != {_shown(got)!r}"


def judge_traffic(scenario: TrafficScenario, reference: TrafficRun, other: TrafficRun, ref_id: WorldId,
                  other_id: WorldId) -> TrafficJudgement:
    geometry = traffic_geometry(scenario)
    decision = first_decision_difference(reference.decisions, other.decisions)
    agreed = len(reference.memory) if decision is None else decision.iteration
    memory, known = first_memory_difference(ref_id, reference.memory[:agreed], other_id, other.memory[:agreed],
                                            geometry.page_size)
    problems = _unshared(traffic_problems(scenario, reference), traffic_problems(scenario, other),
                         lambda p: p.identity, ref_id, other_id)
    canary = _unshared(reference.canary, other.canary, _read_identity, ref_id, other_id)
    theirs = {f.identity for f in reference.inflight}
    extra = tuple(f for f in other.inflight if diverging(f) and f.identity not in theirs)
    error, reference_error = other.error, reference.error
    if error is not None and reference_error is not None and error.message == reference_error.message:
        error = reference_error = None  # both stopped alike (each run's own defect, reported per player)
    return TrafficJudgement(decision, _first_output_difference(reference, other), extra, error, memory, problems,
                            canary, frozenset(known), None if error is not None else reference_error)


def traffic_problems(scenario: TrafficScenario, run: TrafficRun) -> list[MemoryProblem]:
    """The memory oracles on every iteration of ``run``, and the table past every sequence."""
    problems = run_problems(traffic_geometry(scenario), run.memory)
    if run.cells_past_width:
        last = run.memory[-1].record.step if run.memory else 0
        problems.append(MemoryProblem(last, "table", f"{run.cells_past_width} cells past every sequence of the run "
                                                      "were written (found at its end)"))
    return problems


def _unshared(theirs: Sequence[Any], ours: Sequence[Any], identity: Callable[[Any], Any], ref_id: WorldId,
              other_id: WorldId) -> tuple[Any, ...]:
    """What only the checked run found (what both found is a property of both, reported per player),
    and, whichever side it is on, what kvparity's own model found: the model must break none."""
    seen = {identity(x) for x in theirs}
    found = [x for x in ours if other_id.release is None or identity(x) not in seen]
    return tuple(found + (list(theirs) if ref_id.release is None else []))


def _read_identity(read: CanaryRead) -> tuple[int, str, int]:
    return read.iteration, read.rid, read.position


def _first_output_difference(reference: TrafficRun, other: TrafficRun) -> tuple[str, Any, Any] | None:
    for rid in sorted(set(reference.outputs) | set(other.outputs)):
        if reference.outputs.get(rid) != other.outputs.get(rid):
            return rid, reference.outputs.get(rid), other.outputs.get(rid)
    return None
