"""A host tier (issue 35, SGLang's HiCache: --enable-hierarchical-cache): full attention whose
device KV is backed up to a host pool, and half the time to the file storage tier beyond it."""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import strategies as st

from kvparity.caches.kind import CacheKind
from kvparity.model.classes import TRAFFIC_HOST
from kvparity.model.traffic import EVERY_HOST_TIER, HICACHE_WRITE_POLICIES, LOOPS, HostOffer, ServerConfig

# A host tier in the harness drive's worlds (``HostTier``'s fields): smaller than the device's pool,
# so that the host, too, evicts, where every release takes one (else HARNESS_LARGER_HOST);
# write-through, the server's default.
HARNESS_HOST = {"ratio": 0.75, "write_policy": "write_through"}
HARNESS_LARGER_HOST = {"ratio": 1.5, "write_policy": "write_through"}


@st.composite
def host_tiers(draw: Any, config: ServerConfig, offer: HostOffer = EVERY_HOST_TIER, faults: bool = False) -> ServerConfig:
    """``config`` with a host tier: a device pool small enough that the warm-up's prompts are
    evicted from it (128 slots hold any one request drawn here), a host pool smaller than the
    device's (the host evicts what the warm-up left) or larger (it keeps it), any write policy, and
    half the time the file storage tier (where what the host evicted is found again), the host's
    size where the releases' ``offer`` allows; a third of
    the time its transfers are slow (acknowledged one or two iterations late: what they list stays
    listed across iterations). With the nemesis's ``faults``, always the storage tier (where its
    faults are: ``_server_faults``): a host tier's backups refused and loads back from the host
    happen with it too, and a drawn storage tier came out in 7 of 40 scenarios of some tasks."""
    return dataclasses.replace(
        config, kv_slots=128 if config.kv_slots < 256 else draw(st.sampled_from((96, 128))),
        hicache_ratio=draw(st.sampled_from((0.75, 1.5, 2.0) if offer.smaller else (1.5, 2.0))),
        hicache_write_policy=draw(st.sampled_from(HICACHE_WRITE_POLICIES)),
        hicache_storage=faults or draw(st.booleans()),
        hicache_ack_delay=draw(st.sampled_from((0, 0, 0, 0, 1, 2))))


def harness_options(geometry: Any, offer: HostOffer) -> dict[str, Any]:
    """The harness drive's host tier: ``HARNESS_HOST``, or ``HARNESS_LARGER_HOST`` where ``offer``
    takes no host pool smaller than the device's."""
    return {"host": dict(HARNESS_HOST if offer.smaller else HARNESS_LARGER_HOST)}


KIND = CacheKind(
    name="hicache", label="host tier (HiCache)", loops=LOOPS, host_tier=True, default=False,
    served_by=lambda release: release.host_tier is not None,
    describes=lambda config: (config.hicache_ratio is not None and config.mamba_slots is None
                              and config.sliding_window is None),
    serve=lambda draw, config, options: draw(host_tiers(config, options.host_offer, options.nemesis)),
    harness_options=harness_options,
    harness_paged=lambda paged_windows: True,
    classes=TRAFFIC_HOST,
)
