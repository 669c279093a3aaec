"""The ``refactored-linear`` version: SGLang 0.5.3.post1's refactored path with its write step
replaced by the linear-time kernel (``kernels/linear_write.py``). Everything else (requests, the
chunk cache, allocation, bookkeeping) is the refactored version's own, so the harness checks the
new kernel inside the whole path, as an extra world, against the same reference and oracles."""

from __future__ import annotations

from kvparity import refactored
from kvparity.kernels.linear_write import write_cache_indices as linear_write_cache_indices

Req = refactored.Req
ChunkCache = refactored.ChunkCache


class ScheduleBatch(refactored.ScheduleBatch):
    write_cache_indices = staticmethod(linear_write_cache_indices)
