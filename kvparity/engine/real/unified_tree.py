"""Snapshots of a real SGLang ``UnifiedRadixCache`` tree (0.5.19 on), for either TreeCore.

Worker side only (SGLang is imported lazily). Scope: component FULL (a hybrid model's tree too:
its FULL component), any page size, no
HiCache/storage, no EAGLE bigram keys; anything else raises ``UnifiedTreeUnsupported``.

- ``tree_core_kind(cache)``: "rust" or "python", the core actually built (SGLang falls back to
  the Python core with only an INFO log when the Rust one cannot be used).
- ``unified_tree_nodes(cache)``: ``(extra_key, full token path, node slots, FULL lock_ref)`` per
  non-root node, sorted as the adapter's ``tree_contents``; identical for identical trees on both
  cores.

The Python core is walked directly (``root_node`` / ``children`` / ``key`` /
``component_data[FULL]``). The Rust core has no node objects, no ``root_node``/``node_by_id``
(both raise ``NotImplementedError``), no node enumeration and no lock-count accessor, so its dump
is built from:

- ``pretty_print()`` (text, the one listing of node ids; written by Rust to file descriptor 1, so
  the descriptor is captured): node ids and each node's FULL ``lock_ref`` (``full_lock=N``);
- ``backfill_missing_hash_values()`` then ``snapshot_buffer_backup(id, False)``: the node's own
  token ids, ``extra_key`` and parent id (the snapshot is None for a node without page hashes,
  and without storage the core hashes no node, hence the backfill; it only sets page hashes,
  which nothing reads unless HiCache, storage or an external linker is wired);
- ``get_component_device_value(id, FULL)``: the node's slots;
- ``total_size()``: a check that the listing covered every slot of the tree.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

from kvparity.caches.host_pool import HostNode, in_tree_order
from kvparity.engine.real import RealSGLangError
from kvparity.engine.real.versions import VersionEntry

NodeEntry = tuple[str | None, tuple[int, ...], tuple[int, ...], int]

_RUST_ADAPTER = "sglang.srt.mem_cache.rust_tree_core.adapter"
# One pretty_print line: indent, "[node id]", key length, "full_lock=N", then "Full=yes|no".
_LINE = re.compile(r"^\s*\[(\d+)\]\s+(\d+)\s+full_lock=(-?\d+)\s")


class UnifiedTreeUnsupported(RealSGLangError):
    """The cache or its TreeCore lacks what a snapshot needs; the message names what."""


def _components(cache: Any) -> tuple[Any, ...]:
    """The cache's components, FULL first; their enum is the release's ``ComponentType`` (its module
    moved in 0.5.17)."""
    components = tuple(getattr(cache, "tree_components", ()) or ())
    types = type(components[0]) if components else None
    # A hybrid model's tree: its FULL component is dumped (a window's mapping and a Mamba model's
    # state slots are snapshotted from the pools and ``all_mamba_values_flatten``, issue 34).
    if types is None or components not in ((types.FULL,), (types.FULL, types.SWA), (types.FULL, types.MAMBA)):
        raise UnifiedTreeUnsupported(f"tree_components={components}: only FULL, alone or with SWA or MAMBA, "
                                     f"are supported")
    return components


def _core(cache: Any, entry: VersionEntry) -> Any:
    """The tree's core: its ``tree_core`` (0.5.17+, the entry's ``unified_tree_core``), or (0.5.16,
    nodes in the class) the cache itself."""
    _components(cache)  # refuses a tree that is no UnifiedRadixCache
    return cache.tree_core if entry.unified_tree_core else cache


def tree_core_kind(cache: Any, entry: VersionEntry) -> str:
    """'rust', 'python' or 'in-class' (0.5.16): the TreeCore the cache really holds (not what was asked)."""
    core = _core(cache, entry)
    if core is cache:
        return "in-class"
    # Look the Rust adapter up in sys.modules instead of importing it: importing loads the
    # extension, and a core that was never loaded cannot be a Rust core.
    rust = sys.modules.get(_RUST_ADAPTER)
    if rust is not None and isinstance(core, rust.RustUnifiedTreeCore):
        return "rust"
    from sglang.srt.mem_cache.unified_cache.unified_tree_core import UnifiedTreeCore

    if isinstance(core, UnifiedTreeCore):
        return "python"
    raise UnifiedTreeUnsupported(f"unknown TreeCore class {type(core).__module__}.{type(core).__qualname__}")


def unified_tree_nodes(cache: Any, entry: VersionEntry) -> list[NodeEntry]:
    """One ``(extra_key, full token path, node slots, FULL lock_ref)`` per non-root node, sorted
    by (extra_key is not None, extra_key or "", path, slots, lock). On the Rust core this backfills
    page hashes (see the module docstring) and parses ``pretty_print`` for node ids and locks,
    because the Rust core exposes neither through a structured accessor."""
    if getattr(cache, "disable", False):
        return []  # a disabled tree holds nothing (and keeps no nodes to walk)
    kind = tree_core_kind(cache, entry)
    full = _components(cache)[0]
    entries = _rust_nodes(cache.tree_core, full) if kind == "rust" else _python_nodes(_core(cache, entry), full)
    return sorted(entries, key=lambda e: (e[0] is not None, e[0] or "", e[1], e[2], e[3]))


# --------------------------------------------------------------------------- the Python core


def _python_nodes(core: Any, full: Any) -> list[NodeEntry]:
    """The nodes holding device KV (a host tier's host-only nodes hold none: ``host_nodes``)."""
    out: list[NodeEntry] = []
    for node, path, data in _walk(core, full):
        if data.value is None:
            if getattr(data, "host_value", None) is None:
                raise UnifiedTreeUnsupported(f"node {node.id} has neither a FULL device value nor a host value")
            continue
        out.append((node.key.extra_key, path, tuple(int(v) for v in data.value.tolist()), int(data.lock_ref)))
    return out


def _walk(core: Any, full: Any) -> Iterator[tuple[Any, tuple[int, ...], Any]]:
    """Every non-root node of the Python core, its full token path and its component ``full`` (the
    FULL one, unless another is asked for)."""
    stack: list[tuple[Any, tuple[int, ...]]] = [(child, ()) for child in core.root_node.children.values()]
    while stack:
        node, prefix = stack.pop()
        if node.key.is_bigram:
            raise UnifiedTreeUnsupported("bigram (EAGLE) tree keys are not supported")
        path = prefix + tuple(int(t) for t in node.key.raw_token_ids())
        yield node, path, node.component_data[full]
        stack.extend((child, path) for child in node.children.values())


def host_nodes(cache: Any, entry: VersionEntry) -> list[HostNode]:
    """A host tier's nodes with host KV or listed by a load-back (``HostNode``), sorted by path
    (the Python core; the Rust core lists no host values)."""
    if tree_core_kind(cache, entry) == "rust":
        raise UnifiedTreeUnsupported("a host tier's nodes are read from the Python tree core only")
    listed = _listed(cache, entry)
    out = [HostNode(path, () if data.host_value is None else tuple(int(v) for v in data.host_value.tolist()),
                    None if data.value is None else tuple(int(v) for v in data.value.tolist()),
                    *listed(node), node.key.extra_key)
           for node, path, data in _walk(_core(cache, entry), _components(cache)[0])
           if data.host_value is not None or listed(node)[1]]
    return in_tree_order(out)


def _listed(cache: Any, entry: VersionEntry) -> Callable[[Any], tuple[bool, bool]]:
    """Whether a backup and a load-back list a node: on the node from 0.5.18 (the entry's
    ``node_pending_ids``), in the cache's tables of ongoing transfers before (by node id in 0.5.17,
    the entry's ``unified_tree_core``; the node itself in 0.5.16)."""
    if entry.node_pending_ids:
        return lambda node: (node.write_through_pending_id is not None, node.load_back_pending_id is not None)

    def ids(table: dict[Any, Any]) -> set[int]:
        return {e.node_id if entry.unified_tree_core else e.node.id for e in table.values()}
    writing, loading = ids(cache.ongoing_write_through), ids(cache.ongoing_load_back)
    return lambda node: (node.id in writing, node.id in loading)


def state_host_nodes(cache: Any, entry: VersionEntry) -> list[HostNode]:
    """A Mamba model's nodes with a host state (``HostNode``: its one host slot, its device state
    slot or None), sorted by path (the Python core)."""
    if tree_core_kind(cache, entry) == "rust":
        raise UnifiedTreeUnsupported("a host tier's nodes are read from the Python tree core only")
    mamba, listed = _components(cache)[1], _listed(cache, entry)
    out = [HostNode(path, tuple(int(v) for v in data.host_value.tolist()),
                    None if data.value is None else tuple(int(v) for v in data.value.tolist()),
                    *listed(node), node.key.extra_key)
           for node, path, data in _walk(_core(cache, entry), mamba) if data.host_value is not None]
    return in_tree_order(out)


# --------------------------------------------------------------------------- the Rust core


def _capture_fd1(fn: Callable[[], object]) -> str:
    """What ``fn`` writes to file descriptor 1 (Rust's stdout bypasses ``sys.stdout``)."""
    sys.stdout.flush()
    with tempfile.TemporaryFile() as tmp:
        saved = os.dup(1)
        try:
            os.dup2(tmp.fileno(), 1)
            fn()  # Rust's stdout is line-buffered and every printed line ends in a newline
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        tmp.seek(0)
        return tmp.read().decode()


def _rust_nodes(core: Any, full: Any) -> list[NodeEntry]:
    if type(core._binding).__name__ != "RustUnifiedTreeCoreBinding":
        raise UnifiedTreeUnsupported(f"Rust binding {type(core._binding).__name__}: only unigram keys are supported")
    listing: list[tuple[int, int, int]] = []  # (node id, key length, FULL lock_ref), parents first
    for line in _capture_fd1(core.pretty_print).splitlines():
        if not line.strip():
            continue
        m = _LINE.match(line + " ")
        if m is None:
            raise UnifiedTreeUnsupported(f"the Rust core's pretty_print wrote an unexpected line: {line!r}")
        listing.append((int(m[1]), int(m[2]), int(m[3])))
    if not listing or not core.is_root(listing[0][0]):
        raise UnifiedTreeUnsupported("the Rust core's pretty_print did not start with the root node")
    # The only accessor giving a node's tokens is snapshot_buffer_backup, which needs page hashes.
    core.backfill_missing_hash_values()
    paths: dict[int, tuple[int, ...]] = {listing[0][0]: ()}
    out: list[NodeEntry] = []
    held = 0
    for node_id, key_len, lock in listing[1:]:
        snap = core.snapshot_buffer_backup(node_id, False)
        if snap is None:
            raise UnifiedTreeUnsupported(f"the Rust core gave no key for node {node_id} (no FULL value or no hashes)")
        if snap.parent_node_id not in paths:
            raise UnifiedTreeUnsupported(f"node {node_id}'s parent {snap.parent_node_id} was not listed before it")
        if snap.key.is_bigram:
            raise UnifiedTreeUnsupported("bigram (EAGLE) tree keys are not supported")
        tokens = tuple(int(t) for t in snap.key.raw_token_ids())
        if len(tokens) != key_len:
            raise UnifiedTreeUnsupported(f"node {node_id}: key of {len(tokens)} tokens, pretty_print says {key_len}")
        value = core.get_component_device_value(node_id, full)
        if value is None:
            raise UnifiedTreeUnsupported(f"node {node_id} has no FULL device value (host-only nodes are not supported)")
        path = paths[snap.parent_node_id] + tokens
        paths[node_id] = path
        slots = tuple(int(v) for v in value.tolist())
        held += len(slots)
        out.append((snap.key.extra_key, path, slots, lock))
    full_total, _aux = core.total_size()
    if held != full_total:
        raise UnifiedTreeUnsupported(f"the listed nodes hold {held} slots, the Rust core's total_size says {full_total}")
    return out
