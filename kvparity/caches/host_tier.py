"""A host tier (issue 35, SGLang's HiCache: --enable-hierarchical-cache): full attention whose
device KV is backed up to a host pool, and half the time to the file storage tier beyond it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hypothesis import strategies as st

from kvparity.caches.host_pool import POOL, HostState
from kvparity.caches.kind import CacheKind, Memory
from kvparity.model.cache_configs import HICACHE_WRITE_POLICIES, HostTier, printed_fields
from kvparity.model.classes import (
    TRAFFIC_BACKUP_REFUSED,
    TRAFFIC_HOST,
    TRAFFIC_HOST_DEMOTED,
    TRAFFIC_HOST_EVICTED,
    TRAFFIC_HOST_LOAD_BACK,
    TRAFFIC_HOST_RETRACTION,
    TRAFFIC_LOAD_BACK_REFUSED,
    TRAFFIC_PREFETCH_CUT,
    TRAFFIC_STORAGE_FAULT,
    TRAFFIC_STORAGE_HIT,
    TRAFFIC_STORAGE_READ_FAULT,
)
from kvparity.model.traffic import EVERY_HOST_TIER, LOOPS, HostOffer, ServerConfig, TrafficScenario
from kvparity.model.traffic_records import Decision

# A host tier in the harness drive's worlds: smaller than the device's pool, so that the host, too,
# evicts, where every release takes one (else HARNESS_LARGER_HOST); write-through, the server's default.
HARNESS_HOST = HostTier(0.75)
HARNESS_LARGER_HOST = HostTier(1.5)


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
    kv_slots = 128 if config.kv_slots < 256 else draw(st.sampled_from((96, 128)))
    tier = HostTier(ratio=draw(st.sampled_from((0.75, 1.5, 2.0) if offer.smaller else (1.5, 2.0))),
                    write_policy=draw(st.sampled_from(HICACHE_WRITE_POLICIES)),
                    storage=faults or draw(st.booleans()),
                    ack_delay=draw(st.sampled_from((0, 0, 0, 0, 1, 2))))
    return config.with_part(tier, kv_slots=kv_slots)


def harness_options(geometry: Any, offer: HostOffer) -> dict[str, Any]:
    """The harness drive's host tier: ``HARNESS_HOST``, or ``HARNESS_LARGER_HOST`` where ``offer``
    takes no host pool smaller than the device's."""
    return printed_fields(HARNESS_HOST if offer.smaller else HARNESS_LARGER_HOST)


# Each node a host pool backs, by (extra key, path): whether the device has evicted it.
OnTheHostAlone = dict[tuple[str | None, tuple[int, ...]], bool]


def host_classes(decisions: Sequence[Decision], memory: Sequence[Memory]) -> set[str]:
    """A host tier's shapes a run met: device KV kept on the host alone, a node the host kept alone
    holding device KV again after an iteration with a hit (loaded back), a node's host KV gone
    (host eviction), a retraction, tokens fetched from storage; and the nemesis's: storage calls
    failed, prefetches cut, backups and load-backs refused."""
    found: set[str] = set()
    before: OnTheHostAlone = {}
    for rec, snap in zip(decisions, memory):
        host = POOL.record(snap.pools)
        if host is None:
            return found
        now = on_the_host_alone(host)
        if any(now.values()):
            found.add(TRAFFIC_HOST_DEMOTED)
        if loaded_back(rec, before, now):
            found.add(TRAFFIC_HOST_LOAD_BACK)
        if set(before) - set(now):
            found.add(TRAFFIC_HOST_EVICTED)
        if rec.retracted:
            found.add(TRAFFIC_HOST_RETRACTION)
        if host.fetched:  # tokens brought from storage (slots held for a fetch may find nothing there)
            found.add(TRAFFIC_STORAGE_HIT)
        if host.read_faults:
            found.add(TRAFFIC_STORAGE_READ_FAULT)
        if len(host.storage_faults) > host.read_faults:
            found.add(TRAFFIC_STORAGE_FAULT)
        if host.prefetches_cut:
            found.add(TRAFFIC_PREFETCH_CUT)
        if host.backups_refused:
            found.add(TRAFFIC_BACKUP_REFUSED)
        if host.loads_refused:
            found.add(TRAFFIC_LOAD_BACK_REFUSED)
        before = now
    return found


def on_the_host_alone(host: HostState) -> OnTheHostAlone:
    return {(node.extra_key, node.path): node.device is None for node in host.nodes}


def loaded_back(rec: Decision, before: OnTheHostAlone, now: OnTheHostAlone) -> bool:
    """An iteration with a hit after which a node the host kept alone holds device slots again."""
    hit = rec.mode == "EXTEND" and any(n > 0 for n in rec.prefix_lens)
    return hit and any(alone and now.get(path) is False for path, alone in before.items())


def reached(scenario: TrafficScenario, decisions: Sequence[Decision], memory: Sequence[Memory]) -> set[str]:
    return host_classes(decisions, memory)


KIND = CacheKind(
    name="hicache", label="host tier (HiCache)", loops=LOOPS, host_tier=True, default=False,
    served_by=lambda release: release.host_tier is not None,
    caches=(HostTier,),
    serve=lambda draw, config, options: draw(host_tiers(config, options.host_offer, options.nemesis)),
    harness_options=harness_options,
    harness_paged=lambda paged_windows: True,
    classes=TRAFFIC_HOST,
    reached=reached,
)
