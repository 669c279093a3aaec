"""SGLang's own ``Scheduler`` event loop on the CPU, only the model forward replaced (issue 26, a
first step; see ``../shared/sglang-scheduler-shell.md``).

``run_traffic`` (a worker-side ``@remote`` function) builds the release's ``Scheduler`` without its
heavy ``__init__`` (``__new__`` on a small subclass, the attributes its loop reads set here), on a
real world of the release (``build_real_world``: pools, allocator, radix cache), and runs the
release's own ``event_loop_normal`` or ``event_loop_overlap`` (``config["loop"]``). Requests arriving at an iteration go through the release's own
``init_req_max_new_tokens`` and ``_add_request_to_queue``; ``get_next_batch_to_run``,
``get_new_batch_prefill``, ``update_running_batch``, ``run_batch``, ``process_batch_result``,
``SchedulePolicy``, ``PrefillAdder``, ``ScheduleBatch`` and the caches are SGLang's own. Replaced:
the model forward (a deterministic next token from the request's arrival index and its sequence
length), and, off the KV path, logging, the profiler, output streaming (finished requests are
recorded instead), and the idle sleeper (``self_check_during_idle`` keeps SGLang's own leak check
``check_memory`` and the ``new_token_ratio`` reset). Metrics are SGLang's own, disabled. The loop ends, by a private exception raised in
``recv_requests``, once the arrivals are exhausted and nothing runs or waits.

The overlap loop: in 0.5.3.post1 SGLang's own ``init_overlap`` builds its ``FutureMap`` (and CPU
streams/events), and its own ``run_batch`` / ``batch.copy()`` / result queue run unchanged; in 0.5.3
the loop talks to a TP worker thread (``TpModelWorkerClient``), replaced by ``_FakeOverlapClient``
(its docstring says why that is faithful enough for the KV path). ``_resolve_future_token_ids`` (a
``torch.compile`` function of SGLang's, input ids only) runs eagerly: the whole loop runs under
``torch.compiler.set_stance("force_eager")`` (compiling it costs ~30 s on a CPU).

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

Tested for the 0.5.3 family (0.5.3, 0.5.3.post1); later releases need their own attributes.
"""

from __future__ import annotations

import dataclasses
import importlib
import threading
import time
from collections import deque
from types import SimpleNamespace
from typing import Any

import torch

from kvparity.engine.real.adapter import VOCAB_SIZE, build_real_world
from kvparity.engine.real.standins import StandIn
from kvparity.engine.real.standins import install as install_standins
from kvparity.engine.real.worker import Context, remote
from kvparity.model.traffic import LOOPS, next_token

# Extra stand-ins for the scheduler's import chain (wider than the KV path's).
SCHEDULER_STANDINS: dict[str, StandIn] = {
    "setproctitle": StandIn("srt/managers/scheduler.py: the process title of the scheduler process", True),
    "einops": StandIn("srt/layers (via the scheduler's model-executor imports): tensor rearranging in model code", True),
    "sglang.srt.managers.tp_worker": StandIn(
        "srt/managers/scheduler.py: the TP model worker (model runner, CUDA graphs); its chain decorates Triton LoRA "
        "kernels with a helper that needs compiled JITFunctions, which TRITON_INTERPRET=1 does not give", False),
    "sglang.srt.managers.tp_worker_overlap_thread": StandIn(
        "srt/managers/scheduler.py (0.5.3): the overlap loop's TP worker thread (TpModelWorkerClient; the shell's "
        "_FakeOverlapClient takes its place)", False),
}

_INSTALLED: list[Any] = []
MAX_ITERATIONS = 10_000


class _EndOfTraffic(Exception):
    """Raised in recv_requests to leave SGLang's endless event loop."""


def _scheduler_module() -> Any:
    if not _INSTALLED:
        _INSTALLED.append(install_standins(SCHEDULER_STANDINS))
    return importlib.import_module("sglang.srt.managers.scheduler")


def _logits_output() -> Any:
    """What the loop reads of a logits output when no logprobs or hidden states are asked for."""
    return SimpleNamespace(next_token_logits=None, next_token_logprobs=None, input_token_logprobs=None,
                           hidden_states=None)


class _FakeModelWorker:
    """The model forward, replaced: one next token per request of the batch."""

    def __init__(self, shell: Any, mod: Any) -> None:
        self.shell = shell
        self.mod = mod
        # 0.5.3: run_batch wraps a ForwardBatchOutput; 0.5.3.post1: it takes a GenerationBatchResult.
        self.wraps = hasattr(mod.GenerationBatchResult, "from_forward_batch_output")
        self.worker = SimpleNamespace(model_runner=SimpleNamespace(is_hybrid_gdn=False, mambaish_config=None))
        self.reads: list[list[list[int]]] = []  # per forward: each request's req_to_token[row, :seq_len]

    def _forward(self, model_worker_batch: Any) -> torch.Tensor:
        reqs = self.shell.cur_batch.reqs
        seq_lens = model_worker_batch.seq_lens.tolist()
        rows = model_worker_batch.req_pool_indices.tolist()
        assert len(reqs) == len(seq_lens), "the model worker batch and the scheduled batch differ in size"
        pool = self.shell.req_to_token_pool.req_to_token
        self.reads.append([pool[row, :n].tolist() for row, n in zip(rows, seq_lens)])
        return torch.tensor([next_token(self.shell._kvp_arrival[r.rid], n, VOCAB_SIZE) for r, n in zip(reqs, seq_lens)],
                            dtype=torch.int64)

    def forward_batch_generation(self, model_worker_batch: Any) -> Any:
        ids = self._forward(model_worker_batch)
        if self.wraps:
            fbo = importlib.import_module("sglang.srt.model_executor.forward_batch_info").ForwardBatchOutput
            return fbo(logits_output=_logits_output(), next_token_ids=ids, can_run_cuda_graph=False)
        return self.mod.GenerationBatchResult(logits_output=_logits_output(), next_token_ids=ids,
                                              can_run_cuda_graph=False)


class _FakeOverlapClient(_FakeModelWorker):
    """0.5.3's ``TpModelWorkerClient`` (the overlap loop's TP worker thread), replaced.

    What the scheduler sees of the real client, kept: ``forward_batch_generation`` returns at once
    with *future* token ids (negative indices into SGLang's own ``FutureMap``, which the next decode
    batch carries as its input ids), ``cur_sampling_info`` is the copy of the batch's sampling info
    the client made, and ``resolve_last_batch_result(launch_done)`` hands back, in launch order, the
    oldest unresolved result (``logits_output``, next token ids as a list, ``can_run_cuda_graph``)
    once the current batch has been launched. What differs: the forward runs synchronously, inside
    ``forward_batch_generation``, instead of on a thread. Why that is faithful enough for the KV
    path: every interaction of the scheduler with the client is synchronous in the real one too
    (launch returns future ids without waiting; resolve blocks until the result is there), so the
    scheduler's sequence of calls on the pools, the allocator and the tree is the same whatever the
    thread's progress. Where it is not: when the real thread actually reads ``req_to_token`` during
    the window is timing-dependent; here the read happens at launch, the earliest point. The oracle
    does not rely on the read time: it watches the cells over the whole window. The KV *contents*
    (the attention writes) are not modelled at all."""

    def __init__(self, shell: Any, mod: Any, max_running_requests: int) -> None:
        super().__init__(shell, mod)
        future_map = importlib.import_module("sglang.srt.managers.overlap_utils").FutureMap
        self.future_map = future_map(max_running_requests, "cpu")
        self.outputs: deque[tuple[Any, torch.Tensor, bool]] = deque()
        self.cur_sampling_info: Any = None

    def forward_batch_generation(self, model_worker_batch: Any) -> Any:
        # The client's launch: a copy of the sampling info (the scheduler updates the batch's in place).
        sampling_info = model_worker_batch.sampling_info
        sampling_info.update_penalties()
        model_worker_batch.sampling_info = self.cur_sampling_info = dataclasses.replace(
            sampling_info, sampling_info_done=threading.Event(), penalizer_orchestrator=None)
        bs = len(model_worker_batch.seq_lens)
        future_ct = self.future_map.update_ct(bs)
        # The thread's work, done here: resolve the future input ids, forward, store the next tokens.
        self.future_map.resolve_future(model_worker_batch)
        ids = self._forward(model_worker_batch)
        self.future_map.store_to_map(future_ct, bs, ids)
        if model_worker_batch.launch_done is not None:
            model_worker_batch.launch_done.set()
        self.outputs.append((_logits_output(), ids, False))
        fbo = importlib.import_module("sglang.srt.model_executor.forward_batch_info").ForwardBatchOutput
        return fbo(next_token_ids=self.future_map.update_next_future(future_ct, bs), can_run_cuda_graph=False)

    def resolve_last_batch_result(self, launch_done: threading.Event | None = None) -> tuple[Any, list[int], bool]:
        if not self.outputs:
            raise RuntimeError("resolve_last_batch_result: no batch in flight (the real client would block forever)")
        logits_output, ids, can_run_cuda_graph = self.outputs.popleft()
        if launch_done is not None and not launch_done.is_set():
            raise RuntimeError("resolve_last_batch_result: the current batch was never launched")
        return logits_output, ids.tolist(), can_run_cuda_graph


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


def _shell_class(mod: Any) -> Any:
    class SchedulerShell(mod.Scheduler):
        """SGLang's Scheduler: arrivals from a list, records per iteration, stubs off the KV path."""

        _kvp_pass_open: bool = False  # a pass of the loop has begun and its record is not complete

        # ---- arrivals (SGLang's own init_req_max_new_tokens and _add_request_to_queue)
        def recv_requests(self) -> list[Any]:
            # A pass of either loop starts here: the previous pass's record is complete.
            if self._kvp_pass_open:
                self._kvp_end_iteration()
            i = self._kvp_iteration
            idle = (not self.waiting_queue and self.chunked_req is None and self.last_batch is None
                    and self.running_batch.is_empty())
            if i >= len(self._kvp_arrivals) and idle:
                raise _EndOfTraffic
            if i >= MAX_ITERATIONS:
                raise RuntimeError(f"run_traffic: still busy after {MAX_ITERATIONS} iterations")
            self._kvp_pass_open = True
            self._kvp_t0 = time.perf_counter()
            return list(self._kvp_arrivals[i]) if i < len(self._kvp_arrivals) else []

        def process_input_requests(self, recv_reqs: list[Any]) -> None:
            sampling_params = importlib.import_module("sglang.srt.sampling.sampling_params").SamplingParams
            for spec in recv_reqs:
                tokens = [int(t) for t in spec["tokens"]]
                self._kvp_arrival[spec["rid"]] = len(self._kvp_arrival)
                params = sampling_params(max_new_tokens=int(spec.get("max_new_tokens", 16)))
                params.normalize(None)
                params.verify(self.model_config.vocab_size)
                req = mod.Req(spec["rid"], "", tokens, params, vocab_size=self.model_config.vocab_size)
                req.tokenizer = None
                self.init_req_max_new_tokens(req)
                n = len(req.origin_input_ids)
                req.logprob_start_len = n if req.is_prefill_only else n - 1
                self._add_request_to_queue(req)
            self._kvp_check("process_input_requests")

        # ---- observation only: SGLang's own batch formation, then a record of it
        def get_next_batch_to_run(self) -> Any:
            self.num_retracted_reqs = 0  # update_running_batch sets it when it retracts
            batch = super().get_next_batch_to_run()
            rec: dict[str, Any] = {"iteration": self._kvp_iteration, "mode": None, "rids": [],
                                   "prefix_lens": [], "extend_lens": [], "seq_lens": [], "rows": [], "chunked": None,
                                   "retracted": self.num_retracted_reqs}
            if batch is not None:
                rec["mode"] = batch.forward_mode.name
                rec["rids"] = [r.rid for r in batch.reqs]
                rec["seq_lens"] = [int(x) for x in batch.seq_lens.tolist()]
                rec["rows"] = [int(x) for x in batch.req_pool_indices.tolist()]
                if batch.forward_mode.is_extend():
                    rec["prefix_lens"] = [int(x) for x in batch.prefix_lens]
                    rec["extend_lens"] = [int(x) for x in batch.extend_lens]
                    # Only an extend batch's: a decode batch merged from a chunked prefill keeps a
                    # stale chunked_req that SGLang no longer reads.
                    rec["chunked"] = batch.chunked_req.rid if batch.chunked_req is not None else None
            rec["waiting"] = [r.rid for r in self.waiting_queue]
            self._kvp_records.append(rec)
            self._kvp_check("get_next_batch_to_run")
            if batch is not None:
                self._kvp_check_rows(batch)
            return batch

        # ---- the in-flight oracle (observation only, unless a test names a fault)
        def run_batch(self, batch: Any) -> Any:
            pool = self.req_to_token_pool.req_to_token
            rows = [int(x) for x in batch.req_pool_indices.tolist()]
            seq_lens = [int(x) for x in batch.seq_lens.tolist()]
            flight = _InFlight(self._kvp_iteration, list(batch.reqs), rows, seq_lens,
                               [pool[row, :n].clone() for row, n in zip(rows, seq_lens)])
            result = super().run_batch(batch)
            self._kvp_flights.append(flight)
            fault = self._kvp_fault
            if fault is not None and int(fault["iteration"]) == flight.iteration:
                flight.undo = FAULTS[fault["name"]](self, flight, fault)
            self._kvp_check("run_batch")
            return result

        def _kvp_check(self, step: str) -> None:
            pool = self.req_to_token_pool.req_to_token
            for flight in self._kvp_flights:
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
            for flight in self._kvp_flights:
                owners = dict(zip(flight.rows, (r.rid for r in flight.reqs)))
                for req in batch.reqs:
                    owner = owners.get(req.req_pool_idx)
                    if owner is not None and owner != req.rid and (req.req_pool_idx, req.rid) not in flight.rows_taken:
                        flight.rows_taken.add((req.req_pool_idx, req.rid))
                        flight.findings.append({
                            "kind": "row", "batch_iteration": flight.iteration, "rid": owner,
                            "row": req.req_pool_idx, "taken_by": req.rid,
                            "detected": {"iteration": self._kvp_iteration, "step": "get_next_batch_to_run"}})

        def _kvp_land(self, batch: Any) -> None:
            """The start of N's process_batch_result: N's window ends; classify what was found."""
            self._kvp_check("before process_batch_result")
            flight = self._kvp_flights.popleft()
            assert [r.rid for r in batch.reqs] == [r.rid for r in flight.reqs], "results out of launch order"
            if flight.undo is not None:
                flight.undo()
            by_rid = {r.rid: r for r in flight.reqs}
            for finding in flight.findings:
                req = by_rid[finding["rid"]]
                # SGLang's own criterion for dropping N's token of the request (process_batch_result).
                finding["class"] = "retracted" if req.is_retracted else "finished" if req.finished() else "live"
                self._kvp_findings.append(finding)

        def process_batch_result(self, batch: Any, result: Any, *args: Any) -> None:
            is_dummy_first = getattr(batch.forward_mode, "is_dummy_first", lambda: False)()
            if not is_dummy_first:  # 0.5.3's overlap loop: a dummy first batch starts the pipeline
                self._kvp_land(batch)
            super().process_batch_result(batch, result, *args)
            self._kvp_check("process_batch_result")  # the window of the batch still in flight

        def self_check_during_idle(self) -> None:
            # SGLang's own checks (check_memory raises on a KV or row leak) and the one KV-path
            # effect: the ratio reset; the idle sleeper is left out.
            self.check_memory()
            self.check_tree_cache()
            self.new_token_ratio = self.init_new_token_ratio

        def _kvp_end_iteration(self) -> None:
            rec = self._kvp_records[-1]
            assert rec["iteration"] == self._kvp_iteration, "a pass of the loop formed no batch record"
            rec["finished"] = sorted(self._kvp_finished_now)
            rec["ms"] = round((time.perf_counter() - self._kvp_t0) * 1000, 3)
            self._kvp_finished_now.clear()
            self._kvp_iteration += 1
            self._kvp_pass_open = False

        # ---- stubs off the KV path
        def stream_output(self, reqs: list[Any], return_logprob: bool, skip_req: Any = None) -> None:
            for req in reqs:
                if req.finished() and req is not skip_req and req.rid not in self._kvp_done:
                    self._kvp_done[req.rid] = list(req.output_ids)
                    self._kvp_finished_now.append(req.rid)

        def _profile_batch_predicate(self, batch: Any) -> None:
            pass

        def log_prefill_stats(self, *args: Any, **kwargs: Any) -> None:
            pass

        def log_decode_stats(self, *args: Any, **kwargs: Any) -> None:
            pass

    return SchedulerShell


def _build(ctx: Context, config: dict[str, Any], arrivals: list[list[dict[str, Any]]]) -> Any:
    entry = ctx.require_sglang()
    mod = _scheduler_module()
    sb = importlib.import_module("sglang.srt.managers.schedule_batch")
    policy_mod = importlib.import_module("sglang.srt.managers.schedule_policy")
    global_config = importlib.import_module("sglang.global_config").global_config
    disagg = importlib.import_module("sglang.srt.disaggregation.utils").DisaggregationMode

    loop = str(config.get("loop", "normal"))
    if loop not in LOOPS:
        raise ValueError(f"run_traffic: loop {loop!r} is none of {LOOPS}")
    overlap = loop == "overlap"
    fault = config.get("fault")
    if fault is not None and fault.get("name") not in FAULTS:
        raise ValueError(f"run_traffic: no fault named {fault.get('name')!r} (known: {sorted(FAULTS)})")
    page_size = int(config.get("page_size", 1))
    geometry = {"pool_rows": int(config["pool_rows"]), "max_context_len": int(config.get("max_context_len", 4096)),
                "kv_slots": int(config["kv_slots"]), "page_size": page_size, "need_sort": False}
    radix = bool(config.get("radix_cache", True))
    world = build_real_world(entry, "torch", geometry, "radix" if radix else "chunk", "cpu")
    max_running = int(config.get("max_running_requests", geometry["pool_rows"]))
    chunked = config.get("chunked_prefill_size")
    chunked = None if chunked is None or int(chunked) <= 0 else int(chunked)
    sa = world.server_args
    for name, value in (("schedule_policy", config.get("schedule_policy", "fcfs")),
                        ("max_prefill_tokens", int(config["max_prefill_tokens"])),
                        ("chunked_prefill_size", chunked if chunked is not None else -1),
                        ("max_running_requests", max_running), ("disable_overlap_schedule", not overlap),
                        ("schedule_conservativeness", float(config.get("schedule_conservativeness", 1.0)))):
        setattr(sa, name, value)
    world.activate()
    # What Scheduler.__init__ writes into the globals: the micro-batch size (renamed in 0.5.3.post1).
    key = "pp_max_micro_batch_size" if "pp_max_micro_batch_size" in sb.global_server_args_dict else "max_micro_batch_size"
    sb.global_server_args_dict[key] = max_running

    cls = _shell_class(mod)
    shell = cls.__new__(cls)
    s = shell.__dict__
    # 0.5.3's overlap loop talks to a TP worker thread; 0.5.3.post1's keeps the overlap in the scheduler
    # (init_overlap below) and calls the plain worker.
    own_overlap = hasattr(mod.Scheduler, "init_overlap")
    fake = _FakeOverlapClient(shell, mod, max_running) if overlap and not own_overlap else _FakeModelWorker(shell, mod)
    max_total = world.allocator.size
    s.update(
        server_args=sa, model_config=world.model_config, page_size=page_size,
        req_to_token_pool=world.req_to_token_pool, token_to_kv_pool_allocator=world.allocator,
        tree_cache=world.tree_cache, max_total_num_tokens=max_total,
        max_req_len=min(geometry["max_context_len"] - 1, max_total - 1),
        waiting_queue=[], running_batch=sb.ScheduleBatch(reqs=[], batch_is_full=False), chunked_req=None,
        last_batch=None, cur_batch=None, grammar_queue=[],
        policy=policy_mod.SchedulePolicy(sa.schedule_policy, world.tree_cache, False, False, False),
        max_prefill_tokens=sa.max_prefill_tokens, chunked_prefill_size=chunked, is_mixed_chunk=False,
        enable_priority_scheduling=False,
        priority_scheduling_preemption_threshold=sa.priority_scheduling_preemption_threshold, try_preemption=False,
        max_queued_requests=None, enable_lora=False, enable_hierarchical_cache=False, enable_hicache_storage=False,
        disaggregation_mode=disagg.NULL, truncation_align_size=None, enable_overlap=overlap,
        max_running_requests=max_running, device="cpu", default_stream=torch.cpu.current_stream(),
        spec_algorithm=world.spec_algorithm, is_generation=True, is_hybrid=False, pp_size=1,
        model_worker=fake, tp_worker=fake, forward_ct=0, forward_ct_decode=0, num_generated_tokens=0,
        forward_sleep_time=None, decode_mem_cache_buf_multiplier=1, enable_metrics=False,
        enable_metrics_for_all_schedulers=False, attn_tp_rank=0, return_health_check_ct=0, enable_trace=False,
        enable_kv_cache_events=False, num_retracted_reqs=0,
    )
    init = min(global_config.default_init_new_token_ratio * sa.schedule_conservativeness, 1.0)
    floor = min(init * global_config.default_min_new_token_ratio_factor, 1.0)
    s.update(init_new_token_ratio=init, min_new_token_ratio=floor, new_token_ratio=init,
             new_token_ratio_decay=(init - floor) / global_config.default_new_token_ratio_decay_steps)
    # The shell's own bookkeeping.
    s.update(_kvp_arrivals=arrivals, _kvp_iteration=0, _kvp_records=[], _kvp_arrival={}, _kvp_done={},
             _kvp_finished_now=[], _kvp_t0=time.perf_counter(), _kvp_world=world, _kvp_fake=fake,
             _kvp_pass_open=False, _kvp_flights=deque(), _kvp_findings=[], _kvp_fault=fault, _kvp_loop=loop)
    shell.init_metrics(0, 0, None)
    if own_overlap:
        shell.init_overlap()  # SGLang's own: FutureMap, the batch record buffer, CPU streams (a no-op when off)
    return shell


@remote
def run_traffic(ctx: Context, config: dict[str, Any], arrivals: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """Play ``arrivals`` (per iteration, dicts with ``rid``, ``tokens``, ``max_new_tokens``) through
    the release's own ``event_loop_normal`` or ``event_loop_overlap`` under ``config`` (``loop``:
    "normal" (default) or "overlap"; ``schedule_policy``, ``page_size``, ``pool_rows``, ``kv_slots``,
    ``max_prefill_tokens``, ``chunked_prefill_size`` (None or -1: off), ``max_running_requests``,
    ``radix_cache``, ``schedule_conservativeness``: how much of each request's remaining output
    admission reserves, SGLang's ``--schedule-conservativeness``; ``fault``: tests of the oracle
    only, see ``FAULTS``). Returns ``iterations`` (per pass of the loop: the batch formed, the waiting
    queue after scheduling, the requests finished), ``outputs`` (each finished request's output ids),
    ``inflight_violations`` (the in-flight oracle's findings: ``kind`` "cell" with ``row``,
    ``columns``, ``old``, ``new``, or "row" with ``row`` and ``taken_by``; each with
    ``batch_iteration``, the request ``rid`` of that batch, ``detected`` (iteration and step) and
    ``class``: "live", "finished" or "retracted"), ``loop``, ``build_s`` and ``loop_s``."""
    t0 = time.perf_counter()
    shell = _build(ctx, config, arrivals)
    build_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    # SGLang's torch.compile'd helpers (the overlap loop's future-token resolution) run eagerly.
    with torch.compiler.set_stance("force_eager"):
        try:
            if shell._kvp_loop == "overlap":
                shell.event_loop_overlap()
            else:
                shell.event_loop_normal()
        except _EndOfTraffic:
            pass
    assert not shell._kvp_flights, "the loop ended with a batch still in flight"
    return {
        "loop": shell._kvp_loop,
        "iterations": shell._kvp_records,
        "outputs": shell._kvp_done,
        "inflight_violations": shell._kvp_findings,
        "build_s": round(build_s, 3),
        "loop_s": round(time.perf_counter() - t1, 3),
    }
