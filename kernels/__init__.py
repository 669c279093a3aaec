"""Triton kernels of the KV-index path, each with a torch twin.

``kernels.runtime`` is imported first: it fixes the Triton mode (interpreter on CPU, compiled on
CUDA) before any ``@triton.jit`` decorator runs. Every public function takes ``backend`` ("triton"
or "torch") explicitly.
"""

from kvparity.kernels import runtime  # noqa: F401  (must run before triton is imported)
from kvparity.kernels.alloc_extend import alloc_extend, alloc_extend_kernel
from kvparity.kernels.last_loc import get_last_loc, get_last_loc_kernel
from kvparity.kernels.legacy_write import write_extend_slots, write_req_to_token_pool_triton
from kvparity.kernels.refactored_write import (
    prefix_pointer_table,
    write_prefix_and_extend_slots,
    write_req_to_token_pool_with_prefix_triton,
)
from kvparity.kernels.runtime import BACKENDS, DEVICE, INTERPRET

__all__ = [
    "BACKENDS",
    "DEVICE",
    "INTERPRET",
    "alloc_extend",
    "alloc_extend_kernel",
    "get_last_loc",
    "get_last_loc_kernel",
    "prefix_pointer_table",
    "write_extend_slots",
    "write_prefix_and_extend_slots",
    "write_req_to_token_pool_triton",
    "write_req_to_token_pool_with_prefix_triton",
]
