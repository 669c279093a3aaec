"""``check_candidate``: does a plug-in candidate have the same effect as the legacy reference?

Hypothesis draws batches meeting SPEC section 8 (``parity.target_inputs``); each runs through the
sandbox (``parity.sandbox``) and is judged against this repo's torch twins. On the first fault the
property raises an ``AssertionError`` carrying it, and Hypothesis shrinks the batch; shrinking keeps
the fault KIND of the first finding (a smaller batch that fails differently counts as passing) and
stops after ``shrink_seconds`` (crashes and hangs cost a worker restart each). The result carries
the shrunk batch and its fault as readable text.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import seed as hypothesis_seed

from parity.candidates import SIGNATURES, CandidateLoadError, absolute_spec, split_spec
from parity.contract import ContractError
from parity.sandbox import Outcome, Sandbox
from parity.target_inputs import (
    TARGETS, Effect, Fault, KernelBatch, compare_effect, contract_violations, involved_requests, kernel_batches,
)


@dataclass
class CheckResult:
    """``verdict`` is "parity" or "divergence". ``batches_run`` counts candidate calls before the
    first fault (all of them on parity); ``shrink_calls`` those spent shrinking."""

    target: str
    spec: str
    verdict: str
    batches_run: int
    shrink_calls: int = 0
    fault: Fault | None = None
    counterexample: KernelBatch | None = None
    worker_starts: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def fault_kind(self) -> str | None:
        return self.fault.kind if self.fault else None

    def report(self) -> str:
        head = f"kvparity check {self.target} {self.spec}: {self.verdict} ({self.batches_run} batches"
        head += f", {self.shrink_calls} shrink calls)" if self.shrink_calls else ")"
        if self.fault is None or self.counterexample is None:
            return head
        batch = self.counterexample.describe(involved_requests(self.counterexample, self.fault))
        return "\n".join([head, "counterexample (shrunk):", batch, self.fault.describe()] + self.notes)


    def to_dict(self) -> dict[str, object]:
        """JSON-ready: verdict, counts, fault (kind, summary, details, cells) and the batch."""
        return {
            "target": self.target, "candidate": self.spec, "verdict": self.verdict,
            "batches_run": self.batches_run, "shrink_calls": self.shrink_calls, "worker_starts": self.worker_starts,
            "fault": None if self.fault is None else {
                "kind": self.fault.kind, "summary": self.fault.summary, "details": self.fault.details,
                "cells": [list(c) for c in self.fault.cells]},
            "counterexample": None if self.counterexample is None else json.loads(self.counterexample.to_json()),
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

from parity.checker import replay_batch

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
    from kernels import runtime

    batch = KernelBatch.from_dict(json.loads(batch_json))
    problems = contract_violations(batch)
    if problems:
        # Checked before the candidate runs: e.g. two requests in one row race on the GPU, and a
        # racy batch that happens to agree proves nothing.
        raise ContractError(f"the batch breaks SPEC section 8, so no verdict on it: {'; '.join(problems)}")
    with Sandbox(call_timeout=call_timeout) as box:
        _load_or_raise(box, target, absolute_spec(spec))
        fault = judge(box.call(target, absolute_spec(spec), batch.to_json()), batch, runtime.DEVICE)
    if fault is None:
        return f"parity on this batch:\n{batch.describe()}", None
    return f"{batch.describe(involved_requests(batch, fault))}\n{fault.describe()}", fault


def judge(outcome: Outcome, batch: KernelBatch, device: object) -> Fault | None:
    """Classify one sandbox outcome: ``None`` is parity for this batch."""
    if outcome.status == "load_error":
        raise CandidateLoadError(outcome.error)
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


class _Search:
    """The state the Hypothesis property shares across examples."""

    def __init__(self, target: str, spec: str, sandbox: Sandbox, device: object, shrink_seconds: float) -> None:
        self.target, self.spec, self.sandbox, self.device = target, spec, sandbox, device
        self.shrink_seconds = shrink_seconds
        self.seen: dict[str, Fault | None] = {}
        self.calls = 0
        self.first_fault_at: float | None = None
        self.calls_before_fault = 0
        self.best: tuple[KernelBatch, Fault] | None = None
        self.budget_spent = False

    def fault_of(self, batch: KernelBatch) -> Fault | None:
        key = batch.to_json()
        if key in self.seen:
            return self.seen[key]
        if self.first_fault_at is not None and time.monotonic() - self.first_fault_at > self.shrink_seconds:
            raise _ShrinkBudgetSpent()  # not an Exception: Hypothesis lets it through and stops
        problems = contract_violations(batch)
        if problems:
            raise AssertionError(f"kvparity generated a batch breaking SPEC 8 (a kvparity bug): {problems}")
        self.calls += 1
        fault = judge(self.sandbox.call(self.target, self.spec, key), batch, self.device)
        self.seen[key] = fault
        return fault

    def property(self, batch: KernelBatch) -> None:
        fault = self.fault_of(batch)
        if fault is None:
            return
        if self.best is None:
            self.first_fault_at = time.monotonic()
            self.calls_before_fault = self.calls
        elif fault.kind != self.best[1].kind:
            return  # keep the kind of the first finding while shrinking
        self.best = (batch, fault)
        raise AssertionError(fault.describe())


def check_candidate(
    target: str,
    spec: str,
    examples: int = 100,
    seed: int | None = None,
    *,
    sandbox: Sandbox | None = None,
    call_timeout: float = 10.0,
    shrink_seconds: float = 60.0,
) -> CheckResult:
    """Run ``examples`` batches for ``target`` through candidate ``spec`` in the sandbox.
    ``seed=None`` is derandomized (the same batches every run). Raises ``CandidateLoadError``
    (exit code 2 in the CLI) when the candidate cannot be loaded or has the wrong signature."""
    if target not in TARGETS:
        raise CandidateLoadError(f"target {target!r} is not one of {TARGETS}")
    if examples < 1:
        raise ValueError(f"check_candidate: examples={examples}, expected at least 1")
    split_spec(spec)  # a malformed spec fails here, before a worker starts
    spec = absolute_spec(spec)
    from kernels import runtime

    own = sandbox is None
    box = sandbox or Sandbox(call_timeout=call_timeout)
    search = _Search(target, spec, box, runtime.DEVICE, shrink_seconds)
    starts_before = box.starts
    try:
        _load_or_raise(box, target, spec)
        _run_hypothesis(search, target, examples, seed)
    finally:
        if own:
            box.close()
    return _result(search, target, spec, box.starts - starts_before)


def _load_or_raise(box: Sandbox, target: str, spec: str) -> None:
    outcome = box.load(target, spec)
    if outcome.status == "load_error":
        raise CandidateLoadError(outcome.error)
    if outcome.status != "loaded":
        raise CandidateLoadError(f"candidate {spec!r}: loading it {outcome.status.replace('_', ' ')}: {outcome.error}")


def _run_hypothesis(search: _Search, target: str, examples: int, seed: int | None) -> None:
    config = settings(
        max_examples=examples, database=None, deadline=None, derandomize=seed is None, print_blob=False,
        report_multiple_bugs=False, verbosity=Verbosity.quiet, phases=(Phase.explicit, Phase.generate, Phase.shrink),
        suppress_health_check=list(HealthCheck),
    )
    def prop(batch: KernelBatch) -> None:
        search.property(batch)

    test = config(given(kernel_batches(target))(prop))
    if seed is not None:
        test = hypothesis_seed(seed)(test)
    try:
        test()
    except CandidateLoadError:
        raise
    except _ShrinkBudgetSpent:
        search.budget_spent = True
    except Exception:  # the AssertionError carrying the fault (or Flaky after the budget): see search.best
        if search.best is None:
            raise


def _result(search: _Search, target: str, spec: str, starts: int) -> CheckResult:
    if search.best is None:
        return CheckResult(target, spec, "parity", search.calls, worker_starts=starts)
    batch, fault = search.best
    notes = [f"(shrinking stopped after its budget of {search.shrink_seconds:g} s; the batch may not be minimal)"] \
        if search.budget_spent else []
    return CheckResult(target, spec, "divergence", search.calls_before_fault,
                       search.calls - search.calls_before_fault, fault, batch, starts, notes)


__all__ = ["SIGNATURES", "CandidateLoadError", "CheckResult", "check_candidate", "judge", "replay_batch"]
