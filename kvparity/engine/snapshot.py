"""A snapshot of one world after one stage (harness-driven) or one iteration of a scheduler loop
(scheduler-driven): everything SPEC section 7 says must be equal, as plain CPU values, plus what the
oracles need (each request's status and the slots it holds), the allocator's and the tree's sizes,
and (scheduler-driven) the scheduler's accounting. Whoever plays takes it through one interface,
``SnapshotSource``: kvparity's scheduler loop (``kvparity.engine.scheduler.Scheduler``), kvparity's
model of SGLang's event loop (``kvparity.engine.traffic_loop``) and the scheduler shell around a
release's own loop (``kvparity.engine.real.scheduler_shell``). The world's part is read alike for
both (``_world_state``; the pools beside the device's KV as the world reads them, its
``pool_records``); the requests' views differ: a stage's are complete (SPEC 7), an iteration's
hold what memory is made of (``memory_view``: status, row, protected length, outputs, what it holds)."""

from __future__ import annotations

import base64
import dataclasses
import functools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from kvparity.caches.host_pool import POOL as HOST_POOL
from kvparity.caches.host_pool import HostState
from kvparity.caches.pool import PoolRecord, pools_from_plain, pools_to_plain
from kvparity.caches.window_pool import POOL as WINDOW_POOL
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

    # Two pools by name, typed, for the readers above the kinds that ask for one (the window-OOM
    # oracle, the drive's steering by storage faults); a kind's own readers ask its pool (``Pool.record``).
    @property
    def window(self) -> WindowState | None:
        """A sliding-window model's window pool (None: full attention)."""
        return WINDOW_POOL.record(self.pools)

    @property
    def host(self) -> HostState | None:
        """A host tier's pool (None: no host tier)."""
        return HOST_POOL.record(self.pools)

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
        "pools": world.pool_records(radix, reqs),
    }


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
