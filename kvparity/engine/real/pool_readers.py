"""What a real world's pools beside its device KV hold after a stage or an iteration, read from the
release's own objects: a sliding-window model's window pool, a Mamba model's state pool, a host
tier's pool and a Mamba model's host state pool, as the records ``kvparity.caches`` registers
(``RealWorld.pool_records``; kvparity's own worlds have none). Also the names of the counts
kvparity keeps on a host tier's cache controller (``host_tier`` counts, this module reads)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from kvparity.caches.host_pool import POOL as HOST_POOL
from kvparity.caches.host_pool import STATE_POOL as STATE_HOST_POOL
from kvparity.caches.host_pool import HostNode, HostState
from kvparity.caches.pool import PoolRecord
from kvparity.caches.state_pool import POOL as STATES_POOL
from kvparity.caches.state_pool import MambaState
from kvparity.caches.window_pool import POOL as WINDOW_POOL
from kvparity.caches.window_pool import WindowState
from kvparity.engine.real.versions import VersionEntry
from kvparity.engine.snapshot import _host_copy, released_pages


def pool_records(world: Any, radix: bool, reqs: Iterable[Any]) -> dict[str, PoolRecord]:
    """The records of the pools a real world has beside its device KV (none for full attention),
    by the names ``kvparity.caches`` registers them under (``reqs``: the player's waiting SGLang
    requests, for the state slots their matches took)."""
    found: dict[str, PoolRecord | None] = {
        WINDOW_POOL.name: window_state(world.allocator, world.tree_cache, radix),
        STATES_POOL.name: None if getattr(world, "mamba", None) is None else mamba_state(
            world.entry, world.req_to_token_pool, world.tree_cache, radix, world.state_slots, world.request_rows, reqs),
        HOST_POOL.name: None if getattr(world, "host_pool", None) is None else host_state(
            world.host_pool, world.host_nodes(), kv_in_flight(world.tree_cache, world.entry),
            **controller_counts(world.tree_cache.cache_controller)),
        STATE_HOST_POOL.name: None if getattr(world, "state_host_pool", None) is None else host_state(
            world.state_host_pool, world.state_host_nodes(), state_in_flight(world.tree_cache, world.entry)),
    }
    return {name: record for name, record in found.items() if record is not None}


def window_state(allocator: Any, tree: Any, radix: bool) -> WindowState | None:
    """The window pool of a sliding-window model's allocator (None for any other allocator)."""
    window = getattr(allocator, "swa_attn_allocator", None)
    if window is None or window is getattr(allocator, "full_attn_allocator", None):  # an all-window pool
        return None
    mapping = _host_copy(allocator.full_to_swa_index_mapping[:-1])  # the last entry is a -1 sentinel
    full = torch.nonzero(mapping > 0).flatten()
    free = torch.cat([_host_copy(window.free_pages), _host_copy(released_pages(window))])
    return WindowState(
        slots=int(window.size), page_size=int(getattr(window, "page_size", 1)),
        mapped=tuple(zip(full.tolist(), mapping[full].tolist())), free=tuple(free.tolist()),
        available_size=int(window.available_size()),
        evictable_size=int(tree.swa_evictable_size()) if radix else 0,
        protected_size=int(tree.swa_protected_size()) if radix else 0)


# The name of a Mamba model's state pool among a host pool group's (SGLang's PoolName.MAMBA, a str enum).
STATE_POOL = "mamba"
# The tokens a cache controller's page transfers brought from storage, counted where kvparity runs
# its transfer thread's loop (``host_tier``), kept on the controller under this name.
FETCHED_TOKENS = "kvparity_fetched_tokens"
# The storage calls SGLang's failure injector failed, by name (the nemesis's storage faults), listed
# where kvparity seeds the injector (``host_tier``), kept on the controller under this name.
STORAGE_FAULTS = "kvparity_storage_faults"
# The prefetches from storage the release's own policy ended before every page came, counted where
# kvparity runs the storage tier (``host_tier``), kept on the controller under this name.
PREFETCHES_CUT = "kvparity_prefetches_cut"
# The controller's backups (device to host) and load-backs (host to device) that found no room and
# returned None, counted where kvparity builds the tier (``host_tier``), kept on the controller.
BACKUPS_REFUSED = "kvparity_backups_refused"
LOADS_REFUSED = "kvparity_loads_refused"


def controller_counts(controller: Any) -> dict[str, Any]:
    """What kvparity counted on a host tier's cache controller (``HostState``'s fields of the same names)."""
    return {"fetched": int(getattr(controller, FETCHED_TOKENS, 0)),
            "storage_faults": tuple(getattr(controller, STORAGE_FAULTS, ())),
            "prefetches_cut": int(getattr(controller, PREFETCHES_CUT, 0)),
            "backups_refused": int(getattr(controller, BACKUPS_REFUSED, 0)),
            "loads_refused": int(getattr(controller, LOADS_REFUSED, 0))}


def host_state(host_pool: Any, nodes: list[HostNode], in_flight: set[int], **counts: Any) -> HostState:
    """A host tier's pool (the KV's, or a Mamba model's states'): its free slots (the free list and,
    from 0.5.20, the freed chunks not yet merged back into it), the tree's nodes holding host
    values (``HostNode``s), the slots fetches from storage hold; ``counts``: what kvparity counted on
    its controller (``controller_counts``: the tokens fetched so far, ...)."""
    released = [_host_copy(t) for t in getattr(host_pool, "release_slots", ()) if t is not None]
    free = torch.cat([_host_copy(host_pool.free_slots), *released]) if released else _host_copy(host_pool.free_slots)
    return HostState(slots=int(host_pool.size), free=tuple(int(s) for s in free.tolist()),
                     nodes=tuple(nodes), available_size=int(host_pool.available_size()),
                     in_flight=tuple(sorted(in_flight)), **counts)


def kv_in_flight(tree: Any, entry: VersionEntry) -> set[int]:
    """The host KV slots fetches from storage hold: each fetch's, and the pages one's transfer
    gives back, not yet released."""
    fetching = {int(s) for entry in getattr(tree, "ongoing_prefetch", {}).values() for s in _fetch_holds(entry)}
    return fetching | _releasing(getattr(tree.cache_controller, "host_mem_release_queue", None)) | \
        _ended_early(tree.cache_controller, entry)


def _ended_early(controller: Any, entry: VersionEntry) -> set[int]:
    """The host slots past what it fetched that a fetch its policy ended early still holds: given
    back when its last acknowledgement (``completed_req``) is read, a pass later (UnifiedRadixCache's
    tier, 0.5.19 on; 0.5.23 only where the operation's ``ack_releases_incomplete_host_indices`` says)."""
    return {int(s) for op in _ended_early_operations(controller, entry) if op.host_indices is not None
            for s in _host_copy(op.host_indices[op.completed_tokens:]).tolist()}


def _ended_early_operations(controller: Any, entry: VersionEntry) -> list[Any]:
    """The fetches whose last acknowledgement (``completed_req``) waits to be read, each to give back
    what it holds past what came: its KV slots' tail and, its extra pools' transfers not done, those
    (none before 0.5.19: the entry's ``prefetch_acks``; the sync queue is None without storage)."""
    if not entry.prefetch_acks:
        return []
    acks = [ack for queue in (controller.prefetch_sync_queue, controller.ack_prefetch_queue) if queue is not None
            for ack in list(queue.queue)]
    return [ack.operation for ack in acks if ack.completed_req
            and getattr(ack.operation, "ack_releases_incomplete_host_indices", True)]


def state_in_flight(tree: Any, entry: VersionEntry) -> set[int]:
    """The host state slots fetches from storage hold: a fetch's transfers of the Mamba pool, and
    the slots one gives back, queued for release (the controller's queue of that pool)."""
    fetching = {int(s) for entry in tree.ongoing_prefetch.values() for transfers in entry.comp_xfers.values()
                for transfer in transfers if transfer.name == STATE_POOL and transfer.host_indices is not None
                for s in _host_copy(transfer.host_indices).tolist()}
    queues = getattr(tree.cache_controller, "extra_host_mem_release_queues", {})
    ended = {int(s) for op in _ended_early_operations(tree.cache_controller, entry)
             if not op.pool_transfers_done for transfer in (op.pool_transfers or ())
             if transfer.name == STATE_POOL and transfer.host_indices is not None
             for s in _host_copy(transfer.host_indices).tolist()}
    return fetching | _releasing(queues.get(STATE_POOL)) | ended


def _releasing(queue: Any) -> set[int]:
    """The host slots a controller's release queue holds, not yet freed (None: no queue)."""
    pages = list(queue.queue) if queue is not None else []
    return {int(s) for page in pages if page is not None for s in _host_copy(page).tolist()}


def _fetch_holds(entry: Any) -> list[int]:
    """The host slots a fetch the tree still lists holds: all it was given, but once its transfer
    ended (a read that failed, or its policy: the operation is terminated) what came alone. The
    rest is given back by its IO thread at once (``prefetch_io_aux_func``: HiRadixCache, and
    UnifiedRadixCache to 0.5.18, while the tree lists the fetch until the scheduler next checks
    it), or held until its last acknowledgement is read (``_ended_early``, UnifiedRadixCache 0.5.19
    on), or waits in the release queue (``_releasing``)."""
    slots, operation = _fetch_of(entry)
    if slots is None:
        return []
    return _host_copy(slots[:operation.completed_tokens] if operation.is_terminated() else slots).tolist()


def _fetch_of(entry: Any) -> tuple[Any, Any]:
    """A fetch's host slots and transfer: UnifiedRadixCache's entry names both (``_OngoingPrefetch``);
    HiRadixCache's plain tuple ends with the transfer, whose slots are those the storage hit kept."""
    if hasattr(entry, "operation"):
        return entry.host_indices, entry.operation
    return entry[-1].host_indices, entry[-1]


def state_allocator(req_to_token_pool: Any, entry: VersionEntry) -> Any:
    """Who hands out a Mamba model's state slots: its request pool's ``mamba_allocator`` (0.5.13+,
    the entry's ``mamba_allocator``), else its ``MambaPool``."""
    return req_to_token_pool.mamba_allocator if entry.mamba_allocator else req_to_token_pool.mamba_pool


def mamba_state(entry: VersionEntry, req_to_token_pool: Any, tree: Any, radix: bool, slots: tuple[int, ...],
                rows: tuple[int, ...], reqs: Iterable[Any] = ()) -> MambaState:
    """The state pool of a Mamba model's request pool; ``slots`` and ``rows``: the pool's state
    slots and request rows, as its free lists held them when built (a padding row or slot is
    neither); ``reqs``: the player's waiting SGLang requests (a match may have taken a slot for one)."""
    allocator = state_allocator(req_to_token_pool, entry)
    in_use = sorted(set(rows) - set(int(r) for r in req_to_token_pool.free_slots))
    mapping = _host_copy(req_to_token_pool.req_index_to_mamba_index_mapping).tolist()
    kept = tree_state_slots(tree, entry) if radix else []
    return MambaState(
        slots=slots, rows=tuple((row, int(mapping[row])) for row in in_use), waiting=_waiting_slots(reqs, entry),
        tree=tuple(sorted(int(s) for s in kept)), free=tuple(int(s) for s in _host_copy(allocator.free_slots).tolist()),
        available_size=int(allocator.available_size()),
        evictable_size=int(tree.mamba_evictable_size()) if radix else 0,
        protected_size=int(tree.mamba_protected_size()) if radix else 0)


def state_fields(req: Any, entry: VersionEntry) -> Any:
    """Where a request keeps its row and state slot: ``req.kv`` from 0.5.19 (the entry's
    ``req_kv_info``); the request itself before (0.5.16 to 0.5.18 have a ``req.kv`` of their own,
    a ``ReqKvInfo`` set only while the request holds KV)."""
    return req.kv if entry.req_kv_info else req


def _waiting_slots(reqs: Iterable[Any], entry: VersionEntry) -> tuple[int, ...]:
    """The state slots of waiting requests that hold no row."""
    held = []
    for req in reqs:
        kv = state_fields(req, entry)
        if kv.mamba_pool_idx is not None and kv.req_pool_idx is None:
            held.append(int(kv.mamba_pool_idx))
    return tuple(sorted(held))


def tree_state_slots(tree: Any, entry: VersionEntry) -> list[int]:
    """The state slots a Mamba tree keeps: ``all_mamba_values_flatten`` (0.5.7+, the entry's
    ``mamba_values_flatten``: MambaRadixCache's and UnifiedRadixCache's), or before it each node's
    ``mamba_value``."""
    if entry.mamba_values_flatten:
        return [int(s) for s in _host_copy(tree.all_mamba_values_flatten()).tolist()]
    return [int(s) for node in tree._collect_all_nodes() if node.mamba_value is not None
            for s in node.mamba_value.tolist()]
