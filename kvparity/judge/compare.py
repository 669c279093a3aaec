"""Compare two worlds' snapshots of the same stage. Everything SPEC section 7 lists must be equal;
the differences it allows are named in ``ALLOWED`` and nothing else is excused.

A difference is either a divergence (a bug, in the refactor or in a backend) or a known legacy
defect (SPEC 7's chunk-cache aliasing), which is reported as such and never hidden. Between real
releases, the known differences (``KNOWN_VERSION_DIFFERENCES``, each written in the row of the release
that made it, ``kvparity.engine.releases``) are excused by name: each one a run meets is reported as
a finding, never silently as parity (matched by ``_known_version_difference``).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any

import torch

from kvparity.engine.release_order import version_key
from kvparity.engine.releases import (
    CHECKPOINT_SPLITS_AT_PROMPT,
    FINISH_REPOINTS_ROW,
    FINISH_SPLITS_AT_PROMPT,
    INT64_STAGED_FREES,
    KEEPS_RETRACTED_ROW_INDEX,
    KNOWN_VERSION_DIFFERENCES,
    PAGED_TAIL_FREED_LAST,
    RELEASED_HAS_NO_PREFIX,
)
from kvparity.engine.snapshot import REQUEST_FIELDS, Snapshot
from kvparity.model.worlds import WorldId

ALLOWED = {
    "prefix type": "legacy [] vs refactored empty int64 tensor; chunk cache int32 view vs int64 copy",
    "adjust_max_prefix_ids": "exists only in legacy (not part of any snapshot)",
    "after allocation failure": "request fields, and legacy's prefix writes into the rows the failed batch took",
    "legacy chunk-cache alias": "legacy's view prefix reads a freed row that was taken again (a legacy defect)",
}
ALIAS_DEFECT = "legacy chunk-cache alias"

# Two real releases that number rows or pages otherwise, one consistent map explaining every stage
# (``kvparity.judge.renumber``): what the release matrix calls "renumbered", named in a check.
RENUMBERED_BETWEEN_RELEASES = "rows or pages renumbered between releases"
# Topology-only tree differences, newest first: the first whose release lies between two worlds names it.
TREE_SPLITS = (CHECKPOINT_SPLITS_AT_PROMPT, FINISH_SPLITS_AT_PROMPT)


@dataclass
class Difference:
    world: str  # the world's name (``str(WorldId)``), as reports show it
    reference: str
    what: str  # which field, e.g. "req_to_token", "request r1 prefix_values"
    detail: str
    cells: list[tuple[int, int, int, int]] = field(default_factory=list)  # (row, column, expected, got)
    known_defect: str | None = None

    def line(self) -> str:
        tag = f" [known defect: {self.known_defect}]" if self.known_defect else ""
        return f"{self.world} vs {self.reference}: {self.what}: {self.detail}{tag}"


def _table_cells(ref: torch.Tensor, got: torch.Tensor, excused: set[tuple[int, int]]) -> list[tuple[int, int, int, int]]:
    if ref.shape != got.shape or ref.dtype != got.dtype:
        return [(-1, -1, -1, -1)]
    if torch.equal(ref, got):
        return []
    cells = []
    for row, col in (ref != got).nonzero().tolist():
        if (row, col) not in excused:
            cells.append((row, col, int(ref[row, col]), int(got[row, col])))
    return cells


def _failure_excuses(snap: Snapshot) -> set[tuple[int, int]]:
    """Cells legacy may have written before its allocation failed (SPEC section 4)."""
    return {(row, col) for row, start, end in snap.record.write_region for col in range(start, end)}


def compare(ref_id: WorldId, ref: Snapshot, world: WorldId, got: Snapshot) -> list[Difference]:
    diffs: list[Difference] = []
    ref_name, name = str(ref_id), str(world)

    def add(what: str, detail: str, **kw) -> None:
        diffs.append(Difference(name, ref_name, what, detail, **kw))

    cross_version = ref_id.family != world.family
    r_rec, g_rec = ref.record, got.record
    if (r_rec.kind, r_rec.rids, r_rec.outcome) != (g_rec.kind, g_rec.rids, g_rec.outcome):
        add("stage", f"{g_rec.describe()!r} != {r_rec.describe()!r}")
        return diffs
    failed = cross_version and r_rec.outcome != "ok"
    for attr in ("rows", "out_cache_loc", "last_loc"):
        if getattr(r_rec, attr) != getattr(g_rec, attr):
            add(attr, f"{getattr(g_rec, attr)} != {getattr(r_rec, attr)}")
    excused = _failure_excuses(ref) | _failure_excuses(got) if failed else set()
    cells = _table_cells(ref.req_to_token, got.req_to_token, excused)
    if cells:
        known = _known_version_difference(ref_id, world, FINISH_REPOINTS_ROW) if _repointed_rows(ref, got, cells) else None
        add("req_to_token", f"{len(cells)} cells differ", cells=cells, known_defect=known)
    for attr in ("free_pages", "release_pages"):
        a, b = getattr(ref, attr), getattr(got, attr)
        if a.dtype != b.dtype or not torch.equal(a, b):
            same_set = a.dtype == b.dtype and sorted(a.tolist()) == sorted(b.tolist())
            known = _known_version_difference(ref_id, world, PAGED_TAIL_FREED_LAST) if same_set else None
            if a.dtype != b.dtype and a.tolist() == b.tolist():
                known = _known_version_difference(ref_id, world, INT64_STAGED_FREES)
            add(f"allocator {attr}", f"{b.tolist()} ({b.dtype}) != {a.tolist()} ({a.dtype})", known_defect=known)
    for attr in ("available_size", "free_rows", "evictable_size", "protected_size"):
        if getattr(ref, attr) != getattr(got, attr):
            add(attr, f"{getattr(got, attr)} != {getattr(ref, attr)}")
    if ref.tree != got.tree:
        same_tokens = per_token(ref.tree) == per_token(got.tree)
        known = tree_split_difference(ref_id, world) if same_tokens else None
        what = "tree topology (the same tokens, slots and locks)" if same_tokens else "tree"
        add(what, f"{got.tree} != {ref.tree}", known_defect=known)
    for rid, r_view in ref.requests.items():
        if failed and rid in r_rec.rids:
            continue  # ALLOWED "after allocation failure"
        g_view = got.requests[rid]
        if _compared(r_view) == _compared(g_view) and (cross_version or r_view.prefix_kind == g_view.prefix_kind):
            continue  # the common case, decided in one tuple comparison: _request_diffs would say nothing
        diffs += _request_diffs(rid, r_view, g_view, world, ref_id, cross_version)
    return diffs


# A view's compared fields as one tuple (built in C): equal tuples mean every field is equal.
_compared = operator.attrgetter(*REQUEST_FIELDS)


def _known_version_difference(ref_id: WorldId, world: WorldId, key: str) -> str | None:
    """``key`` when exactly one of the two worlds is a real release from the one that made the
    change on (so the difference is that release's intended change), else None."""
    since = KNOWN_VERSION_DIFFERENCES[key][0]
    ref_release, release = ref_id.release, world.release
    if ref_release is None or release is None:
        return None
    newer = [version_key(r) >= version_key(since) for r in (ref_release, release)]
    return key if newer[0] != newer[1] else None


# The prefix kind of a 0.5.22+ request whose KV was released (kvparity.engine.real.adapter_prefix_len).
RELEASED_PREFIX_KIND = "ReleasedPrefix"


def per_token(tree: tuple) -> list[tuple]:
    """The tree token by token: ``(extra key, path up to and with the token, slot, lock)``, sorted.
    Two trees that differ only in where nodes are split have the same tokens."""
    out = []
    for extra, path, slots, lock in tree:
        start = len(path) - len(slots)
        out += [(extra is not None, extra or "", path[: start + i + 1], slot, lock) for i, slot in enumerate(slots)]
    return sorted(out)


def known_between(ref_id: WorldId, world: WorldId) -> frozenset[str]:
    """The known release differences that can show between these two worlds."""
    return frozenset(key for key in KNOWN_VERSION_DIFFERENCES if _known_version_difference(ref_id, world, key))


def tree_split_difference(ref_id: WorldId, world: WorldId) -> str | None:
    """The release change a topology-only tree difference between these worlds is, if any."""
    for key in TREE_SPLITS:
        if _known_version_difference(ref_id, world, key):
            return key
    return None


def _live_columns(snap: Snapshot) -> dict[int, int]:
    """Row -> how many of its columns the request holding it has live (its later cells are stale)."""
    return {v.req_pool_idx: v.slotted for v in snap.requests.values()
            if v.req_pool_idx is not None and v.status not in ("waiting", "finished")}


def _repointed_rows(ref: Snapshot, got: Snapshot, cells: list[tuple[int, int, int, int]]) -> bool:
    """Every differing cell is stale on both sides (its row free, or past its owner's live
    columns), and one side's value there is a slot its tree holds: what a finish that repointed
    the row onto the tree before freeing it left behind."""
    live_a, live_b = _live_columns(ref), _live_columns(got)
    stale = lambda row, col: col >= live_a.get(row, 0) and col >= live_b.get(row, 0)  # noqa: E731
    return all(stale(row, col) and (b in got.tree_slot_set or a in ref.tree_slot_set) for row, col, a, b in cells)


def aliases_a_row_it_left(view: Any) -> bool:
    """Legacy's view prefix points into a row the request no longer owns (it moved to another row,
    or finished and its row was freed): whoever takes that row next rewrites the "prefix"."""
    return view.alias_row is not None and (view.alias_row != view.req_pool_idx or view.status == "finished")


def _request_diffs(rid, r_view, g_view, world: WorldId, ref_id: WorldId, cross_version) -> list[Difference]:
    diffs = []
    name, ref_name = str(world), str(ref_id)
    for attr in REQUEST_FIELDS:
        a, b = getattr(r_view, attr), getattr(g_view, attr)
        if a == b:
            continue
        defect = None
        if attr == "req_pool_idx" and r_view.status == "waiting" and None in (a, b):
            defect = _known_version_difference(ref_id, world, KEEPS_RETRACTED_ROW_INDEX)
        if attr == "prefix_values" and cross_version:
            legacy_view = r_view if ref_id.family == "legacy" else g_view
            if aliases_a_row_it_left(legacy_view):
                defect = ALIAS_DEFECT
        if attr == "prefix_values" and RELEASED_PREFIX_KIND in (r_view.prefix_kind, g_view.prefix_kind):
            defect = _known_version_difference(ref_id, world, RELEASED_HAS_NO_PREFIX)
        diffs.append(Difference(name, ref_name, f"request {rid} {attr}", f"{b} != {a}", known_defect=defect))
    if not cross_version and r_view.prefix_kind != g_view.prefix_kind:
        # Same version on another backend: even the prefix's type must match.
        released = RELEASED_PREFIX_KIND in (r_view.prefix_kind, g_view.prefix_kind)
        defect = _known_version_difference(ref_id, world, RELEASED_HAS_NO_PREFIX) if released else None
        diffs.append(Difference(name, ref_name, f"request {rid} prefix type", f"{g_view.prefix_kind} != {r_view.prefix_kind}",
                                known_defect=defect))
    return diffs
