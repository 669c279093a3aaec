"""A hybrid linear (Mamba) model (issue 34): a state pool beside the KV pool, a tree that caches
states without a buffer (page size 1, the normal loop only)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hypothesis import strategies as st

from kvparity.caches.kind import CacheKind, Memory
from kvparity.caches.state_pool import POOL
from kvparity.model.cache_configs import MAMBA_SLOTS_PER_REQUEST, MambaStates
from kvparity.model.classes import (
    TRAFFIC_STATE,
    TRAFFIC_STATE_EVICTED,
    TRAFFIC_STATE_RESTORED,
    TRAFFIC_STATE_RETRACTED_RESTORED,
    TRAFFIC_STATE_RETRACTION,
)
from kvparity.model.traffic import ServerConfig, TrafficScenario
from kvparity.model.traffic_records import Decision


@st.composite
def mamba_models(draw: Any, config: ServerConfig) -> ServerConfig:
    """``config`` as a hybrid linear (Mamba) model's server: page size 1 (its tree keeps no state
    buffer), state slots from the fewest a server runs its requests with (the tree's states are
    evicted to admit more) to a few more."""
    least = MAMBA_SLOTS_PER_REQUEST * config.max_running_requests
    return config.with_part(MambaStates(draw(st.sampled_from((least, least + 2, least + 8)))), page_size=1)


def harness_options(geometry: Any, offer: Any) -> dict[str, Any]:
    """The harness drive's state slots: the fewest a server runs its rows with."""
    return {"mamba_slots": MAMBA_SLOTS_PER_REQUEST * geometry.pool_rows}


def state_classes(scenario: TrafficScenario, decisions: Sequence[Decision], memory: Sequence[Memory]) -> set[str]:
    """A Mamba model's shapes a run met: a radix hit whose request runs in a slot of its own (its
    state copied from the one the tree keeps), a slot the tree kept and freed after (evicted), a
    retraction, and a retracted request readmitted on such a hit."""
    found: set[str] = set()
    admitted: set[str] = set()
    retracted: set[str] = set()
    kept: set[int] = set()
    for rec, snap in zip(decisions, memory):
        states = POOL.record(snap.pools)
        if states is None:
            return found
        if kept & set(states.free):
            found.add(TRAFFIC_STATE_EVICTED)
        kept = set(states.tree)
        retracted.update(rid for rid in rec.waiting if rid in admitted)
        if rec.retracted:
            found.add(TRAFFIC_STATE_RETRACTION)
        if rec.mode == "EXTEND":
            slot_of = dict(states.rows)
            restored = [rid for rid, row, hit in zip(rec.rids, rec.rows, rec.prefix_lens)
                        if hit > 0 and slot_of.get(row) not in (None, *kept)]
            if restored:
                found.add(TRAFFIC_STATE_RESTORED)
            if any(rid in retracted for rid in restored):
                found.add(TRAFFIC_STATE_RETRACTED_RESTORED)
            admitted.update(rec.rids)
    return found


KIND = CacheKind(
    name="mamba", label="Mamba", loops=("normal",), host_tier=False, default=True,
    served_by=lambda release: release.serves_mamba,
    caches=(MambaStates,),
    serve=lambda draw, config, options: draw(mamba_models(config)),
    harness_options=harness_options,
    harness_paged=lambda paged_windows: False,
    classes=TRAFFIC_STATE,
    reached=state_classes,
)
