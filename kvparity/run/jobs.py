"""A sweep shared out over job processes: each builds the drive from the plan's spec, takes tasks
as it comes free, plays them with the sweep's ``play_tasks`` (handed over, so that this module needs
no import of the sweep), and sends its events back through a queue; a difference that ends the run
(a drive that stops at its first) stops every job."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from kvparity.engine import processes
from kvparity.engine.errors import RealSGLangError
from kvparity.judge.verdict import Example
from kvparity.run.drive import Drive, Task
from kvparity.run.events import SweepEvents
from kvparity.run.plan import SweepPlan, TaskOutcome

PlayTasks = Callable[[list[Task], SweepPlan, Drive, SweepEvents], list[TaskOutcome]]


def play_in_jobs(jobs: int, plan: SweepPlan, events: SweepEvents, play_tasks: PlayTasks) -> list[TaskOutcome]:
    """The plan's tasks, taken by ``jobs`` processes as they come free (tasks differ in cost; the
    longest first). The jobs' events come back through a queue and are handed to ``events`` here,
    in order. A difference that ends the run stops them all: the others stop between two scenarios,
    the tasks not started are cancelled."""
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
        futures: dict[Future, Task] = {}
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
        outcomes: list[TaskOutcome] = []
        with ProcessPoolExecutor(max_workers=jobs, mp_context=context, initializer=_job_init,
                                 initargs=(env, plan, messages, gpus, stop, claims, time.time() - events.elapsed(), play_tasks)) as pool:
            by_cost = sorted(plan.tasks, key=lambda task: -_COST_HINT.get(task.name, _COST_DEFAULT))
            futures.update({pool.submit(_job_task, task): task for task in by_cost})
            for future in as_completed(list(futures)):
                if not future.cancelled():
                    outcomes.append(future.result())
        done.set()
        reader.join()
    return outcomes


def _hand_on(message: tuple, events: SweepEvents, futures: dict) -> None:
    """One job's event, handed to the caller's ``events``; a difference that ends the run cancels
    the tasks not started."""
    kind, *payload = message
    if kind == "played":
        events.played()
    elif kind == "found":
        first, stop = payload
        if stop:
            for future in list(futures):
                future.cancel()  # a task already running stops at its next scenario (the stop event)
        events.found(first, stop=stop)
    elif kind == "shrinking":
        events.shrinking(*payload)


class _JobEvents:
    """A job's events, sent to the calling process; ``stop`` and the claims are shared by every job
    of the run (a Manager dict's ``setdefault`` is one call to its server: the first claim wins)."""

    def __init__(self, messages: Any, stop: Any, claims: Any, started: float) -> None:
        self.messages, self.stop, self.claims, self.started = messages, stop, claims, started
        self.finder = False  # this job's difference ended the run: it is not cancelled while it shrinks it
        self.reported = False  # this job handed over the run's first difference

    def played(self) -> None:
        self.messages.put(("played",))

    def found(self, first: Example, *, stop: bool) -> bool:
        was_first = not self.reported and self.claims.setdefault("first found", os.getpid()) == os.getpid()
        self.reported = self.reported or was_first
        if stop:
            self.stop.set()
            self.finder = was_first
        if was_first:
            self.messages.put(("found", first, stop))
        return was_first

    def shrinking(self, tried: int, smallest: Any) -> None:
        if self.finder:
            self.messages.put(("shrinking", tried, smallest))

    def cancelled(self) -> bool:
        return self.stop.is_set() and not self.finder

    def claim(self, key: str) -> bool:
        return self.claims.setdefault(key, os.getpid()) == os.getpid()

    def elapsed(self) -> float:
        return time.time() - self.started


# Seconds each task's default scenarios took in one process (CPU, Triton's interpreter,
# 2026-12-01): only the order parallel jobs take tasks in, never what they play.
_COST_HINT = {
    "logprobs": 25.1, "shared prefixes": 22.4, "free form": 20.4, "decode pressure": 19.0, "chunked rounds": 16.3,
    "retract and re-admit": 15.9, "long lengths": 10.5, "near out of memory": 8.1, "row reuse": 8.0,
    "free-page churn": 7.0,
}
_COST_DEFAULT = 30.0  # a task not measured yet goes first


# One process of a parallel run: its drive (made on first use, closed at exit) and the events it sends back.
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


def _job_init(env: dict[str, str], plan: SweepPlan, messages: Any, gpus: Any, stop: Any, claims: Any, started: float,
              play_tasks: PlayTasks) -> None:
    import atexit

    processes.adopt_env(env)
    gpu = gpus.get()
    if gpu:  # pinned before anything touches CUDA (torch starts it lazily)
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu
        _JOB["device"] = gpu
    from kvparity.kernels import runtime  # noqa: F401  (the device and Triton's mode, as in the parent)
    from kvparity.model import profiles

    profiles.load(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
    _JOB.update(plan=plan, drive=None, events=_JobEvents(messages, stop, claims, started), play_tasks=play_tasks)
    atexit.register(lambda: _JOB["drive"] is not None and _JOB["drive"].close())


def _job_task(task: Task) -> TaskOutcome:
    from kvparity.judge.verdict import Row

    if _JOB["events"].stop.is_set():  # another task ended the run while this one waited
        row = Row(task.name, task.key)
        row.cancelled = True
        return TaskOutcome(task, row)
    if _JOB["drive"] is None:
        _JOB["drive"] = _JOB["plan"].spec.build()
    try:
        outcome = _JOB["play_tasks"]([task], _JOB["plan"], _JOB["drive"], _JOB["events"])[0]
    except RealSGLangError:  # a worker that cannot start: every other job stops too
        _JOB["events"].stop.set()
        raise
    outcome.device = _JOB.get("device", "")
    return outcome
