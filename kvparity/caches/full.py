"""Full attention: a server of one KV pool, every release."""

from __future__ import annotations

from kvparity.caches.kind import CacheKind
from kvparity.model.traffic import LOOPS

KIND = CacheKind(
    name="full", label="full attention", loops=LOOPS, host_tier=False, default=True,
    served_by=lambda release: True,
    caches=(),
    serve=lambda draw, config, options: config,
    harness_options=lambda geometry, offer: {},
    harness_paged=lambda paged_windows: True,
)
