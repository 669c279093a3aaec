"""What kvparity knows of one cache kind, as one record (issue 50): its name and how reports name
it, the event loops a server of it runs, whether it has a host tier, whether a real pair's check
serves it unless ``--caches`` says, which releases serve it, the server a scenario draws for it, and
the worlds the harness drive builds for it. A kind's module (``kvparity.caches.full`` and so on)
exports one as ``KIND``; ``kvparity.caches`` registers them, and looks them up by name."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kvparity.caches.pool import PoolRecord
from kvparity.model.cache_configs import CacheConfig
from kvparity.model.traffic import HostOffer, ServerConfig, TrafficScenario
from kvparity.model.traffic_records import Decision
from kvparity.model.traffic_strategies import ServeOptions


class ReleaseFacts(Protocol):
    """What a release's version entry says of the cache kinds it serves (``engine.real.versions``)."""

    @property
    def serves_mamba(self) -> bool: ...

    @property
    def host_tier(self) -> str | None: ...

    @property
    def host_mamba(self) -> bool: ...


class HeldRequest(Protocol):
    """What a kind's traffic classes read of a request after an iteration (``engine.snapshot.RequestView``)."""

    @property
    def status(self) -> str: ...

    @property
    def held(self) -> tuple[int, ...]: ...


class Memory(Protocol):
    """What a kind's traffic classes read of the memory after an iteration (``engine.snapshot.Snapshot``):
    its pools by name, the device slots the tree holds, the requests."""

    @property
    def pools(self) -> Mapping[str, PoolRecord]: ...

    @property
    def tree_slots(self) -> tuple[int, ...]: ...

    @property
    def requests(self) -> Mapping[str, HeldRequest]: ...


# The scenario shapes of its own a scheduler-driven run met: (the scenario, the run's iteration
# records, the memory after each) -> their names (``kvparity.judge.traffic_classes`` adds the
# shapes every kind has).
Reached = Callable[[TrafficScenario, Sequence[Decision], Sequence[Memory]], set[str]]


def nothing_of_its_own(scenario: TrafficScenario, decisions: Sequence[Decision], memory: Sequence[Memory]) -> set[str]:
    return set()


# A kind's server, drawn: (Hypothesis's draw, a drawn full-attention server, the drive's options) -> its own.
Serve = Callable[[Any, ServerConfig, ServeOptions], ServerConfig]


@dataclass(frozen=True)
class CacheKind:
    name: str  # as ``--caches``, the JSON and the release registry name it
    label: str  # as reports name it
    loops: tuple[str, ...]  # the event loops its server runs (a Mamba model's tree without a state buffer: normal only)
    host_tier: bool  # served with a host tier (HiCache)
    default: bool  # served by a real pair's check unless ``--caches`` says (a host tier is asked for by name)
    served_by: Callable[[ReleaseFacts], bool]  # whether kvparity drives a release serving it
    caches: tuple[type[CacheConfig], ...]  # what its server holds beside full attention (``ServerConfig.caches``)
    serve: Serve  # its server, drawn (``traffic_scenarios``)
    # The harness drive's worlds: their options, sized for a scenario's geometry under the host
    # tiers a release pair takes, and whether their templates take page sizes above 1 (given
    # whether every release of the lane pages a window pool).
    harness_options: Callable[[Any, HostOffer], dict[str, Any]]
    harness_paged: Callable[[bool], bool]
    classes: tuple[str, ...] = ()  # the scenario shapes of its own a report counts (``kvparity.model.classes``)
    reached: Reached = nothing_of_its_own  # which of them a run met

    def describes(self, config: ServerConfig) -> bool:
        """Whether ``config`` is a server of this kind: it holds this kind's caches, no other."""
        return {type(part) for part in config.caches} == set(self.caches)

    @property
    def hybrid(self) -> bool:
        """Anything but full attention alone: played real release against real release only."""
        return self.name != "full"
