"""Oracles that do not trust legacy: facts every world must satisfy on its own, so that a bug both
versions share is still caught. Each takes the snapshots before and after one stage of one world
and returns readable violations (an empty list when all is well)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from kvparity.caches import pool_problems
from kvparity.engine.snapshot import Snapshot
from kvparity.model.poison import POISON
from kvparity.model.records import LogprobAdmission
from kvparity.model.scenario import Scenario
from kvparity.model.worlds import Geometry

# A known SGLang defect (SPEC 1, cache_unfinished_req step 2), reported as a finding, never hidden
# and never a failure: row columns before the old prefix length are not rewritten when the page
# under them was freed as a duplicate, so the row keeps slots of a freed page.
STALE_ROW_DEFECT = "upstream: stale row cells after a duplicate page was freed"
# A known SGLang hazard (issue 48), reported as a finding, never a failure: a window model's decode
# that runs out of window pages keeps the full page it took (``SWATokenToKVPoolAllocator.alloc_decode``
# takes it first and returns None without giving it back). The decode then raises and the server
# stops, and SGLang's own scheduler checks both pools first (0.5.10 on), so nothing ever reads the
# kept page; only a script that decodes past the window pool, as the harness drive does, shows it.
FAILED_DECODE_KEEPS_PAGE = "upstream: a window model's failed decode keeps the full page it took"


@dataclass(frozen=True)
class Violation:
    """An oracle's finding in one world: the world's name and the message (``step N kind: ...``)."""

    world: str
    message: str

    def line(self) -> str:
        return f"{self.world}: {self.message}"

    __str__ = line


def violations(world: str, problems: list[str]) -> list[Violation]:
    return [Violation(world, p) for p in problems]


def check_stage(scenario: Scenario, before: Snapshot, after: Snapshot) -> list[str]:
    record = after.record
    problems = list(record.contract_violations)
    problems += kv_canary(after)
    problems += untouched_cells(before, after)
    if record.kind == "extend" and record.outcome == "ok":
        problems += rows_hold_prefix_then_new_slots(after)
        problems += extend_lens_positive(after)
        problems += new_slots_fresh(scenario.geometry, before, after)
        problems += last_loc_matches_prefix(scenario, after)
    if record.kind == "decode" and record.outcome == "ok":
        problems += new_slots_fresh(scenario.geometry, before, after)
    problems += cached_row_names_prefix(scenario, after)
    problems += logprob_start_respected(after)
    problems += conservation(scenario.geometry, after, kept=pages_a_failed_decode_kept(scenario.geometry, before, after))
    problems += hybrid_pools_conserved(after)
    return [f"step {record.step} {record.kind}: {p}" for p in problems]


def hybrid_pools_conserved(after: Snapshot) -> list[str]:
    """The pools a cache kind adds beside the device's KV (none for full attention), each judged
    by its own oracle as registered (``kvparity.caches.pool``): a window's, a state pool's, a host
    tier's."""
    return [f"{oracle}: {problem}" for oracle, problem in pool_problems(after.pools, after.tree)]


def kv_canary(after: Snapshot) -> list[str]:
    """Every slot the stage's forward read holds its own token's canary: the token, the position
    and the chained hash of its request's prefix (``kvparity.engine.canary``, which read them)."""
    return [f"KV canary: {read.line()}" for read in after.record.canary]


def untouched_cells(before: Snapshot, after: Snapshot) -> list[str]:
    """Only the cells the stage may write changed; by induction, never-written cells keep POISON."""
    # One comparison of the whole tables, then the stage's region cleared from the result; cells
    # are listed one by one only for the message. NumPy on the host copies the snapshot holds: one
    # thread, no hand-off to torch's intra-op threads (slower at these sizes, and with --jobs the
    # cores are already taken).
    changed = _host(before.req_to_token) != _host(after.req_to_token)
    if not changed.any():
        return []
    _clear_region(changed, after.record.write_region)
    if not changed.any():
        return []
    rows, cols = np.nonzero(changed)  # row-major, the order the cells are reported in
    stray = list(zip(rows[:6].tolist(), cols[:6].tolist()))
    shown = ", ".join(
        f"({r}, {c}) {int(before.req_to_token[r, c])} -> {int(after.req_to_token[r, c])}" for r, c in stray
    )
    return [f"{len(rows)} cells outside the stage's rows/columns changed: {shown}"]


def _host(table: torch.Tensor) -> np.ndarray:
    return table.numpy(force=True)  # a view of a CPU tensor, no copy


def _clear_region(cells: np.ndarray, region: tuple[tuple[int, int, int], ...]) -> None:
    """Set False the cells ``(row, start, end)`` allows: ``start <= column < end`` of ``row``.
    A region outside the table allows nothing (no wrap-around of negative indices)."""
    rows, cols = cells.shape
    for row, start, end in region:
        start, end = max(start, 0), min(end, cols)
        if 0 <= row < rows and start < end:
            cells[row, start:end] = False


def rows_hold_prefix_then_new_slots(after: Snapshot) -> list[str]:
    """Row i, columns [0, seq_len): its prefix (as handed in) then its share of out_cache_loc."""
    record, problems, start = after.record, [], 0
    out_cache_loc = record.out_cache_loc or ()  # an extend stage always has one
    for rid, row, prefix, seq, ext in zip(record.rids, record.rows, record.prefix_values, record.seq_lens, record.extend_lens):
        share = out_cache_loc[start : start + ext]
        start += ext
        expected = list(prefix) + list(share)
        got = after.req_to_token[row, :seq].tolist()
        if got != expected:
            bad = [c for c, (g, e) in enumerate(zip(got, expected)) if g != e][:6]
            problems.append(
                f"request {rid} row {row} columns {bad}: got {[got[c] for c in bad]}, expected {[expected[c] for c in bad]}"
            )
    if start != len(out_cache_loc):
        problems.append(f"out_cache_loc has {len(out_cache_loc)} slots, extend_lens sum to {start}")
    return problems


def _cached_row_mismatches(scenario: Scenario, after: Snapshot) -> Iterator[tuple[str, int, list[int], bool]]:
    """For each request the stage cached unfinished: (rid, row, columns where the row differs
    from its new prefix, whether all of them are the known stale-row defect)."""
    record, ps = after.record, scenario.geometry.page_size
    cached = record.cached_unfinished
    if not cached:
        return
    old_lens = dict(zip(record.rids, (len(p) for p in record.prefix_values)))
    for rid in cached:
        view = after.requests[rid]
        row = record.rows[record.rids.index(rid)]
        prefix = list(view.prefix_values)
        got = after.req_to_token[row, : len(prefix)].tolist()
        if got == prefix:
            continue
        bad = [c for c, (g, e) in enumerate(zip(got, prefix)) if g != e]
        if bad:
            # The defect: columns before the old prefix length still name a page freed just now.
            free = after.free_set
            stale = all(c < old_lens.get(rid, 0) and got[c] // ps in free for c in bad)
            yield rid, row, bad, stale


def cached_row_names_prefix(scenario: Scenario, after: Snapshot) -> list[str]:
    """After ``cache_unfinished_req`` (a chunk, or a completed prompt that keeps running) the row
    holds the request's new prefix (the tree's slots, not the duplicates just freed) in columns
    ``[0, len(prefix))``, except for the known stale-row defect (see ``stale_row_defects``)."""
    problems = []
    for rid, row, bad, stale in _cached_row_mismatches(scenario, after):
        if stale:
            continue
        got = after.req_to_token[row, :].tolist()
        prefix = after.requests[rid].prefix_values
        problems.append(f"cached {rid}: row {row} columns {bad[:6]} hold {[got[c] for c in bad[:6]]}, "
                        f"its prefix is {[prefix[c] for c in bad[:6]]}")
    return problems


def stale_row_defects(scenario: Scenario, after: Snapshot) -> list[str]:
    """SGLang's ``cache_unfinished_req`` left row cells naming a freed page (STALE_ROW_DEFECT):
    one line per request, saying whether it matters (the request keeps running on that row) or
    not (a chunked request, whose row is freed next)."""
    lines = []
    for rid, row, bad, stale in _cached_row_mismatches(scenario, after):
        if not stale:
            continue
        running = after.requests[rid].status == "running"
        consequence = "stale: it keeps running on this row" if running else "harmless: its row is freed next"
        cells = after.req_to_token[row, :].tolist()
        lines.append(f"request {rid} row {row} columns {bad} name freed slots {[cells[c] for c in bad]} "
                     f"({consequence})")
    return lines


def extend_lens_positive(after: Snapshot) -> list[str]:
    return [
        f"request {rid} scheduled with extend_input_len {ext}"
        for rid, ext in zip(after.record.rids, after.record.extend_lens)
        if ext < 1
    ]


def new_slots_fresh(geometry: Geometry, before: Snapshot, after: Snapshot) -> list[str]:
    """New slots are unique, >= 1, not held by anyone before the stage, and their pages are no
    longer free after it."""
    new = list(after.record.out_cache_loc or ())
    new_set = set(new)
    problems = []
    if len(new_set) != len(new):
        dupes = [s for s, n in Counter(new).items() if n > 1]  # in order of first appearance
        problems.append(f"new slots handed out twice: {dupes[:6]}")
    if new and min(new) < 1:
        low = [s for s in new if s < 1]
        problems.append(f"new slots below 1 (slot 0 is reserved): {low[:6]}")
    # Requests' slots cannot be evicted; the tree's can (SPEC 3: evict before allocating), so a
    # slot the tree held before the stage may be handed out again if the tree no longer holds it.
    reused = sorted((new_set & after.tree_slot_set) | (new_set & before.request_held))
    if reused:
        problems.append(f"new slots held by a request or by the tree: {reused[:6]}")
    ps = geometry.page_size
    still_free = sorted({s // ps for s in new_set} & after.free_set)
    if still_free:
        problems.append(f"pages of new slots still listed as free: {still_free[:6]}")
    return problems


def last_loc_matches_prefix(scenario: Scenario, after: Snapshot) -> list[str]:
    """Paged: ``(last_loc + 1) % page_size == prefix_len % page_size`` and last_loc is the
    prefix's last slot (-1 for none)."""
    record, ps = after.record, scenario.geometry.page_size
    if ps == 1 or record.last_loc is None:
        return []
    problems = []
    for rid, last, prefix in zip(record.rids, record.last_loc, record.prefix_values):
        want = prefix[-1] if prefix else -1
        if last != want or (last + 1) % ps != len(prefix) % ps:
            problems.append(f"request {rid}: last_loc {last}, prefix of {len(prefix)} ends with {want}")
    return problems


def logprob_start_respected(after: Snapshot) -> list[str]:
    """With logprobs on, the cache never supplies the logprob start or anything after it."""
    problems = []
    for note in after.record.notes:
        if isinstance(note, LogprobAdmission) and note.matched > max(note.start, 0):
            problems.append(f"cache matched {note.matched} tokens past logprob_start_len {note.start}")
    return problems


def pages_a_failed_decode_kept(geometry: Geometry, before: Snapshot, after: Snapshot) -> frozenset[int]:
    """The full pages a window model's failed decode kept (FAILED_DECODE_KEEPS_PAGE): after a decode
    that ran out of memory, pages free before it and neither free nor held after, at most one per
    request of the batch (each asked for one); none for any other stage or model."""
    record = after.record
    if record.kind != "decode" or record.outcome != "oom" or after.window is None:
        return frozenset()
    kept = before.free_set - after.free_set - _pages(geometry.page_size, after.held_slots)
    return frozenset(kept) if len(kept) <= len(record.rids) else frozenset()


def _pages(page_size: int, slots: frozenset[int]) -> frozenset[int]:
    """The page ids of ``slots`` (the slots themselves at page size 1)."""
    return slots if page_size == 1 else frozenset(map(page_size.__rfloordiv__, slots))


def conservation(geometry: Geometry, snap: Snapshot, kept: frozenset[int] = frozenset()) -> list[str]:
    """free + held by the tree + held by live requests (+ ``kept``, the pages a failed decode kept:
    ``pages_a_failed_decode_kept``) == every page, and no page twice."""
    ps = geometry.page_size
    total = geometry.kv_slots // ps
    # Page ids (slots when page_size is 1), as sets built once per snapshot (``Snapshot``); the
    # per-page lists below are built only when something is wrong, for the message.
    free, free_set = snap.free_list, snap.free_set
    problems = []
    if len(free_set) != len(free):
        twice = [p for p, n in Counter(free).items() if n > 1]  # in order of first appearance
        problems.append(f"pages free twice: {twice[:6]}")
    held_slots = snap.held_slots
    if held_slots and min(held_slots) < 1:  # POISON is below 1 too
        bad = sorted(s for s in held_slots if s < 1 or s == POISON)
        problems.append(f"held slots that are not real slots: {bad[:6]}")
        return problems
    held_pages = _pages(ps, held_slots) | kept
    both = sorted(held_pages & free_set)
    if both:
        problems.append(f"pages both free and held: {both[:6]}")
    if len(free_set) + len(held_pages) != total:
        problems.append(
            f"{len(free_set)} free + {len(held_pages)} held pages != {total} (leak or double count)"
        )
    return problems
