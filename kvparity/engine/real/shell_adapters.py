"""What differs between SGLang's scheduler generations, for the scheduler shell
(``kvparity.engine.real.scheduler_shell``): adapters behind one ``typing.Protocol``,
``ShellAdapter``.

An adapter decides the extra stand-ins on the scheduler's import chain, the world (the release's
``build_real_world`` generation, its default cache), the server arguments and how they are
published, the attributes the loop reads and which of SGLang's own initialisers are called, the
hooks (this generation's names for receiving a pass's requests and streaming output; stubs for the
idle sleeper, logging and the profiler), the forward's result type, the overlap loop's client, how
the loop is entered, and how a batch record and a request are read.

Six scheduler generations (``kvparity.engine.releases.SCHEDULER_GENERATIONS``: where the scheduler's
structure changed), and within them one adapter class per release that changed what the loop reads,
each a subclass of the one before it that says, in its docstring, only what changed, registered by
name (``SHELLS``). The release registry's rows name the adapter that first drives each release and
the generation it begins; ``adapter_for(entry)`` asks it. Nothing else branches on versions.

Collaborators the shell leaves out are small and raise on use: module stand-ins (``StandIn``), and
here ``Unused`` (an IPC socket, a communicator), ``GroupOfOne`` (a process group of this process:
its size and rank are read, its communicators are ``Unused``), ``_NoGrammars``, the model config's
stand-in (``ShellModelConfig``: a read of any other field raises).

Worker side only: SGLang is imported lazily, after the stand-ins.
"""

from __future__ import annotations

import dataclasses
import importlib
import threading
from array import array
from collections import deque
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, Protocol, TypeVar

import torch

from kvparity.engine.real import RealSGLangError
from kvparity.engine.real.adapter import ModelConfigStandIn, build_real_world, make_server_args
from kvparity.engine.real.standins import StandIn
from kvparity.engine.real.versions import VersionEntry
from kvparity.engine.releases import shell_of
from kvparity.engine.snapshot import full_allocator
from kvparity.model.cache_configs import CacheConfig


@dataclasses.dataclass(frozen=True)
class Knobs:
    """A traffic run's server configuration (``run_traffic``'s config, checked)."""

    loop: str
    schedule_policy: str
    page_size: int
    pool_rows: int
    max_context_len: int
    kv_slots: int
    max_prefill_tokens: int
    chunked_prefill_size: int | None
    max_running_requests: int
    radix_cache: bool
    schedule_conservativeness: float
    caches: tuple[CacheConfig, ...] = ()  # what the server holds beside full attention (``ServerConfig.caches``)
    tree_core: str | None = None  # the radix tree's core (None: the server's default)

    @property
    def overlap(self) -> bool:
        return self.loop == "overlap"

    def hybrid(self) -> dict[str, Any]:
        """The world options of the server's caches beside full attention and of a tree core (none
        for full attention on the default core)."""
        options: dict[str, Any] = {} if self.tree_core is None else {"tree_core": self.tree_core}
        return options | ({"caches": self.caches} if self.caches else {})

    def geometry(self) -> dict[str, Any]:
        return {"pool_rows": self.pool_rows, "max_context_len": self.max_context_len, "kv_slots": self.kv_slots,
                "page_size": self.page_size, "need_sort": False}


class ShellAdapter(Protocol):
    """One scheduler generation, as the shell drives it."""

    name: str  # the first release this adapter drives
    generation: str  # the scheduler generation (``SCHEDULER_GENERATIONS``) it belongs to

    def standins(self) -> dict[str, StandIn]:
        """Stand-ins this generation's scheduler import chain needs beyond the shell's own."""
        ...

    def build_world(self, entry: VersionEntry, knobs: Knobs) -> Any:
        """The release's real world (pools, allocator, the cache a server builds by default)."""
        ...

    def set_up(self, shell: Any, mod: Any, world: Any, knobs: Knobs) -> None:
        """Everything the loop reads, on the shell built with ``__new__``: attributes set here and
        SGLang's own small initialisers; ``shell._kvp_forward`` is the forward to wire in."""
        ...

    def run(self, shell: Any, knobs: Knobs) -> None:
        """Enter the scheduler's event loop (``event_loop_normal`` or ``event_loop_overlap`` as
        ``knobs.loop`` says; the shell checks which ran)."""
        ...

    def hooks(self) -> dict[str, Callable[..., Any]]:
        """Methods of the shell class under this generation's names (receiving a pass's requests,
        output streaming; stubs for the idle sleeper, logging and profiling)."""
        ...

    def new_req(self, shell: Any, spec: dict[str, Any]) -> Any:
        """A ``Req`` built as this release's ``handle_generate_request`` builds it."""
        ...

    def batch_of(self, planned: Any) -> Any:
        """The batch to run, from what ``get_next_batch_to_run`` returned (or None)."""
        ...

    def seq_lens(self, batch: Any) -> list[int]:
        """The batch's sequence lengths (the columns of each row its forward reads)."""
        ...

    def extend_lens(self, batch: Any) -> tuple[list[int], list[int]]:
        """An extend batch's prefix lengths and extend lengths, per request."""
        ...

    def req_row(self, req: Any) -> int | None:
        """The request's row of ``req_to_token`` (None: it holds none)."""
        ...

    def req_class(self, req: Any) -> str:
        """SGLang's own criterion for dropping a landed batch's token of the request:
        "retracted", "finished", else "live"."""
        ...

    def lands(self, batch: Any) -> bool:
        """Whether this ``process_batch_result`` is the landing of a launched batch (0.5.3's
        overlap loop also processes a dummy first batch)."""
        ...

    def new_token_ratio(self, shell: Any) -> float:
        """How much of the running requests' remaining outputs admission reserves now."""
        ...

    # ---- the steps ``build_world``, ``set_up`` and ``new_req`` are made of: what a later release's
    # adapter overrides (the protocol is the adapter's whole surface, so mypy checks every override).

    def server_fields(self, knobs: Knobs) -> dict[str, Any]:
        """The server arguments the traffic run is started with (SGLang's names)."""
        ...

    def server_args(self, world: Any, knobs: Knobs) -> Any:
        """The world's server arguments with ``server_fields`` set, as this generation publishes them."""
        ...

    def set_globals(self, shell: Any, knobs: Knobs) -> None:
        """What ``Scheduler.__init__`` writes into the globals."""
        ...

    def model_runner(self) -> Any:
        """The model runner's stand-in (the fields the loop reads)."""
        ...

    def model_config(self, world: Any, knobs: Knobs) -> Any:
        """The model config's stand-in (``ShellModelConfig``)."""
        ...

    def forward_result(self, ids: torch.Tensor) -> Any:
        """The forward's result, in this generation's type, for the next token ids ``ids``."""
        ...

    def model_worker(self, shell: Any, mod: Any, knobs: Knobs) -> Any:
        """The TP worker the loop calls (the overlap loop's client where it has one)."""
        ...

    def attributes(self, shell: Any, mod: Any, world: Any, knobs: Knobs, sa: Any) -> dict[str, Any]:
        """The attributes the loop reads that ``Scheduler.__init__`` sets inline."""
        ...

    def policy(self, sa: Any, world: Any) -> dict[str, Any]:
        """The schedule policy, as ``__init__`` builds it."""
        ...

    def token_ratio(self, sa: Any) -> dict[str, float]:
        """The new-token ratio's start, floor and decay, as ``__init__`` computes them."""
        ...

    def initialisers(self, shell: Any) -> None:
        """SGLang's own small initialisers of this generation."""
        ...

    def input_ids(self, tokens: list[int]) -> Any:
        """A prompt as this release's tokenizer hands ``Req`` its ``origin_input_ids``."""
        ...


# --------------------------------------------------------------------------- shared pieces


class ShellModelConfig(ModelConfigStandIn):
    """The world's model-config stand-in plus the fields the scheduler reads (any other read still
    raises, naming the field): the context length (0.5.6+: FutureMap's size, the request length
    check), the EOS token ids a request is built with, and (``fields``) what later releases ask: the
    model implementation a server resolves at load (0.5.10+, ``init_chunked_prefill``), the
    reasoning parser's end-of-thinking token(s) (0.5.11+, 0.5.17+; None without a parser) and
    start-of-thinking ids (0.5.23+)."""

    __slots__ = ("context_len", "hf_eos_token_id", "is_multimodal", "_resolved_model_impl", "_resolved_model_arch",
                 "think_end_id", "think_end_ids", "self_opened_think_start_ids")

    def __init__(self, vocab_size: int, context_len: int, **fields: Any) -> None:
        super().__init__(vocab_size)
        self.context_len = context_len
        self.hf_eos_token_id = None
        self.is_multimodal = False
        for name, value in fields.items():
            setattr(self, name, value)


def _logits_output() -> Any:
    """SGLang's own logits output, empty: no logprobs or hidden states are asked for (the loop
    reads only its None fields)."""
    return _module("sglang.srt.layers.logits_processor").LogitsProcessorOutput(next_token_logits=None)


def _module(name: str) -> Any:
    return importlib.import_module(name)


def _recv(shell: Any) -> list[Any]:
    return shell._kvp_recv()


def _stream_output(shell: Any, reqs: list[Any], *args: Any, **kwargs: Any) -> None:
    shell._kvp_stream(reqs, *args, **kwargs)


def _nothing(shell: Any, *args: Any, **kwargs: Any) -> None:
    return None


def _model_runner(**fields: Any) -> Any:
    """What the scheduler reads of the model runner: no hybrid (linear-attention, Mamba) model;
    ``fields``: what a generation reads beyond that."""
    return SimpleNamespace(is_hybrid_gdn=False, mambaish_config=None, **fields)


class _ModelWorker:
    """The TP worker the scheduler calls, its forward replaced (``result`` wraps the next ids in
    this generation's result type)."""

    def __init__(self, forward: Callable[[Any], torch.Tensor], result: Callable[[torch.Tensor], Any],
                 model_runner: Any) -> None:
        self.forward = forward
        self.result = result
        self.model_runner = model_runner
        self.worker = SimpleNamespace(model_runner=model_runner)

    def forward_batch_generation(self, model_worker_batch: Any, *args: Any, **kwargs: Any) -> Any:
        return self.result(self.forward(model_worker_batch))


class _NoGrammars:
    """SGLang's ``GrammarManager`` (0.5.8+) with no constrained-generation request ever queued
    (the shell's requests carry no grammar): only the loop's question is answered; anything else
    is an AttributeError."""

    def __init__(self) -> None:
        self.grammar_queue: tuple[Any, ...] = ()  # read by is_fully_idle (0.5.11+)

    def has_waiting_grammars(self) -> bool:
        return False

    def abort_requests(self, recv_req: Any) -> None:
        """An abort finds no grammar request to cancel (none is ever queued)."""

    def __len__(self) -> int:
        return 0


class UnusedError(RealSGLangError, AttributeError):
    """SGLang used a collaborator the shell left out (an AttributeError too, so that a mere
    ``getattr(obj, name, default)`` / ``hasattr`` probe reads as absent)."""


class Unused:
    """A collaborator the shell's configuration never uses (an IPC socket, a process group's
    communicator, ...): any attribute read or call raises, naming it."""

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "_name", name)

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        raise UnusedError(f"the scheduler shell's {self._name} was used (.{attr}): this run should not need it")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise UnusedError(f"the scheduler shell's {self._name} was called: this run should not need it")


class GroupOfOne:
    """A process group of this one process: its size and rank are read (one, rank 0); its
    communicators are ``Unused`` (nothing is ever exchanged with nobody)."""

    world_size = 1
    rank_in_group = 0
    first_rank = 0
    is_first_rank = True

    def __init__(self, name: str) -> None:
        self.name = name
        self.cpu_group = Unused(f"{name}'s CPU communicator")
        self.device_group = Unused(f"{name}'s device communicator")

    def __repr__(self) -> str:
        return f"<kvparity one-process {self.name}>"


class _Receiver:
    """SGLang's request receiver (0.5.13+), replaced: a pass's requests come from the arrivals."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell

    def recv_requests(self, *args: Any, **kwargs: Any) -> list[Any]:
        return self.shell._kvp_recv()


class _OutputSink:
    """SGLang's output streamer (0.5.13+), replaced: finished requests are recorded."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell

    def stream_output(self, reqs: list[Any], *args: Any, **kwargs: Any) -> None:
        self.shell._kvp_stream(reqs, *args, **kwargs)


def _single_process_state(cls: Any) -> Any:
    """SGLang's ``ParallelState`` of one process: every size 1, every rank 0 (the data-parallel
    rank None, as without DP)."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name.endswith("_size"):
            values[f.name] = 1
        elif f.name == "dp_rank":
            values[f.name] = None
        elif f.name.endswith("_rank") or f.name == "gpu_id":
            values[f.name] = 0
        else:
            raise RealSGLangError(f"ParallelState has a field {f.name!r} the scheduler shell does not know")
    return cls(**values)


class _FakeOverlapClient:
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

    def __init__(self, forward: Callable[[Any], torch.Tensor], max_running_requests: int) -> None:
        self.forward = forward
        self.worker = SimpleNamespace(model_runner=_model_runner())
        self.future_map = _module("sglang.srt.managers.overlap_utils").FutureMap(max_running_requests, "cpu")
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
        ids = self.forward(model_worker_batch)
        self.future_map.store_to_map(future_ct, bs, ids)
        if model_worker_batch.launch_done is not None:
            model_worker_batch.launch_done.set()
        self.outputs.append((_logits_output(), ids, False))
        fbo = _module("sglang.srt.model_executor.forward_batch_info").ForwardBatchOutput
        return fbo(next_token_ids=self.future_map.update_next_future(future_ct, bs), can_run_cuda_graph=False)

    def resolve_last_batch_result(self, launch_done: threading.Event | None = None) -> tuple[Any, list[int], bool]:
        if not self.outputs:
            raise RuntimeError("resolve_last_batch_result: no batch in flight (the real client would block forever)")
        logits_output, ids, can_run_cuda_graph = self.outputs.popleft()
        if launch_done is not None and not launch_done.is_set():
            raise RuntimeError("resolve_last_batch_result: the current batch was never launched")
        return logits_output, ids.tolist(), can_run_cuda_graph


# --------------------------------------------------------------------------- the generations

# The adapters by name, as the release registry's rows name them (``Release.shell``).
SHELLS: dict[str, Callable[[str, str], ShellAdapter]] = {}


_Adapter = TypeVar("_Adapter", bound=ShellAdapter)


def registered(cls: type[_Adapter]) -> type[_Adapter]:
    """Register an adapter class under its name (mypy checks it against ``ShellAdapter``)."""
    SHELLS[cls.__name__] = cls
    return cls


@registered
class Shell053:
    """0.5.3: ``Scheduler.__init__`` in one piece (53 attributes read by the loop, set here), only
    ``init_metrics`` split out; the overlap loop talks to a TP worker thread
    (``tp_worker_overlap_thread.TpModelWorkerClient``, faked); the forward returns a
    ``ForwardBatchOutput``, which ``run_batch`` wraps; the globals are schedule_batch's
    ``global_server_args_dict`` (``max_micro_batch_size``)."""

    def __init__(self, name: str, generation: str) -> None:
        # The first release it drives and its scheduler generation, as the release registry says.
        self.name, self.generation = name, generation

    def standins(self) -> dict[str, StandIn]:
        return {"sglang.srt.managers.tp_worker_overlap_thread": StandIn(
            "srt/managers/scheduler.py (0.5.3): the overlap loop's TP worker thread (TpModelWorkerClient; the "
            "0.5.3 adapter's _FakeOverlapClient takes its place)", False)}

    # ---- the world and the server arguments

    def build_world(self, entry: VersionEntry, knobs: Knobs) -> Any:
        return build_real_world(entry, "torch", knobs.geometry(), "radix" if knobs.radix_cache else "chunk", "cpu",
                                **knobs.hybrid())

    def server_fields(self, knobs: Knobs) -> dict[str, Any]:
        """The server arguments the traffic run is started with (SGLang's names)."""
        return {"schedule_policy": knobs.schedule_policy, "max_prefill_tokens": knobs.max_prefill_tokens,
                "chunked_prefill_size": knobs.chunked_prefill_size or -1,
                "max_running_requests": knobs.max_running_requests, "disable_overlap_schedule": not knobs.overlap,
                "schedule_conservativeness": knobs.schedule_conservativeness}

    def server_args(self, world: Any, knobs: Knobs) -> Any:
        sa = world.server_args
        for name, value in self.server_fields(knobs).items():
            setattr(sa, name, value)
        world.activate()
        return sa

    def set_globals(self, shell: Any, knobs: Knobs) -> None:
        """What ``Scheduler.__init__`` writes into the globals: the micro-batch size."""
        sb = _module("sglang.srt.managers.schedule_batch")
        sb.global_server_args_dict["max_micro_batch_size"] = knobs.max_running_requests

    # ---- the scheduler's attributes

    def model_runner(self) -> Any:
        return _model_runner()

    def model_config(self, world: Any, knobs: Knobs) -> Any:
        return ShellModelConfig(world.model_config.vocab_size, knobs.max_context_len)

    def forward_result(self, ids: torch.Tensor) -> Any:
        fbo = _module("sglang.srt.model_executor.forward_batch_info").ForwardBatchOutput
        return fbo(logits_output=_logits_output(), next_token_ids=ids, can_run_cuda_graph=False)

    def model_worker(self, shell: Any, mod: Any, knobs: Knobs) -> Any:
        if knobs.overlap:
            return _FakeOverlapClient(shell._kvp_forward, knobs.max_running_requests)
        return _ModelWorker(shell._kvp_forward, self.forward_result, self.model_runner())

    def attributes(self, shell: Any, mod: Any, world: Any, knobs: Knobs, sa: Any) -> dict[str, Any]:
        """The attributes the loop reads that ``Scheduler.__init__`` sets inline."""
        sb = _module("sglang.srt.managers.schedule_batch")
        disagg = _module("sglang.srt.disaggregation.utils").DisaggregationMode
        worker = self.model_worker(shell, mod, knobs)
        max_total = full_allocator(world.allocator).size  # a sliding-window model's: its full pool
        return dict(
            server_args=sa, model_config=self.model_config(world, knobs),
            page_size=knobs.page_size,
            req_to_token_pool=world.req_to_token_pool, token_to_kv_pool_allocator=world.allocator,
            tree_cache=world.tree_cache, max_total_num_tokens=max_total,
            max_req_len=min(knobs.max_context_len - 1, max_total - 1),
            waiting_queue=[], running_batch=sb.ScheduleBatch(reqs=[], batch_is_full=False), chunked_req=None,
            last_batch=None, cur_batch=None, grammar_queue=[], **self.policy(sa, world),
            max_prefill_tokens=sa.max_prefill_tokens, chunked_prefill_size=knobs.chunked_prefill_size,
            is_mixed_chunk=False, enable_priority_scheduling=False,
            priority_scheduling_preemption_threshold=sa.priority_scheduling_preemption_threshold, try_preemption=False,
            max_queued_requests=None, enable_lora=False,
            enable_hierarchical_cache=getattr(world, "host", None) is not None,
            enable_hicache_storage=getattr(getattr(world, "host", None), "storage", False),
            disaggregation_mode=disagg.NULL, truncation_align_size=None, enable_overlap=knobs.overlap,
            max_running_requests=knobs.max_running_requests, device="cpu", default_stream=torch.cpu.current_stream(),
            spec_algorithm=world.spec_algorithm, is_generation=True, is_hybrid=world.window is not None, pp_size=1,
            model_worker=worker, tp_worker=worker, forward_ct=0, forward_ct_decode=0, num_generated_tokens=0,
            forward_sleep_time=None, decode_mem_cache_buf_multiplier=1, enable_metrics=False,
            enable_metrics_for_all_schedulers=False, attn_tp_rank=0, return_health_check_ct=0, enable_trace=False,
            enable_kv_cache_events=False, num_retracted_reqs=0, **_window_attributes(world),
        )

    def policy(self, sa: Any, world: Any) -> dict[str, Any]:
        """The schedule policy, as ``__init__`` builds it (no hierarchical cache, no priorities)."""
        policy = _module("sglang.srt.managers.schedule_policy").SchedulePolicy
        return {"policy": policy(sa.schedule_policy, world.tree_cache, False, False, False)}

    def token_ratio(self, sa: Any) -> dict[str, float]:
        global_config = _module("sglang.global_config").global_config
        init = min(global_config.default_init_new_token_ratio * sa.schedule_conservativeness, 1.0)
        floor = min(init * global_config.default_min_new_token_ratio_factor, 1.0)
        return dict(init_new_token_ratio=init, min_new_token_ratio=floor, new_token_ratio=init,
                    new_token_ratio_decay=(init - floor) / global_config.default_new_token_ratio_decay_steps)

    def initialisers(self, shell: Any) -> None:
        """SGLang's own small initialisers of this generation."""
        shell.init_metrics(0, 0, None)

    def set_up(self, shell: Any, mod: Any, world: Any, knobs: Knobs) -> None:
        sa = self.server_args(world, knobs)
        self.set_globals(shell, knobs)
        shell.__dict__.update(self.attributes(shell, mod, world, knobs, sa))
        shell.__dict__.update(self.token_ratio(sa))
        self.initialisers(shell)

    # ---- the loop, hooks, requests, batches

    def run(self, shell: Any, knobs: Knobs) -> None:
        if knobs.overlap:
            shell.event_loop_overlap()
        else:
            shell.event_loop_normal()

    def hooks(self) -> dict[str, Callable[..., Any]]:
        return {"recv_requests": _recv, "stream_output": _stream_output, "maybe_sleep_on_idle": _nothing,
                "_profile_batch_predicate": _nothing, "log_prefill_stats": _nothing, "log_decode_stats": _nothing}

    def input_ids(self, tokens: list[int]) -> Any:
        return list(tokens)

    def new_req(self, shell: Any, spec: dict[str, Any]) -> Any:
        vocab_size = shell.model_config.vocab_size
        params = _module("sglang.srt.sampling.sampling_params").SamplingParams(
            max_new_tokens=int(spec.get("max_new_tokens", 16)))
        params.normalize(None)
        params.verify(vocab_size)
        req = _module("sglang.srt.managers.schedule_batch").Req(
            spec["rid"], "", self.input_ids([int(t) for t in spec["tokens"]]), params, vocab_size=vocab_size)
        req.tokenizer = None
        n = len(req.origin_input_ids)
        req.logprob_start_len = n if req.is_prefill_only else n - 1
        return req

    def batch_of(self, planned: Any) -> Any:
        return planned

    def seq_lens(self, batch: Any) -> list[int]:
        return [int(x) for x in batch.seq_lens.tolist()]

    def extend_lens(self, batch: Any) -> tuple[list[int], list[int]]:
        return [int(x) for x in batch.prefix_lens], [int(x) for x in batch.extend_lens]

    def req_row(self, req: Any) -> int | None:
        return req.req_pool_idx

    def req_class(self, req: Any) -> str:
        return "retracted" if req.is_retracted else "finished" if req.finished() else "live"

    def lands(self, batch: Any) -> bool:
        return not batch.forward_mode.is_dummy_first()

    def new_token_ratio(self, shell: Any) -> float:
        return float(shell.new_token_ratio)


def _window_attributes(world: Any) -> dict[str, Any]:
    """What ``Scheduler.__init__`` reads of the model's windows from the worker: the window, and
    each pool's tokens per layer (a full-attention model: no window, the one pool)."""
    window = world.window
    return dict(sliding_window_size=None if window is None else window.size,
                full_tokens_per_layer=full_allocator(world.allocator).size,
                swa_tokens_per_layer=None if window is None else window.slots)


@registered
class Shell053Post1(Shell053):
    """0.5.3.post1: the overlap lives in the scheduler (SGLang's own ``init_overlap``: FutureMap,
    CPU streams, the batch record buffer) and calls the plain worker; the forward returns a
    ``GenerationBatchResult``; the global ``max_micro_batch_size`` became ``pp_max_micro_batch_size``."""

    def standins(self) -> dict[str, StandIn]:
        return {}

    def set_globals(self, shell: Any, knobs: Knobs) -> None:
        sb = _module("sglang.srt.managers.schedule_batch")
        sb.global_server_args_dict["pp_max_micro_batch_size"] = knobs.max_running_requests

    def forward_result(self, ids: torch.Tensor) -> Any:
        result = _module("sglang.srt.managers.scheduler").GenerationBatchResult
        return result(logits_output=_logits_output(), next_token_ids=ids, can_run_cuda_graph=False)

    def model_worker(self, shell: Any, mod: Any, knobs: Knobs) -> Any:
        return _ModelWorker(shell._kvp_forward, self.forward_result, self.model_runner())

    def initialisers(self, shell: Any) -> None:
        shell.init_metrics(0, 0, None)
        shell.init_overlap()  # SGLang's own: FutureMap, the batch record buffer, CPU streams (a no-op when off)

    def lands(self, batch: Any) -> bool:
        return True


@registered
class Shell053Post2(Shell053Post1):
    """0.5.3.post2: the globals are a ServerArgs (``get_global_server_args()``, set by the world),
    so the micro-batch size is a field of it; ``speculative.eagle_info`` imports the model runner,
    whose LoRA chain decorates Triton kernels with a helper that needs compiled JITFunctions."""

    def standins(self) -> dict[str, StandIn]:
        return {"sglang.srt.lora.triton_ops": StandIn(
            "srt/lora/backend (0.5.3.post2+, via speculative.eagle_info -> model_executor.model_runner): Triton LoRA "
            "kernels decorated with cached_triton_kernel, which asserts a compiled JITFunction (TRITON_INTERPRET=1 "
            "gives none); LoRA is off here", False)}

    def server_fields(self, knobs: Knobs) -> dict[str, Any]:
        return dict(super().server_fields(knobs), pp_max_micro_batch_size=knobs.max_running_requests)

    def set_globals(self, shell: Any, knobs: Knobs) -> None:
        pass

    def attributes(self, shell: Any, mod: Any, world: Any, knobs: Knobs, sa: Any) -> dict[str, Any]:
        return dict(super().attributes(shell, mod, world, knobs, sa), is_hybrid_gdn=world.mamba is not None)

    def token_ratio(self, sa: Any) -> dict[str, float]:
        """The same formula, its constants read from ``sglang.srt.environ.envs``."""
        envs = _module("sglang.srt.environ").envs
        init = min(envs.SGLANG_INIT_NEW_TOKEN_RATIO.get() * sa.schedule_conservativeness, 1.0)
        floor = min(init * envs.SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR.get(), 1.0)
        return dict(init_new_token_ratio=init, min_new_token_ratio=floor, new_token_ratio=init,
                    new_token_ratio_decay=(init - floor) / envs.SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS.get())


@registered
class Shell054Post2(Shell053Post2):
    """0.5.4.post2: the scheduler's mixins import PD-multiplexing (``multiplex/pdmux_context.py``),
    which imports ``yaml`` for its config file (multiplexing is off here)."""

    def standins(self) -> dict[str, StandIn]:
        return dict(super().standins(), yaml=StandIn(
            "srt/multiplex/pdmux_context.py (0.5.4.post2+, via the scheduler's multiplexing mixin): the "
            "PD-multiplexing config file (multiplexing is off here)", True))

    def attributes(self, shell: Any, mod: Any, world: Any, knobs: Knobs, sa: Any) -> dict[str, Any]:
        return dict(super().attributes(shell, mod, world, knobs, sa), enable_pdmux=False)


@registered
class Shell055Post1(Shell054Post2):
    """0.5.5.post1: the loop reads ``require_mlp_sync`` (DP attention's MLP sync; off)."""

    def attributes(self, shell: Any, mod: Any, world: Any, knobs: Knobs, sa: Any) -> dict[str, Any]:
        return dict(super().attributes(shell, mod, world, knobs, sa), require_mlp_sync=False)


@registered
class Shell056(Shell055Post1):
    """0.5.6: the loops read ``_engine_paused`` (pause/continue generation; never paused here);
    ``init_overlap`` sizes the FutureMap from ``model_config.context_len``; diffusion LLMs
    (``dllm_config``, None without one); ``is_hybrid`` became ``is_hybrid_swa``."""

    def attributes(self, shell: Any, mod: Any, world: Any, knobs: Knobs, sa: Any) -> dict[str, Any]:
        return dict(super().attributes(shell, mod, world, knobs, sa), _engine_paused=False, dllm_config=None,
                    is_hybrid_swa=world.window is not None)


@registered
class Shell056Post1(Shell056):
    """0.5.6.post1: the leak check reads ``is_ssm_model`` (state-space models' pools: a Mamba model's)."""

    def attributes(self, shell: Any, mod: Any, world: Any, knobs: Knobs, sa: Any) -> dict[str, Any]:
        return dict(super().attributes(shell, mod, world, knobs, sa), is_ssm_model=world.mamba is not None)


@registered
class Shell057(Shell056Post1):
    """0.5.7: ``__init__`` split into SGLang's own small initialisers, called here:
    ``init_running_status`` (queues, batches, counters), ``init_chunked_prefill``,
    ``init_schedule_policy`` (the policy, preemption, the new-token ratios), ``init_metrics`` and
    ``init_overlap`` (streams, and the FutureMap when on)."""

    def attributes(self, shell: Any, mod: Any, world: Any, knobs: Knobs, sa: Any) -> dict[str, Any]:
        return dict(super().attributes(shell, mod, world, knobs, sa), schedule_policy=sa.schedule_policy,
                    schedule_low_priority_values_first=False, dp_size=1, attn_tp_size=1, tp_size=1,
                    is_hybrid_ssm=world.mamba is not None)

    def policy(self, sa: Any, world: Any) -> dict[str, Any]:
        return {}  # init_schedule_policy's

    def token_ratio(self, sa: Any) -> dict[str, float]:
        return {}  # init_schedule_policy's

    def initialisers(self, shell: Any) -> None:
        shell.init_running_status()
        shell.init_chunked_prefill()
        shell.init_schedule_policy()
        shell.init_metrics(0, 0, None)
        shell.init_overlap()


@registered
class Shell058(Shell057):
    """0.5.8: grammars moved into a ``GrammarManager`` (``grammar_manager``; none queued here);
    SGLang's own ``init_diffusion_llm`` (the diffusion-LLM staging, empty without a dLLM config)."""

    def attributes(self, shell: Any, mod: Any, world: Any, knobs: Knobs, sa: Any) -> dict[str, Any]:
        return dict(super().attributes(shell, mod, world, knobs, sa), grammar_manager=_NoGrammars())

    def initialisers(self, shell: Any) -> None:
        super().initialisers(shell)
        shell.init_diffusion_llm()


@registered
class Shell059(Shell058):
    """0.5.9: the forward stream is the model runner's (``tp_worker.get_worker_info()``), set
    before ``init_overlap``: a CPU stream here."""

    def attributes(self, shell: Any, mod: Any, world: Any, knobs: Knobs, sa: Any) -> dict[str, Any]:
        return dict(super().attributes(shell, mod, world, knobs, sa), forward_stream=torch.cpu.Stream())


@registered
class Shell0510(Shell059):
    """0.5.10: ``init_chunked_prefill`` asks the model config for its resolved implementation
    (chunked prefill is off for a multimodal model on the Transformers backend): a native one; the
    loop reads ``enable_hisparse`` (off), ``disable_radix_cache`` and ``use_ngram_embedding`` (no);
    the loop is entered through ``run_event_loop``, which makes the schedule stream first."""

    def model_config(self, world: Any, knobs: Knobs, **fields: Any) -> Any:
        impl = _module("sglang.srt.configs.model_config").ModelImpl.SGLANG
        return ShellModelConfig(world.model_config.vocab_size, knobs.max_context_len, _resolved_model_impl=impl,
                                **fields)

    def attributes(self, shell: Any, mod: Any, world: Any, knobs: Knobs, sa: Any) -> dict[str, Any]:
        return dict(super().attributes(shell, mod, world, knobs, sa), enable_hisparse=False,
                    disable_radix_cache=not knobs.radix_cache, use_ngram_embedding=False)

    def run(self, shell: Any, knobs: Knobs) -> None:
        """SGLang's own ``run_event_loop``: it makes the schedule stream the loops wait on, then
        dispatches by the scheduler's flags (no disaggregation, no PD multiplexing, one pipeline
        stage: ``enable_overlap`` picks the loop)."""
        shell.run_event_loop()


@registered
class Shell0511(Shell0510):
    """0.5.11: the output processor reads the model config's ``think_end_id`` (None: no reasoning
    parser); the idle hook is ``on_idle``, which does its checks and the ratio reset only when
    ``is_fully_idle`` (reads ``enable_overlap_mlx``: off)."""

    def model_config(self, world: Any, knobs: Knobs, **fields: Any) -> Any:
        return super().model_config(world, knobs, think_end_id=None, **fields)

    def attributes(self, shell: Any, mod: Any, world: Any, knobs: Knobs, sa: Any) -> dict[str, Any]:
        return dict(super().attributes(shell, mod, world, knobs, sa), enable_overlap_mlx=False)


@registered
class Shell0513(Shell0511):
    """0.5.13: the scheduler is split into components (``scheduler_components``), built by
    SGLang's own initialisers (metrics reporter, profiler, weight updater, DP-attention adapter,
    pool-stats observer, invariant checker, KV-events publisher, load inquirer, batch-result
    processor) except the request receiver and the output streamer, the shell's; process groups
    and IPC channels are ``Unused``; ``ps`` is a one-process ``ParallelState``; the FutureMap is
    always on (it relays the input ids in both loops); requests carry ``array("q")`` input ids;
    ``uvicorn`` is on the import chain; the new-token ratio lives in a ``NewTokenRatioTracker``."""

    def new_token_ratio(self, shell: Any) -> float:
        return float(shell.new_token_ratio_tracker.current)

    def standins(self) -> dict[str, StandIn]:
        return dict(super().standins(), uvicorn=StandIn(
            "srt/disaggregation/encode_receiver.py (0.5.13+, imported by the scheduler): the HTTP server of the "
            "multimodal encoder disaggregation (off here)", True))

    def input_ids(self, tokens: list[int]) -> Any:
        return array("q", tokens)  # what the tokenizer hands a request from 0.5.13

    def model_runner(self) -> Any:
        # init_overlap asks the attention backend whether the FutureMap publishes CPU sequence
        # lengths: a torch-native backend keeps BaseAttnBackend's default (yes).
        return _model_runner(attn_backend=SimpleNamespace(needs_cpu_seq_lens=True))

    def parallel_state(self) -> dict[str, Any]:
        """The scheduler's ``ps`` (one process)."""
        return {"ps": _single_process_state(_module("sglang.srt.distributed.parallel_state_wrapper").ParallelState)}

    def attributes(self, shell: Any, mod: Any, world: Any, knobs: Knobs, sa: Any) -> dict[str, Any]:
        groups = {name: GroupOfOne(name) for name in (
            "tp_group", "tp_cpu_group", "attn_tp_group", "attn_tp_cpu_group", "attn_cp_group", "attn_cp_cpu_group",
            "dp_tp_group", "dp_tp_cpu_group", "pp_group", "world_group")}
        ipc = SimpleNamespace(**{name: Unused(f"ipc channel {name}") for name in (
            "recv_from_tokenizer", "recv_from_rpc", "send_to_tokenizer", "send_to_detokenizer",
            "send_metrics_from_scheduler")})
        memory_saver = _module("sglang.srt.utils.torch_memory_saver_adapter").TorchMemorySaverAdapter.create(enable=False)
        return dict(
            super().attributes(shell, mod, world, knobs, sa), **groups, **self.parallel_state(), ipc_channels=ipc,
            idle_sleeper=None, mm_receiver=None, disagg_prefill_bootstrap_queue=None,
            disagg_prefill_inflight_queue=None, disagg_decode_prealloc_queue=None, disagg_decode_transfer_queue=None,
            draft_worker=None, decode_offload_manager=None, hisparse_coordinator=None,
            **_window_attributes(world), scripted_scheduler_hook=None, rust_server=None,
            recv_skipper=None, input_blocker=None, memory_saver_adapter=memory_saver,
            request_receiver=_Receiver(shell), output_streamer=_OutputSink(shell), load_snapshot_writer=None)

    def metrics_reporter(self, shell: Any) -> None:
        """SGLang's metrics collector context and reporter, as ``__init__`` builds them (metrics off)."""
        mod = _module("sglang.srt.managers.scheduler")
        context = mod.SchedulerMetricsCollector.init_new(
            server_args=shell.server_args, ps=shell.ps, tp_rank=0, pp_rank=0, dp_rank=None,
            enable_priority_scheduling=False, enable_lora=False, enable_hierarchical_cache=False)
        shell.metrics_collector_context = context
        shell.metrics_collector = context.collector
        shell.metrics_reporter = mod.SchedulerMetricsReporter(
            scheduler=shell, tp_rank=0, pp_rank=0, dp_rank=None, metrics_collector_context=context,
            metrics_collector=context.collector)

    def initialisers(self, shell: Any) -> None:
        """SGLang's own, in ``__init__``'s order (the receiver and the output streamer are the shell's)."""
        shell.init_running_status()
        shell.init_chunked_prefill()
        shell.init_diffusion_llm()
        self.metrics_reporter(shell)
        for name in self.component_initialisers():
            getattr(shell, name)()

    def component_initialisers(self) -> list[str]:
        """The rest of ``__init__``'s initialisers the loop needs, in its order."""
        return ["init_schedule_policy", "init_profiler", "init_overlap", "init_weight_updater", "init_dp_attn_adapter",
                "init_pool_stats_observer", "init_invariant_checker", "init_kv_events_publisher", "init_load_inquirer",
                "init_batch_result_processor"]


@registered
class Shell0514(Shell0513):
    """0.5.14: the loops read ``gracefully_exit`` (a shutdown request breaks them; never here)."""

    def attributes(self, shell: Any, mod: Any, world: Any, knobs: Knobs, sa: Any) -> dict[str, Any]:
        return dict(super().attributes(shell, mod, world, knobs, sa), gracefully_exit=False)


@registered
class Shell0515(Shell0514):
    """0.5.15: admission may wait for free running slots (``min_free_slots_delayer``, built as the
    TP-worker init builds it: SGLang's own ``resolve_min_free_slots``; off by default); the
    prefill reads the model runner's ``prefill_aware_swa`` (no sliding window)."""

    def attributes(self, shell: Any, mod: Any, world: Any, knobs: Knobs, sa: Any) -> dict[str, Any]:
        slots = mod.resolve_min_free_slots(sa.min_free_slots_delay, knobs.max_running_requests)  # not DFlash
        delayer = None if slots is None else mod.MinFreeSlotsDelayer(min_free_slots=slots)
        return dict(super().attributes(shell, mod, world, knobs, sa), min_free_slots_delayer=delayer)

    def model_runner(self) -> Any:
        runner = super().model_runner()
        runner.prefill_aware_swa = False  # sliding-window attention's eviction floor (no SWA model)
        return runner


def _no_ngram_embedding() -> Any:
    """The model runner's ``NgramEmbeddingManager`` (0.5.16+) for a model without n-gram embeddings
    (what its ``from_model`` returns then)."""
    cls = _module("sglang.srt.model_executor.model_runner_components.ngram_embedding_manager").NgramEmbeddingManager
    off = {"enabled": False, "table": None, "n": 0, "k": 0}  # from_model's values without n-gram embeddings
    return cls(**{f.name: off[f.name] for f in dataclasses.fields(cls) if f.name in off})


@registered
class Shell0516(Shell0515):
    """0.5.16: ``get_next_batch_to_run(running_batch=, last_batch=)`` returns a ``NextBatchPlan``
    (the batch to run and the running batch, which the loop stores); the metrics collector and
    reporter have initialisers of their own; the request length limit is ``max_new_tokens_limit``
    (SGLang's environment default); the batch goes through the model runner's n-gram embedding
    manager (disabled)."""

    def attributes(self, shell: Any, mod: Any, world: Any, knobs: Knobs, sa: Any) -> dict[str, Any]:
        envs = _module("sglang.srt.environ").envs
        return dict(super().attributes(shell, mod, world, knobs, sa),
                    max_new_tokens_limit=envs.SGLANG_MAX_NEW_TOKENS_LIMIT.get(), enable_dp_attention=False,
                    enable_unified_memory=False, enable_decode_hicache=False,
                    ngram_embedding_manager=_no_ngram_embedding())

    def metrics_reporter(self, shell: Any) -> None:
        shell.init_metrics_collector(0, 0, None)
        shell.init_metrics_reporter(0, 0, None)

    def batch_of(self, planned: Any) -> Any:
        return planned.batch_to_run


@registered
class Shell0517(Shell0516):
    """0.5.17: the end-of-thinking marker became a token sequence, ``think_end_ids`` (None)."""

    def model_config(self, world: Any, knobs: Knobs, **fields: Any) -> Any:
        return super().model_config(world, knobs, think_end_ids=None, **fields)


def _record_fields(server_args: Any) -> list[str]:
    """The field names of a ServerArgs record (a dataclass up to 0.5.19, a msgspec Struct after)."""
    if dataclasses.is_dataclass(server_args):
        return [f.name for f in dataclasses.fields(server_args)]
    return list(type(server_args).__struct_fields__)


@registered
class Shell0519(Shell0517):
    """0.5.19: the server arguments are resolved once, when published, into config bags the
    scheduler reads (``get_schedule()``, ...); the record is read-only afterwards. So the run's
    arguments go into a fresh record (the world's raw fields plus the run's), which the world then
    publishes, as a server started with them would. The world's tree is a UnifiedRadixCache on the
    release's default core; a request's row is ``req.kv.req_pool_idx``; result processing publishes
    load statistics (SGLang's own ``init_load_publisher``)."""

    def server_args(self, world: Any, knobs: Knobs) -> Any:
        old = world.server_args
        fields = {name: getattr(old, name) for name in _record_fields(old)}
        sa = make_server_args(world.sg, **dict(fields, **self.server_fields(knobs)))
        world.server_args = sa
        world.activate()
        return sa

    def req_row(self, req: Any) -> int | None:
        return req.kv.req_pool_idx  # the request's KV info (ReqKvInfo) holds its row from 0.5.19

    def component_initialisers(self) -> list[str]:
        names = super().component_initialisers()
        return names[:names.index("init_load_inquirer")] + ["init_load_publisher"] + names[names.index("init_load_inquirer"):]


@registered
class Shell0520(Shell0519):
    """0.5.20: a pass starts with ``ingest_requests`` (SGLang's own: timeout aborts, then the
    receiver, then ``process_input_requests``); the stage metrics live on the metrics reporter and
    the scheduler keeps a reference; a dynamic chunk sizer may follow ``init_chunked_prefill``; the
    schedule stream is made with the model worker; new flags (session radix cache, external cache
    linker: off) and the HRRN policy's processed-token counter."""

    def initialisers(self, shell: Any) -> None:
        shell.init_running_status()
        shell.init_chunked_prefill()
        shell.maybe_init_dynamic_chunk_sizer()
        shell.init_diffusion_llm()
        self.metrics_reporter(shell)
        for name in self.component_initialisers():
            getattr(shell, name)()

    def metrics_reporter(self, shell: Any) -> None:
        super().metrics_reporter(shell)
        shell.scheduler_stage_metrics = shell.metrics_reporter.scheduler_stage_metrics

    def attributes(self, shell: Any, mod: Any, world: Any, knobs: Knobs, sa: Any) -> dict[str, Any]:
        # The schedule stream is made with the model worker now (run_event_loop only checks it).
        return dict(super().attributes(shell, mod, world, knobs, sa),
                    schedule_stream=torch.get_device_module("cpu").Stream(priority=0), processed_tokens_counter=0,
                    enable_session_radix_cache=False, enable_unified_cache_external_linker=False)


@registered
class Shell0521(Shell0520):
    """0.5.21: the parallel ranks live in SGLang's runtime context (``get_parallel()``), no
    ``ParallelState`` any more: the shell publishes the run's server arguments with the launcher's
    rank bundle of a single process (``SpawnRanks``: world rank 0, no DP, no device); the metrics
    initialisers take no ranks; the world's tree core is Rust (the release's default); admission
    asks ``enable_lmcache`` (off)."""

    def server_args(self, world: Any, knobs: Knobs) -> Any:
        sa = super().server_args(world, knobs)
        rc = _module("sglang.srt.runtime_context")
        rc.publish(sa, role="scheduler", ranks=rc.SpawnRanks(world_rank=0, dp_rank=None, gpu_id=None))
        return sa

    def parallel_state(self) -> dict[str, Any]:
        return {}

    def attributes(self, shell: Any, mod: Any, world: Any, knobs: Knobs, sa: Any) -> dict[str, Any]:
        return dict(super().attributes(shell, mod, world, knobs, sa), enable_lmcache=False)

    def metrics_reporter(self, shell: Any) -> None:
        shell.init_metrics_collector()
        shell.init_metrics_reporter()
        shell.scheduler_stage_metrics = shell.metrics_reporter.scheduler_stage_metrics


@registered
class Shell0522(Shell0521):
    """0.5.22: the "prefix_len" state model (``build_real_world`` builds it: UnifiedRadixCache on
    the Rust core, no ChunkCache); the process groups live in the runtime context too: the shell
    states one-process groups there (``get_parallel().override_permanently``); ``attn_dp_enabled``
    (no DP attention)."""


    GROUPS = ("world_group", "tp_group", "pp_group", "moe_ep_group", "moe_dp_group", "moe_tp_group", "attn_tp_group",
              "attn_cp_group")

    def server_args(self, world: Any, knobs: Knobs) -> Any:
        sa = super().server_args(world, knobs)
        parallel = _module("sglang.srt.runtime_context").get_parallel()
        parallel.override_permanently(**{name: GroupOfOne(name) for name in self.GROUPS})
        return sa

    def attributes(self, shell: Any, mod: Any, world: Any, knobs: Knobs, sa: Any) -> dict[str, Any]:
        return dict(super().attributes(shell, mod, world, knobs, sa), attn_dp_enabled=False)


@registered
class Shell0523(Shell0522):
    """0.5.23: the output processor reads the reasoning parser's self-opened start-of-thinking ids
    (``self_opened_think_start_ids``, None without a parser)."""

    def model_config(self, world: Any, knobs: Knobs, **fields: Any) -> Any:
        return super().model_config(world, knobs, self_opened_think_start_ids=None, **fields)


# --------------------------------------------------------------------------- choosing one


def adapter_for(entry: VersionEntry) -> ShellAdapter:
    """The adapter the release registry names for ``entry``'s release (``kvparity.engine.releases``:
    the newest row at or before it that names one)."""
    name, first, generation = shell_of(entry.version)
    return SHELLS[name](first, generation)
