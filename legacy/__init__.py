"""SGLang 0.5.3: the KV-index path before pull request #11200."""

from kernels import runtime  # noqa: F401
from legacy.chunk_cache import ChunkCache
from legacy.req import Req
from legacy.schedule_batch import ScheduleBatch

__all__ = ["ChunkCache", "Req", "ScheduleBatch"]
