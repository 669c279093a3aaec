"""Real SGLang worlds in the kvparity process: one worker process per SGLang (``RealWorker``), each
playing whole scenarios with kvparity's scheduler loop (``kvparity.engine.real.play``) and sending back
every stage's snapshot as plain data. Nothing here imports sglang.

A world that dies or hangs is a ``RealFailure`` naming the version, the step and the operation it
was in; the worker is restarted for the next scenario, and kvparity itself goes on.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvparity import caches
from kvparity.engine.change import Change
from kvparity.engine.real import WORKER_PLUGINS, RealSGLangError
from kvparity.engine.real.install import SGLangSource, resolve
from kvparity.engine.real.play import STEP_MARK
from kvparity.engine.real.worker import RealWorker, RemoteError, WorkerDied, WorkerHung
from kvparity.engine.snapshot import Snapshot, snapshot_from_plain
from kvparity.model.scenario import Scenario, scenario_to_dict
from kvparity.model.traffic import EVERY_HOST_TIER, HostOffer
from kvparity.model.worlds import WorldId

BACKENDS = ("triton", "torch")
DEFAULT_TIMEOUT_S = 120.0
PYTHON_TREE = "python-tree"  # WorldId.variant of a world on the Python radix-tree core


def world_options(world: WorldId, tree_class: str | None = None) -> dict[str, str]:
    """What the worker builds a world with beyond its backend (``adapter.build_real_world``):
    its tree core, and the tree class asked for (only releases with a UnifiedRadixCache choose)."""
    options = {"tree_core": "python"} if world.variant == PYTHON_TREE else {}
    return options | ({"tree_class": tree_class} if tree_class and world.release and _has_unified(world.release) else {})


def _has_unified(release: str) -> bool:
    from kvparity.engine.real.versions import SUPPORTED

    return SUPPORTED[release].unified_radix_cache is not None


def source_label(source: SGLangSource) -> str:
    """``sglang-0.5.3`` for an installed release; ``<folder>@<version>`` for a path (a checkout's
    ``python/`` folder is named after the checkout)."""
    if source.origin == "path":
        folder = Path(source.path).resolve()
        name = folder.parent.name if folder.name == "python" else folder.name
        return f"{name}@{source.version}"
    return f"sglang-{source.version}"


@dataclass(frozen=True)
class RealFailure:
    """A real world that could not finish a scenario."""

    world: str
    kind: str  # died | hung | error
    step: int | None  # the scenario step it was playing (None: before the first)
    operation: str | None  # the innermost function it was in, when known
    message: str

    def line(self) -> str:
        where = f"step {self.step}" if self.step is not None else "before the first step"
        op = f", in {self.operation}" if self.operation else ""
        return f"{self.world} {self.kind} at {where}{op}: {self.message}"


# How much of a worker's stderr is read for the last step mark of a play that raised (SGLang logs
# between marks; a play marks its start, so a mark this far back is still this play's or none).
_MARKED_LINES = 400
_FRAME = re.compile(r'File "([^"]+)", line (\d+) in (\w+)')


def _where(stderr: str) -> tuple[int | None, str | None]:
    """The last step mark and the innermost SGLang or kvparity frame of a crash dump."""
    step = None
    for line in stderr.splitlines():
        if line.startswith(STEP_MARK):
            with contextlib.suppress(ValueError):  # a line the crash cut short
                step = json.loads(line[len(STEP_MARK):])["index"]
    step = None if step is not None and step < 0 else step  # -1: the play's start, before its first step
    for path, lineno, func in _FRAME.findall(stderr):  # faulthandler: most recent call first
        if "sglang" in path or "triton" in path:
            return step, f"{func} ({Path(path).name}:{lineno})"
    return step, None


class RealLane:
    """Real worlds: ``specs`` are SGLang versions or paths (anything ``install.resolve`` takes)
    or ``SGLangSource``s, each played on every backend in ``backends``. Its worlds (``ids``;
    ``names``, their names ``<label>/<backend>``), in order: each label on each backend."""

    def __init__(self, specs: list[Any], backends: tuple[str, ...] = BACKENDS, *, timeout: float = DEFAULT_TIMEOUT_S,
                 tree_core_variants: bool = True, tree_class: str | None = None, model: str = "full"):
        unknown = [b for b in backends if b not in BACKENDS]
        if unknown or not backends:
            raise RealSGLangError(f"backends {list(backends)}: expected some of {BACKENDS}")
        self.sources = [s if isinstance(s, SGLangSource) else resolve(str(s)) for s in specs]
        self.backends = tuple(backends)
        self.tree_class = tree_class  # None: what a server of each release builds
        self.model = model  # the cache kind its worlds serve (``kvparity.caches``)
        # The host tiers every release of the lane serves (its worlds are compared with each other).
        self.host_offer = functools.reduce(HostOffer.both, (s.entry.host_offer for s in self.sources), EVERY_HOST_TIER)
        self.labels = [source_label(s) for s in self.sources]
        self.workers = {
            label: RealWorker(source, plugins=WORKER_PLUGINS, call_timeout=timeout)
            for label, source in zip(self.labels, self.sources)
        }
        # Each release on each backend as a server builds it; then, where a release has two radix-tree
        # cores (0.5.21+: Rust, the server's, and Python), the same on the Python core (a host tier's
        # worlds are on it already: its nodes' host slots are read from there).
        self.ids = tuple(
            WorldId(label, b, source.entry.family, source.entry.version)
            for label, source in zip(self.labels, self.sources) for b in self.backends
        ) + tuple(
            WorldId(label, b, source.entry.family, source.entry.version, PYTHON_TREE)
            for label, source in zip(self.labels, self.sources) for b in self.backends
            if tree_core_variants and len(source.entry.tree_cores) > 1 and not caches.get(model).host_tier
        )
        self.names = tuple(str(world) for world in self.ids)
        self.kernels: dict[str, dict[str, str]] = {}  # world name -> which kernels it ran (0.5.22+ report them)
        # world name -> the adapter facts it plays with undone (``undone``): none in a lane as built.
        self.facts: dict[str, dict[str, bool]] = {}

    def undone(self, world: str, changes: Sequence[Change]) -> RealLane | None:
        """This lane with ``changes`` undone in ``world``'s adapter (``Change.adapter_undo``; None:
        one of them says no such fact). It shares this lane's workers: the caller does not close it."""
        if not changes or any(c.adapter_undo is None for c in changes):
            return None
        lane = copy.copy(self)
        lane.facts = {**self.facts, world: {**self.facts.get(world, {}), **dict(c.adapter_undo for c in changes
                                                                                 if c.adapter_undo)}}
        return lane

    def start(self) -> None:
        for worker in self.workers.values():
            if not worker.alive:
                worker.start()

    def close(self) -> None:
        for worker in self.workers.values():
            worker.close()

    def __enter__(self) -> RealLane:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def play(self, scenario: Scenario, stop_before: int | None = None, *,
             only: frozenset[str] | None = None) -> dict[str, list[Snapshot] | RealFailure]:
        """Every real world's snapshots of ``scenario`` (steps before ``stop_before``), or how it
        failed; ``only``: just the worlds of those names."""
        data = scenario_to_dict(scenario)
        out: dict[str, list[Snapshot] | RealFailure] = {}
        for world in self.ids:
            if only is not None and str(world) not in only:
                continue
            worker, name = self.workers[world.version], str(world)
            try:
                reply = worker.call("play", backend=world.backend, scenario=data, stop_before=stop_before,
                                    options=world_options(world, self.tree_class)
                                    | caches.get(self.model).harness_options(scenario.geometry, self.host_offer),
                                    facts=self.facts.get(name, {}))
            except (WorkerDied, WorkerHung) as exc:
                step, operation = _where(getattr(exc, "stderr_tail", "") or worker.last_stderr)
                kind = "died" if isinstance(exc, WorkerDied) else "hung"
                out[name] = RealFailure(name, kind, step, operation, str(exc).splitlines()[0])
                continue
            except RemoteError as exc:  # SGLang raised: at the step the play marked last
                step, _ = _where(worker.stderr_tail(_MARKED_LINES))
                out[name] = RealFailure(name, "error", step, None, f"{exc.type}: {exc.remote_message}")
                continue
            out[name] = [snapshot_from_plain(s) for s in reply["snapshots"]]
            if reply.get("kernels"):
                self.kernels[name] = reply["kernels"]
        return out
