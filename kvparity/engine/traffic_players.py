"""Who plays a traffic scenario (issue 26): one interface, two kinds of player.

- ``RealTrafficPlayer``: a real SGLang (release or folder), in a worker process, through its own
  scheduler event loop (``kvparity.engine.real.scheduler_shell.run_traffic``), normal or overlap.
- ``ModelTrafficPlayer``: kvparity's own model of a version ("legacy": 0.5.3, "refactored":
  0.5.3.post1), in this process, through kvparity's model of SGLang's normal loop
  (``kvparity.engine.traffic_loop.play_traffic``); it has no overlap loop.

Both return what ``run_traffic`` returns: ``iterations`` (one record per pass of the loop),
``outputs`` and, in the overlap loop, ``inflight_violations``.
"""

from __future__ import annotations

from typing import Any, Protocol

from kvparity.model.traffic import TrafficScenario
from kvparity.model.worlds import MODELLED_RELEASES

SHELL_PLUGINS = ("kvparity.engine.real.scheduler_shell",)


class TrafficPlayer(Protocol):
    name: str
    release: str  # the SGLang release it is, or models
    loops: tuple[str, ...]  # the event loops it can play

    def play(self, scenario: TrafficScenario) -> dict[str, Any]: ...

    def close(self) -> None: ...


class RealTrafficPlayer:
    """A real SGLang's own scheduler, in its own worker process (started on first use)."""

    loops: tuple[str, ...] = ("normal", "overlap")

    def __init__(self, source: Any, worker: Any = None) -> None:
        """``worker``: a running ``RealWorker`` of ``source`` with the shell's plugin, kept open on
        ``close`` (the caller's); without one, the player starts and closes its own."""
        from kvparity.engine.real.lane import source_label
        from kvparity.engine.real.worker import RealWorker

        self.source = source
        self.release = source.entry_release or source.version  # the adapter entry that drives it
        self.name = f"{source_label(source)} (SGLang's own scheduler)"
        self.owns_worker = worker is None
        self.worker = RealWorker(source, plugins=SHELL_PLUGINS) if worker is None else worker

    def play(self, scenario: TrafficScenario) -> dict[str, Any]:
        config, arrivals = scenario.to_plain()
        result: dict[str, Any] = self.worker.call("run_traffic", config=config, arrivals=arrivals)
        return result

    def close(self) -> None:
        if self.owns_worker:
            self.worker.close()


class ModelTrafficPlayer:
    """kvparity's own model of ``version``, on torch (the traffic loop has no kernel of its own: the
    kernels' backends are compared by the harness-driven check)."""

    loops: tuple[str, ...] = ("normal",)

    def __init__(self, version: str) -> None:
        self.version = version
        self.release = {v: r for r, v in MODELLED_RELEASES.items()}[version]  # the release it models
        self.name = f"{version}/torch (kvparity's model of the scheduler)"

    def play(self, scenario: TrafficScenario) -> dict[str, Any]:
        from kvparity.engine.traffic_loop import play_traffic

        return play_traffic(self.version, scenario)

    def close(self) -> None:
        pass


class CachingPlayer:
    """A player that plays each scenario once (the matrix judges a release in two pairs, and
    shrinking replays candidates); the results are kept, with the play time of each."""

    def __init__(self, player: TrafficPlayer) -> None:
        self.player = player
        self.name, self.release, self.loops = player.name, player.release, player.loops
        self.results: dict[TrafficScenario, dict[str, Any]] = {}

    def play(self, scenario: TrafficScenario) -> dict[str, Any]:
        if scenario not in self.results:
            self.results[scenario] = self.player.play(scenario)
        return self.results[scenario]

    def close(self) -> None:
        self.player.close()
