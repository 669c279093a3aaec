"""Hand-built inputs for the judges' unit tests (``test_judge_*.py``): scenarios, stage records,
snapshots, stage observations, violations and world names.

Every test builds its cases here and nowhere else, so that when a record changes shape (notes
becoming typed observations, violations a typed record, out of memory a typed exception, world
names a world identity) only this module changes. Tables are tiny (2 rows of 6 columns unless a
case asks for more) and filled with POISON, with the cells a case names written over it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from kvparity.caches import POOLS
from kvparity.engine.snapshot import RequestView, Snapshot
from kvparity.mem_cache.errors import Exhausted
from kvparity.model.poison import POISON as POISON  # re-exported: tests write expected cells with it
from kvparity.model.records import LogprobAdmission, Note, Observation, StageRecord
from kvparity.model.scenario import Scenario
from kvparity.model.worlds import Geometry, WorldId

# ---- worlds ------------------------------------------------------------------------------------
LEGACY_TORCH = WorldId.modelled("legacy", "torch")
LEGACY_TRITON = WorldId.modelled("legacy", "triton")
REFACTORED_TORCH = WorldId.modelled("refactored", "torch")


def release_world(release: str, family: str = "legacy", backend: str = "torch") -> WorldId:
    """A real SGLang release's world, named ``sglang-<release>/<backend>`` as the real lane names it."""
    return WorldId(f"sglang-{release}", backend, family, release)


# ---- scenarios, requests, snapshots ------------------------------------------------------------
def scenario(page_size: int = 1, kv_slots: int = 8) -> Scenario:
    """A scenario of no requests: the judges read only its geometry."""
    geometry = Geometry(pool_rows=2, max_context_len=6, kv_slots=kv_slots, page_size=page_size)
    return Scenario(geometry=geometry, cache_kind="radix", requests=(), steps=())


def view(row: int | None, held: tuple[int, ...] = (), prefix: tuple[int, ...] = (), status: str = "running",
         **fields: Any) -> RequestView:
    """A request's view: its row, the slots it holds, its prefix; any other field by name."""
    base: dict[str, Any] = dict(status=status, fill_ids=(5, 6, 7), extend_input_len=1, req_pool_idx=row, cached_tokens=0,
                already_computed=0, extend_logprob_start_len=0, last_matched_prefix_len=0, output_len=0,
                prefix_values=prefix, prefix_kind="torch.int64 cpu tensor", alias_row=None, held=held)
    return RequestView(**(base | fields))


def snap(record: StageRecord, rows: dict[int, list[int]] | None = None, free: tuple[int, ...] | list[int] = (),
         release: tuple[int, ...] | list[int] = (), requests: dict[str, RequestView] | None = None,
         tree_slots: tuple[int, ...] = (), shape: tuple[int, int] = (2, 6), **fields: Any) -> Snapshot:
    """A snapshot after ``record``: table cells by row (the rest POISON), free pages, requests;
    any other field (``free_rows``, ``tree``, ``available_size``, ...) or pool (``window``, ...) by name."""
    table = torch.full(shape, POISON, dtype=torch.int32)
    for row, cells in (rows or {}).items():
        table[row, : len(cells)] = torch.tensor(cells, dtype=torch.int32)
    base: dict[str, Any] = dict(record=record, req_to_token=table, free_pages=torch.tensor(list(free), dtype=torch.int64),
                release_pages=torch.tensor(list(release), dtype=torch.int64), available_size=len(free),
                free_rows=(), tree=(), tree_slots=tuple(tree_slots), requests=requests or {})
    return Snapshot(**_pooled(base | fields, {}))


def changed(snapshot: Snapshot, **fields: Any) -> Snapshot:
    """``snapshot`` with ``fields`` or pools (``window=None``: none) replaced (a fresh snapshot:
    derived sets are not carried)."""
    return dataclasses.replace(snapshot, **_pooled(fields, snapshot.pools))


def _pooled(fields: dict[str, Any], pools: dict[str, Any]) -> dict[str, Any]:
    """``fields`` with those naming a registered pool (``kvparity.caches.POOLS``) moved into ``pools``."""
    named = {name: fields.pop(name) for name in list(fields) if name in POOLS}
    if not named:
        return fields
    merged = {name: record for name, record in (pools | named).items() if record is not None}
    return fields | {"pools": merged}


def with_cells(snapshot: Snapshot, cells: dict[tuple[int, int], int]) -> Snapshot:
    """``snapshot`` with its table's ``(row, column)`` cells set to the values given."""
    table = snapshot.req_to_token.clone()
    for (row, col), value in cells.items():
        table[row, col] = value
    return changed(snapshot, req_to_token=table)


def with_request(snapshot: Snapshot, rid: str, **fields: Any) -> Snapshot:
    """``snapshot`` with fields of request ``rid``'s view replaced."""
    requests = dict(snapshot.requests)
    requests[rid] = dataclasses.replace(requests[rid], **fields)
    return changed(snapshot, requests=requests)


# ---- stage records -----------------------------------------------------------------------------
START = StageRecord(step=-1, kind="start")


def stage(kind: str, step: int = 0, **fields: Any) -> StageRecord:
    """A stage record of ``kind``; every other field by name (``outcome``: "ok", "oom" or "error")."""
    return StageRecord(step=step, kind=kind, **fields)


def extend(out: tuple[int, ...] = (1, 2, 3), region: tuple[tuple[int, int, int], ...] = ((0, 0, 3),),
           **fields: Any) -> StageRecord:
    """Step 0: r0 extends from an empty prefix into row 0 with the slots ``out``."""
    base: dict[str, Any] = dict(rids=("r0",), rows=(0,), prefix_values=((),), seq_lens=(len(out),), extend_lens=(len(out),),
                out_cache_loc=out, write_region=region)
    return stage("extend", **(base | fields))


def batch(prefix_lens: list[int], seq_lens: list[int] | None = None, step: int = 0,
          rids: tuple[str, ...] | None = None) -> StageRecord:
    """An ok extend of one request per prefix length (r0, r1, ...), each with one new token
    unless ``seq_lens`` says otherwise: the shape the scenario classes read."""
    seqs = seq_lens or [n + 1 for n in prefix_lens]
    return stage("extend", step, rids=rids or tuple(f"r{i}" for i in range(len(prefix_lens))),
                 rows=tuple(range(len(prefix_lens))), prefix_values=tuple(tuple(range(1, n + 1)) for n in prefix_lens),
                 seq_lens=tuple(seqs), extend_lens=tuple(s - p for s, p in zip(seqs, prefix_lens)))


def cache_unfinished(prefix: tuple[int, ...]) -> StageRecord:
    """Step 1: ``cache_unfinished_req`` of r0 (row 0), whose prefix before the stage was ``prefix``."""
    return stage("cache_unfinished", 1, rids=("r0",), rows=(0,), prefix_values=(prefix,))


_RAN_OUT = {
    "kv": (Exhausted.KV, "RuntimeError: alloc_token_slots: out of KV memory: 3 slots needed, available_size=2, "
                         "evictable_size=0"),
    "rows": (Exhausted.ROWS, "RuntimeError: alloc_req_slots: out of request rows: 1 needed, 0 free of 2"),
}


def out_of_memory(kind: str = "extend", of: str = "kv", **fields: Any) -> StageRecord:
    """A stage of ``kind`` (r0 into row 0) that ran out of ``of``: "kv" (KV slots) or "rows" (request rows)."""
    exhausted, error = _RAN_OUT[of]
    base: dict[str, Any] = dict(rids=("r0",), rows=(0,), prefix_values=((),), seq_lens=(3,), extend_lens=(3,), outcome="oom",
                exhausted=exhausted, error=error)
    return stage(kind, **(base | fields))


def failed_otherwise(kind: str = "extend") -> StageRecord:
    """A stage of ``kind`` that raised something other than out of memory (a broken version)."""
    return stage(kind, rids=("r0",), rows=(0,), prefix_values=((),), seq_lens=(3,), extend_lens=(3,),
                 outcome="error", error="ValueError: bad batch")


# ---- what a stage observed, and contract violations --------------------------------------------
def note(name: str) -> Note:
    """A simple observation of the scheduler by the name reports give it (e.g. "radix hit")."""
    return Note(name)


def logprob(requested: int, start: int, matched: int, rid: str = "r0") -> LogprobAdmission:
    """The admission of a request with logprobs: the start it asked for, the start the server
    made of it, and how many tokens the cache supplied."""
    return LogprobAdmission(rid, requested, start, matched)


def observed(record: StageRecord, *observations: Observation) -> StageRecord:
    """``record`` with ``observations`` as what it observed."""
    return dataclasses.replace(record, notes=tuple(observations))


def violating(record: StageRecord, *violations: str) -> StageRecord:
    """``record`` with the contract violations given (SPEC 8's checks at the stage)."""
    return dataclasses.replace(record, contract_violations=tuple(violations))
