"""The scheduler loop (SPEC section 6) as a Hypothesis state machine, played on every world in
lockstep.

``test_parity.py`` draws a whole scenario up front and then plays it. Here Hypothesis chooses
each next scheduler step while it watches the current state: extends admit requests that are
waiting (new or retracted) and carry the chunked request on, finishes and retractions name a
running request, and eviction is drawn only with a radix tree. Long interleavings of chunked
prefill, radix hits, decode, retraction, re-admission and eviction are reached that way.

After every step, every world (legacy and refactored, each on torch and on Triton) is
snapshotted after every stage of that step; each snapshot must satisfy the oracles that do not
trust legacy (``kvparity.judge.oracles.check_stage``: untouched cells, fresh slots, conservation, ...)
and be equal to the reference world's (``kvparity.judge.compare.compare``, SPEC section 7). Known legacy
defects (the chunk-cache view alias) are counted with ``hypothesis.event``, never hidden and never
failures. A failure prints the steps played so far as a ``Scenario`` and how to replay it with
``kvparity.run.replay``; Hypothesis's own listing of the rules follows it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from hypothesis import HealthCheck, Phase, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvparity.engine.scheduler import Scheduler, StageRecord
from kvparity.judge.compare import Difference
from kvparity.judge.run_result import RunResult
from kvparity.model.classes import classify
from kvparity.model.scenario import Decode, Evict, Extend, RequestSpec, Retract, Scenario, Step
from kvparity.model.strategies import current_shape, token_run
from kvparity.model.worlds import Geometry
from kvparity.report.failure import format_failure
from kvparity.run.runner import ALL_WORLDS, Lockstep

NIGHTLY = os.environ.get("HYPOTHESIS_PROFILE") == "nightly"
# Bounds that keep the module well under a minute on one CPU core in the ci profile (Triton runs in
# interpreter mode there); the nightly profile plays longer runs. KVPARITY_MAX_EXAMPLES (conftest)
# is honoured as it is: it asks for a time-boxed run of a chosen size.
STEP_COUNT = 24 if NIGHTLY else 12
MAX_EXAMPLES = 400 if NIGHTLY else 100
if os.environ.get("KVPARITY_MAX_EXAMPLES"):
    MAX_EXAMPLES = int(os.environ["KVPARITY_MAX_EXAMPLES"])
MAX_REQUESTS = 8 if NIGHTLY else 5
MAX_ADMIT = 4  # requests named by one Extend step



@dataclass(frozen=True)
class _RequestDraw:
    """The choices behind one request, turned into a ``RequestSpec`` once all are drawn. Each
    field shrinks towards the plain case (0): its own prompt, no logprobs, no extra key."""

    repeat: int  # 4: repeat an earlier prompt exactly
    stem: int
    keep: int  # tokens of the stem kept (clamped to its length)
    suffix: int  # tokens of its own after them
    logprob: int  # 3: logprobs on (radix cache only)
    start: int  # which logprob start
    extra: int  # 3: extra key "lora-a"


def _request_draws(max_prompt: int):
    return st.builds(
        _RequestDraw, st.integers(0, 4), st.integers(0, 1), st.integers(0, max_prompt), st.integers(0, 8),
        st.integers(0, 3), st.integers(0, 4), st.integers(0, 3),
    )


def _requests(cache: str, stems: list[tuple[int, ...]], draws: list[_RequestDraw]) -> tuple[RequestSpec, ...]:
    requests: list[RequestSpec] = []
    for i, d in enumerate(draws):
        if requests and d.repeat == 4:
            tokens = requests[d.keep % len(requests)].tokens
        else:
            stem = stems[d.stem % len(stems)]
            keep = min(d.keep, len(stem))
            tokens = stem[:keep] + token_run(10_000 * (i + 1), d.suffix if keep else max(1, d.suffix))
        logprob = cache == "radix" and d.logprob == 3
        start = [-1, 0, len(tokens) // 2, len(tokens) - 1, len(tokens) + 3][d.start] if logprob else -1
        extra = "lora-a" if d.extra == 3 else None
        requests.append(RequestSpec(f"r{i}", tokens, return_logprob=logprob, logprob_start_len=start, extra_key=extra))
    return tuple(requests)


@st.composite
def lockstep_setups(draw) -> Scenario:
    """Geometry, cache kind, chunk size and a pool of requests, all known before the first step
    (the ``Scheduler`` builds every ``Req`` up front); the steps are chosen later, by the rules.

    Prompts are cut from one or two shared stems (and sometimes repeat an earlier prompt exactly)
    so that radix hits, node splits and exact repeats happen. Rows and KV slots are usually roomy;
    sometimes rows are tight (two: row reuse by the chunked request) or KV slots are tight, so that
    an allocation fails (out of memory). Every draw shrinks towards the plain case (page size 1,
    no chunking, roomy pools, fewer and shorter requests), so a shrunk failure shows only what it
    needs; the requests are one list, so that shrinking can drop any of them."""
    shape = current_shape()
    ps = draw(st.sampled_from(shape.page_sizes), label="page size")
    # The radix cache twice: it has the most to reach (hits, node splits, eviction).
    cache = draw(st.sampled_from(("radix", "radix", "chunk")), label="cache")
    chunk_size = None
    if draw(st.booleans(), label="chunked prefill?"):
        chunk_size = draw(st.integers(1, max(4, min(2 * ps + 3, 24))), label="chunk size")
    tight_rows = draw(st.integers(0, 3), label="tight rows?") == 3
    spare_rows = draw(st.integers(1, 2), label="spare rows")
    kv_divisor = draw(st.sampled_from([1, 1, 1, 2, 3, 6]), label="kv divisor (above 1: tight)")
    need_sort = draw(st.booleans(), label="need_sort")
    # The requests last: dropping one while shrinking leaves every other choice where it was.
    stems = draw(st.lists(st.integers(1, shape.max_prompt), min_size=1, max_size=2), label="stem lengths")
    stems = [token_run(100_000 * (k + 1), n) for k, n in enumerate(stems)]
    draws = draw(st.lists(_request_draws(shape.max_prompt), min_size=1, max_size=MAX_REQUESTS), label="requests")
    requests = _requests(cache, stems, draws)
    rows = 2 if tight_rows else len(requests) + spare_rows
    # A request grows by one token per extend that completes it and per decode: at most two per
    # step. Roomy KV holds twice what every request could need; a tight one a half to a sixth.
    longest = max(len(r.tokens) for r in requests) + 2 * STEP_COUNT + 2
    need = 2 * sum(len(r.tokens) + 2 * STEP_COUNT + ps for r in requests) // kv_divisor
    kv_slots = max(2 * ps, -(-need // ps) * ps)
    geometry = Geometry(pool_rows=rows, max_context_len=longest + 2, kv_slots=kv_slots, page_size=ps,
                        need_sort=need_sort)
    return Scenario(geometry, cache, requests, (), chunk_size)


def _admit_picks(least: int):
    """Which waiting requests an Extend names, as indices into the waiting list (wrapped)."""
    return st.lists(st.integers(0, MAX_REQUESTS - 1), min_size=least, max_size=MAX_ADMIT)


def _picked(waiting: list[str], picks: list[int]) -> tuple[str, ...]:
    """De-duplicated in order: a repeated pick is dropped, never rejected (so shrinking, which
    makes picks equal, keeps the example valid)."""
    return tuple(dict.fromkeys(waiting[i % len(waiting)] for i in picks))


class SchedulerLockstep(RuleBasedStateMachine):
    """Four schedulers, one per world, fed the same steps; the first world is the reference."""

    def __init__(self) -> None:
        super().__init__()
        self.scenario: Scenario | None = None
        self.lockstep: Lockstep | None = None
        self.steps: list[Step] = []
        self.findings_seen = 0

    @property
    def names(self) -> tuple[str, ...]:
        return self.lockstep.names

    @property
    def schedulers(self) -> dict[str, Scheduler]:
        return self.lockstep.schedulers if self.lockstep else {}

    # ---- state the preconditions read (the reference world; the invariant keeps the others equal)
    @property
    def ref(self) -> Scheduler:
        return self.schedulers[self.names[0]]

    def live(self) -> bool:
        return bool(self.schedulers) and not any(s.halted for s in self.schedulers.values())

    def waiting(self) -> list[str]:
        return [rid for rid, status in self.ref.status.items() if status == "waiting"]

    # ---- setup -----------------------------------------------------------------------------------
    @initialize(scenario=lockstep_setups(), first_batch=_admit_picks(1))
    def setup(self, scenario: Scenario, first_batch: list[int]) -> None:
        """A fresh server: one pool, allocator and cache per world, every request waiting (the
        scenario's steps are empty: the rules supply them one by one), then its first prefill
        batch (see ``admit_and_extend``). Every world must be equal from the start."""
        self.scenario = scenario
        self.lockstep = Lockstep(scenario, ALL_WORLDS)
        event(f"setup: page size {scenario.geometry.page_size}, cache {scenario.cache_kind}, "
              f"{'chunked' if scenario.chunk_size else 'unchunked'}")
        self._raise_on_failure()
        # The first batch is part of the setup rather than a rule: with every request waiting,
        # admitting some is the only step that does anything, and Hypothesis's swarm testing
        # (which switches some rules off for a whole run) would otherwise waste many runs.
        self._play(Extend(_picked(self.waiting(), first_batch)))

    @precondition(lambda self: self.live())
    @rule(data=st.data())
    def admit_and_extend(self, data) -> None:
        """One prefill batch. If a request was cut by the chunk size in the previous batch, it is
        cached first (``cache_unfinished_req``) and its row freed; it then continues in this batch,
        first (as in SGLang) or, with ``chunked_last``, after the newly admitted requests. Each
        admitted waiting request (new, or retracted earlier) gets ``init_next_round_input`` with the
        tree cache (a radix hit supplies its prefix) and is cut to the remaining token budget; a
        cut request becomes the new chunked request. A request whose prompt is complete samples
        its first output token. With nothing waiting and no chunked request, the step is skipped
        (identically in every world)."""
        waiting = self.waiting()
        # Without a chunked request to continue, name at least one waiting request.
        picks = data.draw(_admit_picks(0 if self.ref.chunked is not None else 1) if waiting else st.just([]),
                          label="admit (indices into the waiting requests)")
        chunked_last = self.ref.chunked is not None and data.draw(st.booleans(), label="chunked_last")
        self._play(Extend(_picked(waiting, picks), chunked_last=chunked_last))

    @precondition(lambda self: self.live())
    @rule()
    def decode(self) -> None:
        """One decode step for every running request: a new KV slot each (page size 1: ``alloc``;
        paged: continuing the page of column ``seq_len - 1``) written in column ``seq_len``, then
        one more output token. With nobody running, the step is skipped.

        This rule and ``admit_and_extend`` apply in every state, skips included, so that swarm
        testing rarely leaves a run with no enabled rule (such a run is discarded)."""
        self._play(Decode())

    @precondition(lambda self: self.live() and self.ref.running)
    @rule(data=st.data())
    def finish(self, data) -> None:
        """A decode step in which some running requests sample a stop token: they are cached
        finished inside the step's one free group (``cache_finished_req`` hands their slots to the
        tree, radix, or frees them, chunk cache) and their rows are freed."""
        finish = data.draw(st.lists(st.sampled_from(self.ref.running), min_size=1, max_size=3, unique=True),
                           label="finish")
        self._play(Decode(finish=tuple(finish)))

    @precondition(lambda self: self.live() and self.ref.running)
    @rule(data=st.data())
    def retract(self, data) -> None:
        """A running request is retracted: its own slots and its row are freed (slots the radix
        tree holds stay there), its node is unlocked, ``reset_for_retract`` runs and it is back in
        the waiting queue, to be re-admitted by a later extend."""
        self._play(Retract(data.draw(st.sampled_from(self.ref.running), label="retract")))

    @precondition(lambda self: self.live() and self.scenario.cache_kind == "radix")
    @rule(num_tokens=st.integers(1, 64))
    def evict(self, num_tokens: int) -> None:
        """Memory pressure: the radix tree evicts at least ``num_tokens`` tokens of unlocked
        leaves, least recently used first; their slots go back to the allocator."""
        self._play(Evict(num_tokens))

    @precondition(lambda self: not self.live())
    @rule()
    def halted(self) -> None:
        """Nothing is played: a world halted (an allocation failed, SPEC section 4). After a failed
        allocation the versions leave request state different by design, so the server stops
        there; this rule only exists so that the machine still has an enabled rule."""

    # ---- invariants --------------------------------------------------------------------------------
    @invariant()
    def worlds_agree_on_request_states(self) -> None:
        """Every world's scheduler sees each request in the same state (waiting, chunked, running,
        finished), runs the same requests in the same order and has the same chunked request."""
        if not self.schedulers:
            return
        ref = self.ref
        for name in self.names[1:]:
            other = self.schedulers[name]
            problems = [
                f"request {rid}: {other.status[rid]} != {ref.status[rid]}"
                for rid in ref.status if other.status[rid] != ref.status[rid]
            ]
            if other.running != ref.running:
                problems.append(f"running {other.running} != {ref.running}")
            if other.chunked != ref.chunked:
                problems.append(f"chunked request {other.chunked!r} != {ref.chunked!r}")
            if bool(other.halted) != bool(ref.halted):
                problems.append(f"halted {other.halted!r} != {ref.halted!r}")
            assert not problems, self._report(
                [Difference(name, self.names[0], "scheduler", p) for p in problems], [], None
            )

    @precondition(lambda self: self.live())
    @invariant()
    def live_requests_hold_distinct_rows(self) -> None:
        """In every world, each running request (and the chunked one while it has a row) holds a
        request row of its own that is not in the free list."""
        for name, scheduler in self.schedulers.items():
            holders = list(scheduler.running)
            if scheduler.chunked is not None and scheduler.chunked_has_row:
                holders.append(scheduler.chunked)
            rows = [scheduler.reqs[rid].req_pool_idx for rid in holders]
            free = set(scheduler.pool.free_slots)
            problems = [f"request {rid} has no row" for rid, row in zip(holders, rows) if row is None]
            problems += [f"request {rid} holds row {row}, a free one" for rid, row in zip(holders, rows) if row in free]
            if len(set(rows)) != len(rows):
                problems.append(f"requests {holders} share rows {rows}")
            assert not problems, self._report([], [f"{name}: {p}" for p in problems], None)

    def teardown(self) -> None:
        if self.scenario is None:
            return
        for name in sorted(classify(self.scenario, self.lockstep.result.records)):
            event(f"class: {name}")

    # ---- playing one step on every world -----------------------------------------------------------
    def _play(self, step: Step) -> None:
        """``kvparity.run.runner.Lockstep``: every world plays the step stage by stage; each stage is
        snapshotted, checked by the oracles and compared with the reference world."""
        self.steps.append(step)
        for record in self.lockstep.play(len(self.steps) - 1, step):
            event(f"stage {record.kind}: {record.outcome}")
            if record.kind == "skip":
                event(f"skip: {', '.join(record.notes)}")
        self._raise_on_failure()

    def _raise_on_failure(self) -> None:
        """Fail on a divergence or an oracle violation; a known legacy defect is only an event."""
        result = self.lockstep.result
        for diff in result.findings[self.findings_seen:]:
            event(f"legacy defect reported: {diff.known_defect}")
        self.findings_seen = len(result.findings)
        if not result.ok:
            raise AssertionError(self._report(result.divergences, result.violations, result.first_difference))

    def _report(self, divergences: list[Difference], violations: list[str], first: StageRecord | None) -> str:
        """``kvparity.report.failure.format_failure``: the differing cells as a table, the oracle
        violations, and the steps played so far as a replayable ``Scenario``."""
        played = Scenario(
            self.scenario.geometry, self.scenario.cache_kind, self.scenario.requests, tuple(self.steps),
            self.scenario.chunk_size,
        )
        result = RunResult(played, self.names, divergences=divergences, violations=violations, first_difference=first)
        return "\n" + format_failure(result)


# The active profile, bounded. Without the explain phase: once a failure is found, Hypothesis
# would trace every shrinking run (sys.settrace on Python < 3.12) to explain it, which makes each
# Triton-interpreter run about eight times slower and the shrink take minutes instead of seconds.
SchedulerLockstep.TestCase.settings = settings(
    max_examples=min(settings.default.max_examples, MAX_EXAMPLES),
    stateful_step_count=min(settings.default.stateful_step_count, STEP_COUNT),
    phases=[phase for phase in settings.default.phases if phase is not Phase.explain],
    # Runs in which swarm testing left no enabled rule are discarded: never a health-check failure.
    suppress_health_check=[*settings.default.suppress_health_check, HealthCheck.filter_too_much],
)
TestSchedulerLockstep = SchedulerLockstep.TestCase
