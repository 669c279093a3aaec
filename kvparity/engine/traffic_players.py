"""Who plays a traffic scenario (issue 26): one interface, two kinds of player.

- ``RealTrafficPlayer`` (``kvparity.engine.real.players``, the real SGLang layer above this one): a
  real SGLang (release or folder), in a worker process, through its own scheduler event loop
  (``kvparity.engine.real.scheduler_shell.run_traffic``), normal or overlap.
- ``ModelTrafficPlayer``: kvparity's own model of a version ("legacy": 0.5.3, "refactored":
  0.5.3.post1), in this process, through kvparity's model of SGLang's normal loop
  (``kvparity.engine.traffic_loop.play_traffic``); it has no overlap loop.

Both return a ``TrafficRun`` (``kvparity.engine.traffic_run``): the decisions and memory of every
pass of the loop, the outputs and, in the overlap loop, the in-flight findings. ``world_id`` names
the world a player's memory is compared as (``kvparity.judge.memory``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from kvparity.engine.change import Change
from kvparity.engine.traffic_run import TrafficRun
from kvparity.model.traffic import EVERY_HOST_TIER, HostOffer, TrafficScenario
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
