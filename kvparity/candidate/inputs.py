"""Inputs for plug-in candidates of the kernel-level targets, and the judgement of their effect.

A ``KernelBatch`` is plain data (ints and tuples, JSON-friendly), so it can cross into the
sandbox's child process and be printed as a counterexample. ``materialise`` turns it into the
tensors a candidate gets, every one of them INSIDE a larger buffer whose margins hold ``GUARD``
(``kvparity.candidate.guarded``): the Triton interpreter does no bounds checking, so a candidate writing a
row, a column or an element out of bounds lands in a margin, and ``compare_effect`` finds it
there. What differs between targets is declared in their records (``kvparity.candidate.targets``); nothing
here branches on a target's name.

Every batch meets SPEC section 8 (int64 1-D lengths of length ``bs`` on the device, contiguous
int64 prefixes with ``numel == prefix_len``, ``0 <= row < rows``, ``prefix_len <= seq_len <= width``,
``sum(extend_lens) == out_cache_loc.numel()``), holds distinct slots that fit the int32 table, and
mixes the situations section 8 is about: distinct rows in non-identity order, empty and non-empty
prefixes, lengths crossing the 512-token block, prefixes that end inside a page (paged
``alloc_extend``). A target with a table gets batches in production order, as a long-running
server has them (issue 25): rows as a churned free list hands them out, prefixes laid out in
pages of 1, 16 or 64 slots (``LAYOUT_PAGE_SIZES``, which the target does not see) from scattered
pages, mostly ending inside a page, the new tokens filling the last page first. Batches reach
production shapes (``KernelShape``, per Hypothesis profile): past every request block of the
kernels (256, 512; nightly 8,192 requests), slots up to 2**31 - 1, page sizes 1 to 256.
"""

from __future__ import annotations

import bisect
import itertools
import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch
from hypothesis import strategies as st

from kvparity.candidate.guarded import GUARD, Guarded, Materialised, where
from kvparity.candidate.targets import FILLER_BASE, TARGETS, Target, lookup
from kvparity.judge.differ import cell_text
from kvparity.model.contract import length_findings
from kvparity.model.poison import POISON
from kvparity.model.profiles import KERNEL_PAGE_SIZES
from kvparity.run.minimize import halvings

FILLER_NOTE = ("note: req_to_token cells outside any request's prefix hold 1,000,000 + their flat index "
               "(row * width + col), so a read from the wrong cell names the cell it read")
INT32_MAX = 2**31 - 1  # req_to_token is int32: every slot, however it is passed, must fit
PAGE_SIZES = KERNEL_PAGE_SIZES  # alloc_extend: 1, 2, 4, ..., 256
# The page sizes the slots of a target without one (it sees every slot on its own) are laid out in:
# servers often run SGLang's paged allocator at 16 or 64 (some attention backends need pages), so
# its prefixes are runs of that many slots from scattered pages. Only the slots change, never an
# argument; 1 (every slot its own page) is where shrinking goes.
LAYOUT_PAGE_SIZES = (1, 16, 64)
# What a wrong cell holds, when it holds a sentinel: never written, or read out of bounds.
_CELL_NOTES = {POISON: "POISON: never written", GUARD: "GUARD value: read out of bounds"}


@dataclass(frozen=True)
class KernelShape:
    """How large candidate batches get (per Hypothesis profile: ``kernel_shape``).

    Most batches are ``small`` (per-request draws, which Hypothesis shrinks well), one in
    ``medium_one_in`` is ``medium``. WIDE batches, past the kernels' request blocks, have a size
    from one of the ``wide`` ranges and short rows (at most ``wide_length`` new and, unpaged,
    prefix tokens each): under Triton's interpreter every request of a one-program-per-request
    kernel costs milliseconds. ``kvparity.candidate.check`` plays every ``wide`` range in every run, about
    one batch in ``wide_one_in`` in all (at least one per range). ``long_lengths``: row lengths
    that cross the column blocks (512; the linear kernel's 1,024; nightly: 4,096 and 8,192).
    Slots come from four regions: small, straddling 2**15 (int16's end), just below 2**31
    (int32's top, which the int32 table still holds) and anywhere between; page sizes are
    ``page_sizes`` (alloc_extend)."""

    name: str
    small: tuple[int, int]
    medium: tuple[int, int]
    medium_one_in: int
    wide: tuple[tuple[int, int], ...]
    wide_one_in: int
    wide_length: int
    long_lengths: tuple[tuple[int, int], ...]
    page_sizes: tuple[int, ...] = PAGE_SIZES

    @property
    def largest_batch(self) -> int:
        return max(high for _, high in self.wide)


CI_KERNEL_SHAPE = KernelShape(
    "ci", small=(1, 6), medium=(7, 40), medium_one_in=8, wide=((257, 300), (513, 560)), wide_one_in=32,
    wide_length=3, long_lengths=((500, 530), (1020, 1100)))
NIGHTLY_KERNEL_SHAPE = KernelShape(
    "nightly", small=(1, 8), medium=(9, 128), medium_one_in=6,
    wide=((257, 300), (513, 1100), (1025, 4096), (4097, 8192), (8192, 8192)), wide_one_in=64,
    wide_length=4, long_lengths=((500, 530), (1020, 1100), (4090, 4200), (8190, 8300)))


def kernel_shape(profile: str | None = None) -> KernelShape:
    """The nightly shape for the ``nightly`` profile, the ci shape for every other one
    (``profile`` None: ``HYPOTHESIS_PROFILE``, as ``kvparity.model.profiles.load`` sets it)."""
    profile = profile if profile is not None else os.environ.get("HYPOTHESIS_PROFILE", "ci")
    return NIGHTLY_KERNEL_SHAPE if profile == "nightly" else CI_KERNEL_SHAPE


@dataclass(frozen=True)
class KernelBatch:
    """One call's worth of input, as plain data. ``prefixes[i]`` are the KV slots of request
    ``i``'s cached tokens (so ``prefix_len = len(prefixes[i])``); ``out_cache_loc`` the new slots
    of the whole batch (write_cache_indices); ``free_pages`` the free page ids (alloc_extend)."""

    target: str
    rows: tuple[int, ...]
    prefixes: tuple[tuple[int, ...], ...]
    seq_lens: tuple[int, ...]
    pool_rows: int
    width: int
    page_size: int = 1
    out_cache_loc: tuple[int, ...] = ()
    free_pages: tuple[int, ...] = ()

    @property
    def spec(self) -> Target:
        """The target's record (``kvparity.candidate.targets``)."""
        return lookup(self.target)

    @property
    def bs(self) -> int:
        return len(self.rows)

    @property
    def prefix_lens(self) -> list[int]:
        return [len(p) for p in self.prefixes]

    @property
    def extend_lens(self) -> list[int]:
        return [s - p for s, p in zip(self.seq_lens, self.prefix_lens)]

    @property
    def extend_num_tokens(self) -> int:
        return sum(self.extend_lens)

    @property
    def last_loc(self) -> list[int]:
        return [p[-1] if p else -1 for p in self.prefixes]

    @property
    def longest_row(self) -> int:
        return max(self.seq_lens, default=0)

    def new_pages(self) -> list[int]:
        """alloc_extend: the new pages request ``i`` takes, ``ceil(seq/ps) - ceil(pre/ps)``."""
        ps = self.page_size
        return [-(-s // ps) - -(-p // ps) for s, p in zip(self.seq_lens, self.prefix_lens)]

    def new_slots(self) -> list[int]:
        """The slots this batch's new tokens get: ``out_cache_loc``, or for alloc_extend what SPEC
        section 1 allocates (``paged_new_slots``: for coverage and shrinking)."""
        if self.spec.new_slots != "allocated":
            return list(self.out_cache_loc)
        return paged_new_slots(self.prefix_lens, list(self.seq_lens), self.last_loc, list(self.free_pages),
                               self.page_size)

    @property
    def largest_slot(self) -> int:
        """The largest slot the batch holds or allocates (0 for a batch without any)."""
        return max([s for p in self.prefixes for s in p] + self.new_slots(), default=0)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @staticmethod
    def from_dict(data: dict[str, Any]) -> KernelBatch:
        tuples = {k: tuple(v) for k, v in data.items() if k in ("rows", "seq_lens", "out_cache_loc", "free_pages")}
        prefixes = tuple(tuple(p) for p in data["prefixes"])
        return KernelBatch(**{**data, **tuples, "prefixes": prefixes})

    def describe(self, requests: list[int] | None = None, limit: int = 16) -> str:
        """Readable, one request per line (long slot lists abbreviated). A batch of more than
        ``limit`` requests shows its first and last few and those listed in ``requests``."""
        shown = None
        if self.bs > limit:
            shown = set(range(4)) | set(range(self.bs - 4, self.bs)) | set((requests or [])[:limit])
        no_table = self.spec.table is None  # its rows play no part
        lines = [
            f"target {self.target}: bs={self.bs}, "
            + (f"page_size={self.page_size}" if no_table else f"req_to_token [{self.pool_rows}, {self.width}]")
            + f", largest slot {self.largest_slot}"
        ]
        for i, (row, prefix, seq) in enumerate(zip(self.rows, self.prefixes, self.seq_lens)):
            if shown is not None and i not in shown:
                if i - 1 in shown:
                    lines.append("  ...")
                continue
            lines.append(
                f"  request {i}: " + ("" if no_table else f"row {row}, ") + f"prefix_len {len(prefix)}, seq_len {seq}, "
                f"extend_len {seq - len(prefix)}, prefix {_abbrev(prefix)}"
            )
        if self.spec.new_slots == "given":
            lines.append(f"  out_cache_loc ({len(self.out_cache_loc)}): {_abbrev(self.out_cache_loc)}")
        if self.spec.new_slots == "allocated":
            lines.append(f"  last_loc {self.last_loc}; free_pages ({len(self.free_pages)}): {_abbrev(self.free_pages)}")
        return "\n".join(lines)


def paged_new_slots(prefix_lens: list[int], seq_lens: list[int], last_loc: list[int], pages: list[int],
                    page_size: int) -> list[int]:
    """The slots a paged allocator gives new tokens (SPEC section 1): each request first fills the
    rest of its prefix's last page (after ``last_loc``), then takes whole pages from ``pages`` in
    order. At page size 1 that is ``pages`` itself, one slot per new token."""
    ps, slots, first = page_size, [], 0
    for pre, seq, last in zip(prefix_lens, seq_lens, last_loc):
        old_end = -(-pre // ps) * ps
        for pos in range(pre, seq):
            if pos < old_end:
                slots.append(last + 1 + pos - pre)
            else:
                slots.append(pages[first + pos // ps - old_end // ps] * ps + pos % ps)
        first += -(-seq // ps) - old_end // ps
    return slots


def _abbrev(values: tuple[int, ...], keep: int = 6) -> str:
    if len(values) <= 2 * keep:
        return str(list(values))
    head = ", ".join(map(str, values[:keep]))
    tail = ", ".join(map(str, values[-keep:]))
    return f"[{head}, ... ({len(values) - 2 * keep} more) ..., {tail}]"


def contract_violations(batch: KernelBatch) -> list[str]:
    """SPEC section 8 for a batch (``kvparity.model.contract.length_findings``, the check the tensor
    inputs get too), plus distinct slots that fit the int32 table, and enough free pages for an
    allocating target; empty when the batch is valid."""
    problems = []
    if batch.bs < 1 or not len(batch.prefixes) == len(batch.seq_lens) == batch.bs:
        return [f"a batch needs at least one request and one prefix and seq_len each (bs={batch.bs})"]
    spec = batch.spec
    if spec.new_slots == "allocated" and sum(batch.new_pages()) > len(batch.free_pages):
        return [f"{sum(batch.new_pages())} new pages needed, {len(batch.free_pages)} free"]
    given = len(batch.out_cache_loc) if spec.new_slots == "given" else None
    found = length_findings(list(batch.rows), batch.prefix_lens, list(batch.seq_lens), batch.pool_rows, batch.width,
                            given, batch.extend_num_tokens)
    if not found.rows_ok:
        problems.append(f"rows {batch.rows} are not distinct rows of [0, {batch.pool_rows})")
    for i in found.misordered:
        problems.append(f"request {i}: not 0 <= prefix_len {batch.prefix_lens[i]} <= seq_len {batch.seq_lens[i]} "
                        f"<= width {batch.width}")
    if found.slot_count is not None:
        problems.append(f"out_cache_loc has {found.slot_count[0]} slots, extend lens sum to {found.slot_count[1]}")
    slots = [s for p in batch.prefixes for s in p] + list(batch.out_cache_loc)
    if len(set(slots)) != len(slots) or any(s < 1 for s in slots):
        problems.append("slots are not distinct and >= 1")
    if batch.largest_slot > INT32_MAX:
        problems.append(f"slot {batch.largest_slot} does not fit the int32 req_to_token")
    return problems


# --------------------------------------------------------------------------- smaller batches


def without_requests(batch: KernelBatch, drop: set[int] | range) -> KernelBatch:
    """``batch`` without the requests ``drop`` (indices): their rows, prefixes and lengths, their
    share of ``out_cache_loc``, and (alloc_extend) the free pages they would have taken, so every
    other request keeps exactly its slots."""
    drop = set(drop)
    keep = [i for i in range(batch.bs) if i not in drop]
    out: list[int] = []
    start = 0
    for i, ext in enumerate(batch.extend_lens):
        if i not in drop and batch.spec.new_slots == "given":
            out.extend(batch.out_cache_loc[start : start + ext])
        start += ext
    free = list(batch.free_pages)
    if batch.spec.new_slots == "allocated":
        free, first = [], 0
        for i, pages in enumerate(batch.new_pages()):
            if i not in drop:
                free.extend(batch.free_pages[first : first + pages])
            first += pages
        free.extend(batch.free_pages[first:])  # the spare pages
    return replace(batch, rows=tuple(batch.rows[i] for i in keep), prefixes=tuple(batch.prefixes[i] for i in keep),
                   seq_lens=tuple(batch.seq_lens[i] for i in keep), out_cache_loc=tuple(out), free_pages=tuple(free))


def without_prefix_elements(batch: KernelBatch, request: int, drop: set[int] | range) -> KernelBatch | None:
    """``batch`` with elements ``drop`` (positions) removed from request ``request``'s prefix and
    its seq_len shortened to match (its new tokens stay). None for an allocating target, whose
    prefix is positions in pages (removing one would move the request's page boundaries)."""
    if batch.spec.paged:
        return None
    drop = set(drop)
    prefix = tuple(s for j, s in enumerate(batch.prefixes[request]) if j not in drop)
    removed = len(batch.prefixes[request]) - len(prefix)
    prefixes = batch.prefixes[:request] + (prefix,) + batch.prefixes[request + 1 :]
    seq_lens = batch.seq_lens[:request] + (batch.seq_lens[request] - removed,) + batch.seq_lens[request + 1 :]
    return replace(batch, prefixes=prefixes, seq_lens=seq_lens)


def compacted(batch: KernelBatch) -> KernelBatch:
    """The same requests in the smallest table that holds them (width = longest row, at least 1;
    rows up to the largest used)."""
    return replace(batch, width=max(1, batch.longest_row), pool_rows=max(batch.rows) + 1)


def smaller_batches(batch: KernelBatch) -> Iterator[KernelBatch]:
    """Smaller batches, big cuts first (``kvparity.run.minimize``'s candidates): the last requests
    (half of them, a quarter, ... one: an index-bound bug, such as one from request 257 on, keeps
    only what reaches its index), then chunks of requests anywhere, then chunks of each request's
    prefix (write_cache_indices, get_last_loc), then the smallest table that holds the batch. A
    batch keeps one request at least."""
    for size in halvings(batch.bs)[1:] if batch.bs > 1 else ():
        yield without_requests(batch, range(batch.bs - size, batch.bs))
    for size in halvings(batch.bs)[1:] if batch.bs > 1 else ():
        for start in range(0, batch.bs, size):
            yield without_requests(batch, range(start, min(start + size, batch.bs)))
    for request, prefix in enumerate(batch.prefixes):
        for size in halvings(len(prefix)):
            for start in range(0, len(prefix), size):
                smaller = without_prefix_elements(batch, request, range(start, min(start + size, len(prefix))))
                if smaller is not None:
                    yield smaller
    if compacted(batch) != batch:
        yield compacted(batch)


# --------------------------------------------------------------------------- strategies


def _scatter(count: int, a: int, b: int) -> list[int]:
    """``count`` distinct ids >= 1 in a scrambled order: ``1 + (a*k + b) mod P``, P prime > count.
    Shrinks (a -> 1, b -> 0) to ``1, 2, 3, ...``."""
    prime = _next_prime(count + 1)
    a = 1 + a % (prime - 1)
    return [1 + (a * k + b) % prime for k in range(count)]


def _next_prime(n: int) -> int:
    def is_prime(m: int) -> bool:
        return m >= 2 and all(m % d for d in range(2, int(m**0.5) + 1))

    while not is_prime(n):
        n += 1
    return n


def _mix(seed: int, index: int, salt: int) -> int:
    """A well-mixed 32-bit number from (seed, index, salt): per-request values of a wide batch."""
    x = (seed * 0x9E3779B1 + index * 0x85EBCA77 + salt * 0xC2B2AE3D + 0x27D4EB2F) & 0xFFFFFFFF
    for shift, factor in ((16, 0x7FEB352D), (15, 0x846CA68B)):
        x = ((x ^ (x >> shift)) * factor) & 0xFFFFFFFF
    return x ^ (x >> 16)


def _rare(draw: st.DrawFn, one_in: int) -> bool:
    """True about once in ``one_in`` draws; shrinks to False."""
    return draw(st.integers(0, one_in - 1)) == one_in - 1


@st.composite
def _length(draw: st.DrawFn, minimum: int, shape: KernelShape, page_size: int) -> int:
    """A prefix or extend length: mostly short; sometimes long enough to cross the column blocks;
    with pages, often whole pages plus an offset that is 0, 1, or near the page end."""
    if _rare(draw, 8):
        return draw(_long_length(shape))
    if page_size > 1 and draw(st.booleans()):
        return max(minimum, draw(_in_pages(page_size, 2)))
    return draw(st.integers(minimum, 12))


@st.composite
def _layout_prefix_length(draw: st.DrawFn, shape: KernelShape, layout: int) -> int:
    """A prefix laid out in pages of ``layout`` slots that the target does not see: a server's
    prefixes are long, so it spans up to 4 pages (scattered ones) and mostly ends inside one;
    sometimes long enough to cross the column blocks. At layout 1, a short or a long one."""
    if layout == 1:
        return draw(_length(1, shape, 1))
    if _rare(draw, 8):
        return draw(_long_length(shape))
    return max(1, draw(_in_pages(layout, 4)))


@st.composite
def _long_length(draw: st.DrawFn, shape: KernelShape) -> int:
    low, high = draw(st.sampled_from(shape.long_lengths))
    return draw(st.integers(low, high))


@st.composite
def _in_pages(draw: st.DrawFn, page_size: int, most_pages: int) -> int:
    """Up to ``most_pages`` whole pages and an offset of 0, 1, half a page or a page less one."""
    offset = draw(st.sampled_from(sorted({0, 1, page_size // 2, page_size - 1})))
    return draw(st.integers(0, most_pages)) * page_size + offset


@st.composite
def _churned_rows(draw: st.DrawFn, pool_rows: int, bs: int) -> list[int]:
    """``bs`` distinct rows of ``pool_rows`` as a churned free list hands them out. SGLang's
    ``ReqToTokenPool`` pops rows from the head of its free list and appends freed rows at its tail,
    so after a while a batch is runs of rows that were freed together: ascending within a run,
    jumping between runs (the runs' row blocks in an order other than the batch's). Drawn as up to
    5 cuts of the batch, an order of the blocks and the pool's unused rows; a fresh pool (now and
    then, and where shrinking goes) hands out ascending rows."""
    churned = bs > 1 and draw(st.integers(0, 15)) > 0
    cuts = draw(st.lists(st.integers(1, bs - 1), min_size=1, max_size=min(5, bs - 1), unique=True)) if churned else []
    bounds = [0, *sorted(cuts), bs]
    runs = [hi - lo for lo, hi in zip(bounds, bounds[1:])]  # their lengths, in batch order
    blocks = draw(st.permutations(range(len(runs))))  # blocks[i]: the rank of run i's block of rows
    if churned and blocks == sorted(blocks):  # the fresh order (where the permutation shrinks to)
        blocks = blocks[::-1]
    starts, at = [0] * len(runs), 0
    for run in sorted(range(len(runs)), key=blocks.__getitem__):
        starts[run], at = at, at + runs[run]
    unused = set(draw(st.lists(st.integers(0, pool_rows - 1), min_size=pool_rows - bs, max_size=pool_rows - bs,
                               unique=True)))  # rows other requests hold (or free further back)
    kept = [row for row in range(pool_rows) if row not in unused]
    return [kept[start + k] for start, length in zip(starts, runs) for k in range(length)]


@st.composite
def _shape(draw: st.DrawFn, shape: KernelShape, page_size: int, size: str | tuple[int, int],
           layout: int | None = None) -> tuple[list[int], list[int], list[int], int, int]:
    """Rows (distinct, scrambled), prefix lens (empty ones mixed in), seq lens, pool rows, width.
    ``size``: "narrow" (small or medium batches), "any" (a wide one now and then too), or a
    (low, high) range of wide batch sizes. ``layout``: for a target with a table, the page size
    its slots are laid out in; its small and medium batches are in production order
    (``_production_requests``). None for one without (alloc_extend: its rows play no part, and
    its prefixes are in its own pages already)."""
    if isinstance(size, tuple):
        return draw(_wide_shape(shape, page_size, size))
    if size == "any" and _rare(draw, shape.wide_one_in):
        return draw(_wide_shape(shape, page_size, draw(st.sampled_from(shape.wide))))
    low, high = shape.medium if _rare(draw, shape.medium_one_in) else shape.small
    bs = draw(st.integers(low, high))
    pool_rows = bs + draw(st.integers(0, 3))
    if layout is None:
        rows = draw(st.permutations(range(pool_rows)))[:bs]
        prefix_lens = [0 if draw(st.booleans()) else draw(_length(1, shape, page_size)) for _ in range(bs)]
        seq_lens = [pre + draw(_length(1, shape, page_size)) for pre in prefix_lens]
    else:
        rows, prefix_lens, seq_lens = draw(_production_requests(shape, pool_rows, bs, layout))
    width = max(seq_lens) + draw(st.integers(0, 3))
    return rows, prefix_lens, seq_lens, pool_rows, width


@st.composite
def _production_requests(draw: st.DrawFn, shape: KernelShape, pool_rows: int, bs: int,
                         layout: int) -> tuple[list[int], list[int], list[int]]:
    """Rows, prefix lens and seq lens as a long-running server has them: rows as its churned free
    list hands them out, a prefix for two requests in three (most hit its cache), prefixes in
    pages of ``layout`` slots that span several pages and mostly end inside one."""
    rows = draw(_churned_rows(pool_rows, bs))
    prefix_lens = [0 if draw(st.integers(0, 2)) == 2 else draw(_layout_prefix_length(shape, layout))
                   for _ in range(bs)]
    seq_lens = [pre + draw(_length(1, shape, layout)) for pre in prefix_lens]
    return rows, prefix_lens, seq_lens


@st.composite
def _wide_shape(draw: st.DrawFn, shape: KernelShape, page_size: int,
                wide: tuple[int, int]) -> tuple[list[int], list[int], list[int], int, int]:
    """A batch of ``wide[0]`` to ``wide[1]`` requests (past a request block), with short rows.
    Its rows and lengths come from a few drawn numbers (not one draw per request), so Hypothesis's
    draw stays small. The size shrinks to ``wide[0] + 1`` (two requests past a block boundary at
    ``wide[0] - 1``); ``wide[0]`` itself is drawn too."""
    low, high = wide
    bs = low + 1 + draw(st.integers(-1, high - low - 1)) if high > low else low
    pool_rows = bs + draw(st.integers(0, 3))
    prime = _next_prime(pool_rows)
    a, b = 1 + draw(st.integers(0, 10**6)) % (prime - 1), draw(st.integers(0, 10**6))
    rows = [r for r in ((a * k + b) % prime for k in range(prime)) if r < pool_rows][:bs]
    seed, n = draw(st.integers(0, 2**32 - 1)), shape.wide_length
    # A prefix: none, a few tokens, or (paged) up to the end of its first page, so new tokens cross it.
    prefix_lens = []
    for i in range(bs):
        kind = _mix(seed, i, 0) % 4
        if kind < 2 or (kind == 3 and page_size == 1):
            prefix_lens.append(0 if kind == 0 else 1 + _mix(seed, i, 1) % n)
        else:
            prefix_lens.append(max(1, page_size - 1 - _mix(seed, i, 1) % min(n, page_size)))
    seq_lens = [pre + 1 + _mix(seed, i, 2) % n for i, pre in enumerate(prefix_lens)]
    return rows, prefix_lens, seq_lens, pool_rows, max(seq_lens) + draw(st.integers(0, 3))


@st.composite
def _page_base(draw: st.DrawFn, span: int, page_size: int, avoid: tuple[int, int]) -> int:
    """Where page ids ``base + 1 .. base + span`` start: small (shrinks here), straddling slot
    2**15 (int16's end), at the top of int32 (the last slot near 2**31 - 1), or anywhere between.
    Slots never reach ``avoid`` (get_last_loc's filler values)."""
    top = (INT32_MAX + 1) // page_size - 1 - span  # the largest base: last slot <= 2**31 - 1
    region = draw(st.integers(0, 3))
    if region == 0 or top <= 0:
        base = 0
    elif region == 1:
        base = max(0, 2**15 // page_size - span // 2)
    elif region == 2:
        base = top - draw(st.integers(0, 3))
    else:
        base = draw(st.integers(0, top))
    low, high = avoid
    if base * page_size < high and (base + span + 1) * page_size > low:
        base = -(-high // page_size)  # above the filler
    return base


@st.composite
def kernel_batches(draw: st.DrawFn, target: str, shape: KernelShape | None = None,
                   size: str | tuple[int, int] = "any") -> KernelBatch:
    """A batch for ``target`` meeting SPEC section 8, sized by ``shape`` (by default the current
    Hypothesis profile's, ``kernel_shape()``) and ``size``: "any" (small and medium batches, and
    now and then a wide one), "narrow" (no wide ones) or a (low, high) range of wide batch sizes
    (``kvparity.candidate.check`` plays each of ``shape.wide`` a fixed number of times). What the batch
    holds besides requests follows ``target``'s record: page sizes and free pages for an
    allocating target, ``out_cache_loc`` for one given its slots, slots clear of the filler for
    one that reads the table; for one with a table, slots laid out in pages of a drawn
    ``LAYOUT_PAGE_SIZES`` and small and medium batches in production order."""
    if target not in TARGETS:
        raise ValueError(f"kernel_batches: target {target!r} is not one of {TARGETS}")
    spec = lookup(target)
    shape = shape or kernel_shape()
    page_size = draw(st.sampled_from(shape.page_sizes)) if spec.paged else 1
    layout = page_size if spec.paged else draw(st.sampled_from(LAYOUT_PAGE_SIZES))
    has_table = spec.table is not None
    rows, prefix_lens, seq_lens, pool_rows, width = draw(_shape(shape, page_size, size, layout if has_table else None))
    prefix_pages = [_pages_for(p, layout) for p in prefix_lens]
    new_pages = sum(_pages_for(s, layout) for s in seq_lens) - sum(prefix_pages)
    spare = draw(st.integers(0, 3))
    pages = _scatter(sum(prefix_pages) + new_pages + spare, draw(st.integers(0, 10**6)), draw(st.integers(0, 10**6)))
    span = _next_prime(len(pages) + 1)  # _scatter's ids lie in 1 .. span
    filler = (FILLER_BASE, FILLER_BASE + pool_rows * width) if spec.table == "input" else (0, 0)
    base = draw(_page_base(span, layout, filler))
    pages = [base + p for p in pages]
    prefixes, used = [], 0
    for pre, npages in zip(prefix_lens, prefix_pages):
        own = pages[used : used + npages]
        prefixes.append(tuple(own[j // layout] * layout + j % layout for j in range(pre)))
        used += npages
    rest = pages[used:]
    out_cache_loc: tuple[int, ...] = ()
    free_pages: tuple[int, ...] = ()
    if spec.new_slots == "given":  # as the paged allocator gave them: the prefix's last page first
        last_loc = [p[-1] if p else -1 for p in prefixes]
        out_cache_loc = tuple(paged_new_slots(prefix_lens, seq_lens, last_loc, rest, layout))
    elif spec.new_slots == "allocated":
        free_pages = tuple(rest)
    return KernelBatch(target, tuple(rows), tuple(prefixes), tuple(seq_lens), pool_rows, width,
                       page_size, out_cache_loc, free_pages)


def _pages_for(count: int, page_size: int) -> int:
    return -(-count // page_size)


# --------------------------------------------------------------------------- materialisation


def materialise(batch: KernelBatch, device: torch.device) -> Materialised:
    """Fresh guarded tensors for ``batch``: lengths on ``device`` (``*_cpu`` copies on the CPU),
    as its target's record lays them out."""
    return batch.spec.materialise(batch, device)


def candidate_args(m: Materialised) -> tuple[list[Any], dict[str, Any]]:
    """The arguments of SGLang's call (SPEC section 9) for ``m``: all positional, as SGLang
    passes them (the keyword dict stays empty)."""
    return m.batch.spec.arguments(m)


# --------------------------------------------------------------------------- reference and judgement


@dataclass
class Effect:
    """What a call left behind: every buffer (guards included) and a description of the return."""

    buffers: dict[str, list[int]]
    returned: dict[str, Any] | None = None  # {"type", "dtype", "shape", "device", "values"}


def describe_return(value: Any) -> dict[str, Any]:
    if not isinstance(value, torch.Tensor):
        return {"type": type(value).__name__}
    return {"type": "Tensor", "dtype": str(value.dtype), "shape": list(value.shape),
            "device": str(value.device), "values": value.detach().cpu().reshape(-1).tolist()}


def reference_effect(batch: KernelBatch, device: torch.device) -> Effect:
    """The legacy reference, through this repo's torch twins, on freshly materialised buffers."""
    spec = batch.spec
    m = spec.materialise(batch, device)
    value = spec.reference(m)
    return Effect(m.snapshot(), None if spec.returns == "ignored" else describe_return(value))


@dataclass
class Fault:
    """Why a candidate diverged. ``cells`` are (row, col, expected, got) of wrong results."""

    kind: str
    summary: str
    details: list[str] = field(default_factory=list)
    cells: list[tuple[int, int, int, int]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # how to read the details; printed in full

    def describe(self, limit: int = 12) -> str:
        lines = [f"fault: {self.kind}: {self.summary}"]
        lines += [f"  {d}" for d in self.details[:limit]]
        if len(self.details) > limit:
            lines.append(f"  ... and {len(self.details) - limit} more")
        return "\n".join(lines + self.notes)


def involved_requests(batch: KernelBatch, fault: Fault) -> list[int]:
    """The requests that a fault's wrong cells belong to (to show them in a long batch)."""
    found: dict[int, None] = {}
    ends = list(itertools.accumulate(batch.extend_lens))
    request_of_row = {row: i for i, row in enumerate(batch.rows)}
    cells_are = batch.spec.cells_are
    for row, col, _, _ in fault.cells:
        if cells_are == "rows":
            index = request_of_row.get(row)
        elif cells_are == "requests":
            index = col
        else:
            index = bisect.bisect_right(ends, col)
            index = index if index < batch.bs else None
        if index is not None:
            found.setdefault(index)
    return list(found)


def _guard_hits(g: Guarded, got: list[int]) -> list[str]:
    hits = []
    for k in list(range(g.lo)) + list(range(g.hi, len(got))):
        if got[k] != GUARD:
            hits.append(f"{g.name}: guard {where(g, k)} holds {got[k]} (guard value {GUARD})")
    return hits


def _cell_diffs(g: Guarded, got: list[int], want: list[int]) -> list[tuple[int, int, int, int]]:
    diffs = []
    for k in range(g.lo, g.hi):
        if got[k] != want[k]:
            row, col = divmod(k - g.lo, g.width) if g.width else (0, k - g.lo)
            diffs.append((row, col, want[k], got[k]))
    return diffs


def compare_effect(batch: KernelBatch, got: Effect, device: torch.device) -> Fault | None:
    """``None`` when the candidate's effect equals the reference exactly; else the first fault by
    severity (guard damaged, input modified, wrong return, wrong result), listing every finding."""
    want = reference_effect(batch, device)
    layout = materialise(batch, device).guarded
    missing = [g.name for g in layout if g.name not in got.buffers or len(got.buffers[g.name]) != len(g.buffer)]
    if missing:
        return Fault("crashed", f"the sandbox returned no (or truncated) buffers for {missing}")
    guard = [h for g in layout for h in _guard_hits(g, got.buffers[g.name])]
    if guard:
        return Fault("guard_damaged", "wrote outside the tensors it was given", guard)
    modified = [
        (g.name, _cell_diffs(g, got.buffers[g.name], want.buffers[g.name])) for g in layout if g.role == "input"
    ]
    modified = [(name, d) for name, d in modified if d]
    if modified:
        details = [f"{name}: {_cells_text(d, table=name == 'req_to_token')}" for name, d in modified]
        return Fault("input_modified", f"changed its input(s) {[n for n, _ in modified]}", details)
    # A result returned (get_last_loc) IS the result; a target that must return None
    # (write_cache_indices) has its cells compared first (a wrong table matters more than a stray
    # return value), then its return.
    returns = batch.spec.returns
    if want.returned is not None and returns == "result":
        fault = _compare_return(batch, got.returned or {"type": "nothing"}, want.returned)
        if fault:
            return fault
    for g in layout:
        if g.role == "output":
            diffs = _cell_diffs(g, got.buffers[g.name], want.buffers[g.name])
            if diffs:
                return _wrong_cells(g.name, diffs, table=bool(g.width))
    if want.returned is not None and returns == "none":
        return _compare_return(batch, got.returned or {"type": "nothing"}, want.returned)
    return None


def _compare_return(batch: KernelBatch, got: dict[str, Any], want: dict[str, Any]) -> Fault | None:
    if want["type"] == "NoneType" and got.get("type") != "NoneType":
        return Fault("wrong_return", f"returned a {got.get('type')}; SGLang's {batch.target} returns None",
                     [f"returned: {_short(got)}" + (f", values {_abbrev(tuple(got['values']))}" if "values" in got else ""),
                      "expected: None (SGLang ignores the return value, so a replacement that returns "
                      "something is not SGLang's function)"])
    for key in ("type", "dtype", "shape", "device"):
        if got.get(key) != want.get(key):
            return Fault("wrong_return", f"returned {key} {got.get(key)}, expected {want.get(key)}",
                         [f"returned: {_short(got)}", f"expected: {_short(want)}"])
    diffs = [(0, i, w, g) for i, (g, w) in enumerate(zip(got.get("values", []), want.get("values", []))) if g != w]
    if not diffs:
        return None
    fault = _wrong_cells("returned tensor", diffs, table=False)
    if batch.spec.table == "input":  # it returns cells it read from the table: say which each should be
        if any(_filler_note(batch, got) for _, _, _, got in diffs):
            fault.notes.append(FILLER_NOTE)
        fault.details = [
            f"{d} [request {i} is row {batch.rows[i]}, prefix_len {batch.prefix_lens[i]}"
            + (f": column {batch.prefix_lens[i] - 1}]" if batch.prefix_lens[i] else ": -1]")
            + _filler_note(batch, got) for d, (_, i, _, got) in zip(fault.details, diffs)]
    return fault


def _filler_note(batch: KernelBatch, value: int) -> str:
    """get_last_loc: which cell a filler value came from."""
    flat = value - FILLER_BASE
    if not 0 <= flat < batch.pool_rows * batch.width:
        return ""
    row, col = divmod(flat, batch.width)
    return f" (filler of row {row}, col {col}: it read that cell)"


def _short(ret: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in ret.items() if k != "values")


def _wrong_cells(name: str, diffs: list[tuple[int, int, int, int]], table: bool) -> Fault:
    return Fault("wrong_result", f"{name}: {len(diffs)} cell(s) differ from the legacy reference",
                 [cell_text(d, table=table, notes=_CELL_NOTES) for d in diffs], diffs)


def _cells_text(diffs: list[tuple[int, int, int, int]], table: bool, limit: int = 4) -> str:
    shown = "; ".join(cell_text(d, table=table, notes=_CELL_NOTES) for d in diffs[:limit])
    return f"{len(diffs)} cell(s) changed: {shown}" + (" ..." if len(diffs) > limit else "")
