"""A HiCache world's host tier (issue 35): ``--enable-hierarchical-cache`` keeps KV the device
evicts in a host pool, and loads it back on a prefix hit. Driven where a server of the release
builds it as ``UnifiedRadixCache.init_hicache`` (0.5.19+, ``VersionEntry.host_tier``).

What a CPU lacks, and what stands in for it (all kvparity's, installed on the release's modules):

- the device-host copies: SGLang's ``sgl_kernel.kvcacheio.transfer_kv_direct`` (the copy of io
  backend "direct", layer-first layout), bound in the host pool's module on CUDA only: a torch
  gather/scatter doing the same copy, ``_transfer_kv_direct``;
- the host buffer: the default allocator of device "cpu" registers it with ``cudaHostRegister``:
  the host pool's own allocator, unpinned;
- streams and events need nothing: on a CPU SGLang takes ``torch.cpu``'s, whose events are done
  when recorded.

Deterministic transfers. Nothing runs on a thread: a copy happens inside the call that starts it,
at the point of the loop a server's stream order implies. A backup (device to host) is queued when
the tree backs a node up (an insert, or a hit under a selective policy) and copied when the
scheduler flushes the queue (``check_hicache_events`` at the start of an iteration, the flush after
a batch's result): a server's write stream starts it then, after the forward that wrote the KV. A
load-back is queued at admission (``init_load_back``) and copied in ``ready_to_load_host_cache``,
before the batch's forward reads it (a server's forward waits on the load stream layer by layer).
Acknowledgements are read at the next ``check_hicache_events``, as a server's events would report
them done by then. The file storage tier is not driven yet (its controller runs threads).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

import torch

from kvparity.engine.real import RealSGLangError

# The write policies a release's HiCache offers (SGLang's --hicache-write-policy).
HOST_WRITE_POLICIES = ("write_through", "write_back", "write_through_selective")
# A HiCache world's KV: float32, head_dim KV_LANES (the canary's lanes, ``LaneStore``, need 7).
KV_LANES = 8
_COMMON = "sglang.srt.mem_cache.pool_host.common"
_MHA = "sglang.srt.mem_cache.pool_host.mha"


@dataclass(frozen=True)
class HostTier:
    """A server's host tier: its host pool's size as a ratio to the device pool's (SGLang's
    ``--hicache-ratio``: the host pool is that many times the device's slots, in whole pages, and
    a page more) and its write policy."""

    ratio: float
    write_policy: str = "write_through"

    def __post_init__(self) -> None:
        if not self.ratio > 0:
            raise RealSGLangError(f"hicache_ratio={self.ratio}: must be > 0")
        if self.write_policy not in HOST_WRITE_POLICIES:
            raise RealSGLangError(f"hicache_write_policy={self.write_policy!r}: expected one of {HOST_WRITE_POLICIES}")

    def server_fields(self) -> dict[str, Any]:
        """The server arguments that attach this tier (what a CPU can copy with: io backend
        "direct", layer-first layout; no storage backend)."""
        return dict(
            enable_hierarchical_cache=True, hicache_ratio=self.ratio, hicache_size=0,
            hicache_write_policy=self.write_policy, hicache_io_backend="direct", hicache_mem_layout="layer_first",
            hicache_storage_backend=None,
        )


def _transfer_kv_direct(src_layers: list[torch.Tensor], dst_layers: list[torch.Tensor], src_indices: torch.Tensor,
                        dst_indices: torch.Tensor, page_size: int) -> None:
    """``transfer_kv_direct``: for each layer, the KV of ``src_indices`` copied to ``dst_indices``
    (token slots; the page size only tells the CUDA kernel how to batch its copies)."""
    if len(src_layers) != len(dst_layers) or src_indices.numel() != dst_indices.numel():
        raise RealSGLangError(f"transfer_kv_direct: {len(src_layers)} layers to {len(dst_layers)}, "
                              f"{src_indices.numel()} slots to {dst_indices.numel()}")
    src, dst = src_indices.to(torch.int64).cpu(), dst_indices.to(torch.int64).cpu()
    for s, d in zip(src_layers, dst_layers):
        d[dst.to(d.device)] = s[src.to(s.device)].to(d.dtype)


def _unpinned(dims: Any, dtype: Any, device: Any, pin_memory: Any, allocator: Any, *args: Any, **kwargs: Any) -> Any:
    """The host buffer from the host pool's own allocator, never registered with CUDA."""
    return allocator.allocate(dims, dtype=dtype, device=device)


def install_cpu_copies() -> None:
    """Put the stand-ins into the imported release (idempotent; before its tree attaches HiCache)."""
    importlib.import_module(_COMMON).ALLOC_MEMORY_FUNCS["cpu"] = _unpinned
    setattr(importlib.import_module(_MHA), "transfer_kv_direct", _transfer_kv_direct)  # noqa: B010 (bound on CUDA only)


def attach(tree: Any, server_args: Any, params: Any) -> Any:
    """Attach the host tier ``server_args`` name to a UnifiedRadixCache as the server's factory
    does (``init_hicache``); returns the host pool."""
    install_cpu_copies()
    tree.init_hicache(server_args, params)
    host = host_pool(tree)
    host.pin_memory = False  # its storage path asks torch for pinned scratch pages otherwise
    return host


def host_pool(tree: Any) -> Any:
    """The tree's host KV pool (the anchor of a pool group from 0.5.23)."""
    host = tree.cache_controller.mem_pool_host
    anchor = getattr(host, "anchor_entry", None)
    return anchor.host_pool if anchor is not None else host
