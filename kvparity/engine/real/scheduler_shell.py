"""SGLang's own ``Scheduler`` event loop on the CPU, only the model forward replaced (issue 26, a
first step; see ``../shared/sglang-scheduler-shell.md``).

``run_traffic`` (a worker-side ``@remote`` function) builds the release's ``Scheduler`` without its
heavy ``__init__`` (``__new__`` on a small subclass, the attributes its loop reads set here), on a
real world of the release (``build_real_world``: pools, allocator, radix cache), and runs the
release's own ``event_loop_normal``. Requests arriving at an iteration go through the release's own
``init_req_max_new_tokens`` and ``_add_request_to_queue``; ``get_next_batch_to_run``,
``get_new_batch_prefill``, ``update_running_batch``, ``run_batch``, ``process_batch_result``,
``SchedulePolicy``, ``PrefillAdder``, ``ScheduleBatch`` and the caches are SGLang's own. Replaced:
the model forward (a deterministic next token from the request's arrival index and its sequence
length), and, off the KV path, logging, the profiler, output streaming (finished requests are
recorded instead), and the idle sleeper (``self_check_during_idle`` keeps SGLang's own leak check
``check_memory`` and the ``new_token_ratio`` reset). Metrics are SGLang's own, disabled. The loop ends, by a private exception raised in
``recv_requests``, once the arrivals are exhausted and nothing runs or waits.

Tested for the 0.5.3 family (0.5.3, 0.5.3.post1); later releases need their own attributes.
"""

from __future__ import annotations

import importlib
import time
from types import SimpleNamespace
from typing import Any

import torch

from kvparity.engine.real.adapter import VOCAB_SIZE, build_real_world
from kvparity.engine.real.standins import StandIn
from kvparity.engine.real.standins import install as install_standins
from kvparity.engine.real.worker import Context, remote

# Extra stand-ins for the scheduler's import chain (wider than the KV path's).
SCHEDULER_STANDINS: dict[str, StandIn] = {
    "setproctitle": StandIn("srt/managers/scheduler.py: the process title of the scheduler process", True),
    "einops": StandIn("srt/layers (via the scheduler's model-executor imports): tensor rearranging in model code", True),
    "sglang.srt.managers.tp_worker": StandIn(
        "srt/managers/scheduler.py: the TP model worker (model runner, CUDA graphs); its chain decorates Triton LoRA "
        "kernels with a helper that needs compiled JITFunctions, which TRITON_INTERPRET=1 does not give", False),
    "sglang.srt.managers.tp_worker_overlap_thread": StandIn(
        "srt/managers/scheduler.py (0.5.3): the overlap loop's TP worker thread (normal loop only here)", False),
}

_INSTALLED: list[Any] = []
MAX_ITERATIONS = 10_000


class _EndOfTraffic(Exception):
    """Raised in recv_requests to leave SGLang's endless event loop."""


def _scheduler_module() -> Any:
    if not _INSTALLED:
        _INSTALLED.append(install_standins(SCHEDULER_STANDINS))
    return importlib.import_module("sglang.srt.managers.scheduler")


def _next_token(arrival_index: int, seq_len: int) -> int:
    """The deterministic forward: a token in [10, VOCAB_SIZE) from the request and its length."""
    return 10 + (arrival_index * 7919 + seq_len * 104729) % (VOCAB_SIZE - 10)


class _FakeModelWorker:
    """The model forward, replaced: one next token per request of the batch."""

    def __init__(self, shell: Any, mod: Any) -> None:
        self.shell = shell
        self.mod = mod
        # 0.5.3: run_batch wraps a ForwardBatchOutput; 0.5.3.post1: it takes a GenerationBatchResult.
        self.wraps = hasattr(mod.GenerationBatchResult, "from_forward_batch_output")
        self.worker = SimpleNamespace(model_runner=SimpleNamespace(is_hybrid_gdn=False, mambaish_config=None))
        self.reads: list[list[list[int]]] = []  # per forward: each request's req_to_token[row, :seq_len]

    def forward_batch_generation(self, model_worker_batch: Any) -> Any:
        reqs = self.shell.cur_batch.reqs
        seq_lens = model_worker_batch.seq_lens.tolist()
        rows = model_worker_batch.req_pool_indices.tolist()
        assert len(reqs) == len(seq_lens), "the model worker batch and the scheduled batch differ in size"
        pool = self.shell.req_to_token_pool.req_to_token
        self.reads.append([pool[row, :n].tolist() for row, n in zip(rows, seq_lens)])
        ids = torch.tensor([_next_token(self.shell._kvp_arrival[r.rid], n) for r, n in zip(reqs, seq_lens)],
                           dtype=torch.int64)
        if self.wraps:
            fbo = importlib.import_module("sglang.srt.model_executor.forward_batch_info").ForwardBatchOutput
            return fbo(logits_output=None, next_token_ids=ids, can_run_cuda_graph=False)
        return self.mod.GenerationBatchResult(logits_output=None, next_token_ids=ids, can_run_cuda_graph=False)


def _shell_class(mod: Any) -> Any:
    class SchedulerShell(mod.Scheduler):
        """SGLang's Scheduler: arrivals from a list, records per iteration, stubs off the KV path."""

        # ---- arrivals (SGLang's own init_req_max_new_tokens and _add_request_to_queue)
        def recv_requests(self) -> list[Any]:
            i = self._kvp_iteration
            idle = (not self.waiting_queue and self.chunked_req is None and self.last_batch is None
                    and self.running_batch.is_empty())
            if i >= len(self._kvp_arrivals) and idle:
                raise _EndOfTraffic
            if i >= MAX_ITERATIONS:
                raise RuntimeError(f"run_traffic: still busy after {MAX_ITERATIONS} iterations")
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

        # ---- observation only: SGLang's own batch formation, then a record of it
        def get_next_batch_to_run(self) -> Any:
            self.num_retracted_reqs = 0  # update_running_batch sets it when it retracts
            batch = super().get_next_batch_to_run()
            rec: dict[str, Any] = {"iteration": self._kvp_iteration, "mode": None, "rids": [],
                                   "prefix_lens": [], "extend_lens": [], "seq_lens": [], "chunked": None,
                                   "retracted": self.num_retracted_reqs}
            if batch is not None:
                rec["mode"] = batch.forward_mode.name
                rec["rids"] = [r.rid for r in batch.reqs]
                rec["seq_lens"] = [int(x) for x in batch.seq_lens.tolist()]
                if batch.forward_mode.is_extend():
                    rec["prefix_lens"] = [int(x) for x in batch.prefix_lens]
                    rec["extend_lens"] = [int(x) for x in batch.extend_lens]
                    # Only an extend batch's: a decode batch merged from a chunked prefill keeps a
                    # stale chunked_req that SGLang no longer reads.
                    rec["chunked"] = batch.chunked_req.rid if batch.chunked_req is not None else None
            rec["waiting"] = [r.rid for r in self.waiting_queue]
            self._kvp_records.append(rec)
            return batch

        def process_batch_result(self, batch: Any, result: Any, *args: Any) -> None:
            super().process_batch_result(batch, result, *args)
            self._kvp_end_iteration()

        def self_check_during_idle(self) -> None:
            # SGLang's own checks (check_memory raises on a KV or row leak) and the one KV-path
            # effect: the ratio reset; the idle sleeper is left out.
            self.check_memory()
            self.check_tree_cache()
            self.new_token_ratio = self.init_new_token_ratio
            self._kvp_end_iteration()

        def _kvp_end_iteration(self) -> None:
            rec = self._kvp_records[-1]
            rec["finished"] = sorted(self._kvp_finished_now)
            rec["ms"] = round((time.perf_counter() - self._kvp_t0) * 1000, 3)
            self._kvp_finished_now.clear()
            self._kvp_iteration += 1

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
                        ("max_running_requests", max_running), ("disable_overlap_schedule", True),
                        ("schedule_conservativeness", float(config.get("schedule_conservativeness", 1.0)))):
        setattr(sa, name, value)
    world.activate()
    # What Scheduler.__init__ writes into the globals: the micro-batch size (renamed in 0.5.3.post1).
    key = "pp_max_micro_batch_size" if "pp_max_micro_batch_size" in sb.global_server_args_dict else "max_micro_batch_size"
    sb.global_server_args_dict[key] = max_running

    cls = _shell_class(mod)
    shell = cls.__new__(cls)
    s = shell.__dict__
    fake = _FakeModelWorker(shell, mod)
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
        disaggregation_mode=disagg.NULL, truncation_align_size=None, enable_overlap=False,
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
             _kvp_finished_now=[], _kvp_t0=time.perf_counter(), _kvp_world=world, _kvp_fake=fake)
    shell.init_metrics(0, 0, None)
    return shell


@remote
def run_traffic(ctx: Context, config: dict[str, Any], arrivals: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """Play ``arrivals`` (per iteration, dicts with ``rid``, ``tokens``, ``max_new_tokens``) through
    the release's own ``event_loop_normal`` under ``config`` (``schedule_policy``, ``page_size``,
    ``pool_rows``, ``kv_slots``, ``max_prefill_tokens``, ``chunked_prefill_size`` (None or -1: off),
    ``max_running_requests``, ``radix_cache``, ``schedule_conservativeness``: how much of each
    request's remaining output admission reserves, SGLang's ``--schedule-conservativeness``). Returns ``iterations`` (per iteration: the batch
    formed, the waiting queue after scheduling, the requests finished), ``outputs`` (each finished
    request's output ids), ``build_s`` and ``loop_s``."""
    t0 = time.perf_counter()
    shell = _build(ctx, config, arrivals)
    build_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    try:
        shell.event_loop_normal()
    except _EndOfTraffic:
        pass
    return {
        "iterations": shell._kvp_records,
        "outputs": shell._kvp_done,
        "build_s": round(build_s, 3),
        "loop_s": round(time.perf_counter() - t1, 3),
    }
