"""Oracles that do not trust legacy: facts every world must satisfy on its own, so that a bug both
versions share is still caught. Each takes the snapshots before and after one stage of one world
and returns readable violations (an empty list when all is well)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from kvparity.engine.snapshot import HostState, MambaState, Snapshot, WindowState
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
    """A hybrid model's second pool (none for full attention): the window's or the states'."""
    found = [] if after.window is None else [f"window slots conserved: {p}" for p in window_conserved(after.window)]
    found += [] if after.states is None else [f"state slots conserved: {p}" for p in states_conserved(after.states)]
    return found + [f"host tier: {p}" for p in host_tier_problems(after)]


def host_tier_problems(after: Snapshot) -> list[str]:
    """A host tier's pool and nodes (none without one): ``host_slots_conserved``, ``host_nodes_consistent``;
    a Mamba model's state host pool conserved too (a node's one host state is no per-token copy)."""
    if after.host is None:
        return []
    states = [] if after.state_host is None else [f"states: {p}" for p in host_slots_conserved(after.state_host)]
    return host_slots_conserved(after.host) + host_nodes_consistent(after.host, after.tree) + states


def host_slots_conserved(host: HostState) -> list[str]:
    """Every host slot is exactly one of free, backing one node (a backup in flight already backs
    its node) or held by a fetch from storage, none a transfer lists is free, and nothing else is
    handed out."""
    backing = Counter(s for node in host.nodes for s in node.host)
    places = Counter(host.free) + backing + Counter(host.in_flight)
    problems = []
    twice = sorted(s for s, n in places.items() if n > 1)
    if twice:
        problems.append(f"host slots in two places at once (free, backing a node, fetched from storage): {twice[:6]}")
    stray = sorted(s for s in places if not 0 <= s < host.slots)
    if stray:
        problems.append(f"host slots that are no slots of the pool: {stray[:6]}")
    lost = sorted(set(range(host.slots)) - set(places))
    if lost:
        problems.append(f"host slots neither free, nor backing a node, nor fetched from storage (leaked): {lost[:6]}")
    listed = sorted(set(host.free) & ({s for n in host.nodes if n.writing or n.loading for s in n.host}
                                      | set(host.in_flight)))
    if listed:
        problems.append(f"host slots freed while a transfer lists them: {listed[:6]}")
    if host.available_size != len(host.free):
        problems.append(f"host available_size {host.available_size} is not the {len(host.free)} free slots")
    return problems


def host_nodes_consistent(host: HostState, tree: tuple) -> list[str]:
    """A node's device and host states agree: a node on both holds as many slots on each, a node
    being loaded back has its device slots, and no device KV hangs below a node the device evicted
    (eviction demotes leaves first) in the same extra key's tree."""
    problems = []
    for n in host.nodes:
        if n.device is not None and len(n.device) != len(n.host):
            problems.append(f"node {_short(n.path)}: {len(n.device)} device slots but {len(n.host)} host slots")
        if n.loading and n.device is None:
            problems.append(f"node {_short(n.path)}: a load-back lists it, but it has no device slots")
        if n.loading and not n.host:
            problems.append(f"node {_short(n.path)}: a load-back lists it, but its host KV was freed")
    evicted = [(n.extra_key, n.path) for n in host.nodes if n.device is None]
    below = [e[1] for e in tree
             if any(e[0] == key and len(e[1]) > len(p) and e[1][: len(p)] == p for key, p in evicted)]
    if below:
        problems.append(f"device KV below a node the device evicted: {_short(below[0])}")
    return problems


def _short(path: tuple[int, ...]) -> str:
    return f"[{len(path)} tokens ending {list(path[-3:])}]"


def window_conserved(window: WindowState) -> list[str]:
    """A sliding-window model's window pool: every window slot is mapped from at most one full
    slot, no mapped slot lies on a free page, no page is free twice, the padding page 0 is never
    free, and every other page is free or holds a mapped slot (SGLang frees a window page when the
    last full slot mapping into it lets go)."""
    problems = []
    page = window.page_size
    owners = Counter(w for _, w in window.mapped)
    twice = sorted(w for w, n in owners.items() if n > 1)
    if twice:
        problems.append(f"window slots mapped from two full slots: {twice[:6]}")
    free = Counter(window.free)
    if [p for p, n in free.items() if n > 1]:
        problems.append(f"window pages free twice: {sorted(p for p, n in free.items() if n > 1)[:6]}")
    if 0 in free:
        problems.append("the window's padding page 0 is on its free list")
    on_free = sorted(w for w in owners if w // page in free)
    if on_free:
        problems.append(f"mapped window slots on a free page: {on_free[:6]}")
    held = {w // page for w in owners}
    lost = sorted(set(range(1, window.slots // page + 1)) - held - set(free))
    if lost:
        problems.append(f"window pages neither free nor mapped (leaked): {lost[:6]}")
    return problems


def states_conserved(states: MambaState) -> list[str]:
    """A Mamba model's state pool: every slot is exactly one of free, kept by the tree, named by a
    request row in use (a request restoring a state from the tree gets a copy in a slot of its own)
    or held by a waiting request (before 0.5.10, one its match took), and nothing else is handed out."""
    places = (Counter(states.free) + Counter(states.tree) + Counter(slot for _, slot in states.rows)
              + Counter(states.waiting))
    problems = []
    twice = sorted(s for s, n in places.items() if n > 1)
    if twice:
        problems.append(f"state slots in two places at once (free, the tree, a row, a waiting request): {twice[:6]}")
    stray = sorted(set(places) - set(states.slots))
    if stray:
        problems.append(f"state slots that are no slots of the pool: {stray[:6]}")
    lost = sorted(set(states.slots) - set(places))
    if lost:
        problems.append(f"state slots neither free, nor kept by the tree, nor a request's (leaked): {lost[:6]}")
    if states.available_size != len(states.free):
        problems.append(f"state available_size {states.available_size} is not the {len(states.free)} free slots")
    return problems


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
