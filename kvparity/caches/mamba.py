"""A hybrid linear (Mamba) model (issue 34): a state pool beside the KV pool, a tree that caches
states without a buffer (page size 1, the normal loop only)."""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import strategies as st

from kvparity.caches.kind import CacheKind
from kvparity.model.classes import TRAFFIC_STATE
from kvparity.model.traffic import MAMBA_SLOTS_PER_REQUEST, ServerConfig


@st.composite
def mamba_models(draw: Any, config: ServerConfig) -> ServerConfig:
    """``config`` as a hybrid linear (Mamba) model's server: page size 1 (its tree keeps no state
    buffer), state slots from the fewest a server runs its requests with (the tree's states are
    evicted to admit more) to a few more."""
    least = MAMBA_SLOTS_PER_REQUEST * config.max_running_requests
    return dataclasses.replace(config, page_size=1, mamba_slots=draw(st.sampled_from((least, least + 2, least + 8))))


def harness_options(geometry: Any, offer: Any) -> dict[str, Any]:
    """The harness drive's state slots: the fewest a server runs its rows with."""
    return {"mamba_slots": MAMBA_SLOTS_PER_REQUEST * geometry.pool_rows}


KIND = CacheKind(
    name="mamba", label="Mamba", loops=("normal",), host_tier=False, default=True,
    served_by=lambda release: release.serves_mamba,
    describes=lambda config: config.mamba_slots is not None and config.hicache_ratio is None,
    serve=lambda draw, config, options: draw(mamba_models(config)),
    harness_options=harness_options,
    harness_paged=lambda paged_windows: False,
    classes=TRAFFIC_STATE,
)
