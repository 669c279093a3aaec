"""A sweep shared out over job processes: each takes (template, shard) tasks as it comes free,
plays them with the sweep's ``play_templates`` (handed over, so that this module needs no import of
the sweep), and sends its events back through a queue; a failure in any job stops them all."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from kvparity.engine import processes
from kvparity.engine.real import RealSGLangError
from kvparity.model.scenario import Scenario
from kvparity.model.strategies import TEMPLATES
from kvparity.run.events import FirstFailure, SweepEvents
from kvparity.run.plan import TemplateOutcome, TemplatePlan

PlayTemplates = Callable[[list[tuple[int, int]], TemplatePlan, Any, SweepEvents], list[TemplateOutcome]]


def play_in_jobs(jobs: int, plan: TemplatePlan, lane_factory: Callable[[], Any] | None, events: SweepEvents,
                 play_templates: PlayTemplates) -> list[TemplateOutcome]:
    """The (template, shard) tasks, taken by ``jobs`` spawned processes as they come free
    (templates differ in cost). The jobs' events come back through a queue and are handed to
    ``events`` here, in order. A failure in any job stops them all: the others stop between two
    scenarios, the tasks not started are cancelled."""
    import threading
    from concurrent.futures import Future, ProcessPoolExecutor, as_completed

    context = processes.context()
    env = processes.passed_env()
    with context.Manager() as manager:
        messages = manager.Queue()
        gpus = manager.Queue()  # each job takes one: the visible GPUs round-robin
        stop, claims = manager.Event(), manager.dict()
        visible = visible_gpus()
        for i in range(jobs):
            gpus.put(visible[i % len(visible)] if visible else "")
        futures: dict[Future, tuple[int, int]] = {}
        done = threading.Event()

        def drain() -> None:
            while not done.is_set() or not messages.empty():
                try:
                    message = messages.get(timeout=0.2)
                except Exception:  # queue.Empty, or the manager going away at the end
                    continue
                _hand_on(message, events, futures)

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        outcomes: list[TemplateOutcome] = []
        with ProcessPoolExecutor(max_workers=jobs, mp_context=context, initializer=_job_init,
                                 initargs=(env, lane_factory, messages, gpus, stop, claims, play_templates)) as pool:
            # Longest first, so that no long task starts last while the other jobs idle.
            by_cost = sorted(plan.tasks(), key=lambda task: -_COST_HINT.get(TEMPLATES[task[0]].name, _COST_DEFAULT))
            futures.update({pool.submit(_job_template, task, plan): task for task in by_cost})
            for future in as_completed(list(futures)):
                if not future.cancelled():
                    outcomes.append(future.result())
        done.set()
        reader.join()
    return outcomes


def _hand_on(message: tuple, events: SweepEvents, futures: dict) -> None:
    """One job's event, handed to the caller's ``events``; a failure cancels the tasks not started."""
    kind, *payload = message
    if kind == "played":
        events.played()
    elif kind == "found":
        for future in list(futures):
            future.cancel()  # a task already running stops at its next scenario (the stop event)
        events.found(*payload)
    elif kind == "shrinking":
        events.shrinking(*payload)


class _JobEvents:
    """A job's events, sent to the calling process; ``stop`` is shared by every job of the run."""

    def __init__(self, messages: Any, stop: Any, claims: Any) -> None:
        self.messages, self.stop, self.claims = messages, stop, claims
        self.finder = False  # this job found the failure: it is not cancelled while it shrinks it

    def played(self) -> None:
        self.messages.put(("played",))

    def found(self, first: FirstFailure) -> None:
        already = self.stop.is_set()
        self.stop.set()
        self.finder = not already
        if self.finder:
            self.messages.put(("found", first))

    def shrinking(self, tried: int, smallest: Scenario) -> None:
        if self.finder:
            self.messages.put(("shrinking", tried, smallest))

    def cancelled(self) -> bool:
        return self.stop.is_set() and not self.finder

    def claim(self, defect: str) -> bool:
        return self.claims.setdefault(defect, os.getpid()) == os.getpid()


# Seconds each template's 80 default scenarios took in one process (CPU, Triton's interpreter,
# 2026-12-01): only the order parallel jobs take tasks in, never what they play.
_COST_HINT = {
    "logprobs": 25.1, "shared prefixes": 22.4, "free form": 20.4, "decode pressure": 19.0, "chunked rounds": 16.3,
    "retract and re-admit": 15.9, "long lengths": 10.5, "near out of memory": 8.1, "row reuse": 8.0,
    "free-page churn": 7.0,
}
_COST_DEFAULT = 30.0  # a template not measured yet goes first


# One process of a parallel run: its real-SGLang lane (made on first use, closed at exit) and the
# events it sends back.
_JOB: dict[str, Any] = {}


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES names them (none on a CPU run)."""
    from kvparity.kernels import runtime

    if runtime.DEVICE.type != "cuda":
        return []
    import torch

    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    names = [n.strip() for n in listed.split(",") if n.strip()] if listed else []
    return names or [str(i) for i in range(torch.cuda.device_count())]


def _job_init(env: dict[str, str], lane_factory: Callable[[], Any] | None, messages: Any, gpus: Any, stop: Any,
              claims: Any, play_templates: PlayTemplates) -> None:
    import atexit

    processes.adopt_env(env)
    gpu = gpus.get()
    if gpu:  # pinned before anything touches CUDA (torch starts it lazily)
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu
        _JOB["device"] = gpu
    from kvparity.kernels import runtime  # noqa: F401  (the device and Triton's mode, as in the parent)
    from kvparity.model import profiles

    profiles.load(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
    _JOB.update(lane_factory=lane_factory, lane=None, events=_JobEvents(messages, stop, claims),
                play_templates=play_templates)
    atexit.register(lambda: _JOB["lane"] is not None and _JOB["lane"].close())


def _job_template(task: tuple[int, int], plan: TemplatePlan) -> TemplateOutcome:
    if _JOB["events"].stop.is_set():  # another task failed while this one waited
        return TemplateOutcome(*task, cancelled=True)
    if _JOB["lane"] is None and _JOB["lane_factory"] is not None:
        _JOB["lane"] = _JOB["lane_factory"]()
    try:
        outcome = _JOB["play_templates"]([task], plan, _JOB["lane"], _JOB["events"])[0]
    except RealSGLangError:  # a worker that cannot start: every other job stops too
        _JOB["events"].stop.set()
        raise
    outcome.device = _JOB.get("device", "")
    return outcome
