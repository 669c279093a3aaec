"""SGLang 0.5.3: the KV-index path before pull request #11200."""

from kvparity.kernels import runtime  # noqa: F401
from kvparity.legacy.chunk_cache import ChunkCache
from kvparity.legacy.req import Req
from kvparity.legacy.schedule_batch import ScheduleBatch

__all__ = ["ChunkCache", "Req", "ScheduleBatch"]
