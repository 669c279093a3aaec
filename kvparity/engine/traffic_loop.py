"""kvparity's own model of SGLang 0.5.3's ``event_loop_normal``, playing a traffic scenario
(``kvparity.model.traffic``) on a world of one version (``legacy`` or ``refactored``): the version
decides admission, chunking, decoding and retraction itself, as SGLang's own loop does in
``kvparity.engine.real.scheduler_shell.run_traffic``, whose result shape ``play_traffic`` returns.

One pass of the loop (one iteration record):

1. the arrivals of this iteration join the waiting queue (``init_req_max_new_tokens``,
   ``_add_request_to_queue``);
2. ``get_next_batch_to_run``: the chunked request is cached and gives its row back; the last
   prefill batch, less finished and chunked requests, joins the running batch; then a prefill
   batch (``get_new_batch_prefill``: ``calc_priority``, then ``PrefillAdder``) if one forms, else
   a decode of the running batch (``update_running_batch``: memory check, retraction, the
   ``new_token_ratio`` update, ``prepare_for_decode``);
3. the batch runs (the KV canary's forward, ``kvparity.engine.iteration_recorder``: one next token
   per request from the hash it read at its last position) and its results are processed: a
   prefilled request that is not chunked takes its first output and is cached (finished or not);
   decoded requests take one output each, finished ones are cached inside one free group;
4. no batch: SGLang's idle self-check (the leak check; ``new_token_ratio`` back to its start);
5. the memory after the pass is snapshotted, as the shell snapshots a release's.

The loop ends at the first pass, past the last arrival, that finds nothing waiting, chunked,
running or just run: the shell's own stop rule, so that both count the same passes.

Only the normal loop is modelled. A scenario whose config names the overlap loop is played with the
normal loop's decisions, and the result says so (``"loop": "normal"``): the KV path's decisions are
the normal loop's; what the overlap loop adds (the decode whose token is discarded because a finish
is known one batch late, and the in-flight windows) is not. ``inflight_violations`` is always empty:
in the normal loop a batch's window (its run to its result) contains no other step.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvparity.engine.canary import Launch
from kvparity.engine.iteration_recorder import (
    LIVE,
    IterationRecorder,
    RequestState,
    admission_budget,
    decode_requests,
    extend_requests,
)
from kvparity.engine.scheduler import retract_order
from kvparity.engine.traffic_run import TrafficRun
from kvparity.engine.world import World, build_world
from kvparity.mem_cache.prefill_adder import AddReqResult, PrefillAdder
from kvparity.mem_cache.schedule_batch import RETRACT_DECODE_STEPS
from kvparity.mem_cache.schedule_policy import calc_priority
from kvparity.model.canary import token_from
from kvparity.model.traffic import MAX_CONTEXT_LEN, Arrival, TrafficScenario, traffic_geometry
from kvparity.model.traffic_records import Decision, StopError

# The real shell's model: the vocabulary the forward draws from (the shell's model config stand-in,
# ``kvparity.engine.real.adapter.VOCAB_SIZE``); the width of a request row (``MAX_CONTEXT_LEN``)
# caps every request's outputs as SGLang's ``max_req_len`` does.
VOCAB_SIZE = 32000
MAX_ITERATIONS = 10_000  # the shell's guard against a loop that never drains
# SGLang's global_config defaults: new_token_ratio starts at 0.7 × --schedule-conservativeness and
# decays, decode by decode, to 0.14 of that over 600 decodes.
INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14
NEW_TOKEN_RATIO_DECAY_STEPS = 600.0

EXTEND, DECODE = "EXTEND", "DECODE"  # SGLang's ForwardMode names, as the shell records them


class RequestRefused(ValueError):
    """A request a server refuses before queueing it (no room for its outputs): the scenario is bad."""


@dataclass
class Batch:
    """A batch formed by the loop: its mode, its requests (in batch order), the prepared
    ``ScheduleBatch`` of the world's version, and (prefill) the chunked request at formation."""

    mode: str
    reqs: list[Any]
    schedule_batch: Any
    chunked_req: Any = None


@dataclass
class NewTokenRatio:
    """How much of each running request's remaining outputs admission reserves."""

    init: float
    floor: float
    decay: float
    value: float

    @classmethod
    def for_conservativeness(cls, conservativeness: float) -> NewTokenRatio:
        init = min(INIT_NEW_TOKEN_RATIO * conservativeness, 1.0)
        floor = min(init * MIN_NEW_TOKEN_RATIO_FACTOR, 1.0)
        return cls(init, floor, (init - floor) / NEW_TOKEN_RATIO_DECAY_STEPS, init)

    def decay_once(self) -> None:
        """A decode that needed no retraction: reserve a little less next time."""
        self.value = max(self.value - self.decay, self.floor)


def _identity_in(req: Any, reqs: list[Any]) -> bool:
    # Requests compare by identity in SGLang (no __eq__): two requests with equal fields differ.
    return any(req is r for r in reqs)


class TrafficLoop:
    """The scheduler state of one traffic run: waiting queue, running batch, chunked request,
    last batch, new_token_ratio; one ``run_pass`` per iteration."""

    def __init__(self, world: World, scenario: TrafficScenario, ranking_key: Callable[[Any], list[int]] | None = None) -> None:
        """``ranking_key``: what the waiting queue is ranked by (default: the version's own key)."""
        config = scenario.config
        self.ranking_key = ranking_key
        self.world = world
        self.scenario = scenario
        self.config = config
        self.page_size = config.page_size
        # What SGLang's max_req_len allows: a request's outputs are clipped to the row and the pool.
        self.max_req_len = min(MAX_CONTEXT_LEN - 1, world.allocator.size - 1)
        self.ratio = NewTokenRatio.for_conservativeness(config.schedule_conservativeness)
        self.waiting: list[Any] = []
        self.running: list[Any] = []
        self.batch_is_full = False  # the running batch's flag: no admission until something leaves
        self.chunked_req: Any = None
        self.last_batch: Batch | None = None
        self.arrival_index: dict[str, int] = {}
        self.reqs: dict[str, Any] = {}  # every request that has arrived
        self.outputs: dict[str, list[int]] = {}  # finished requests, in finishing order
        self.iteration = 0
        self.records: list[Decision] = []
        self.memory: list[Any] = []  # a snapshot after every pass
        self.recorder = IterationRecorder(world, radix=config.radix_cache,
                                          kv_slots=config.kv_slots, page_size=config.page_size,
                                          width=scenario.table_width(MAX_CONTEXT_LEN))
        self._finished_now: list[str] = []
        self._retracted_now = 0
        self._launch: Launch | None = None
        self._adder: tuple[tuple[str, float], ...] = ()

    # ---- the loop --------------------------------------------------------------------------------
    def idle(self) -> bool:
        """The shell's stop rule (past the last arrival): nothing waits, is chunked, has just run
        or runs. A finished request still counts as running until a decode pass filters it out."""
        return not self.waiting and self.chunked_req is None and self.last_batch is None and not self.running

    def run(self) -> None:
        while not (self.iteration >= len(self.scenario.arrivals) and self.idle()):
            if self.iteration >= MAX_ITERATIONS:
                raise RuntimeError(f"play_traffic: still busy after {MAX_ITERATIONS} iterations")
            self.run_pass()

    def run_pass(self) -> None:
        t0 = time.perf_counter()
        arrivals = self.scenario.arrivals
        self._launch, self._adder = None, ()
        self.receive(arrivals[self.iteration] if self.iteration < len(arrivals) else ())
        batch = self.get_next_batch_to_run()
        rec = self._record(batch)
        if batch is not None:
            self.process_batch_result(batch, self.run_batch(batch))
        else:
            self.self_check_during_idle()
        self.last_batch = batch
        rec["finished"] = sorted(self._finished_now)
        rec["ms"] = round((time.perf_counter() - t0) * 1000, 3)
        decision = Decision.from_plain(rec)
        self.records.append(decision)
        out_cache_loc = None if batch is None else batch.schedule_batch.out_cache_loc.tolist()
        accounting = (("new_token_ratio", float(self.ratio.value)),) + self._adder
        self.memory.append(self.recorder.snapshot(decision, out_cache_loc, self._launch, self.request_states(),
                                                  accounting))
        self._finished_now = []
        self.iteration += 1

    def request_states(self) -> dict[str, RequestState]:
        """Every request that has arrived, as the loop holds it after a pass (the shell's rule:
        finished; running or chunked while held by the running batch, the last batch or as the
        chunked request, and not back in the waiting queue; else waiting)."""
        held = [*self.running, *(self.last_batch.reqs if self.last_batch is not None else ()),
                *([self.chunked_req] if self.chunked_req is not None else ())]
        held_ids = {id(r) for r in held} - {id(r) for r in self.waiting}
        states = {}
        for rid, req in self.reqs.items():
            if rid in self.outputs:
                status = "finished"
            elif id(req) in held_ids:
                status = "chunked" if req is self.chunked_req else "running"
            else:
                status = "waiting"
            live = status in LIVE
            states[rid] = RequestState(status, req.req_pool_idx if live else None,
                                       req.last_matched_prefix_len if live else 0, len(req.output_ids))
        return states

    # ---- arrivals ----------------------------------------------------------------------------------
    def receive(self, arrivals: tuple[Arrival, ...]) -> None:
        for arrival in arrivals:
            self.arrival_index[arrival.rid] = len(self.arrival_index)
            # init_req_max_new_tokens: the outputs must fit the row and the pool with the prompt.
            max_new_tokens = min(arrival.max_new_tokens, self.max_req_len - len(arrival.tokens) - 1)
            if max_new_tokens < 1:
                # A server rejects a prompt this long before queueing it (validate_input_length,
                # which the shell does not call): a request with no room for outputs is not modelled.
                raise RequestRefused(f"request {arrival.rid!r}: {len(arrival.tokens)} prompt tokens leave no room for "
                                 f"outputs (max_req_len {self.max_req_len})")
            req = self.world.new_req(arrival.rid, list(arrival.tokens), max_new_tokens=max_new_tokens)
            self.reqs[arrival.rid] = req
            self.waiting.append(req)

    # ---- batch formation -----------------------------------------------------------------------------
    def get_next_batch_to_run(self) -> Batch | None:
        self._retracted_now = 0
        self._cache_chunked_req()
        self._merge_last_prefill()
        batch = self.get_new_batch_prefill()
        if batch is not None:
            return batch  # prefill first: decoding waits while anything can be admitted
        if self.running:
            return self.update_running_batch()
        return None

    def _cache_chunked_req(self) -> None:
        """The chunked request's last chunk goes into the cache (so its next chunk matches it) and
        its row is freed: in 0.5.3 it takes a new row with every chunk."""
        req = self.chunked_req
        if req is not None:
            self.world.cache_unfinished_req(req, chunked=True)
            self.world.req_to_token_pool.free(req.req_pool_idx)

    def _merge_last_prefill(self) -> None:
        """The last prefill batch joins the running batch, less its finished and chunked requests."""
        last = self.last_batch
        if last is None or last.mode != EXTEND:
            return
        exclude = [r for r in (self.chunked_req, last.chunked_req) if r is not None]
        kept = [r for r in last.reqs if r.rid not in self.outputs and not _identity_in(r, exclude)]
        if len(kept) < len(last.reqs):
            self.batch_is_full = False
        if kept:
            if not self.running:
                self.batch_is_full = False  # SGLang takes the prefill batch itself, whose flag is clear
            self.running = self.running + kept

    def get_new_batch_prefill(self) -> Batch | None:
        if (self.batch_is_full or not self.waiting) and self.chunked_req is None:
            return None
        max_running = self.config.max_running_requests
        if max_running - len(self.running) <= 0 and self.chunked_req is None:
            self.batch_is_full = True
            return None
        calc_priority(self.config.schedule_policy, self.waiting, self.world.tree_cache, self.ranking_key)
        adder = PrefillAdder(self.page_size, self.world.tree_cache, self.world.allocator, self.running,
                             self.ratio.value, self.config.max_prefill_tokens, self.config.chunked_prefill_size)
        self._adder = admission_budget(adder)
        if self.chunked_req is not None:
            self.world.init_next_round_input(self.chunked_req, use_tree_cache=False)
            self.chunked_req = adder.add_chunked_req(self.chunked_req)
        self._admit_waiting(adder)
        can_run = adder.can_run_list
        if not can_run:
            return None
        self.waiting = [r for r in self.waiting if not _identity_in(r, can_run)]
        if adder.new_chunked_req is not None:
            assert self.chunked_req is None, "two chunked requests at once"
            self.chunked_req = adder.new_chunked_req
        schedule_batch = self.world.batch(can_run)
        schedule_batch.prepare_for_extend()
        return Batch(EXTEND, can_run, schedule_batch, self.chunked_req)

    def _admit_waiting(self, adder: PrefillAdder) -> None:
        """Waiting requests in ranked order until the rows (max_running_requests) or the adder's
        budget say stop; a memory stop (NO_TOKEN) marks the running batch full."""
        allocatable = self.config.max_running_requests - len(self.running)
        for req in self.waiting:
            if len(adder.can_run_list) >= allocatable:
                self.batch_is_full = True
            if self.batch_is_full:
                break
            self.world.init_next_round_input(req)  # matched again, with the version's own match key
            result = adder.add_one_req(req)
            if result != AddReqResult.CONTINUE:
                if result == AddReqResult.NO_TOKEN:
                    self.batch_is_full = True
                break

    def update_running_batch(self) -> Batch | None:
        """Decode the running batch: finished requests leave; when the next step's memory is short
        even after eviction, retract (and reserve more from now on), else reserve a little less."""
        initial_bs = len(self.running)
        self.running = [r for r in self.running if r.rid not in self.outputs]
        if not self.running:
            self.batch_is_full = False
            return None
        if not self.world.batch(self.running).check_decode_mem():
            retracted = self._retract_decode()
            self._retracted_now = len(retracted)
            self.waiting.extend(retracted)  # _add_request_to_queue(req, is_retracted=True)
        else:
            self.ratio.decay_once()
        if len(self.running) < initial_bs:
            self.batch_is_full = False
        schedule_batch = self.world.batch(self.running)
        schedule_batch.prepare_for_decode()
        return Batch(DECODE, self.running, schedule_batch)

    def _retract_decode(self) -> list[Any]:
        """SGLang's retract_decode: at least one request goes (never the last), in ``retract_order``,
        until the rest can decode; the rest stay in that order. The new ratio assumes the rest
        need ``RETRACT_DECODE_STEPS`` more outputs each."""
        reqs = self.running
        batch = self.world.batch(reqs)
        order = retract_order(reqs)
        retracted: list[Any] = []
        first = True
        while first or not batch.check_decode_mem(selected_indices=order):
            if len(order) == 1:
                if self.world.allocator.available_size() <= 0:
                    raise RuntimeError("retract_decode: no space left for the only request left")
                break
            first = False
            idx = order.pop()
            retracted.append(reqs[idx])
            batch.release_req(idx, len(order))
        if len(order) != len(reqs):  # filter_batch(keep_indices=order) reorders only when it drops
            self.running = [reqs[i] for i in order]
        decoded = sum(len(r.output_ids) for r in self.running)
        max_new = sum(r.max_new_tokens for r in self.running)
        self.ratio.value = min(1.0, (decoded + RETRACT_DECODE_STEPS * len(self.running)) / max_new)
        return retracted

    # ---- running and results ---------------------------------------------------------------------------
    def run_batch(self, batch: Batch) -> list[int]:
        """The forward: the canary's (``kvparity.engine.canary``), launched and landed at once (the
        normal loop); one next token per request, from the hash it read at its last position."""
        sb = batch.schedule_batch
        rids = [r.rid for r in batch.reqs]
        rows = [int(x) for x in sb.req_pool_indices.tolist()]
        seq_lens = [int(n) for n in sb.seq_lens.tolist()]
        out_cache_loc = [int(x) for x in sb.out_cache_loc.tolist()]
        known = [tuple(r.origin_input_ids) + tuple(r.output_ids) for r in batch.reqs]
        if batch.mode == EXTEND:
            prefix_lens = [int(n) for n in sb.prefix_lens]
            inputs = [t for own, p, n in zip(known, prefix_lens, seq_lens) for t in own[p:n]]
            requests = extend_requests(rids, rows, seq_lens, prefix_lens, inputs, out_cache_loc, known)
        else:
            requests = decode_requests(rids, rows, seq_lens, [own[n - 1] for own, n in zip(known, seq_lens)],
                                       out_cache_loc, known)
        self._launch = self.recorder.launch(self.iteration, requests)
        self.recorder.land(self._launch, [])
        return [token_from(h, VOCAB_SIZE) for h in self._launch.last_hashes]

    def process_batch_result(self, batch: Batch, next_ids: list[int]) -> None:
        if batch.mode == EXTEND:
            self._process_prefill(batch, next_ids)
        else:
            self._process_decode(batch, next_ids)

    def _process_prefill(self, batch: Batch, next_ids: list[int]) -> None:
        """A request whose prompt is now complete samples its first output; finished, it is cached
        and freed; else its prompt is cached so that others can match it. The chunked request
        discards its token (its prompt is not complete)."""
        for req, token in zip(batch.reqs, next_ids):
            if req is batch.chunked_req:
                continue
            req.output_ids.append(token)
            if self._check_finished(req):
                self.world.cache_finished_req(req)
            else:
                self.world.cache_unfinished_req(req)

    def _process_decode(self, batch: Batch, next_ids: list[int]) -> None:
        """Every request samples one output; finishes are freed in one free group (paged: freed
        pages reach the free list together, at the group's end)."""
        allocator = self.world.allocator
        allocator.free_group_begin()
        for req, token in zip(batch.reqs, next_ids):
            req.output_ids.append(token)
            if self._check_finished(req):
                self.world.cache_finished_req(req)
        allocator.free_group_end()

    def _check_finished(self, req: Any) -> bool:
        """Length is the only stop: the forward never draws an end-of-sequence token."""
        if len(req.output_ids) < req.max_new_tokens:
            return False
        self.outputs[req.rid] = list(req.output_ids)
        self._finished_now.append(req.rid)
        return True

    def self_check_during_idle(self) -> None:
        """SGLang's idle check: nothing may hold KV slots or rows but the tree's evictable nodes;
        and admission starts reserving from the initial ratio again."""
        allocator, tree, pool = self.world.allocator, self.world.tree_cache, self.world.req_to_token_pool
        if allocator.available_size() + tree.evictable_size() != allocator.size - tree.protected_size():
            raise ValueError(f"KV memory leak: available {allocator.available_size()} + evictable "
                             f"{tree.evictable_size()} != {allocator.size} - protected {tree.protected_size()}")
        if pool.available_size() != pool.size:
            raise ValueError(f"request row leak: {pool.available_size()} of {pool.size} rows free")
        self.ratio.value = self.ratio.init

    # ---- records -------------------------------------------------------------------------------------
    def _record(self, batch: Batch | None) -> dict[str, Any]:
        """The shell's iteration record of the batch just formed (``finished`` and ``ms`` are
        added at the end of the pass, then it becomes a ``Decision``)."""
        rec: dict[str, Any] = {"iteration": self.iteration, "mode": None, "rids": [], "prefix_lens": [],
                               "extend_lens": [], "seq_lens": [], "rows": [], "chunked": None,
                               "retracted": self._retracted_now}
        if batch is not None:
            sb = batch.schedule_batch
            rec["mode"] = batch.mode
            rec["rids"] = [r.rid for r in batch.reqs]
            rec["seq_lens"] = [int(n) for n in sb.seq_lens.tolist()]
            rec["rows"] = [int(row) for row in sb.req_pool_indices.tolist()]
            if batch.mode == EXTEND:
                rec["prefix_lens"] = [int(n) for n in sb.prefix_lens]
                rec["extend_lens"] = [int(n) for n in sb.extend_lens]
                rec["chunked"] = batch.chunked_req.rid if batch.chunked_req is not None else None
        rec["waiting"] = [r.rid for r in self.waiting]
        return rec


def play_traffic(version: str, scenario: TrafficScenario, backend: str = "torch", *,
                 ranking_key_of: str | None = None) -> TrafficRun:
    """Play ``scenario`` through kvparity's model of SGLang 0.5.3's normal loop on a fresh world of
    ``version`` ("legacy" models 0.5.3, "refactored" 0.5.3.post1): what ``scheduler_shell.run_traffic``
    returns, with ``loop`` always "normal" (see the module docstring) and no in-flight findings.
    ``ranking_key_of``: rank the waiting queue with that version's ``Req.ranking_key`` instead of
    ``version``'s own (the one line of pull request #11200 in ``schedule_policy``, undone)."""
    t0 = time.perf_counter()
    cache_kind = "radix" if scenario.config.radix_cache else "chunk"
    world = build_world(version, backend, traffic_geometry(scenario), cache_kind)
    key = None if ranking_key_of is None else importlib.import_module(f"kvparity.{ranking_key_of}.req").Req.ranking_key
    loop = TrafficLoop(world, scenario, key)
    build_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    error = None
    try:
        loop.run()
    except RequestRefused:
        raise  # a scenario a server would refuse: bad input, not a result
    except Exception as exc:  # the model stopped (its idle leak check, a broken mutant): that is a result
        error = StopError.of(loop.iteration, exc, "kvparity's model of the scheduler")
    return TrafficRun(loop="normal", decisions=tuple(loop.records), memory=tuple(loop.memory),
                      outputs={rid: tuple(out) for rid, out in loop.outputs.items()}, error=error,
                      build_s=round(build_s, 3), loop_s=round(time.perf_counter() - t1, 3),
                      record_s=round(loop.recorder.seconds, 3), cells_past_width=loop.recorder.written_past_width())
