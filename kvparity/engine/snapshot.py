"""A snapshot of one world after one stage (harness-driven) or one iteration of a scheduler loop
(scheduler-driven): everything SPEC section 7 says must be equal, as plain CPU values, plus what the
oracles need (each request's status and the slots it holds), the allocator's and the tree's sizes,
and (scheduler-driven) the scheduler's accounting. Whoever plays takes it through one interface,
``SnapshotSource``: kvparity's scheduler loop (``kvparity.engine.scheduler.Scheduler``), kvparity's
model of SGLang's event loop (``kvparity.engine.traffic_loop``) and the scheduler shell around a
release's own loop (``kvparity.engine.real.scheduler_shell``). The world's part is read alike for
both (``_world_state``); the requests' views differ: a stage's are complete (SPEC 7), an iteration's
hold what memory is made of (``memory_view``: status, row, protected length, outputs, what it holds)."""

from __future__ import annotations

import base64
import dataclasses
import functools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from kvparity.caches.host_pool import HostNode, HostState
from kvparity.caches.pool import PoolRecord, pools_from_plain, pools_to_plain
from kvparity.caches.state_pool import MambaState
from kvparity.caches.window_pool import WindowState
from kvparity.engine.scheduler import Scheduler, StageRecord, dtype_name
from kvparity.kernels import runtime

REQUEST_FIELDS = (
    "status",
    "fill_ids",
    "extend_input_len",
    "req_pool_idx",
    "cached_tokens",
    "already_computed",
    "extend_logprob_start_len",
    "last_matched_prefix_len",
    "output_len",
    "prefix_values",
)


@dataclass(frozen=True)
class RequestView:
    status: str
    fill_ids: tuple[int, ...]
    extend_input_len: int
    req_pool_idx: int | None
    cached_tokens: int
    already_computed: int
    extend_logprob_start_len: int
    last_matched_prefix_len: int
    output_len: int
    prefix_values: tuple[int, ...]
    prefix_kind: str  # e.g. "list", "torch.int64 cpu copy", "torch.int32 view of row 3"
    alias_row: int | None  # the req_to_token row a view prefix points into, else None
    held: tuple[int, ...]  # KV slots this request holds (for conservation)
    slotted: int = 0  # how many of its tokens have a KV slot: its row's live columns [0, slotted)


@dataclass(frozen=True)
class Snapshot:
    record: StageRecord
    req_to_token: torch.Tensor
    free_pages: torch.Tensor
    release_pages: torch.Tensor
    available_size: int
    free_rows: tuple[int, ...]
    tree: tuple
    tree_slots: tuple[int, ...]
    requests: dict[str, RequestView]
    evictable_size: int = 0  # the tree's (0 without a radix tree)
    protected_size: int = 0
    # What the scheduler's admission reckoned with (scheduler-driven only): ``new_token_ratio`` and
    # what the PrefillAdder of this iteration was given, as (name, value) pairs; shown, not compared.
    accounting: tuple[tuple[str, float], ...] = ()
    # The pools the world's cache kind adds beside the device's KV, by name (``kvparity.caches.pool``:
    # none for full attention); the judges ask the registry of pools, not these names.
    pools: dict[str, PoolRecord] = dataclasses.field(default_factory=dict)

    # The pools by name, typed, for what reads one pool's shapes (the traffic classes, the canary).
    @property
    def window(self) -> WindowState | None:
        """A sliding-window model's window pool (None: full attention)."""
        return self.pools.get("window")  # type: ignore[return-value]

    @property
    def states(self) -> MambaState | None:
        """A Mamba model's state pool (None: no Mamba layer)."""
        return self.pools.get("states")  # type: ignore[return-value]

    @property
    def host(self) -> HostState | None:
        """A host tier's pool (None: no host tier)."""
        return self.pools.get("host")  # type: ignore[return-value]

    @property
    def state_host(self) -> HostState | None:
        """A Mamba model's host tier's state pool (its nodes' host states)."""
        return self.pools.get("state_host")  # type: ignore[return-value]

    # Derived sets, computed once per snapshot: the oracles read each snapshot twice (as the
    # stage's "after", then as the next stage's "before") and several oracles need the same set.
    # A snapshot is never changed after it is taken, so nothing here goes stale.
    @functools.cached_property
    def free_list(self) -> list[int]:
        """Free page ids (slots when page_size is 1): ``free_pages`` then ``release_pages``."""
        return self.free_pages.tolist() + self.release_pages.tolist()

    @functools.cached_property
    def free_set(self) -> frozenset[int]:
        return frozenset(self.free_list)

    @functools.cached_property
    def tree_slot_set(self) -> frozenset[int]:
        return frozenset(self.tree_slots)

    @functools.cached_property
    def request_held(self) -> frozenset[int]:
        """Every KV slot some request holds (the tree's excluded)."""
        return frozenset().union(*(view.held for view in self.requests.values()))

    @functools.cached_property
    def held_slots(self) -> frozenset[int]:
        """Every KV slot held by the tree or by a request."""
        return self.tree_slot_set | self.request_held


def _alias_row(prefix: Any, table: torch.Tensor) -> int | None:
    if not isinstance(prefix, torch.Tensor) or prefix.numel() == 0:
        return None
    if prefix.untyped_storage().data_ptr() != table.untyped_storage().data_ptr():
        return None
    return (prefix.data_ptr() - table.data_ptr()) // (table.stride(0) * table.element_size())


def prefix_kind(prefix: Any, alias_row: int | None, *, golden: bool = False) -> str:
    """What a request's prefix is: "list", "torch.int64 cpu tensor", "torch.int32 view of row 3".
    A golden file's wording (``golden=True``) leaves the device out, so that one file holds on CPU
    and GPU, and says when a tensor is not contiguous: "int64 tensor", "int32 view of row 3"."""
    if not isinstance(prefix, torch.Tensor):
        return type(prefix).__name__
    if golden:
        kind = f"{dtype_name(prefix)} view of row {alias_row}" if alias_row is not None else f"{dtype_name(prefix)} tensor"
        return kind if prefix.is_contiguous() else kind + " (not contiguous)"
    if alias_row is not None:
        return f"{prefix.dtype} view of row {alias_row}"
    return _tensor_kind(prefix.dtype, prefix.device.type)


@functools.cache
def _tensor_kind(dtype: torch.dtype, device_type: str) -> str:
    # Formatting a dtype is slow next to the rest of a request's view, and there are few of them.
    return f"{dtype} {device_type} tensor"


# Tensors whose ``tolist`` already gives Python ints (a float or bool prefix, a bug, still goes
# through ``int`` as every list prefix does).
_INT_DTYPES = runtime.INT_DTYPES


def _prefix_values(prefix: Any, values: list[Any] | None) -> tuple[int, ...]:
    """The prefix's values as ints; ``values`` is a tensor prefix's ``tolist``, read already."""
    if isinstance(prefix, torch.Tensor):
        values = values or []
        return tuple(values) if prefix.dtype in _INT_DTYPES else tuple(map(int, values))
    return tuple(map(int, prefix))


def _view(fields: dict[str, Any]) -> RequestView:
    """``RequestView(**fields)`` without its ``__init__``: a frozen dataclass's ``__init__`` sets
    each field through ``object.__setattr__`` (and keywords cost a dict of their own), several
    times the cost of filling ``__dict__`` at once. The class has no ``__post_init__`` to skip;
    that ``fields`` names every field and nothing else is ``test_snapshot_views``'s to check."""
    view = object.__new__(RequestView)
    view.__dict__.update(fields)
    return view


def _request_view(scheduler: Scheduler, rid: str, host_rows: Any, read: list[Any] | None) -> RequestView:
    """``host_rows``: the snapshot's host copy of ``req_to_token`` as a NumPy array (a row's slice
    and ``tolist`` there cost a tenth of torch's); ``read``: the request's tensor prefix as a list
    (None for a list prefix)."""
    req = scheduler.reqs[rid]
    prefix = req.prefix_indices
    alias = _alias_row(prefix, scheduler.pool.req_to_token)
    prefix_values = _prefix_values(prefix, read)
    return _view({
        "status": scheduler.status[rid],
        "fill_ids": tuple(req.fill_ids),
        "extend_input_len": req.extend_input_len,
        "req_pool_idx": req.req_pool_idx,
        "cached_tokens": req.cached_tokens,
        "already_computed": req.already_computed,
        "extend_logprob_start_len": req.extend_logprob_start_len,
        "last_matched_prefix_len": req.last_matched_prefix_len,
        "output_len": len(req.output_ids),
        "prefix_values": prefix_values,
        "prefix_kind": prefix_kind(prefix, alias),
        "alias_row": alias,
        "held": tuple(scheduler.held_slots(rid, host_rows, prefix_values)),
        "slotted": scheduler.slotted[rid],
    })


def _host_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A CPU copy of ``tensor``. From the CPU, an integer tensor is copied by NumPy, in this thread:
    torch hands a table this size to its intra-op threads, several times slower here and worse
    when ``--jobs`` processes already take every core."""
    tensor = tensor.detach()
    if tensor.device.type == "cpu" and tensor.dtype in _INT_DTYPES:
        return torch.from_numpy(tensor.numpy().copy())
    return tensor.to("cpu", copy=True)


def _tensor_prefixes_read(scheduler: Scheduler) -> dict[str, list[Any]]:
    """Every request's tensor prefix as a list, read back from the device together."""
    tensors = {rid: req.prefix_indices for rid, req in scheduler.reqs.items() if isinstance(req.prefix_indices, torch.Tensor)}
    return dict(zip(tensors, runtime.host_lists(list(tensors.values()))))


def take_snapshot(scheduler: Scheduler, record: StageRecord) -> Snapshot:
    """A stage of kvparity's own scheduler loop (harness-driven)."""
    table = _host_copy(scheduler.pool.req_to_token)
    rows = table.numpy()  # shares the copy's memory
    read = _tensor_prefixes_read(scheduler)
    return Snapshot(
        record=record,
        req_to_token=table,
        requests={rid: _request_view(scheduler, rid, rows, read.get(rid)) for rid in scheduler.reqs},
        **_world_state(scheduler.world, scheduler.radix,
                       [req for rid, req in scheduler.reqs.items() if scheduler.status[rid] == "waiting"]),
    )


def iteration_snapshot(world: Any, radix: bool, record: StageRecord, requests: dict[str, RequestView], *,
                       width: int, accounting: tuple[tuple[str, float], ...] = (), reqs: Iterable[Any] = ()) -> Snapshot:
    """An iteration of a scheduler's event loop (scheduler-driven): the table's first ``width``
    columns only (a traffic run's rows are wider than any of its sequences; past them every cell
    still holds the poison, which the player checks), the requests' ``memory_view``s."""
    return Snapshot(record=record, req_to_token=_host_copy(world.req_to_token_pool.req_to_token[:, :width]),
                    requests=requests, accounting=accounting, **_world_state(world, radix, reqs))


def full_allocator(allocator: Any) -> Any:
    """The allocator of the full-attention pool: ``allocator`` itself, or a sliding-window model's
    full part (its window part is snapshotted apart)."""
    return getattr(allocator, "full_attn_allocator", allocator)


def released_pages(allocator: Any) -> torch.Tensor:
    """An allocator's freed pages waiting for the next sort: ``release_pages`` (None until the
    first free from 0.5.20), or from 0.5.21 the paged allocator's ``staged_pages`` list, in order."""
    staged = getattr(allocator, "staged_pages", None)
    if staged is not None:
        return torch.cat(staged) if staged else torch.empty((0,), dtype=torch.int64, device=allocator.device)
    if allocator.release_pages is None:
        return torch.empty((0,), dtype=torch.int64, device=allocator.device)
    return allocator.release_pages


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


def kv_in_flight(tree: Any) -> set[int]:
    """The host KV slots fetches from storage hold: each fetch's, and the pages one's transfer
    gives back, not yet released."""
    fetching = {int(s) for entry in getattr(tree, "ongoing_prefetch", {}).values() for s in _fetch_holds(entry)}
    return fetching | _releasing(getattr(tree.cache_controller, "host_mem_release_queue", None)) | \
        _ended_early(tree.cache_controller)


def _ended_early(controller: Any) -> set[int]:
    """The host slots past what it fetched that a fetch its policy ended early still holds: given
    back when its last acknowledgement (``completed_req``) is read, a pass later (UnifiedRadixCache's
    tier, 0.5.19 on; 0.5.23 only where the operation's ``ack_releases_incomplete_host_indices`` says)."""
    return {int(s) for op in _ended_early_operations(controller) if op.host_indices is not None
            for s in _host_copy(op.host_indices[op.completed_tokens:]).tolist()}


def _ended_early_operations(controller: Any) -> list[Any]:
    """The fetches whose last acknowledgement (``completed_req``) waits to be read, each to give back
    what it holds past what came: its KV slots' tail and, its extra pools' transfers not done, those."""
    acks = [ack for name in ("prefetch_sync_queue", "ack_prefetch_queue")
            for ack in list(getattr(getattr(controller, name, None), "queue", ()))]
    return [ack.operation for ack in acks if getattr(ack, "completed_req", False)
            and getattr(ack.operation, "ack_releases_incomplete_host_indices", True)]


def state_in_flight(tree: Any) -> set[int]:
    """The host state slots fetches from storage hold: a fetch's transfers of the Mamba pool, and
    the slots one gives back, queued for release (the controller's queue of that pool)."""
    fetching = {int(s) for entry in tree.ongoing_prefetch.values() for transfers in entry.comp_xfers.values()
                for transfer in transfers if transfer.name == STATE_POOL and transfer.host_indices is not None
                for s in _host_copy(transfer.host_indices).tolist()}
    queues = getattr(tree.cache_controller, "extra_host_mem_release_queues", {})
    ended = {int(s) for op in _ended_early_operations(tree.cache_controller)
             if not getattr(op, "pool_transfers_done", False) for transfer in (getattr(op, "pool_transfers", None) or ())
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


def state_allocator(req_to_token_pool: Any) -> Any:
    """Who hands out a Mamba model's state slots: the pool's ``mamba_allocator`` (0.5.13+), else
    its ``MambaPool`` (None for a request pool without states)."""
    allocator = getattr(req_to_token_pool, "mamba_allocator", None)
    return allocator if allocator is not None else getattr(req_to_token_pool, "mamba_pool", None)


def mamba_state(req_to_token_pool: Any, tree: Any, radix: bool, slots: tuple[int, ...],
                rows: tuple[int, ...], reqs: Iterable[Any] = ()) -> MambaState | None:
    """The state pool of a Mamba model's request pool (None for a request pool without one);
    ``slots`` and ``rows``: the pool's state slots and request rows, as its free lists held them
    when built (a padding row or slot is neither); ``reqs``: the player's waiting SGLang requests
    (a match may have taken a slot for one)."""
    allocator = state_allocator(req_to_token_pool)
    if allocator is None:
        return None
    in_use = sorted(set(rows) - set(int(r) for r in req_to_token_pool.free_slots))
    mapping = _host_copy(req_to_token_pool.req_index_to_mamba_index_mapping).tolist()
    kept = tree_state_slots(tree) if radix else []
    return MambaState(
        slots=slots, rows=tuple((row, int(mapping[row])) for row in in_use), waiting=_waiting_slots(reqs),
        tree=tuple(sorted(int(s) for s in kept)), free=tuple(int(s) for s in _host_copy(allocator.free_slots).tolist()),
        available_size=int(allocator.available_size()),
        evictable_size=int(tree.mamba_evictable_size()) if radix else 0,
        protected_size=int(tree.mamba_protected_size()) if radix else 0)


def _waiting_slots(reqs: Iterable[Any]) -> tuple[int, ...]:
    """The state slots of waiting requests that hold no row (the state fields are on ``req.kv``
    from 0.5.19)."""
    held = []
    for req in reqs:
        kv = getattr(req, "kv", req)
        slot = getattr(kv, "mamba_pool_idx", None)
        if slot is not None and getattr(kv, "req_pool_idx", None) is None:
            held.append(int(slot))
    return tuple(sorted(held))


def tree_state_slots(tree: Any) -> list[int]:
    """The state slots a Mamba tree keeps: ``all_mamba_values_flatten`` (0.5.7+), or before it each
    node's ``mamba_value``."""
    if hasattr(tree, "all_mamba_values_flatten"):
        return [int(s) for s in _host_copy(tree.all_mamba_values_flatten()).tolist()]
    return [int(s) for node in tree._collect_all_nodes() if node.mamba_value is not None
            for s in node.mamba_value.tolist()]


def full_sizes(tree: Any) -> tuple[int, int]:
    """The tree's evictable and protected sizes in the full pool (a sliding-window tree of its own,
    up to 0.5.15, raises on the plain ones: its ``full_*`` ones say it)."""
    try:
        return int(tree.evictable_size()), int(tree.protected_size())
    except NotImplementedError:
        return int(tree.full_evictable_size()), int(tree.full_protected_size())


def _world_state(world: Any, radix: bool, reqs: Iterable[Any] = ()) -> dict[str, Any]:
    """The pools', the allocator's and the tree's part of a snapshot (``reqs``: the player's waiting
    SGLang requests, for the state slots their matches took)."""
    allocator = full_allocator(world.allocator)
    tree = tuple(tuple(e) for e in world.tree_contents()) if radix else ()
    evictable, protected = full_sizes(world.tree_cache) if radix else (0, 0)
    return {
        "free_pages": _host_copy(allocator.free_pages),
        "release_pages": _host_copy(world.release_pages()),
        "available_size": int(allocator.available_size()),
        "free_rows": tuple(int(r) for r in world.req_to_token_pool.free_slots),
        "tree": tree,
        "tree_slots": tuple(slot for entry in tree for slot in entry[2]),  # read as a set: the nodes' order
        "evictable_size": evictable,
        "protected_size": protected,
        "pools": _pools(world, radix, reqs),
    }


def _pools(world: Any, radix: bool, reqs: Iterable[Any]) -> dict[str, PoolRecord]:
    """The records of the pools ``world`` has beside its device KV (none for full attention)."""
    found: dict[str, PoolRecord | None] = {
        "window": window_state(world.allocator, world.tree_cache, radix),
        "states": None if getattr(world, "mamba", None) is None else mamba_state(
            world.req_to_token_pool, world.tree_cache, radix, world.state_slots, world.request_rows, reqs),
        "host": None if getattr(world, "host_pool", None) is None else host_state(
            world.host_pool, world.host_nodes(), kv_in_flight(world.tree_cache),
            **controller_counts(world.tree_cache.cache_controller)),
        "state_host": None if getattr(world, "state_host_pool", None) is None else host_state(
            world.state_host_pool, world.state_host_nodes(), state_in_flight(world.tree_cache)),
    }
    return {name: record for name, record in found.items() if record is not None}


def memory_view(status: str, row: int | None, protected_len: int, output_len: int, held: tuple[int, ...],
                slotted: int) -> RequestView:
    """A request as a scheduler-driven snapshot sees it: its status, its row, the length of the
    prefix the tree owns (SGLang's protected length), its outputs, the slots it holds and its live
    columns. What else a stage's view holds (fill ids, prefix values and type, the extend's
    counters) is the scheduler's bookkeeping, each generation's own: left empty, alike for every
    player, and compared through the decisions instead."""
    return _view({"status": status, "fill_ids": (), "extend_input_len": 0, "req_pool_idx": row, "cached_tokens": 0,
                  "already_computed": 0, "extend_logprob_start_len": 0, "last_matched_prefix_len": protected_len,
                  "output_len": output_len, "prefix_values": (), "prefix_kind": "", "alias_row": None, "held": held,
                  "slotted": slotted})


# ---- plain data, for snapshots that cross a process boundary (real SGLang worlds) -----------------
_TENSORS = ("req_to_token", "free_pages", "release_pages")
_NESTED_RECORD_FIELDS = ("prefix_values", "write_region")


def _tensor_to_plain(t: torch.Tensor) -> dict[str, Any]:
    """A CPU tensor's bytes, base64 (a table or a free list is thousands of ints: turning each into
    a JSON number and back costs more than the rest of a snapshot)."""
    raw = t.detach().contiguous().numpy().tobytes()
    return {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "bytes": base64.b64encode(raw).decode()}


def _tensor_from_plain(d: dict[str, Any]) -> torch.Tensor:
    dtype = getattr(torch, d["dtype"])
    raw = bytearray(base64.b64decode(d["bytes"]))  # writable: torch.frombuffer warns on read-only memory
    flat = torch.frombuffer(raw, dtype=dtype) if raw else torch.empty((0,), dtype=dtype)
    return flat.reshape(d["shape"])


def snapshot_to_plain(snap: Snapshot) -> dict[str, Any]:
    """Everything in ``snap`` as ints, strings, lists and dicts (tensors keep their dtype)."""
    return {
        "record": snap.record.to_plain(),
        **{name: _tensor_to_plain(getattr(snap, name)) for name in _TENSORS},
        "available_size": snap.available_size,
        "free_rows": list(snap.free_rows),
        "tree": [list(e) for e in snap.tree],
        "tree_slots": list(snap.tree_slots),
        "requests": {rid: list(view.__dict__.values()) for rid, view in snap.requests.items()},
        "evictable_size": snap.evictable_size,
        "protected_size": snap.protected_size,
        "accounting": [list(pair) for pair in snap.accounting],
        **pools_to_plain(snap.pools),
    }


_VIEW_FIELDS = tuple(f.name for f in dataclasses.fields(RequestView))


def _view_fields(values: list[Any]) -> dict[str, Any]:
    """A view's fields from its values in field order (``snapshot_to_plain`` sends no names)."""
    return {k: (tuple(v) if isinstance(v, list) else v) for k, v in zip(_VIEW_FIELDS, values)}


def snapshot_from_plain(data: dict[str, Any]) -> Snapshot:
    """The inverse of ``snapshot_to_plain``."""
    record = StageRecord.from_plain(data["record"])
    requests = {
        rid: _view(_view_fields(values))
        for rid, values in data["requests"].items()
    }
    return Snapshot(
        record=record,
        **{name: _tensor_from_plain(data[name]) for name in _TENSORS},
        available_size=data["available_size"],
        free_rows=tuple(data["free_rows"]),
        tree=tuple((e[0], tuple(e[1]), tuple(e[2]), e[3]) for e in data["tree"]),
        tree_slots=tuple(data["tree_slots"]),
        requests=requests,
        evictable_size=data["evictable_size"],
        protected_size=data["protected_size"],
        accounting=tuple((str(k), v) for k, v in data["accounting"]),
        pools=pools_from_plain(data),
    )
