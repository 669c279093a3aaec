"""SGLang 0.5.3.post1: the KV-index path after pull request #11200."""

from kvparity.kernels import runtime  # noqa: F401
from kvparity.refactored.chunk_cache import ChunkCache
from kvparity.refactored.req import Req
from kvparity.refactored.schedule_batch import ScheduleBatch, write_cache_indices

__all__ = ["ChunkCache", "Req", "ScheduleBatch", "write_cache_indices"]
