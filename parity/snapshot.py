"""A snapshot of one world after one stage: everything SPEC section 7 says must be equal, as plain
CPU values, plus what the oracles need (each request's status and the slots it holds)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from parity.scheduler import Scheduler, StageRecord

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


@dataclass
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


def _alias_row(prefix: Any, table: torch.Tensor) -> int | None:
    if not isinstance(prefix, torch.Tensor) or prefix.numel() == 0:
        return None
    if prefix.untyped_storage().data_ptr() != table.untyped_storage().data_ptr():
        return None
    return (prefix.data_ptr() - table.data_ptr()) // (table.stride(0) * table.element_size())


def _prefix_kind(prefix: Any, alias_row: int | None) -> str:
    if not isinstance(prefix, torch.Tensor):
        return type(prefix).__name__
    if alias_row is not None:
        return f"{prefix.dtype} view of row {alias_row}"
    return f"{prefix.dtype} {prefix.device.type} tensor"


def _request_view(scheduler: Scheduler, rid: str) -> RequestView:
    req = scheduler.reqs[rid]
    table = scheduler.pool.req_to_token
    prefix = req.prefix_indices
    alias = _alias_row(prefix, table)
    values = prefix.tolist() if isinstance(prefix, torch.Tensor) else list(prefix)
    return RequestView(
        status=scheduler.status[rid],
        fill_ids=tuple(req.fill_ids),
        extend_input_len=req.extend_input_len,
        req_pool_idx=req.req_pool_idx,
        cached_tokens=req.cached_tokens,
        already_computed=req.already_computed,
        extend_logprob_start_len=req.extend_logprob_start_len,
        last_matched_prefix_len=req.last_matched_prefix_len,
        output_len=len(req.output_ids),
        prefix_values=tuple(int(v) for v in values),
        prefix_kind=_prefix_kind(prefix, alias),
        alias_row=alias,
        held=tuple(scheduler.held_slots(rid)),
        slotted=scheduler.slotted[rid],
    )


def take_snapshot(scheduler: Scheduler, record: StageRecord) -> Snapshot:
    world = scheduler.world
    allocator = world.allocator
    radix = scheduler.scenario.cache_kind == "radix"
    return Snapshot(
        record=record,
        req_to_token=scheduler.pool.req_to_token.detach().to("cpu", copy=True),
        free_pages=allocator.free_pages.detach().to("cpu", copy=True),
        release_pages=allocator.release_pages.detach().to("cpu", copy=True),
        available_size=int(allocator.available_size()),
        free_rows=tuple(int(r) for r in scheduler.pool.free_slots),
        tree=tuple(tuple(e) for e in world.tree_contents()) if radix else (),
        tree_slots=tuple(world.all_tree_slots()) if radix else (),
        requests={rid: _request_view(scheduler, rid) for rid in scheduler.reqs},
    )


# ---- plain data, for snapshots that cross a process boundary (real SGLang worlds) -----------------
_TENSORS = ("req_to_token", "free_pages", "release_pages")
_NESTED_RECORD_FIELDS = ("prefix_values", "write_region")


def _tensor_to_plain(t: torch.Tensor) -> dict[str, Any]:
    return {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "values": t.reshape(-1).tolist()}


def _tensor_from_plain(d: dict[str, Any]) -> torch.Tensor:
    return torch.tensor(d["values"], dtype=getattr(torch, d["dtype"])).reshape(d["shape"])


def _tuples(value: Any) -> Any:
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def snapshot_to_plain(snap: Snapshot) -> dict[str, Any]:
    """Everything in ``snap`` as ints, strings, lists and dicts (tensors keep their dtype)."""
    record = {f.name: getattr(snap.record, f.name) for f in dataclasses.fields(StageRecord)}
    return {
        "record": record,
        **{name: _tensor_to_plain(getattr(snap, name)) for name in _TENSORS},
        "available_size": snap.available_size,
        "free_rows": list(snap.free_rows),
        "tree": [list(e) for e in snap.tree],
        "tree_slots": list(snap.tree_slots),
        "requests": {rid: dataclasses.asdict(view) for rid, view in snap.requests.items()},
    }


def snapshot_from_plain(data: dict[str, Any]) -> Snapshot:
    """The inverse of ``snapshot_to_plain``."""
    raw = dict(data["record"])
    record = StageRecord(**{k: (_tuples(v) if isinstance(v, list) else v) for k, v in raw.items()})
    requests = {
        rid: RequestView(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in view.items()})
        for rid, view in data["requests"].items()
    }
    return Snapshot(
        record=record,
        **{name: _tensor_from_plain(data[name]) for name in _TENSORS},
        available_size=data["available_size"],
        free_rows=tuple(data["free_rows"]),
        tree=tuple((e[0], tuple(e[1]), tuple(e[2]), e[3]) for e in data["tree"]),
        tree_slots=tuple(data["tree_slots"]),
        requests=requests,
    )
