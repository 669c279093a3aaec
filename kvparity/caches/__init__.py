"""The cache kinds kvparity drives (issue 50), one module each, registered here by name in the
order reports list them (the order of ``--caches``'s value and of a check's tasks, whose seeds
follow it): full attention, a sliding-window model, a Mamba model, a host tier, a Mamba model's
host tier. A new kind is one new module and one line below, plus what its releases need."""

from __future__ import annotations

from kvparity.caches.full import KIND as FULL
from kvparity.caches.host_tier import KIND as HOST_TIER
from kvparity.caches.kind import CacheKind, ReleaseFacts
from kvparity.caches.mamba import KIND as MAMBA
from kvparity.caches.mamba_host_tier import KIND as MAMBA_HOST_TIER
from kvparity.caches.registry import KINDS, classes, default_names, get, kind_of, names, register
from kvparity.caches.sliding_window import KIND as SLIDING_WINDOW

for _kind in (FULL, SLIDING_WINDOW, MAMBA, HOST_TIER, MAMBA_HOST_TIER):
    register(_kind)

__all__ = ["KINDS", "CacheKind", "ReleaseFacts", "classes", "default_names", "get", "kind_of", "names", "register"]
