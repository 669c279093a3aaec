"""A real SGLang as a traffic player (``kvparity.engine.traffic_players.TrafficPlayer``): the
release's own scheduler, in a worker process of its own (``kvparity.engine.real.worker``), playing
traffic through the scheduler shell (``kvparity.engine.real.scheduler_shell.run_traffic``)."""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvparity import caches as cache_kinds
from kvparity.engine.change import Change
from kvparity.engine.real import WORKER_PLUGINS
from kvparity.engine.traffic_players import TrafficPlayer, undone_label
from kvparity.engine.traffic_run import TrafficRun
from kvparity.model.traffic import TrafficScenario
from kvparity.model.traffic_records import StopError
from kvparity.model.worlds import WorldId


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
