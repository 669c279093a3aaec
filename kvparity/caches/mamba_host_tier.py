"""A Mamba model's host tier (0.5.16+, where a Mamba model's server builds UnifiedRadixCache): its
KV and its states backed up to host pools of their own."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvparity.caches.host_pool import STATE_POOL
from kvparity.caches.host_tier import KIND as HOST
from kvparity.caches.host_tier import OnTheHostAlone, host_classes, host_tiers, loaded_back, on_the_host_alone
from kvparity.caches.host_tier import harness_options as host_options
from kvparity.caches.kind import CacheKind, Memory
from kvparity.caches.mamba import KIND as MAMBA
from kvparity.caches.mamba import harness_options as state_options
from kvparity.caches.mamba import mamba_models, state_classes
from kvparity.model.cache_configs import HostTier, MambaStates
from kvparity.model.classes import TRAFFIC_STATE_LOAD_BACK
from kvparity.model.traffic import HostOffer, ServerConfig, TrafficScenario
from kvparity.model.traffic_records import Decision
from kvparity.model.traffic_strategies import ServeOptions


def serve(draw: Any, config: ServerConfig, options: ServeOptions) -> ServerConfig:
    """A Mamba model's server (its state slots drawn first), then its host tier."""
    return draw(host_tiers(draw(mamba_models(config)), options.host_offer, options.nemesis))


def harness_options(geometry: Any, offer: HostOffer) -> dict[str, Any]:
    return state_options(geometry, offer) | host_options(geometry, offer)


def state_load_backs(decisions: Sequence[Decision], memory: Sequence[Memory]) -> set[str]:
    """A Mamba model's state the host kept alone (no device slot) holding a device slot again after
    an iteration with a hit: loaded back."""
    before: OnTheHostAlone = {}
    for rec, snap in zip(decisions, memory):
        state_host = STATE_POOL.record(snap.pools)
        if state_host is None:
            return set()
        now = on_the_host_alone(state_host)
        if loaded_back(rec, before, now):
            return {TRAFFIC_STATE_LOAD_BACK}
        before = now
    return set()


def reached(scenario: TrafficScenario, decisions: Sequence[Decision], memory: Sequence[Memory]) -> set[str]:
    """The host tier's shapes, the Mamba model's, and its states loaded back from the host."""
    return (host_classes(decisions, memory) | state_classes(scenario, decisions, memory)
            | state_load_backs(decisions, memory))


KIND = CacheKind(
    name="hicache-mamba", label="Mamba host tier (HiCache)", loops=MAMBA.loops, host_tier=True, default=False,
    served_by=lambda release: release.host_mamba,
    caches=(MambaStates, HostTier),
    serve=serve,
    harness_options=harness_options,
    harness_paged=lambda paged_windows: False,
    classes=HOST.classes + MAMBA.classes,
    reached=reached,
)
