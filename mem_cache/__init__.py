"""What the refactor did not change: pools, allocators, radix cache, and the request/batch state
both versions share."""

from kvparity.kernels import runtime  # noqa: F401  (fixes the Triton mode before triton is imported)
