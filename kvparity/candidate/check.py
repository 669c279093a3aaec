"""``check_candidate``: does a plug-in candidate have the same effect as the legacy reference?

Hypothesis draws batches meeting SPEC section 8 (``kvparity.candidate.inputs``), sized by the profile
(``kernel_shape``): first small and medium ones, then a fixed share of wide ones from each size
range past the kernels' request blocks (``stages_for``). Each runs through the sandbox
(``kvparity.candidate.sandbox``), with a timeout that grows with the batch, and is judged against this repo's
torch twins. On the first fault the property raises an ``AssertionError`` carrying it, and
Hypothesis shrinks the batch; shrinking keeps the fault KIND of the first finding (a smaller batch
that fails differently counts as passing). Then every request and prefix element the fault does
not need is removed (``remove_what_plays_no_part``). Both stop after ``shrink_seconds`` in all
(crashes and hangs cost a worker restart each). The result carries the shrunk batch, its fault,
what the batches played covered, and how many were drawn and played, as readable text.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import seed as hypothesis_seed

from kvparity.candidate.inputs import (
    INT32_MAX,
    Effect,
    Fault,
    KernelBatch,
    KernelShape,
    compare_effect,
    contract_violations,
    involved_requests,
    kernel_batches,
    kernel_shape,
    smaller_batches,
)
from kvparity.candidate.loader import SIGNATURES, CandidateLoadError, absolute_spec, split_spec
from kvparity.candidate.sandbox import KILLED, Outcome, Sandbox
from kvparity.candidate.targets import TARGETS, WRITE_BLOCK, lookup
from kvparity.model.contract import ContractError
from kvparity.run.minimize import minimize

DEFAULT_EXAMPLES = 200  # batches per check (the nightly profile: NIGHTLY_EXAMPLES)
NIGHTLY_EXAMPLES = 2000


def default_examples(profile: str) -> int:
    """Batches a check draws when not told: ``KVPARITY_MAX_EXAMPLES`` when set (as for scenarios),
    else 2,000 in the nightly profile and 200 in the others."""
    from kvparity.model import profiles

    override = getattr(profiles, "max_examples_override", None)  # validates the variable where it can
    cap = override() if override else int(os.environ.get("KVPARITY_MAX_EXAMPLES") or 0) or None
    if cap is not None:
        return cap
    return NIGHTLY_EXAMPLES if profile == "nightly" else DEFAULT_EXAMPLES


@dataclass
class Coverage:
    """What the batches played (before any fault) reached."""

    target: str
    batches: int = 0
    largest_batch: int = 0
    longest_row: int = 0
    largest_slot: int = 0
    page_sizes: set[int] = field(default_factory=set)
    past_request_block: int = 0  # batches of more than the target's request_block requests
    past_column_block: int = 0  # batches with a row longer than WRITE_BLOCK

    def add(self, batch: KernelBatch) -> None:
        self.batches += 1
        self.largest_batch = max(self.largest_batch, batch.bs)
        self.longest_row = max(self.longest_row, batch.longest_row)
        self.largest_slot = max(self.largest_slot, batch.largest_slot)
        self.page_sizes.add(batch.page_size)
        self.past_request_block += batch.bs > lookup(self.target).request_block
        self.past_column_block += batch.longest_row > WRITE_BLOCK

    def lines(self) -> list[str]:
        top = " (int32's top)" if self.largest_slot == INT32_MAX else ""
        spec = lookup(self.target)
        crossed = f"{_count(self.past_request_block, 'batch', 'batches')} of more than {spec.request_block} requests"
        crossed += spec.request_block_note
        if spec.column_block_note is not None:
            crossed += f", {self.past_column_block} with a row longer than {WRITE_BLOCK}{spec.column_block_note}"
        return [
            f"  covered: largest batch {_count(self.largest_batch, 'request')}, "
            f"longest row {_count(self.longest_row, 'token')}, "
            f"largest slot {self.largest_slot}{top}, page sizes {', '.join(map(str, sorted(self.page_sizes)))}",
            f"  block boundaries crossed: {crossed}",
        ]

    def to_dict(self) -> dict[str, object]:
        return {"batches": self.batches, "largest_batch": self.largest_batch, "longest_row": self.longest_row,
                "largest_slot": self.largest_slot, "page_sizes": sorted(self.page_sizes),
                "request_block": lookup(self.target).request_block, "past_request_block": self.past_request_block,
                "past_column_block": self.past_column_block}


def _count(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else many or one + 's'}"


@dataclass
class Stage:
    """One Hypothesis search of a check: ``label`` (which batches), ``examples`` asked of it,
    ``drawn`` the batches it drew before any fault."""

    label: str
    examples: int
    drawn: int = 0


@dataclass
class CheckResult:
    """``verdict`` is "parity" or "divergence". ``batches_run`` counts the distinct batches the
    candidate was called on before the first fault (that one included; all of them on parity), of
    ``drawn`` batches Hypothesis drew (it draws some twice; a repeat is not played again);
    ``shrink_calls`` the calls spent shrinking."""

    target: str
    spec: str
    verdict: str
    batches_run: int
    shrink_calls: int = 0
    fault: Fault | None = None
    counterexample: KernelBatch | None = None
    worker_starts: int = 0
    notes: list[str] = field(default_factory=list)
    drawn: int = 0
    profile: str = "ci"
    derandomized: bool = True
    stages: list[Stage] = field(default_factory=list)
    coverage: Coverage | None = None
    retried: int = 0  # calls that timed out once and were tried again (RETRY_FACTOR)
    returned_on_retry: int = 0  # of those, the ones that returned: a slow call, not a hang

    @property
    def fault_kind(self) -> str | None:
        return self.fault.kind if self.fault else None

    def played_line(self) -> str:
        how = f"profile {self.profile}, " + ("derandomized" if self.derandomized else "seeded")
        asked = ", ".join(f"{s.drawn} {s.label}" for s in self.stages if s.drawn)
        text = f"  played {_count(self.batches_run, 'distinct batch', 'distinct batches')} of {self.drawn} drawn ({how}; {asked})"
        if self.fault is not None:
            text += f", up to the first fault; then {_count(self.shrink_calls, 'call')} shrinking it"
        if self.drawn > self.batches_run:
            text += "; Hypothesis draws some batches more than once, and a repeat is not played again"
        if self.retried:
            text += (f"\n  tried again after a timeout, with {RETRY_FACTOR:g} times the limit: {_count(self.retried, 'call')}, "
                     f"of which {self.returned_on_retry} then returned (slow, not hung: judged as any other call)")
        return text

    def report(self) -> str:
        head = [f"kvparity check {self.target} {self.spec}: {self.verdict}", self.played_line()]
        if self.coverage is not None:
            head += self.coverage.lines()
        if self.fault is None or self.counterexample is None:
            return "\n".join(head)
        batch = self.counterexample.describe(involved_requests(self.counterexample, self.fault))
        return "\n".join(head + ["counterexample (shrunk):", batch, self.fault.describe()] + self.notes)

    def to_dict(self) -> dict[str, object]:
        """JSON-ready: verdict, counts, coverage, fault (kind, summary, details, cells) and the batch."""
        return {
            "target": self.target, "candidate": self.spec, "verdict": self.verdict, "profile": self.profile,
            "derandomized": self.derandomized, "batches_run": self.batches_run, "drawn": self.drawn,
            "stages": [{"batches": s.label, "examples": s.examples, "drawn": s.drawn} for s in self.stages],
            "shrink_calls": self.shrink_calls, "worker_starts": self.worker_starts,
            "retried_after_timeout": self.retried, "returned_on_retry": self.returned_on_retry,
            "coverage": None if self.coverage is None else self.coverage.to_dict(),
            "fault": None if self.fault is None else {
                "kind": self.fault.kind, "summary": self.fault.summary, "details": self.fault.details,
                "cells": [list(c) for c in self.fault.cells], "notes": self.fault.notes},
            "counterexample": None if self.counterexample is None else self.counterexample.to_dict(),
            "notes": self.notes,
        }

    def repro_script(self) -> str:
        """A Python script that replays the counterexample once through the sandbox."""
        if self.counterexample is None:
            raise ValueError("repro_script: no counterexample (the verdict is parity)")
        return REPRO_TEMPLATE.format(target=self.target, spec=self.spec, batch=self.counterexample.to_json())


REPRO_TEMPLATE = '''"""Replay a kvparity counterexample: run from the kvparity repository root,
    python THIS_FILE
It calls the candidate once, in kvparity's sandbox, on the shrunk batch, and prints the verdict."""

import sys

from kvparity.candidate.check import replay_batch

TARGET = {target!r}
CANDIDATE = {spec!r}
BATCH = {batch!r}

if __name__ == "__main__":
    text, fault = replay_batch(TARGET, CANDIDATE, BATCH)
    print(text)
    sys.exit(1 if fault else 0)
'''


def replay_batch(target: str, spec: str, batch_json: str, call_timeout: float = 10.0) -> tuple[str, Fault | None]:
    """Run ``spec`` once on one batch (``KernelBatch.to_json()``): (readable text, fault or None)."""
    from kvparity.kernels import runtime

    batch = KernelBatch.from_dict(json.loads(batch_json))
    problems = contract_violations(batch)
    if problems:
        # Checked before the candidate runs: e.g. two requests in one row race on the GPU, and a
        # racy batch that happens to agree proves nothing.
        raise ContractError(f"the batch breaks SPEC section 8, so no verdict on it: {'; '.join(problems)}")
    with Sandbox(call_timeout=call_timeout) as box:
        _load_or_raise(box, target, absolute_spec(spec))
        fault = judge(box.call(target, absolute_spec(spec), batch.to_dict()), batch, runtime.DEVICE)
    if fault is None:
        return f"parity on this batch:\n{batch.describe()}", None
    return f"{batch.describe(involved_requests(batch, fault))}\n{fault.describe()}", fault


def judge(outcome: Outcome, batch: KernelBatch, device: object) -> Fault | None:
    """Classify one sandbox outcome: ``None`` is parity for this batch."""
    if outcome.status == "load_error":
        raise CandidateLoadError(outcome.error)
    kind = getattr(outcome, "kind", outcome.status)  # the sandbox's exact name of the fault
    if kind in ("exited", "guard_damaged"):
        reply = outcome.reply or {}
        return Fault(kind, outcome.error, (reply.get("traceback") or "").splitlines())
    if outcome.status == "raised":
        reply = outcome.reply or {}
        return Fault("raised", outcome.error, (reply.get("traceback") or "").splitlines())
    if outcome.status in ("crashed", "timed_out"):
        return Fault(outcome.status, outcome.error.splitlines()[0], outcome.error.splitlines()[1:])
    reply = outcome.reply or {}
    effect = Effect(reply.get("buffers", {}), reply.get("returned"))
    return compare_effect(batch, effect, device)  # type: ignore[arg-type]


class _ShrinkBudgetSpent(BaseException):
    """Raised through Hypothesis to end shrinking; the best counterexample so far is kept."""


HYPOTHESIS_SHARE = 0.75  # of the shrink budget; the rest (and what Hypothesis leaves) removes requests


def call_allowance(batch: KernelBatch) -> float:
    """Seconds a call on ``batch`` may take beyond the sandbox's base timeout. Under Triton's
    interpreter a kernel runs its programs one after another (milliseconds each), and SGLang's
    alloc_extend kernel has every program sum over the whole batch and tile: a correct candidate
    on 8,192 requests takes a minute there. Compiled kernels get no allowance."""
    from kvparity.kernels import runtime

    if not runtime.INTERPRET:
        return 0.0
    allowance = 0.01 * batch.bs + 1e-5 * batch.bs * batch.longest_row
    return allowance + batch.spec.interpreter_cost(batch)


# A call that times out is tried once more, in a fresh worker, with this many times its limit: a
# slow interpreter or a busy machine is no fault of the candidate, a hang is (issue 33).
RETRY_FACTOR = 3.0


class _Search:
    """The state the Hypothesis properties of one check share across examples."""

    def __init__(self, target: str, spec: str, sandbox: Sandbox, device: object, shrink_seconds: float) -> None:
        self.target, self.spec, self.sandbox, self.device = target, spec, sandbox, device
        self.shrink_seconds = shrink_seconds
        self.base_timeout = getattr(sandbox, "call_timeout", None)
        self.seen: dict[str, Fault | None] = {}
        self.calls = 0
        self.drawn = 0
        self.stage: Stage | None = None
        self.coverage = Coverage(target)
        self.first_fault_at: float | None = None
        self.deadline = float("inf")
        self.calls_before_fault = 0
        self.best: tuple[KernelBatch, Fault] | None = None
        self.budget_spent = False
        self.shrink_tried = 0
        self.retried = 0  # calls that timed out and were tried again
        self.returned_on_retry = 0  # of those, the ones that then returned (judged as any other call)
        self.progress: Any = None  # a harness_check.Progress: a line every 10 s in logs, a bar on a terminal

    def fault_of(self, batch: KernelBatch) -> Fault | None:
        key = batch.to_json()
        if key in self.seen:
            return self.seen[key]
        if self.first_fault_at is not None and time.monotonic() > self.deadline:
            raise _ShrinkBudgetSpent()  # not an Exception: Hypothesis lets it through and stops
        problems = contract_violations(batch)
        if problems:
            raise AssertionError(f"kvparity generated a batch breaking SPEC 8 (a kvparity bug): {problems}")
        self.calls += 1
        if self.progress is not None:  # the planned batches, then shrinking's own count (never past the plan)
            if self.first_fault_at is None:
                self.progress.step()
            else:
                self.shrink_tried += 1
                self.progress.say(f"shrinking: {self.shrink_tried} smaller batches tried")
        if self.best is None:
            self.coverage.add(batch)
        fault = judge(self._call(batch), batch, self.device)
        self.seen[key] = fault
        return fault

    def _call(self, batch: KernelBatch) -> Outcome:
        """The candidate's call on ``batch`` under a limit that grows with the batch
        (``call_allowance``); a call past it is tried once more with ``RETRY_FACTOR`` times the
        limit, and only a second timeout is the candidate's (its text says both limits)."""
        if self.base_timeout is None:
            return self.sandbox.call(self.target, self.spec, batch.to_dict())
        limit = self.base_timeout + call_allowance(batch)
        try:
            self.sandbox.call_timeout = limit
            outcome = self.sandbox.call(self.target, self.spec, batch.to_dict())
            if outcome.status != "timed_out":
                return outcome
            self.retried += 1
            self.sandbox.call_timeout = limit * RETRY_FACTOR
            outcome = self.sandbox.call(self.target, self.spec, batch.to_dict())
            if outcome.status == "timed_out":
                outcome.error = (f"the call did not return within {limit:g} s, nor within {limit * RETRY_FACTOR:g} s "
                                 f"when tried again; {KILLED}")
            else:
                self.returned_on_retry += 1
            return outcome
        finally:
            self.sandbox.call_timeout = self.base_timeout

    def property(self, batch: KernelBatch) -> None:
        if self.best is None:
            self.drawn += 1
            if self.stage is not None:
                self.stage.drawn += 1
        fault = self.fault_of(batch)
        if fault is None:
            return
        if self.best is None:
            self.first_fault_at = time.monotonic()
            self.deadline = self.first_fault_at + HYPOTHESIS_SHARE * self.shrink_seconds
            self.calls_before_fault = self.calls
        elif fault.kind != self.best[1].kind:
            return  # keep the kind of the first finding while shrinking
        elif _size(batch) > _size(self.best[0]):
            raise AssertionError(fault.describe())  # the same fault on a larger batch: keep the smaller
        self.best = (batch, fault)
        raise AssertionError(fault.describe())

    # ------------------------------------------------------------------ after Hypothesis

    def _keeps_fault(self, candidate: KernelBatch) -> bool:
        """Whether ``candidate`` still shows the first finding's kind of fault (then it is the best)."""
        if contract_violations(candidate):
            return False
        fault = self.fault_of(candidate)
        if fault is None or self.best is None or fault.kind != self.best[1].kind:
            return False
        self.best = (candidate, fault)
        return True

    def remove_what_plays_no_part(self) -> None:
        """Hypothesis shrinks by its draws, so a shrunk batch may keep requests (or prefix
        elements) that play no part, e.g. a middle one. kvparity's shrinker (``run.minimize``, the
        sweep's) removes them, big cuts first (``smaller_batches``), while the fault keeps its
        kind, until none can go; then the table shrinks to the rows and columns used. Stops at the
        end of the shrink budget."""
        assert self.best is not None and self.first_fault_at is not None
        self.deadline = self.first_fault_at + self.shrink_seconds
        try:
            shrunk = minimize(self.best[0], self._keeps_fault, candidates=smaller_batches,
                              budget_s=max(0.0, self.deadline - time.monotonic()))
            self.budget_spent = not shrunk.complete
        except _ShrinkBudgetSpent:  # a call past the deadline: the best so far is kept
            self.budget_spent = True


def remove_what_plays_no_part(target: str, spec: str, batch: KernelBatch, *, sandbox: Sandbox,
                              seconds: float = 60.0) -> tuple[KernelBatch, Fault | None]:
    """``batch`` with every request and prefix element removed that its fault does not need (the
    pass ``check_candidate`` runs after Hypothesis shrinks), and that fault; ``(batch, None)`` when
    the candidate gets parity on it. Stops after ``seconds``."""
    from kvparity.kernels import runtime

    spec = absolute_spec(spec)
    _load_or_raise(sandbox, target, spec)
    search = _Search(target, spec, sandbox, runtime.DEVICE, seconds)
    fault = search.fault_of(batch)
    if fault is None:
        return batch, None
    search.best, search.first_fault_at = (batch, fault), time.monotonic()
    search.remove_what_plays_no_part()
    return search.best


def _size(batch: KernelBatch) -> tuple[int, int]:
    return batch.bs, sum(batch.seq_lens)


def stages_for(examples: int, shape: KernelShape) -> list[tuple[Stage, str | tuple[int, int]]]:
    """The searches of one check: small and medium batches first, then each wide range of the
    shape, about one batch in ``shape.wide_one_in`` in all and at least one per range."""
    per_range = max(1, round(examples / shape.wide_one_in / len(shape.wide)))
    narrow = max(1, examples - per_range * len(shape.wide))
    plan: list[tuple[Stage, str | tuple[int, int]]] = [(Stage("small or medium", narrow), "narrow")]
    for low, high in shape.wide:
        label = f"of {low} requests" if low == high else f"of {low}-{high} requests"
        plan.append((Stage(label, per_range), (low, high)))
    return plan


def check_candidate(
    target: str,
    spec: str,
    examples: int | None = None,
    seed: int | None = None,
    *,
    profile: str | None = None,
    sandbox: Sandbox | None = None,
    call_timeout: float = 10.0,
    shrink_seconds: float = 60.0,
) -> CheckResult:
    """Draw about ``examples`` batches for ``target`` (default ``default_examples(profile)``) and
    run them through candidate ``spec`` in the sandbox. ``profile`` (a name of
    ``kvparity.model.profiles``; default ``HYPOTHESIS_PROFILE``, else ci) sizes the batches
    (``kernel_shape``) and gives the Hypothesis phases. ``seed=None`` is derandomized (the same
    batches every run). Raises ``CandidateLoadError`` (exit code 2 in the CLI) when the candidate
    cannot be loaded or has the wrong signature."""
    from kvparity.model import profiles

    if target not in TARGETS:
        raise CandidateLoadError(f"target {target!r} is not one of {TARGETS}")
    profile = profile or os.environ.get("HYPOTHESIS_PROFILE") or "ci"
    if profile not in profiles.PROFILES:
        raise ValueError(f"profile {profile!r}: expected one of {', '.join(profiles.PROFILES)}")
    examples = default_examples(profile) if examples is None else examples
    if examples < 1:
        raise ValueError(f"check_candidate: examples={examples}, expected at least 1")
    split_spec(spec)  # a malformed spec fails here, before a worker starts
    spec = absolute_spec(spec)
    from kvparity.kernels import runtime

    own = sandbox is None
    box = sandbox or Sandbox(call_timeout=call_timeout)
    search = _Search(target, spec, box, runtime.DEVICE, shrink_seconds)
    starts_before = box.starts
    stages = stages_for(examples, kernel_shape(profile))
    from kvparity.report.progress import Progress

    search.progress = Progress(examples, unit="batches")
    try:
        _load_or_raise(box, target, spec)
        shrink = _run_hypothesis(search, target, stages, seed, profile)
        if search.best is not None and shrink:  # in its own share of the budget, even when Hypothesis used up its own
            search.remove_what_plays_no_part()
    finally:
        search.progress.close()
        if own:
            box.close()
    result = _result(search, target, spec, box.starts - starts_before)
    result.profile, result.derandomized = profile, seed is None
    result.stages = [stage for stage, _ in stages]
    return result


def _load_or_raise(box: Sandbox, target: str, spec: str) -> None:
    outcome = box.load(target, spec)
    if outcome.status == "load_error":
        raise CandidateLoadError(outcome.error)
    if outcome.status != "loaded":
        raise CandidateLoadError(f"candidate {spec!r}: loading it {outcome.status.replace('_', ' ')}: {outcome.error}")


def _run_hypothesis(search: _Search, target: str, stages: list, seed: int | None, profile: str) -> bool:
    """Run the stages in order until one finds a fault. True when the profile shrinks."""
    from kvparity.model import profiles  # noqa: F401  (registers the profiles)

    base = settings.get_profile(profile)
    phases = tuple(p for p in (Phase.explicit, Phase.generate, Phase.shrink) if p in base.phases)
    shape = kernel_shape(profile)
    for stage, size in stages:
        config = settings(
            base, max_examples=stage.examples, database=None, deadline=None, derandomize=seed is None,
            print_blob=False, report_multiple_bugs=False, verbosity=Verbosity.quiet, phases=phases,
            suppress_health_check=list(HealthCheck),
        )

        def prop(batch: KernelBatch) -> None:
            search.property(batch)

        test = config(given(kernel_batches(target, shape, size))(prop))
        if seed is not None:
            test = hypothesis_seed(seed)(test)
        search.stage = stage
        try:
            test()
        except CandidateLoadError:
            raise
        except _ShrinkBudgetSpent:
            search.budget_spent = True
        except Exception:  # the AssertionError carrying the fault (or Flaky after the budget): see search.best
            if search.best is None:
                raise
        if search.best is not None:
            break
    return Phase.shrink in phases


def _result(search: _Search, target: str, spec: str, starts: int) -> CheckResult:
    if search.best is None:
        return CheckResult(target, spec, "parity", search.calls, worker_starts=starts, drawn=search.drawn,
                           coverage=search.coverage, retried=search.retried,
                           returned_on_retry=search.returned_on_retry)
    batch, fault = search.best
    notes = [f"(shrinking stopped after its budget of {search.shrink_seconds:g} s; the batch may not be minimal)"] \
        if search.budget_spent else []
    return CheckResult(target, spec, "divergence", search.calls_before_fault,
                       search.calls - search.calls_before_fault, fault, batch, starts, notes, drawn=search.drawn,
                       coverage=search.coverage, retried=search.retried, returned_on_retry=search.returned_on_retry)


__all__ = ["SIGNATURES", "CandidateLoadError", "CheckResult", "check_candidate", "judge", "remove_what_plays_no_part",
           "replay_batch"]
