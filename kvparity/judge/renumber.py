"""Comparison up to renumbering: two runs of one scenario that hand out different request rows,
pages or slots, but the same ones to the same tokens every time.

Many SGLang releases renumber without changing what any token can see (rows popped from the other
end of the free list, free pages sorted at another moment, the paged tail freed after instead of
before the duplicates). An exact comparison calls each of them a divergence. Here one bijection of
request rows and one of KV pages (a slot maps to the same offset in the mapped page) are built over
the whole scenario, each pair fixed when it first appears and kept while either side holds it (a
page or row free on both sides may pair anew later), and every stage is checked under them:
table cells of mapped rows (unused rows must be identical), ``out_cache_loc``, ``last_loc``,
prefixes, tree contents, free pages and free rows as sets. Everything that is no number of a row,
page or slot (stages, tokens, lengths, counters, lock counts) must be equal as it is.

``renumbering_verdict(ref, got, page_size)`` -> ``RenumberVerdict``: "exact", "renumbered" or
"divergent", and for a divergence which mapping failed, where.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kvparity.engine.snapshot import Snapshot
from kvparity.judge.compare import (
    FINISH_REPOINTS_ROW,
    RELEASED_HAS_NO_PREFIX,
    RELEASED_PREFIX_KIND,
    TREE_SPLITS,
    per_token,
)
from kvparity.model.poison import POISON

EXACT, RENUMBERED, DIVERGENT = "exact", "renumbered", "divergent"
# Fields of a request that are no numbers of rows or slots: equal as they are.
_PLAIN_FIELDS = ("status", "fill_ids", "extend_input_len", "cached_tokens", "already_computed",
                 "extend_logprob_start_len", "last_matched_prefix_len", "output_len")
# Of those, what a waiting request holds from an earlier round (or a retraction's reset, which
# releases reset differently: 0.5.11+ zero the protected length): its next init_next_round_input
# computes them afresh before anything reads them, so they are compared only once it is admitted.
_SCRATCH_WHILE_WAITING = frozenset({"fill_ids", "extend_input_len", "extend_logprob_start_len", "last_matched_prefix_len"})
# A finished request is read by nobody any more: what its release left in those fields (0.5.21
# releases through insert_req and free_kv_row, which set the protected length otherwise) is no
# state of the server.
_SCRATCH_STATUSES = ("waiting", "finished")


@dataclass
class RenumberVerdict:
    verdict: str
    detail: str | None = None  # for a divergence: which mapping (or field) failed, at which stage
    what: str | None = None  # for a divergence: the kind of what failed ("row map", "fill_ids", ...)
    rows: dict[int, int] = field(default_factory=dict)  # reference row -> row
    pages: dict[int, int] = field(default_factory=dict)  # reference page -> page
    findings: set[str] = field(default_factory=set)  # known release differences met (compare.KNOWN_VERSION_DIFFERENCES)
    stage: int | None = None  # for a divergence: the index of the first stage no renumbering explains


class Mismatch(Exception):
    """A stage that no renumbering explains: ``what`` is the kind of what failed (a map such as
    "row map", a request field such as "fill_ids", "stage", ...), the message says where and how."""

    def __init__(self, what: str, message: str) -> None:
        super().__init__(message)
        self.what = what


class Bijection:
    """A one-to-one map built as pairs appear; a pair that contradicts an earlier one raises."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.forward: dict[int, int] = {}
        self.backward: dict[int, int] = {}
        self.ever: set[int] = set()  # reference members ever paired
        self.ever_other: set[int] = set()  # their partners ever paired

    def pair(self, a: int, b: int, where: str) -> None:
        if self.forward.get(a, b) != b:
            raise Mismatch(f"{self.what} map", f"{self.what} map: {where}: reference {a} is {b} here, but was {self.forward[a]} before")
        if self.backward.get(b, a) != a:
            raise Mismatch(f"{self.what} map", f"{self.what} map: {where}: {b} stands for reference {a} here, but for {self.backward[b]} before")
        self.forward[a], self.backward[b] = b, a
        self.ever.add(a)
        self.ever_other.add(b)

    def same_set(self, ref: list[int], got: list[int], where: str) -> None:
        """``ref`` and ``got`` are the same set under the map; members neither side has mapped
        yet must be as many on both sides (the map can still pair them)."""
        ref_set, got_set = set(ref), set(got)
        mapped = {self.forward[a] for a in ref_set if a in self.forward}
        got_mapped = {b for b in got_set if b in self.backward}
        if mapped != got_mapped:
            missing = sorted(self.backward[b] for b in got_mapped - mapped)[:6]
            extra = sorted(a for a in ref_set if a in self.forward and self.forward[a] not in got_set)[:6]
            raise Mismatch(f"{self.what} sets differ", f"{self.what} sets differ: {where}: reference-only {extra}, other-only (as reference) {missing}")
        free_ref = len([a for a in ref_set if a not in self.forward])
        free_got = len([b for b in got_set if b not in self.backward])
        if free_ref != free_got:
            raise Mismatch(f"{self.what} sets differ", f"{self.what} sets differ: {where}: {free_ref} unpaired in the reference, {free_got} here")

    def release(self, ref: list[int], got: list[int]) -> None:
        """Forget the pairs whose members are free on both sides: a page (or row) nobody holds
        can be handed out again in another order, and then pairs anew. ``ever`` keeps what was
        ever paired."""
        got_set = set(got)
        for a in set(ref):
            b = self.forward.get(a)
            if b is not None and b in got_set:
                del self.forward[a], self.backward[b]

    def forget(self, a: int | None = None, b: int | None = None) -> None:
        """Forget the pair holding reference ``a`` or other ``b`` (free on both sides meanwhile)."""
        a = self.backward.get(b) if a is None and b is not None else a
        if a is not None and a in self.forward:
            del self.backward[self.forward.pop(a)]

    def agrees(self, a: int, b: int) -> bool:
        """Whether pairing ``a`` with ``b`` contradicts no pair made so far (nothing is paired)."""
        return self.forward.get(a, b) == b and self.backward.get(b, a) == a

    def is_identity(self) -> bool:
        return all(a == b for a, b in self.forward.items())


class Renumbering:
    """The row and page bijections of one pair of runs, checked stage by stage."""

    def __init__(self, page_size: int, known: frozenset[str] = frozenset(), *, per_iteration: bool = False) -> None:
        self.page_size = page_size
        self.known = known  # known release differences between the two runs, excused and recorded
        # Snapshots once a scheduler iteration (not once a stage): see ``_handed_out_again``.
        self.per_iteration = per_iteration
        self.findings: set[str] = set()
        self.rows = Bijection("row")
        self.pages = Bijection("page")
        # Reference row -> the most columns its owner had while the row's current pair lasted: a
        # free row is compared that far (past it: cells of owners before the pair, compared then).
        self.row_extent: dict[int, int] = {}

    def slot(self, a: int, b: int, where: str) -> None:
        if a == POISON or b == POISON or a < 0 or b < 0:
            if a != b:
                raise Mismatch("slot map", f"slot map: {where}: reference {a}, here {b}")
            return
        ps = self.page_size
        if a % ps != b % ps:
            raise Mismatch("slot map", f"slot map: {where}: reference slot {a} is at offset {a % ps} of its page, {b} at {b % ps}")
        self.pages.pair(a // ps, b // ps, f"{where} (slots {a} and {b})")

    def slots(self, ref: tuple[int, ...] | list[int] | None, got: tuple[int, ...] | list[int] | None, where: str,
              field: str) -> None:
        """``field``: what the slots are, for a difference in their number."""
        if ref is None or got is None or len(ref) != len(got):
            if ref is None and got is None:
                return
            raise Mismatch(field, f"{where}: {got} against the reference's {ref}")
        for i, (a, b) in enumerate(zip(ref or (), got or ())):
            self.slot(a, b, f"{where}[{i}]")

    def stage(self, ref: Snapshot, got: Snapshot) -> None:
        where = ref.record.describe()
        r, g = ref.record, got.record
        if (r.kind, r.rids, r.outcome) != (g.kind, g.rids, g.outcome):
            raise Mismatch("stage", f"stage: {g.describe()!r} against the reference's {where!r}")
        if self.per_iteration:  # what an iteration freed and evicted says more than a page map
            self._sizes(ref, got, where)
            self._handed_out_again(ref, got)
        for i, (a, b) in enumerate(zip(r.rows, g.rows)):
            self.rows.pair(a, b, f"{where}, rows[{i}]")
        if len(r.rows) != len(g.rows):
            raise Mismatch("rows", f"{where}: rows {g.rows} against the reference's {r.rows}")
        self.slots(r.out_cache_loc, g.out_cache_loc, f"{where}, out_cache_loc", "out_cache_loc")
        self.slots(r.last_loc, g.last_loc, f"{where}, last_loc", "last_loc")
        self._requests(ref, got, where)
        self._table(ref, got, where)
        self._tree(ref, got, where)
        self._free(ref, got, where)

    def _handed_out_again(self, ref: Snapshot, got: Snapshot) -> None:
        """An iteration can free a page or a row and hand it out again (a request finishes on the
        result, the next batch allocates), so a snapshot once an iteration may never see it free.
        A page this iteration's batch writes, or a row it runs, whose partner is free now or is
        also the batch's on the other side, was free on both sides within the iteration: its pair
        is forgotten, as a pair seen free on both sides is (a page still read elsewhere, by the
        tree or a row, is paired again there and must agree). A row the batch ran is compared up
        to its sequence length while it is paired: its request may finish within the iteration,
        and the cells past it are an earlier owner's."""
        ps, r, g = self.page_size, ref.record, got.record
        new_a = {s // ps for s in r.out_cache_loc or () if s >= 0}
        new_b = {s // ps for s in g.out_cache_loc or () if s >= 0}
        free_a = {int(p) for p in ref.free_pages.tolist() + ref.release_pages.tolist()}
        free_b = {int(p) for p in got.free_pages.tolist() + got.release_pages.tolist()}
        # Free on both sides now: forgotten before this iteration's cells are paired (a free row's
        # stale cells may name a page the iteration handed out again).
        self.pages.release(list(free_a), list(free_b))
        self.rows.release(list(ref.free_rows), list(got.free_rows))
        _forget_reused(self.pages, new_a, new_b, free_a, free_b)
        _forget_reused(self.rows, set(r.rows), set(g.rows), set(ref.free_rows), set(got.free_rows))
        self.row_extent = {row: n for row, n in self.row_extent.items() if row in self.rows.forward}
        for row, seq_len in zip(r.rows, r.seq_lens):
            self.row_extent[row] = max(self.row_extent.get(row, 0), seq_len)

    def _requests(self, ref: Snapshot, got: Snapshot, where: str) -> None:
        for rid, a in ref.requests.items():
            b = got.requests[rid]
            for name in _PLAIN_FIELDS:
                if a.status in _SCRATCH_STATUSES and name in _SCRATCH_WHILE_WAITING:
                    continue
                if getattr(a, name) != getattr(b, name):
                    raise Mismatch(name, f"{where}: request {rid} {name} {getattr(b, name)} against {getattr(a, name)}")
            # A waiting or finished request holds no row, whatever its req_pool_idx still says
            # (0.5.4 keeps it at a retract; a finished request keeps the index of its freed row).
            holds_row = a.status not in _SCRATCH_STATUSES
            if holds_row and (a.req_pool_idx is None) != (b.req_pool_idx is None):
                raise Mismatch("row", f"{where}: request {rid} row {b.req_pool_idx} against {a.req_pool_idx}")
            if a.req_pool_idx is not None and b.req_pool_idx is not None and holds_row:
                self.rows.pair(a.req_pool_idx, b.req_pool_idx, f"{where}, request {rid}")
            if RELEASED_PREFIX_KIND in (a.prefix_kind, b.prefix_kind) and RELEASED_HAS_NO_PREFIX in self.known:
                if a.prefix_values != b.prefix_values:
                    self.findings.add(RELEASED_HAS_NO_PREFIX)
                continue  # one side has no prefix to compare
            if not (_left_row(a) or _left_row(b)):  # legacy's alias (ALLOWED): its values are no one's
                self.slots(a.prefix_values, b.prefix_values, f"{where}, request {rid} prefix", "prefix_values")

    def _table(self, ref: Snapshot, got: Snapshot, where: str) -> None:
        a_table, b_table = ref.req_to_token, got.req_to_token
        owners = {v.req_pool_idx: v.slotted for v in ref.requests.values()
                  if v.req_pool_idx is not None and v.status not in ("waiting", "finished")}
        if a_table.shape[1:] != b_table.shape[1:] or a_table.dtype != b_table.dtype:
            raise Mismatch("req_to_token", f"{where}: req_to_token {tuple(b_table.shape)} {b_table.dtype} against "
                           f"{tuple(a_table.shape)} {a_table.dtype}")
        self._extra_rows(a_table, b_table, where)
        for row in range(a_table.shape[0]):
            other = self.rows.forward.get(row)
            if other is None:
                # A free row's stale cells are compared while it is paired; a row never used by
                # either run must be identical (its poison untouched).
                never_used = row not in self.rows.ever and row not in self.rows.ever_other
                if never_used and row < b_table.shape[0] and not bool((a_table[row] == b_table[row]).all()):
                    raise Mismatch("req_to_token", f"{where}: row {row}, used by no request in either run, differs")
                continue
            # The live columns of the request holding the row (its cells past them are stale: what
            # an earlier owner left, which no token reads); a free row: what its owners wrote
            # while it was paired.
            if row in owners:
                self.row_extent[row] = max(self.row_extent.get(row, 0), owners[row])
            live = owners.get(row, self.row_extent.get(row, a_table.shape[1]))
            # Each distinct (reference, other) pair of cell values once: the map must hold for all.
            pairs = torch.stack((a_table[row, :live], b_table[other, :live]), dim=1).unique(dim=0).tolist()
            if row not in owners and FINISH_REPOINTS_ROW in self.known and not self._consistent(pairs):
                self.findings.add(FINISH_REPOINTS_ROW)  # a free row's stale cells, repointed in one run
                continue
            for a, b in pairs:
                self.slot(int(a), int(b), f"{where}, row {row} (here {other})")

    def _consistent(self, pairs: list[list[int]]) -> bool:
        """Whether these slot pairs fit the page map as it stands (nothing is paired)."""
        ps = self.page_size
        return all(a == b or (a >= 0 and b >= 0 and a % ps == b % ps and self.pages.agrees(a // ps, b // ps))
                   for a, b in pairs)

    def _extra_rows(self, a_table: torch.Tensor, b_table: torch.Tensor, where: str) -> None:
        """Tables of different heights (0.5.11 reserves row 0 and adds one row): the taller one
        must hold at least that many rows that were never handed out and are still uniform (the
        poison they were filled with), else the tables differ in structure."""
        extra = a_table.shape[0] - b_table.shape[0]
        if extra == 0:
            return
        for table, ever, side in ((a_table, self.rows.ever, "the reference"), (b_table, self.rows.ever_other, "this run")):
            written = [row for row in range(table.shape[0]) if row not in ever and not bool((table[row] == table[row, 0]).all())]
            if written:
                raise Mismatch("req_to_token", f"{where}: req_to_token has {abs(extra)} more rows in one run, and {side}'s row "
                               f"{written[0]}, used by no request, was written")
        taller, ever, side = (a_table, self.rows.ever, "the reference") if extra > 0 else (b_table, self.rows.ever_other, "this run")
        spare = [row for row in range(taller.shape[0]) if row not in ever]
        if len(spare) < abs(extra):
            raise Mismatch("req_to_token", f"{where}: req_to_token has {abs(extra)} more rows in {side}, but only {len(spare)} "
                           f"of its rows were never used")

    def _tree(self, ref: Snapshot, got: Snapshot, where: str) -> None:
        split = next((key for key in TREE_SPLITS if key in self.known), None)
        if split is not None and {(e[0], e[1]) for e in ref.tree} != {(e[0], e[1]) for e in got.tree}:
            self._tree_per_token(ref, got, where, split)
            return
        if len(ref.tree) != len(got.tree):
            raise Mismatch("tree", f"{where}: the tree has {len(got.tree)} nodes against the reference's {len(ref.tree)}")
        by_path = {(e[0], e[1]): e for e in got.tree}
        for extra, path, slots, lock in ref.tree:
            other = by_path.get((extra, path))
            if other is None or other[3] != lock:
                raise Mismatch("tree", f"{where}: tree node {path[:8]}{'...' if len(path) > 8 else ''} (extra key {extra!r}) "
                               f"is {other and ('locked ' + str(other[3]))} against locked {lock}")
            self.slots(slots, other[2], f"{where}, tree node of {len(path)} tokens", "tree")

    def _tree_per_token(self, ref: Snapshot, got: Snapshot, where: str, split: str) -> None:
        """Trees whose nodes are split in other places: equal token by token (path, lock, slot
        under the page map), which is the known release change ``split``."""
        a_tokens, b_tokens = per_token(ref.tree), per_token(got.tree)
        if [t[:3] + t[4:] for t in a_tokens] != [t[:3] + t[4:] for t in b_tokens]:
            raise Mismatch("tree", f"{where}: the tree's tokens or locks differ (not only where its nodes are split)")
        self.slots([t[3] for t in a_tokens], [t[3] for t in b_tokens], f"{where}, tree tokens", "tree")
        self.findings.add(split)

    def _sizes(self, ref: Snapshot, got: Snapshot, where: str) -> None:
        for size in ("available_size", "evictable_size", "protected_size"):
            if getattr(ref, size) != getattr(got, size):
                raise Mismatch(size, f"{where}: {size} {getattr(got, size)} against {getattr(ref, size)}")

    def _free(self, ref: Snapshot, got: Snapshot, where: str) -> None:
        self._sizes(ref, got, where)
        free_a = ref.free_pages.tolist() + ref.release_pages.tolist()
        free_b = got.free_pages.tolist() + got.release_pages.tolist()
        self.pages.same_set(free_a, free_b, f"{where}, free pages")
        self.rows.same_set(list(ref.free_rows), list(got.free_rows), f"{where}, free rows")
        self.pages.release(free_a, free_b)
        self.rows.release(list(ref.free_rows), list(got.free_rows))
        self.row_extent = {row: n for row, n in self.row_extent.items() if row in self.rows.forward}


def _forget_reused(pairs: Bijection, new_a: set[int], new_b: set[int], free_a: set[int], free_b: set[int]) -> None:
    """Forget each pair one of whose members is handed out anew while the other is free or handed
    out anew too (``Renumbering._handed_out_again``)."""
    gone = {a for a in new_a if pairs.forward.get(a) in new_b | free_b}
    gone |= {a for b in new_b if (a := pairs.backward.get(b)) is not None and a in new_a | free_a}
    for a in gone:
        pairs.forget(a=a)


def _left_row(view) -> bool:
    """A view prefix into a row its request no longer owns (kvparity.judge.compare's alias rule)."""
    return view.alias_row is not None and (view.alias_row != view.req_pool_idx or view.status == "finished")


def renumbering_verdict(ref: list[Snapshot], got: list[Snapshot], page_size: int, *, exact: bool,
                        known: frozenset[str] = frozenset(), per_iteration: bool = False) -> RenumberVerdict:
    """``exact``: the caller's exact comparison found no difference. Otherwise, is there one
    consistent renumbering of rows and pages that explains every stage, the ``known`` release
    differences between the two runs excused (and recorded in ``findings`` where met)?
    ``per_iteration``: the snapshots are a scheduler's, once an iteration."""
    if exact:
        return RenumberVerdict(EXACT)
    renumbering = Renumbering(page_size, known, per_iteration=per_iteration)
    index = 0
    try:
        for a, b in zip(ref, got):
            renumbering.stage(a, b)
            index += 1
        if len(ref) != len(got):
            raise Mismatch("stages", f"stages: {len(got) - 1} against the reference's {len(ref) - 1}")
    except Mismatch as exc:
        return RenumberVerdict(DIVERGENT, str(exc), exc.what, rows=renumbering.rows.forward, pages=renumbering.pages.forward,
                               findings=renumbering.findings, stage=index)
    return RenumberVerdict(RENUMBERED, rows=renumbering.rows.forward, pages=renumbering.pages.forward,
                           findings=renumbering.findings)
