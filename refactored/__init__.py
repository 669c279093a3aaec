"""SGLang 0.5.3.post1: the KV-index path after pull request #11200."""

from kernels import runtime  # noqa: F401
from refactored.chunk_cache import ChunkCache
from refactored.req import Req
from refactored.schedule_batch import ScheduleBatch, write_cache_indices

__all__ = ["ChunkCache", "Req", "ScheduleBatch", "write_cache_indices"]
