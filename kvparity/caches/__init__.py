"""The cache kinds kvparity drives (issue 50), one module each, registered here by name in the
order reports list them (the order of ``--caches``'s value and of a check's tasks, whose seeds
follow it): full attention, a sliding-window model, a Mamba model, a host tier, a Mamba model's
host tier. A new kind is one new module and one line below, plus what its releases need. The pools
the kinds add beside the device's KV (``pool.py``) are registered here too, in the order their
problems and differences are reported in: the window's, the states', the host's, the host states'."""

from __future__ import annotations

from kvparity.caches.full import KIND as FULL
from kvparity.caches.host_pool import POOL as HOST_POOL
from kvparity.caches.host_pool import STATE_POOL as STATE_HOST_POOL
from kvparity.caches.host_tier import KIND as HOST_TIER
from kvparity.caches.kind import CacheKind, ReleaseFacts
from kvparity.caches.mamba import KIND as MAMBA
from kvparity.caches.mamba_host_tier import KIND as MAMBA_HOST_TIER
from kvparity.caches.pool import POOLS, Pool, pool_problems, pools_difference, register_pool
from kvparity.caches.registry import KINDS, classes, default_names, get, kind_of, names, register
from kvparity.caches.sliding_window import KIND as SLIDING_WINDOW
from kvparity.caches.state_pool import POOL as STATE_POOL
from kvparity.caches.window_pool import POOL as WINDOW_POOL

for _kind in (FULL, SLIDING_WINDOW, MAMBA, HOST_TIER, MAMBA_HOST_TIER):
    register(_kind)
register_pool(WINDOW_POOL)
register_pool(STATE_POOL)
register_pool(HOST_POOL)
register_pool(STATE_HOST_POOL)

__all__ = ["KINDS", "POOLS", "CacheKind", "Pool", "ReleaseFacts", "classes", "default_names", "get", "kind_of", "names",
           "pool_problems", "pools_difference", "register", "register_pool"]
