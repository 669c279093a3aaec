"""SGLang's own ``Scheduler`` event loop on the CPU, only the model forward replaced (issue 26; see
``../shared/sglang-scheduler-shell.md``), for every release kvparity drives.

``run_traffic`` (a worker-side ``@remote`` function) builds the release's ``Scheduler`` without its
heavy ``__init__`` (``__new__`` on a small subclass, the attributes its loop reads set, SGLang's own
small initialisers called where the release has them), on a real world of the release
(``build_real_world``: pools, allocator, radix cache as a server of the release builds them by
default), and runs the release's own ``event_loop_normal`` or ``event_loop_overlap``
(``config["loop"]``). Requests arriving at an iteration go through the release's own
``init_req_max_new_tokens`` and ``_add_request_to_queue``; ``get_next_batch_to_run``,
``get_new_batch_prefill``, ``update_running_batch``, ``run_batch``, ``process_batch_result``,
``SchedulePolicy``, ``PrefillAdder``, ``ScheduleBatch`` and the caches are SGLang's own. Replaced:
the model forward (the KV canary's, ``kvparity.engine.canary``: every written slot stamped, every
read checked, the next token derived from what was read), and, off the KV path, logging, the profiler, output streaming (finished requests are
recorded instead), and the idle sleeper (SGLang's own idle hook runs otherwise: its leak checks
raise on a KV or row leak, and it resets ``new_token_ratio``). Metrics are SGLang's own, disabled.
The loop ends, by a private exception raised where a pass receives its requests, once the arrivals
are exhausted and nothing runs or waits. In the normal loop the pass that finds no batch runs the
idle hook first; in the overlap loop that pass processes the last result instead, so SGLang's own
leak check runs there only where a scenario idles between arrivals (kvparity's memory oracles run
after every iteration in both).

What differs between scheduler generations (the hooks' names, the attributes and initialisers, the
forward's result type, the overlap loop's client, the world builder, how a batch and a request are
read) lives in one adapter per generation (``kvparity.engine.real.shell_adapters``, chosen by the
release through ``versions``); this module is the part every generation shares.

The overlap loop: from 0.5.3.post1 SGLang's own ``init_overlap`` builds its ``FutureMap`` (and CPU
streams/events), and its own ``run_batch`` / ``batch.copy()`` / result queue run unchanged; in 0.5.3
the loop talks to a TP worker thread (``TpModelWorkerClient``), replaced by the 0.5.3 adapter's fake
client (its docstring says why that is faithful enough for the KV path). SGLang's
``torch.compile``'d helpers run eagerly: the whole loop runs under
``torch.compiler.set_stance("force_eager")`` (compiling them costs ~30 s on a CPU).

The in-flight oracle (both loops; the normal loop's windows are empty): batch N is in flight from
its ``run_batch`` to the start of its ``process_batch_result``. At ``run_batch`` the shell snapshots
each request's row ``req_to_token[row, :seq_len]``; after every step of the loop inside the window
(``process_batch_result`` of N-1, ``process_input_requests``, ``get_next_batch_to_run`` and
``run_batch`` of N+1, the start of N's own ``process_batch_result``) it compares, and after each
batch formation it checks that no request outside N has been given one of N's rows. Each finding is
recorded once (the snapshot then follows the new values), classified at the end of N's window by
SGLang's own criterion for discarding N's token: ``retracted``, ``finished`` (the request finished
on an earlier batch's result, its delayed token is dropped), else ``live``.

Faults, for tests of the oracle only: ``config["fault"]`` names one in ``FAULTS`` (plain data across
the worker boundary); nothing is injected otherwise.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import time
import traceback
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from kvparity.engine.canary import Launch
from kvparity.engine.iteration_recorder import (
    LIVE,
    IterationRecorder,
    RequestState,
    admission_budget,
    decode_requests,
    extend_requests,
)
from kvparity.engine.real import RealSGLangError
from kvparity.engine.real.adapter import VOCAB_SIZE, _dotted
from kvparity.engine.real.host_tier import count_refused_load
from kvparity.engine.real.hybrid_pools import run_deferred_state_work
from kvparity.engine.real.shell_adapters import Knobs, ShellAdapter, adapter_for
from kvparity.engine.real.standins import StandIn
from kvparity.engine.real.standins import install as install_standins
from kvparity.engine.real.versions import VersionEntry
from kvparity.engine.real.worker import Context, remote
from kvparity.engine.traffic_run import TrafficRun
from kvparity.model.canary import token_from
from kvparity.model.traffic import ANY_REQUEST, MAX_CONTEXT_LEN, ServerConfig, table_width
from kvparity.model.traffic_records import TABLE_ONLY, WRONG_KV, Decision, InflightFinding, StopError

# Extra stand-ins for the scheduler's import chain (wider than the KV path's), every release; an
# adapter adds its generation's own.
SCHEDULER_STANDINS: dict[str, StandIn] = {
    "setproctitle": StandIn("srt/managers/scheduler.py: the process title of the scheduler process", True),
    "einops": StandIn("srt/layers (via the scheduler's model-executor imports): tensor rearranging in model code", True),
    "sglang.srt.managers.tp_worker": StandIn(
        "srt/managers/scheduler.py: the TP model worker (model runner, CUDA graphs); its chain decorates Triton LoRA "
        "kernels with a helper that needs compiled JITFunctions, which TRITON_INTERPRET=1 does not give", False),
}

_INSTALLED: dict[str, Any] = {}
MAX_ITERATIONS = 10_000
# Passes after the last arrival in which requests wait and nothing runs: a scheduler that admits
# nothing for this long never will (0.5.3's sliding-window admission can refuse a request forever:
# a run that spun to MAX_ITERATIONS took 100 s).
STALL_PASSES = 200


class ShellCannotDrive(RealSGLangError):
    """The release's scheduler read something its adapter does not provide (an attribute, a module
    on the import chain): the message names the release, the adapter and the missing thing."""


class _EndOfTraffic(Exception):
    """Raised where a pass receives its requests, to leave SGLang's endless event loop."""


def scheduler_module(adapter: ShellAdapter) -> Any:
    """``sglang.srt.managers.scheduler``, imported once per worker behind the stand-ins every
    release needs and the adapter's own."""
    if "standins" not in _INSTALLED:
        _INSTALLED["standins"] = install_standins({**SCHEDULER_STANDINS, **adapter.standins()})
        _INSTALLED["adapter"] = adapter.name
    elif _INSTALLED["adapter"] != adapter.name:
        raise RuntimeError(f"this worker's scheduler stand-ins are {_INSTALLED['adapter']}'s, not {adapter.name}'s")
    return importlib.import_module("sglang.srt.managers.scheduler")


class Forward:
    """The model forward, replaced: the KV canary's forward (``kvparity.engine.canary``) on what a
    model worker gets (the batch's input ids, ``out_cache_loc``, rows and sequence lengths; the
    scheduled batch's prefix lengths): it reads every request's row ``req_to_token[row, :seq_len]``
    as the batch is launched, stamps the new slots, and samples one next token per request from the
    hash it read at the last position."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell

    def __call__(self, worker_batch: Any) -> torch.Tensor:
        shell = self.shell
        batch = shell._kvp_running
        reqs = batch.reqs
        seq_lens = [int(x) for x in worker_batch.seq_lens.tolist()]
        rows = [int(x) for x in worker_batch.req_pool_indices.tolist()]
        assert len(reqs) == len(seq_lens), "the model worker batch and the scheduled batch differ in size"
        input_ids = [int(x) for x in worker_batch.input_ids.tolist()]
        out_cache_loc = [int(x) for x in worker_batch.out_cache_loc.tolist()]
        rids = [r.rid for r in reqs]
        known = [tuple(r.origin_input_ids) + tuple(r.output_ids) for r in reqs]
        if batch.forward_mode.is_extend():
            if shell._kvp_world.mamba is not None:  # what the model runner does before the Mamba layers read
                run_deferred_state_work(shell._kvp_entry, shell.req_to_token_pool, worker_batch)
            prefix_lens, _ = shell._kvp_adapter.extend_lens(batch)
            requests = extend_requests(rids, rows, seq_lens, prefix_lens, input_ids, out_cache_loc, known)
        else:
            requests = decode_requests(rids, rows, seq_lens, input_ids, out_cache_loc, known)
        launch = shell._kvp_recorder.launch(shell._kvp_iteration, requests)
        shell._kvp_launch, shell._kvp_out_cache_loc = launch, out_cache_loc
        return torch.tensor([token_from(h, VOCAB_SIZE) for h in launch.last_hashes], dtype=torch.int64)


@dataclasses.dataclass
class _InFlight:
    """Batch N between its run_batch and the start of its process_batch_result."""

    iteration: int
    reqs: list[Any]
    rows: list[int]
    seq_lens: list[int]
    snapshot: list[torch.Tensor]  # per request: req_to_token[row, :seq_len], following changes once reported
    findings: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    rows_taken: set[tuple[int, str]] = dataclasses.field(default_factory=set)
    undo: Any = None  # a fault's undo, run at the window's end
    launch: Launch | None = None  # the batch's forward, for the canary to land
    # Behind a WAR barrier (0.5.14+ on CUDA): every write the scheduler issues from then on waits
    # for this batch's reads of the table, so none is a race with it.
    fenced: bool = False


def _runs(columns: list[int]) -> list[list[int]]:
    """Consecutive columns grouped: [3, 4, 5, 9] -> [[3, 4, 5], [9]]."""
    out: list[list[int]] = []
    for c in columns:
        if out and out[-1][-1] == c - 1:
            out[-1].append(c)
        else:
            out.append([c])
    return out


def _fault_rewrite_inflight_cell(shell: Any, flight: _InFlight, spec: dict[str, Any]) -> Any:
    """A deliberately broken scheduler, for tests of the oracle: right after ``run_batch`` of the
    batch formed at ``spec["iteration"]``, rewrite ``req_to_token[row, column]`` of its request
    ``spec["request"]`` (an index into the batch; default 0) to ``spec["value"]`` (default: the old
    value + 1), then restore it at the end of the window (so the run itself stays sound)."""
    j = int(spec.get("request", 0))
    row, column = flight.rows[j], int(spec["column"])
    assert column < flight.seq_lens[j], "the fault's column lies outside the cells the batch reads"
    pool = shell.req_to_token_pool.req_to_token
    old = int(pool[row, column])
    pool[row, column] = int(spec.get("value", old + 1))

    def undo() -> None:
        pool[row, column] = old

    return undo


FAULTS = {"rewrite_inflight_cell": _fault_rewrite_inflight_cell}


def _shell_class(mod: Any, adapter: ShellAdapter) -> Any:
    class SchedulerShell(mod.Scheduler):
        """SGLang's Scheduler: arrivals from a list, records per iteration, stubs off the KV path.
        The adapter's hooks (``ShellAdapter.hooks``) name this generation's entry points."""

        _kvp_pass_open: bool = False  # a pass of the loop has begun and its record is not complete
        _kvp_stalled: int = 0  # passes in a row, after the last arrival, in which the scheduler admitted nothing
        _kvp_loop_ran: str | None = None

        # ---- which loop SGLang entered (an adapter may enter through SGLang's own dispatch)
        def event_loop_normal(self, *args: Any, **kwargs: Any) -> Any:
            self._kvp_loop_ran = "normal"
            return super().event_loop_normal(*args, **kwargs)

        def event_loop_overlap(self, *args: Any, **kwargs: Any) -> Any:
            self._kvp_loop_ran = "overlap"
            return super().event_loop_overlap(*args, **kwargs)

        # ---- arrivals (SGLang's own init_req_max_new_tokens and _add_request_to_queue)
        def _kvp_recv(self) -> list[Any]:
            """What a pass of either loop receives; a pass starts here, so the previous pass's
            record is complete."""
            if self._kvp_pass_open:
                self._kvp_end_iteration()
            self._kvp_iter_launch, self._kvp_iter_out = None, None
            self._kvp_adder = ()
            i = self._kvp_iteration
            idle = (not self.waiting_queue and self.chunked_req is None and self.last_batch is None
                    and self.running_batch.is_empty())
            if i >= len(self._kvp_arrivals) and idle:
                raise _EndOfTraffic
            if i >= MAX_ITERATIONS:
                raise RuntimeError(f"run_traffic: still busy after {MAX_ITERATIONS} iterations")
            self._kvp_stalled = self._kvp_stalled + 1 if i >= len(self._kvp_arrivals) and self._kvp_admits_nothing() else 0
            if self._kvp_stalled > STALL_PASSES:
                raise RuntimeError(f"run_traffic: the scheduler admits nothing: {STALL_PASSES} passes with "
                                   f"{len(self.waiting_queue)} requests waiting and none running")
            self._kvp_pass_open = True
            self._kvp_t0 = time.perf_counter()
            return list(self._kvp_arrivals[i]) if i < len(self._kvp_arrivals) else []

        def _kvp_admits_nothing(self) -> bool:
            """Requests wait, none runs, no batch is in flight or was formed by the last pass."""
            return bool(self.waiting_queue) and self.chunked_req is None and self.last_batch is None \
                and self.running_batch.is_empty() and not self._kvp_flights

        def process_input_requests(self, recv_reqs: list[Any]) -> None:
            for spec in recv_reqs:
                if "when" in spec:
                    self._kvp_armed.append((str(spec["abort"]), str(spec["when"])))
                    continue
                if "abort" in spec:
                    self._kvp_abort(str(spec["abort"]))
                    continue
                self._kvp_arrival[spec["rid"]] = len(self._kvp_arrival)
                req = self._kvp_adapter.new_req(self, spec)
                self._kvp_reqs[req.rid] = req
                self.init_req_max_new_tokens(req)
                self._add_request_to_queue(req)
            self._kvp_abort_on_state()
            self._kvp_check("process_input_requests")

        # ---- the nemesis: a client disconnects (SGLang's own abort path, as its tokenizer manager sends it)
        def _kvp_abort(self, rid: str) -> None:
            req = self._kvp_reqs[rid]
            self._kvp_aborts.append((self._kvp_iteration, rid, _abort_state(self, req)))
            io_struct = importlib.import_module("sglang.srt.managers.io_struct")
            self.abort_request(io_struct.AbortReq(rid=rid))
            self._kvp_forget(rid)

        def _kvp_abort_on_state(self) -> None:
            """The aborts on a state: each armed request found in its state now is aborted (once);
            an abort armed for ``ANY_REQUEST`` takes the first request, in arrival order, found there."""
            aborted = {rid for _, rid, _ in self._kvp_aborts}
            for armed in list(self._kvp_armed):
                rid, when = armed
                if rid == ANY_REQUEST:
                    found = next((r for r, req in self._kvp_reqs.items()
                                  if r not in aborted and _abort_state(self, req) == when), None)
                    gone = False
                else:
                    state = _abort_state(self, self._kvp_reqs[rid])
                    found, gone = (rid if state == when else None), state == "finished"
                if found is not None:
                    self._kvp_abort(found)
                    aborted.add(found)
                if found is not None or gone:
                    self._kvp_armed.remove(armed)

        def _kvp_forget(self, rid: str) -> None:
            """An aborted request SGLang no longer holds anywhere (popped from the waiting queue, or
            dropped between chunks), its client answered: done, with what it had decoded."""
            req = self._kvp_reqs.get(rid)
            if req is None or req.finished() or rid in self._kvp_done or _held(self, req) \
                    or any(r is req for r in self.waiting_queue):
                return
            self._kvp_dropped.add(rid)
            self._kvp_done[rid] = list(req.output_ids)
            self._kvp_finished_now.append(rid)

        # ---- observation only: SGLang's own batch formation, then a record of it
        def get_next_batch_to_run(self, *args: Any, **kwargs: Any) -> Any:
            adapter = self._kvp_adapter
            before = {id(r) for r in self.waiting_queue if r.is_retracted}
            planned = super().get_next_batch_to_run(*args, **kwargs)
            batch = adapter.batch_of(planned)
            retracted = [r for r in self.waiting_queue if r.is_retracted and id(r) not in before]
            rec: dict[str, Any] = {"iteration": self._kvp_iteration, "mode": None, "rids": [],
                                   "prefix_lens": [], "extend_lens": [], "seq_lens": [], "rows": [], "chunked": None,
                                   "retracted": len(retracted)}
            if batch is not None:
                rec["mode"] = batch.forward_mode.name
                rec["rids"] = [r.rid for r in batch.reqs]
                rec["seq_lens"] = adapter.seq_lens(batch)
                rec["rows"] = [int(x) for x in batch.req_pool_indices.tolist()]
                if batch.forward_mode.is_extend():
                    rec["prefix_lens"], rec["extend_lens"] = adapter.extend_lens(batch)
                    # Only an extend batch's: a decode batch merged from a chunked prefill keeps a
                    # stale chunked_req that SGLang no longer reads.
                    rec["chunked"] = batch.chunked_req.rid if batch.chunked_req is not None else None
            rec["waiting"] = [r.rid for r in self.waiting_queue]
            self._kvp_records.append(rec)
            self._kvp_check("get_next_batch_to_run")
            if batch is not None:
                self._kvp_check_rows(batch)
            return planned

        # ---- the in-flight oracle (observation only, unless a test names a fault)
        def run_batch(self, batch: Any, *args: Any, **kwargs: Any) -> Any:
            pool = self.req_to_token_pool.req_to_token
            rows = [int(x) for x in batch.req_pool_indices.tolist()]
            seq_lens = self._kvp_adapter.seq_lens(batch)
            flight = _InFlight(self._kvp_iteration, list(batch.reqs), rows, seq_lens,
                               [pool[row, :n].clone() for row, n in zip(rows, seq_lens)])
            self._kvp_running, self._kvp_launch = batch, None
            result = super().run_batch(batch, *args, **kwargs)
            flight.launch = self._kvp_iter_launch = self._kvp_launch
            self._kvp_iter_out = self._kvp_out_cache_loc
            self._kvp_flights.append(flight)
            fault = self._kvp_fault
            if fault is not None and int(fault["iteration"]) == flight.iteration:
                flight.undo = FAULTS[fault["name"]](self, flight, fault)
            self._kvp_check("run_batch")
            return result

        def _apply_war_barrier(self, *args: Any, **kwargs: Any) -> Any:
            """SGLang's write-after-read barrier (0.5.14+; enabled on CUDA, so kvparity applies
            it as a server does): the schedule stream waits for the batches in flight to finish
            reading the shared buffers (the table among them) before any later write."""
            out = super()._apply_war_barrier(*args, **kwargs)
            self._kvp_check("before a WAR barrier")
            for flight in self._kvp_flights:
                flight.fenced = True
            return out

        def _kvp_check(self, step: str) -> None:
            pool = self.req_to_token_pool.req_to_token
            for flight in self._kvp_flights:
                if flight.fenced:
                    continue
                for j, (req, row, n) in enumerate(zip(flight.reqs, flight.rows, flight.seq_lens)):
                    now = pool[row, :n]
                    before = flight.snapshot[j]
                    changed = (now != before).nonzero().flatten().tolist()
                    for columns in _runs(changed):
                        flight.findings.append({
                            "kind": "cell", "batch_iteration": flight.iteration, "rid": req.rid, "row": row,
                            "columns": columns, "old": before[columns].tolist(), "new": now[columns].tolist(),
                            "detected": {"iteration": self._kvp_iteration, "step": step}})
                    if changed:
                        flight.snapshot[j] = now.clone()

        def _kvp_check_rows(self, batch: Any) -> None:
            row_of = self._kvp_adapter.req_row
            for flight in self._kvp_flights:
                if flight.fenced:
                    continue
                owners = dict(zip(flight.rows, (r.rid for r in flight.reqs)))
                for req in batch.reqs:
                    row = row_of(req)
                    owner = owners.get(row) if row is not None else None
                    if owner is not None and owner != req.rid and (row, req.rid) not in flight.rows_taken:
                        flight.rows_taken.add((row, req.rid))
                        flight.findings.append({
                            "kind": "row", "batch_iteration": flight.iteration, "rid": owner,
                            "row": row, "taken_by": req.rid,
                            "detected": {"iteration": self._kvp_iteration, "step": "get_next_batch_to_run"}})

        def _kvp_land(self, batch: Any) -> None:
            """The start of N's process_batch_result: N's window ends; classify what was found."""
            self._kvp_check("before process_batch_result")
            flight = self._kvp_flights.popleft()
            assert [r.rid for r in batch.reqs] == [r.rid for r in flight.reqs], "results out of launch order"
            if flight.undo is not None:
                flight.undo()
            self._kvp_findings += _landed(self, flight)

        def process_batch_result(self, batch: Any, result: Any, *args: Any, **kwargs: Any) -> Any:
            if self._kvp_adapter.lands(batch):
                self._kvp_land(batch)
            out = super().process_batch_result(batch, result, *args, **kwargs)
            self._kvp_check("process_batch_result")  # the window of the batch still in flight
            return out

        def _kvp_end_iteration(self) -> None:
            rec = self._kvp_records[-1]
            assert rec["iteration"] == self._kvp_iteration, "a pass of the loop formed no batch record"
            rec["finished"] = sorted(self._kvp_finished_now)
            rec["ms"] = round((time.perf_counter() - self._kvp_t0) * 1000, 3)
            decision = Decision.from_plain(rec)
            self._kvp_records[-1] = decision
            accounting = (("new_token_ratio", self._kvp_adapter.new_token_ratio(self)),) + self._kvp_adder
            self._kvp_memory.append(self._kvp_recorder.snapshot(
                decision, self._kvp_iter_out, self._kvp_iter_launch, _request_states(self), accounting,
                self.waiting_queue))
            self._kvp_finished_now.clear()
            self._kvp_iteration += 1
            self._kvp_pass_open = False

        def _kvp_stream(self, reqs: list[Any], *args: Any, **kwargs: Any) -> None:
            """Output streaming, replaced: the finished requests are recorded."""
            skip_req = kwargs.get("skip_req", args[1] if len(args) > 1 else None)
            for req in reqs:
                if req.finished() and req is not skip_req and req.rid not in self._kvp_done:
                    self._kvp_done[req.rid] = list(req.output_ids)
                    self._kvp_finished_now.append(req.rid)

    hooks: dict[str, Callable[..., Any]] = adapter.hooks()
    return type("SchedulerShell", (SchedulerShell,), {"__module__": __name__, **hooks})


def _knobs(server: ServerConfig, max_context_len: int = MAX_CONTEXT_LEN) -> Knobs:
    """The shell's knobs of a server (its record has checked its own fields, the loop among them)."""
    chunked = server.chunked_prefill_size
    return Knobs(
        loop=server.loop, schedule_policy=server.schedule_policy, page_size=server.page_size,
        pool_rows=server.pool_rows, max_context_len=max_context_len, kv_slots=server.kv_slots,
        max_prefill_tokens=server.max_prefill_tokens,
        chunked_prefill_size=None if chunked is None or chunked <= 0 else chunked,
        max_running_requests=server.max_running_requests, radix_cache=server.radix_cache,
        schedule_conservativeness=server.schedule_conservativeness, tree_core=server.tree_core,
        caches=server.caches,
    )


def _build(ctx: Context, adapter: ShellAdapter, config: dict[str, Any], arrivals: list[list[dict[str, Any]]]) -> Any:
    entry = ctx.require_sglang()
    # The server as its record (one set of defaults); beside it, a test's fault and the row width.
    plain = dict(config)
    fault, max_context_len = plain.pop("fault", None), int(plain.pop("max_context_len", MAX_CONTEXT_LEN))
    server = ServerConfig.from_plain(plain)
    knobs = _knobs(server, max_context_len)
    if fault is not None and fault.get("name") not in FAULTS:
        raise ValueError(f"run_traffic: no fault named {fault.get('name')!r} (known: {sorted(FAULTS)})")
    mod = scheduler_module(adapter)
    _set_test_retract(mod, entry, server.forced_retraction)
    world = adapter.build_world(entry, knobs)
    cls = _shell_class(mod, adapter)
    shell = cls.__new__(cls)
    width = table_width([(len(a["tokens"]), int(a["max_new_tokens"])) for group in arrivals for a in group
                         if "abort" not in a], knobs.page_size, knobs.max_context_len)
    # The shell's own bookkeeping.
    shell.__dict__.update(
        _kvp_adapter=adapter, _kvp_entry=entry, _kvp_arrivals=arrivals, _kvp_iteration=0, _kvp_records=[],
        _kvp_arrival={}, _kvp_reqs={}, _kvp_done={}, _kvp_finished_now=[], _kvp_t0=time.perf_counter(),
        _kvp_world=world, _kvp_running=None, _kvp_launch=None, _kvp_out_cache_loc=None, _kvp_iter_launch=None,
        _kvp_iter_out=None, _kvp_adder=(), _kvp_memory=[], _kvp_pass_open=False, _kvp_flights=deque(), _kvp_stalled=0,
        _kvp_findings=[], _kvp_fault=fault, _kvp_loop=knobs.loop, _kvp_knobs=knobs, _kvp_aborts=[], _kvp_armed=[],
        _kvp_dropped=set(), _kvp_loading={},
        _kvp_recorder=IterationRecorder(world, radix=world.cache_kind == "radix", kv_slots=knobs.kv_slots,
                                        page_size=knobs.page_size, width=width),
    )
    shell._kvp_forward = Forward(shell)
    adapter.set_up(shell, mod, world, knobs)
    _answer_aborts(shell)
    _record_admission_budget(mod, shell)
    return shell


def _set_test_retract(mod: Any, entry: VersionEntry, interval: int | None) -> None:
    """SGLang's retraction test switch for this run (the nemesis's forced retraction), off unless
    the scenario asks: the scheduler module reads ``TEST_RETRACT`` and ``TEST_RETRACT_INTERVAL`` as
    globals at every decode batch, so each run sets both (a worker plays many scenarios)."""
    if not entry.test_retract_interval:
        if interval is not None:
            raise RealSGLangError(f"forced_retraction: sglang {entry.version} has no retraction test switch at an "
                                  f"interval (SGLANG_TEST_RETRACT_INTERVAL, 0.5.4+)")
        return
    mod.TEST_RETRACT, mod.TEST_RETRACT_INTERVAL = interval is not None, int(interval or 3)


def _record_admission_budget(mod: Any, shell: Any) -> None:
    """What each iteration's PrefillAdder was given (the accounting a snapshot shows): the
    scheduler module's ``PrefillAdder`` becomes a subclass that notes, once built, the budgets it
    starts from (those of ``ADMISSION_BUDGET`` this release has), a request it leaves waiting for
    want of room while its prefix waits on the host (``count_refused_load``), and, for each request
    it admits, the load-backs from the host its admission started (the tree's ``ongoing_load_back``
    keys it added: ``_loading_back``). Nothing it decides changes."""
    base = mod.PrefillAdder
    base = getattr(base, "_kvp_base", base)

    class RecordingAdder(base):  # type: ignore[misc, valid-type]
        _kvp_base = base

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            shell._kvp_adder = admission_budget(self)

        def add_one_req(self, req: Any, *args: Any, **kwargs: Any) -> Any:
            before = set(getattr(shell.tree_cache, "ongoing_load_back", None) or ())
            result = super().add_one_req(req, *args, **kwargs)
            started = set(getattr(shell.tree_cache, "ongoing_load_back", None) or ()) - before
            if started:
                shell._kvp_loading[req.rid] = started
            if getattr(result, "name", None) == "NO_TOKEN" and _waits_on_host(shell._kvp_entry, req):
                count_refused_load(shell.tree_cache)
            return result

    mod.PrefillAdder = RecordingAdder


def _waits_on_host(entry: VersionEntry, req: Any) -> bool:
    """Whether a request's prefix waits on the host: SGLang's own answer where the release has one
    (0.5.13+: its KV, its window or its Mamba state there), else whether its KV is."""
    if entry.needs_host_load_back:
        return bool(req.needs_host_load_back())
    return (getattr(req, "host_hit_length", 0) or 0) > 0


def _held_reqs(shell: Any) -> list[Any]:
    """The requests the scheduler holds in a batch: running, the last batch, chunked, in flight."""
    return [*shell.running_batch.reqs, *(shell.last_batch.reqs if shell.last_batch is not None else ()),
            *([shell.chunked_req] if shell.chunked_req is not None else ()),
            *(r for flight in shell._kvp_flights for r in flight.reqs)]


def _held(shell: Any, req: Any) -> bool:
    return any(r is req for r in _held_reqs(shell))


def _abort_state(shell: Any, req: Any) -> str:
    """Where a request is in its life when its client aborts it (a key of ``TRAFFIC_ABORTS``, or "finished")."""
    if req.finished() or req.rid in shell._kvp_done:
        return "finished"
    if any(r is req for r in shell.waiting_queue):
        if getattr(req, "is_retracted", False):
            return "retracted"
        return "prefetching" if _prefetching(shell, req) else "waiting"
    if _loading_back(shell, req):
        return "loading back"
    if req is shell.chunked_req:
        return "between chunks"
    return "decoding" if req.output_ids else "prefilled"


def _loading_back(shell: Any, req: Any) -> bool:
    """Whether a load-back from the host that the request's admission started is still listed by
    the tree (``ongoing_load_back``, until the pass that finds its transfer done): the request is
    held (in a batch, prefilled or not) while its prefix's KV is still being copied to the device."""
    ongoing = getattr(shell.tree_cache, "ongoing_load_back", None) or {}
    return any(key in ongoing for key in shell._kvp_loading.get(req.rid, ()))


def _prefetching(shell: Any, req: Any) -> bool:
    """Whether the tree is fetching the request's prefix from storage: its ongoing prefetches are
    keyed by request id (HiRadixCache, UnifiedRadixCache to 0.5.22) or by the request's cache
    handle (0.5.23; requests carry one from 0.5.20); a tree without a storage tier has none."""
    ongoing = getattr(shell.tree_cache, "ongoing_prefetch", None) or {}
    handle = req.cache_request_handle if shell._kvp_entry.cache_request_handle else None
    return req.rid in ongoing or (handle is not None and handle in ongoing)


class _AbortAnswers:
    """SGLang's channel to the tokenizer: an abort's answer to its client (an ``AbortReq`` sent
    back, whenever the release sends it: at once for a queued request, later for a chunked one) is
    taken and dropped; anything else goes to what the adapter set there (a stand-in that raises)."""

    def __init__(self, shell: Any, behind: Any) -> None:
        self._shell, self._behind = shell, behind

    def __getattr__(self, name: str) -> Any:
        def send(obj: Any, *args: Any, **kwargs: Any) -> Any:
            if type(obj).__name__ == "AbortReq":
                self._shell._kvp_forget(obj.rid)
                return None
            if self._behind is None:
                raise AttributeError(f"the scheduler shell has no channel to the tokenizer for {name}")
            return getattr(self._behind, name)(obj, *args, **kwargs)

        return send


def _answer_aborts(shell: Any) -> None:
    """SGLang's channels to the tokenizer (the scheduler's own and, from 0.5.13, its IPC
    channels': the entry's ``scheduler_ipc_channels``), each behind ``_AbortAnswers``."""
    for owner in (shell, shell.ipc_channels if shell._kvp_entry.scheduler_ipc_channels else None):
        if owner is not None:
            owner.send_to_tokenizer = _AbortAnswers(shell, getattr(owner, "send_to_tokenizer", None))


def _request_states(shell: Any) -> dict[str, RequestState]:
    """Every request that has arrived, as the scheduler holds it at the end of a pass: finished
    (SGLang's own ``finished()``); running or chunked while the scheduler holds it (the running
    batch, the last batch, the chunked request, a batch in flight) and it is not back in the
    waiting queue (retracted); else waiting."""
    held = _held_reqs(shell)
    held_ids = {id(r) for r in held} - {id(r) for r in shell.waiting_queue}
    protected_field = shell._kvp_entry.protected_len_field
    states = {}
    for rid, req in shell._kvp_reqs.items():
        if req.finished() or rid in shell._kvp_dropped:
            status = "finished"
        elif id(req) in held_ids:
            status = "chunked" if req is shell.chunked_req else "running"
        else:
            status = "waiting"
        live = status in LIVE
        states[rid] = RequestState(status, shell._kvp_adapter.req_row(req) if live else None,
                                   int(_dotted(req, protected_field)) if live else 0, len(req.output_ids))
    return states


def _landed(shell: Any, flight: _InFlight) -> list[InflightFinding]:
    """Batch N's findings when it lands (or when the loop stopped with it in flight), classified by
    SGLang's own criterion for dropping N's token of the request (``process_batch_result``), and by
    the canary: a read through each changed cell, with the KV as of N's place in the stream."""
    by_rid = {r.rid: r for r in flight.reqs}
    cells = [(f, col, new) for f in flight.findings if f["kind"] == "cell" for col, new in zip(f["columns"], f["new"])]
    harmful = shell._kvp_recorder.land(flight.launch, [(f["rid"], col, new) for f, col, new in cells]) \
        if flight.launch is not None else [False] * len(cells)
    wrong = {id(f) for (f, _, _), bad in zip(cells, harmful) if bad}
    wrong_rows = {f["row"] for f in flight.findings if id(f) in wrong}
    out = []
    for f in flight.findings:
        bad = id(f) in wrong if f["kind"] == "cell" else f["row"] in wrong_rows
        out.append(InflightFinding(
            kind=f["kind"], cls=shell._kvp_adapter.req_class(by_rid[f["rid"]]), harm=WRONG_KV if bad else TABLE_ONLY,
            batch_iteration=f["batch_iteration"], rid=f["rid"], row=f["row"],
            detected_iteration=f["detected"]["iteration"], detected_step=f["detected"]["step"],
            columns=tuple(f.get("columns", ())), old=tuple(f.get("old", ())), new=tuple(f.get("new", ())),
            taken_by=f.get("taken_by")))
    return out


@remote
def run_traffic(ctx: Context, config: dict[str, Any], arrivals: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """Play ``arrivals`` (per iteration, dicts with ``rid``, ``tokens``, ``max_new_tokens``) through
    the release's own ``event_loop_normal`` or ``event_loop_overlap`` under ``config`` (``loop``:
    "normal" (default) or "overlap"; ``schedule_policy``, ``page_size``, ``pool_rows``, ``kv_slots``,
    ``max_prefill_tokens``, ``chunked_prefill_size`` (None or -1: off), ``max_running_requests``,
    ``radix_cache``, ``schedule_conservativeness``: how much of each request's remaining output
    admission reserves, SGLang's ``--schedule-conservativeness``; ``fault``: tests of the oracle
    only, see ``FAULTS``). Returns a ``TrafficRun`` as plain data: per iteration the decision and
    the memory snapshot, the outputs, the in-flight findings (classified by SGLang's criterion and
    by the canary), the error SGLang stopped on, the costs, and who played (``player``: release,
    adapter, scheduler generation, tree)."""
    entry = ctx.require_sglang()
    adapter = adapter_for(entry)
    t0 = time.perf_counter()
    try:
        shell = _build(ctx, adapter, config, arrivals)
        build_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        # SGLang's torch.compile'd helpers (the overlap loop's future-token resolution) run eagerly.
        error = None
        with torch.compiler.set_stance("force_eager"):
            try:
                adapter.run(shell, shell._kvp_knobs)
            except _EndOfTraffic:
                pass
            except (AttributeError, ImportError) as exc:
                if not _raised_in_cache(exc):
                    raise
                error = _stopped(shell, exc)  # the cache failed on its own objects (kvparity's world is built)
            except Exception as exc:  # SGLang stopped (its leak check, an assertion): that is a result
                error = _stopped(shell, exc)
    except (AttributeError, ImportError) as exc:  # what the adapter does not provide, or a module it does not stand in
        raise ShellCannotDrive(
            f"the scheduler shell cannot drive sglang {entry.version} (adapter {adapter.name}, scheduler generation "
            f"{adapter.generation}): {type(exc).__name__}: {exc}") from exc
    if error is None and shell._kvp_loop_ran != shell._kvp_loop:
        raise RuntimeError(f"run_traffic: SGLang entered the {shell._kvp_loop_ran} loop, not the {shell._kvp_loop} one")
    assert error is not None or not shell._kvp_flights, "the loop ended with a batch still in flight"
    decisions = tuple(d for d in shell._kvp_records if isinstance(d, Decision))  # a pass cut short by an error: none
    return TrafficRun(
        loop=shell._kvp_loop, decisions=decisions, memory=tuple(shell._kvp_memory),
        outputs={rid: tuple(out) for rid, out in shell._kvp_done.items()}, inflight=tuple(shell._kvp_findings),
        error=error, aborts=tuple(shell._kvp_aborts), build_s=round(build_s, 3),
        loop_s=round(time.perf_counter() - t1, 3),
        record_s=round(shell._kvp_recorder.seconds, 3), cells_past_width=shell._kvp_recorder.written_past_width(),
        player={"release": ctx.info.get("version") or entry.version, "adapter": shell._kvp_adapter.name,
                "scheduler_generation": shell._kvp_adapter.generation, "tree": _tree_label(shell._kvp_world)},
    ).to_plain()


def _raised_in_cache(exc: BaseException) -> bool:
    """Whether an AttributeError rose in SGLang's caches themselves (``sglang/srt/mem_cache``), on
    the objects of the world kvparity built before the loop started: the cache's failure (a
    mutant's, say), not an attribute the shell's adapter does not provide."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f"{os.sep}sglang{os.sep}" in f.filename]
    return isinstance(exc, AttributeError) and not isinstance(exc, RealSGLangError) and bool(frames) and \
        f"{os.sep}srt{os.sep}mem_cache{os.sep}" in frames[-1].filename


def _stopped(shell: Any, exc: Exception) -> StopError:
    """SGLang raised inside its loop: the iteration and where (the innermost frame in sglang), and
    the findings of the batches still in flight, classified as they would have been on landing."""
    while shell._kvp_flights:
        shell._kvp_findings += _landed(shell, shell._kvp_flights.popleft())
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f"{os.sep}sglang{os.sep}" in f.filename]
    where = None
    if frames:
        name = frames[-1].filename
        where = f"{name[name.rindex(os.sep + 'sglang' + os.sep) + 1:]}:{frames[-1].lineno} in {frames[-1].name}"
    return StopError.of(shell._kvp_iteration, exc, where)


def _tree_label(world: Any) -> str:
    """The cache the run used: "radix", "chunk", or "unified/<core>" (the core actually built); a
    hybrid model's: its tree of its own ("SWARadixCache", "MambaRadixCache"), or "unified/<core>,
    FULL+SWA" or "..., FULL+MAMBA"."""
    hybrid = ", FULL+SWA" if world.window is not None else ", FULL+MAMBA" if world.mamba is not None else ""
    if world.tree_class != "unified":
        return type(world.tree_cache).__name__ if hybrid else world.cache_kind
    from kvparity.engine.real.unified_tree import tree_core_kind

    return (f"unified/{tree_core_kind(world.tree_cache, world.entry)}" + ("" if world.cache_kind == "radix" else " (disabled)")
            + hybrid)
