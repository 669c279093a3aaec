"""A Mamba model's host tier (0.5.16+, where a Mamba model's server builds UnifiedRadixCache): its
KV and its states backed up to host pools of their own."""

from __future__ import annotations

from typing import Any

from kvparity.caches.host_tier import KIND as HOST
from kvparity.caches.host_tier import harness_options as host_options
from kvparity.caches.host_tier import host_tiers
from kvparity.caches.kind import CacheKind
from kvparity.caches.mamba import KIND as MAMBA
from kvparity.caches.mamba import harness_options as state_options
from kvparity.caches.mamba import mamba_models
from kvparity.model.traffic import HostOffer, ServerConfig
from kvparity.model.traffic_strategies import ServeOptions


def serve(draw: Any, config: ServerConfig, options: ServeOptions) -> ServerConfig:
    """A Mamba model's server (its state slots drawn first), then its host tier."""
    return draw(host_tiers(draw(mamba_models(config)), options.host_offer, options.nemesis))


def harness_options(geometry: Any, offer: HostOffer) -> dict[str, Any]:
    return state_options(geometry, offer) | host_options(geometry, offer)


KIND = CacheKind(
    name="hicache-mamba", label="Mamba host tier (HiCache)", loops=MAMBA.loops, host_tier=True, default=False,
    served_by=lambda release: release.host_mamba,
    describes=lambda config: config.mamba_slots is not None and config.hicache_ratio is not None,
    serve=serve,
    harness_options=harness_options,
    harness_paged=lambda paged_windows: False,
    classes=HOST.classes + MAMBA.classes,
)
