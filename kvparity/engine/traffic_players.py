"""Who plays a traffic scenario (issue 26): one interface, two kinds of player.

- ``RealTrafficPlayer``: a real SGLang (release or folder), in a worker process, through its own
  scheduler event loop (``kvparity.engine.real.scheduler_shell.run_traffic``), normal or overlap.
- ``ModelTrafficPlayer``: kvparity's own model of a version ("legacy": 0.5.3, "refactored":
  0.5.3.post1), in this process, through kvparity's model of SGLang's normal loop
  (``kvparity.engine.traffic_loop.play_traffic``); it has no overlap loop.

Both return a ``TrafficRun`` (``kvparity.engine.traffic_run``): the decisions and memory of every
pass of the loop, the outputs and, in the overlap loop, the in-flight findings. ``world_id`` names
the world a player's memory is compared as (``kvparity.judge.memory``).
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from kvparity import caches as cache_kinds
from kvparity.engine.real import WORKER_PLUGINS
from kvparity.engine.real.changes import Change
from kvparity.engine.traffic_run import TrafficRun
from kvparity.model.traffic import EVERY_HOST_TIER, HostOffer, TrafficScenario
from kvparity.model.traffic_records import StopError
from kvparity.model.worlds import MODELLED_RELEASES, WorldId


class TrafficPlayer(Protocol):
    name: str
    release: str  # the SGLang release it is, or models
    loops: tuple[str, ...]  # the event loops it can play
    caches: tuple[str, ...]  # the models it can serve (``kvparity.caches``)
    paged_windows: bool  # whether a sliding-window model's pools may take a page size above 1
    host_offer: HostOffer  # the host tiers it serves
    tree_cores: tuple[str, ...]  # the radix tree's cores it ships (two from 0.5.21: Rust, its default, and Python)
    aborts: bool  # whether it takes the nemesis's client aborts (``TrafficScenario.aborts``)
    forced_retraction: bool  # whether it takes the nemesis's forced retraction (``ServerConfig.forced_retraction``)
    world_id: WorldId

    def play(self, scenario: TrafficScenario) -> TrafficRun: ...

    def undone(self, changes: Sequence[Change]) -> TrafficPlayer | None:
        """The same player with every one of ``changes`` undone (None: one cannot be undone here);
        the caller closes it."""
        ...

    def close(self) -> None: ...


def undone_label(changes: Sequence[Change]) -> str:
    """How a player's name says what was undone: the pull request, or "the change"; or how many."""
    if len(changes) == 1:
        return changes[0].pull_request or "the change"
    return f"{len(changes)} named changes of {changes[0].release}"


class RealTrafficPlayer:
    """A real SGLang's own scheduler, in its own worker process (started on first use)."""

    loops: tuple[str, ...] = ("normal", "overlap")
    caches: tuple[str, ...] = cache_kinds.names()
    aborts = True  # through the release's own Scheduler.abort_request, every release

    def __init__(self, source: Any, worker: Any = None, *, copy_of: str | None = None) -> None:
        """``worker``: a running ``RealWorker`` of ``source`` with the shell's plugin, kept open on
        ``close`` (the caller's); without one, the player starts and closes its own. ``copy_of``: a
        folder of the player's own (a copy with a change undone), removed on ``close``."""
        from kvparity.engine.real.lane import source_label
        from kvparity.engine.real.worker import RealWorker

        self.source = source
        self.copy_of = copy_of
        self.release = source.entry_release or source.version  # the adapter entry that drives it
        self.name = f"{source_label(source)} (SGLang's own scheduler)"
        self.world_id = WorldId(source_label(source), "torch", source.entry.family, source.entry.version)
        self.paged_windows = source.entry.paged_swa
        self.host_offer = source.entry.host_offer
        self.tree_cores = source.entry.tree_cores
        self.forced_retraction = source.entry.test_retract_interval
        self.caches = tuple(kind.name for kind in cache_kinds.KINDS.values() if kind.served_by(source.entry))
        self.owns_worker = worker is None
        self.worker = RealWorker(source, plugins=WORKER_PLUGINS) if worker is None else worker

    def play(self, scenario: TrafficScenario) -> TrafficRun:
        """The release's run; one whose worker hung or died (the next call starts a fresh one) is
        a run that stopped on that error, before its first iteration's record."""
        from kvparity.engine.real.worker import WorkerDied, WorkerHung

        config, arrivals = scenario.to_plain()
        try:
            return TrafficRun.from_plain(self.worker.call("run_traffic", config=config, arrivals=arrivals))
        except (WorkerHung, WorkerDied) as exc:
            return TrafficRun(loop=scenario.config.loop, decisions=(), memory=(), outputs={},
                              error=StopError.of(0, exc, None))

    def undone(self, changes: Sequence[Change]) -> TrafficPlayer | None:
        """This release with ``changes`` undone in a copy of its source (only changes of the release
        that made them: their text is where the change put it)."""
        if not changes or any(c.undo is None or c.release != self.source.version for c in changes):
            return None
        from kvparity.engine.real.install import copy_with_edits, resolve

        folder = tempfile.mkdtemp(prefix="kvparity-undone-")
        copy = copy_with_edits(self.source, [c.undo for c in changes if c.undo], Path(folder) / "sglang-copy")
        # Driven as its release: probing may read an undone change's code as an earlier release's.
        player = RealTrafficPlayer(dataclasses.replace(resolve(str(copy)), entry_release=self.release), copy_of=folder)
        player.name = f"{self.name}, {undone_label(changes)} undone"
        return player

    def close(self) -> None:
        if self.owns_worker:
            self.worker.close()
        if self.copy_of is not None:
            shutil.rmtree(self.copy_of, ignore_errors=True)


class ModelTrafficPlayer:
    """kvparity's own model of ``version``, on torch (the traffic loop has no kernel of its own: the
    kernels' backends are compared by the harness-driven check)."""

    loops: tuple[str, ...] = ("normal",)
    caches: tuple[str, ...] = ("full",)  # kvparity's model serves full attention only (issue 34: real against real)
    paged_windows = False
    host_offer = EVERY_HOST_TIER  # unused: kvparity's model serves no host tier
    tree_cores: tuple[str, ...] = ()
    aborts = False  # kvparity's model has no abort path: aborts are drawn real release against real release
    forced_retraction = False  # nor SGLang's retraction test switch

    def __init__(self, version: str, options: tuple[tuple[str, str], ...] = ()) -> None:
        """``options``: ``play_traffic``'s (a change undone: ``Change.model_undo``)."""
        self.version = version
        self.options = options
        self.release = {v: r for r, v in MODELLED_RELEASES.items()}[version]  # the release it models
        self.name = f"{version}/torch (kvparity's model of the scheduler)"
        self.world_id = WorldId.modelled(version, "torch")

    def play(self, scenario: TrafficScenario) -> TrafficRun:
        from kvparity.engine.traffic_loop import play_traffic

        return play_traffic(self.version, scenario, **dict(self.options))

    def undone(self, changes: Sequence[Change]) -> TrafficPlayer | None:
        """The model of this release with ``changes`` undone (changes of the release it models)."""
        if not changes or any(c.model_undo is None or c.release != self.release for c in changes):
            return None
        player = ModelTrafficPlayer(self.version, self.options + tuple(c.model_undo for c in changes if c.model_undo))
        player.name = f"{self.name}, {undone_label(changes)} undone"
        return player

    def close(self) -> None:
        pass


class CachingPlayer:
    """A player that plays each scenario once (the matrix judges a release in two pairs, and
    shrinking replays candidates); the results are kept, with the play time of each."""

    def __init__(self, player: TrafficPlayer) -> None:
        self.player = player
        self.name, self.release, self.loops, self.world_id = player.name, player.release, player.loops, player.world_id
        self.caches, self.paged_windows, self.host_offer = player.caches, player.paged_windows, player.host_offer
        self.tree_cores = player.tree_cores
        self.aborts, self.forced_retraction = player.aborts, player.forced_retraction
        self.results: dict[TrafficScenario, TrafficRun] = {}

    def play(self, scenario: TrafficScenario) -> TrafficRun:
        if scenario not in self.results:
            self.results[scenario] = self.player.play(scenario)
        return self.results[scenario]

    def undone(self, changes: Sequence[Change]) -> TrafficPlayer | None:
        return self.player.undone(changes)

    def close(self) -> None:
        self.player.close()
