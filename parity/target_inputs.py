"""Inputs for plug-in candidates of the kernel-level targets, and the judgement of their effect.

A ``KernelBatch`` is plain data (ints and tuples, JSON-friendly), so it can cross into the
sandbox's child process and be printed as a counterexample. ``materialise`` turns it into the
tensors a candidate gets, every one of them INSIDE a larger buffer whose margins hold ``GUARD``:
the Triton interpreter does no bounds checking, so a candidate writing a row, a column or an
element out of bounds lands in a margin, and ``compare_effect`` finds it there.

Every batch meets SPEC section 8 (int64 1-D lengths of length ``bs`` on the device, contiguous
int64 prefixes with ``numel == prefix_len``, ``0 <= row < rows``, ``prefix_len <= seq_len <= width``,
``sum(extend_lens) == out_cache_loc.numel()``) and mixes the situations section 8 is about:
distinct rows in non-identity order, empty and non-empty prefixes, lengths crossing the
512-token block, prefixes that end inside a page (paged ``alloc_extend``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from hypothesis import strategies as st

from parity.poison import POISON

TARGETS: tuple[str, ...] = ("write_cache_indices", "get_last_loc", "alloc_extend")

GUARD = -31337  # margin sentinel; distinct from POISON and from every slot (slots are >= 1)
MARGIN = 64  # guard elements on each side of a 1-D buffer
TABLE_GUARD_ROWS = 2  # whole guard rows before and after the table (plus MARGIN elements)
FILLER_BASE = 1_000_000  # get_last_loc: cells outside a prefix hold FILLER_BASE + flat index
LONG_LENGTH = (500, 530)  # lengths that cross the kernels' 512-token block
PAGE_SIZES = (2, 4, 8, 16)
WIDE_BATCH = (257, 300)  # get_last_loc: more requests than one 256-request block


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

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @staticmethod
    def from_dict(data: dict[str, Any]) -> "KernelBatch":
        tuples = {k: tuple(v) for k, v in data.items() if k in ("rows", "seq_lens", "out_cache_loc", "free_pages")}
        prefixes = tuple(tuple(p) for p in data["prefixes"])
        return KernelBatch(**{**data, **tuples, "prefixes": prefixes})

    def describe(self, requests: list[int] | None = None, limit: int = 16) -> str:
        """Readable, one request per line (long slot lists abbreviated). A batch of more than
        ``limit`` requests shows its first and last few and those listed in ``requests``."""
        shown = None
        if self.bs > limit:
            shown = set(range(4)) | set(range(self.bs - 4, self.bs)) | set((requests or [])[:limit])
        lines = [
            f"target {self.target}: bs={self.bs}, req_to_token [{self.pool_rows}, {self.width}]"
            + (f", page_size={self.page_size}" if self.target == "alloc_extend" else "")
        ]
        for i, (row, prefix, seq) in enumerate(zip(self.rows, self.prefixes, self.seq_lens)):
            if shown is not None and i not in shown:
                if i - 1 in shown:
                    lines.append("  ...")
                continue
            lines.append(
                f"  request {i}: row {row}, prefix_len {len(prefix)}, seq_len {seq}, "
                f"extend_len {seq - len(prefix)}, prefix {_abbrev(prefix)}"
            )
        if self.target == "write_cache_indices":
            lines.append(f"  out_cache_loc ({len(self.out_cache_loc)}): {_abbrev(self.out_cache_loc)}")
        if self.target == "alloc_extend":
            lines.append(f"  last_loc {self.last_loc}; free_pages ({len(self.free_pages)}): {_abbrev(self.free_pages)}")
        return "\n".join(lines)


def _abbrev(values: tuple[int, ...], keep: int = 6) -> str:
    if len(values) <= 2 * keep:
        return str(list(values))
    head = ", ".join(map(str, values[:keep]))
    tail = ", ".join(map(str, values[-keep:]))
    return f"[{head}, ... ({len(values) - 2 * keep} more) ..., {tail}]"


def contract_violations(batch: KernelBatch) -> list[str]:
    """SPEC section 8 for a batch (plus distinct slots); empty when the batch is valid."""
    problems = []
    if len(set(batch.rows)) != batch.bs or not all(0 <= r < batch.pool_rows for r in batch.rows):
        problems.append(f"rows {batch.rows} are not distinct rows of [0, {batch.pool_rows})")
    for i, (pre, seq) in enumerate(zip(batch.prefix_lens, batch.seq_lens)):
        if not 0 <= pre <= seq <= batch.width:
            problems.append(f"request {i}: not 0 <= prefix_len {pre} <= seq_len {seq} <= width {batch.width}")
    if batch.target == "write_cache_indices" and len(batch.out_cache_loc) != batch.extend_num_tokens:
        problems.append(
            f"out_cache_loc has {len(batch.out_cache_loc)} slots, extend lens sum to {batch.extend_num_tokens}")
    slots = [s for p in batch.prefixes for s in p] + list(batch.out_cache_loc)
    if len(set(slots)) != len(slots) or any(s < 1 for s in slots):
        problems.append("slots are not distinct and >= 1")
    return problems


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


@st.composite
def _length(draw: st.DrawFn, minimum: int) -> int:
    if draw(st.integers(0, 7)) == 7:  # sometimes long enough to cross the 512-token block
        return draw(st.integers(*LONG_LENGTH))
    return draw(st.integers(minimum, 12))


@st.composite
def _shape(draw: st.DrawFn, wide_batches: bool) -> tuple[list[int], list[int], list[int], int, int]:
    """Rows (distinct, scrambled), prefix lens (empty ones mixed in), seq lens, pool rows, width.
    With ``wide_batches``, sometimes more requests than get_last_loc's block of 256 (short ones)."""
    wide = wide_batches and draw(st.integers(0, 7)) == 7
    bs = draw(st.integers(*WIDE_BATCH)) if wide else draw(st.integers(1, 6))
    pool_rows = bs + draw(st.integers(0, 3))
    rows = draw(st.permutations(range(pool_rows)))[:bs]
    length = (lambda minimum: st.integers(minimum, 12)) if wide else _length
    prefix_lens = [0 if draw(st.booleans()) else draw(length(1)) for _ in range(bs)]
    seq_lens = [pre + draw(length(1)) for pre in prefix_lens]
    width = max(seq_lens) + draw(st.integers(0, 3))
    return rows, prefix_lens, seq_lens, pool_rows, width


def _pages_for(count: int, page_size: int) -> int:
    return -(-count // page_size)


@st.composite
def kernel_batches(draw: st.DrawFn, target: str) -> KernelBatch:
    """A batch for ``target`` meeting SPEC section 8."""
    if target not in TARGETS:
        raise ValueError(f"kernel_batches: target {target!r} is not one of {TARGETS}")
    rows, prefix_lens, seq_lens, pool_rows, width = draw(_shape(target == "get_last_loc"))
    page_size = draw(st.sampled_from(PAGE_SIZES)) if target == "alloc_extend" else 1
    prefix_pages = [_pages_for(p, page_size) for p in prefix_lens]
    new_pages = sum(_pages_for(s, page_size) for s in seq_lens) - sum(prefix_pages)
    spare = draw(st.integers(0, 3))
    pages = _scatter(sum(prefix_pages) + new_pages + spare, draw(st.integers(0, 10**6)), draw(st.integers(0, 10**6)))
    prefixes, used = [], 0
    for pre, npages in zip(prefix_lens, prefix_pages):
        own = pages[used : used + npages]
        prefixes.append(tuple(own[j // page_size] * page_size + j % page_size for j in range(pre)))
        used += npages
    rest = pages[used:]
    out_cache_loc: tuple[int, ...] = ()
    free_pages: tuple[int, ...] = ()
    if target == "write_cache_indices":
        out_cache_loc = tuple(rest[: sum(s - p for s, p in zip(seq_lens, prefix_lens))])
    elif target == "alloc_extend":
        free_pages = tuple(rest)
    return KernelBatch(target, tuple(rows), tuple(prefixes), tuple(seq_lens), pool_rows, width,
                       page_size, out_cache_loc, free_pages)


# --------------------------------------------------------------------------- guarded tensors


@dataclass
class Guarded:
    """A view handed to a candidate, inside ``buffer`` whose first ``lo`` and elements from ``hi``
    on are guard. ``role`` is "input" (must not change) or "output" (compared with the reference).
    ``width`` > 0 marks a 2-D table view (row-major inside the flat buffer)."""

    name: str
    buffer: torch.Tensor
    view: torch.Tensor
    lo: int
    hi: int
    role: str
    width: int = 0


def guarded_vector(name: str, values: list[int], device: torch.device, role: str = "input",
                   fill: int | None = None, length: int | None = None) -> Guarded:
    """``int64`` 1-D view of ``values`` (or ``length`` cells of ``fill``), MARGIN guard each side."""
    n = len(values) if fill is None else int(length or 0)
    buffer = torch.full((n + 2 * MARGIN,), GUARD, dtype=torch.int64, device=device)
    if fill is None:
        buffer[MARGIN : MARGIN + n] = torch.tensor(values, dtype=torch.int64)
    else:
        buffer[MARGIN : MARGIN + n] = fill
    return Guarded(name, buffer, buffer[MARGIN : MARGIN + n], MARGIN, MARGIN + n, role)


def guarded_table(batch: KernelBatch, device: torch.device, contents: list[int], role: str) -> Guarded:
    """Contiguous ``int32 [pool_rows, width]`` view; TABLE_GUARD_ROWS rows + MARGIN of guard around."""
    margin = TABLE_GUARD_ROWS * batch.width + MARGIN
    n = batch.pool_rows * batch.width
    buffer = torch.full((n + 2 * margin,), GUARD, dtype=torch.int32, device=device)
    buffer[margin : margin + n] = torch.tensor(contents, dtype=torch.int32)
    view = buffer[margin : margin + n].view(batch.pool_rows, batch.width)
    return Guarded("req_to_token", buffer, view, margin, margin + n, role, batch.width)


def initial_table(batch: KernelBatch) -> list[int]:
    """write_cache_indices: POISON everywhere (a cell nobody should write stays POISON).
    get_last_loc: each row holds its prefix in ``[0, prefix_len)`` and distinct filler elsewhere,
    so reading a wrong column or row gives a wrong value."""
    n = batch.pool_rows * batch.width
    if batch.target == "write_cache_indices":
        return [POISON] * n
    cells = [FILLER_BASE + k for k in range(n)]
    for row, prefix in zip(batch.rows, batch.prefixes):
        cells[row * batch.width : row * batch.width + len(prefix)] = prefix
    return cells


class GuardedPool:
    """The ``req_to_token_pool`` a write_cache_indices candidate gets (SPEC section 9)."""

    def __init__(self, req_to_token: torch.Tensor) -> None:
        self.req_to_token = req_to_token
        self.device = req_to_token.device

    def write(self, index: Any, values: Any) -> None:
        if isinstance(values, torch.Tensor):
            values = values.to(device=self.device, dtype=torch.int32)
        self.req_to_token[index] = values


@dataclass
class Materialised:
    """The guarded tensors of one batch, and the arguments a candidate is called with."""

    batch: KernelBatch
    guarded: list[Guarded] = field(default_factory=list)

    def add(self, g: Guarded) -> torch.Tensor:
        self.guarded.append(g)
        return g.view

    def view(self, name: str) -> torch.Tensor:
        return next(g.view for g in self.guarded if g.name == name)

    def snapshot(self) -> dict[str, list[int]]:
        """Every buffer, guard included, as plain lists (what the sandbox child sends back)."""
        return {g.name: g.buffer.cpu().tolist() for g in self.guarded}


def materialise(batch: KernelBatch, device: torch.device) -> Materialised:
    """Fresh guarded tensors for ``batch``: lengths on ``device`` (``*_cpu`` copies on the CPU)."""
    m = Materialised(batch)
    cpu = torch.device("cpu")
    if batch.target in ("write_cache_indices", "get_last_loc"):
        role = "output" if batch.target == "write_cache_indices" else "input"
        m.add(guarded_table(batch, device, initial_table(batch), role))
    m.add(guarded_vector("req_pool_indices_tensor", list(batch.rows), device))
    m.add(guarded_vector("prefix_lens_tensor", batch.prefix_lens, device))
    if batch.target == "get_last_loc":
        return m
    m.add(guarded_vector("seq_lens_tensor", list(batch.seq_lens), device))
    if batch.target == "alloc_extend":
        m.add(guarded_vector("last_loc", batch.last_loc, device))
        m.add(guarded_vector("free_pages", list(batch.free_pages), device))
        m.add(guarded_vector("out_indices", [], device, "output", fill=POISON, length=batch.extend_num_tokens))
        return m
    m.add(guarded_vector("extend_lens_tensor", batch.extend_lens, device))
    for name, values in (("req_pool_indices_cpu", list(batch.rows)), ("prefix_lens_cpu", batch.prefix_lens),
                         ("seq_lens_cpu", list(batch.seq_lens)), ("extend_lens_cpu", batch.extend_lens)):
        m.add(guarded_vector(name, values, cpu))
    m.add(guarded_vector("out_cache_loc", list(batch.out_cache_loc), device))
    for i, prefix in enumerate(batch.prefixes):
        m.add(guarded_vector(f"prefix_tensors[{i}]", list(prefix), device))
    return m


def candidate_args(m: Materialised) -> tuple[list[Any], dict[str, Any]]:
    """The arguments of SGLang's call (SPEC section 9) for ``m``: all positional, as SGLang
    passes them (the keyword dict stays empty)."""
    b, v = m.batch, m.view
    if b.target == "get_last_loc":
        return [v("req_to_token"), v("req_pool_indices_tensor"), v("prefix_lens_tensor")], {}
    if b.target == "alloc_extend":
        from kernels.alloc_extend import next_power_of_2

        tiles = [next_power_of_2(b.bs), b.page_size, next_power_of_2(b.extend_num_tokens)]
        return [v("prefix_lens_tensor"), v("seq_lens_tensor"), v("last_loc"), v("free_pages"), v("out_indices"), *tiles], {}
    prefixes = [v(f"prefix_tensors[{i}]") for i in range(b.bs)]
    names = ["out_cache_loc", "req_pool_indices_tensor", "req_pool_indices_cpu", "prefix_lens_tensor",
             "prefix_lens_cpu", "seq_lens_tensor", "seq_lens_cpu", "extend_lens_tensor", "extend_lens_cpu"]
    return [v(n) for n in names] + [prefixes, GuardedPool(v("req_to_token"))], {}


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
    from kernels.alloc_extend import alloc_extend
    from kernels.last_loc import get_last_loc
    from kernels.legacy_write import write_extend_slots

    m = materialise(batch, device)
    v = m.view
    returned = None
    if batch.target == "write_cache_indices":
        table = v("req_to_token")
        for row, prefix in zip(batch.rows, batch.prefixes):  # legacy: prefix first, by torch write
            table[row, : len(prefix)] = torch.tensor(prefix, dtype=torch.int32)
        write_extend_slots(table, v("req_pool_indices_tensor"), v("prefix_lens_tensor"), v("seq_lens_tensor"),
                           v("extend_lens_tensor"), v("out_cache_loc"), backend="torch")
    elif batch.target == "get_last_loc":
        returned = describe_return(
            get_last_loc(v("req_to_token"), v("req_pool_indices_tensor"), v("prefix_lens_tensor"), backend="torch"))
    else:
        alloc_extend(v("prefix_lens_tensor"), v("seq_lens_tensor"), v("last_loc"), v("free_pages"), batch.page_size,
                     batch.extend_num_tokens, backend="torch", out=v("out_indices"))
    return Effect(m.snapshot(), returned)


FAULT_KINDS = ("raised", "crashed", "timed_out", "guard_damaged", "input_modified", "wrong_return", "wrong_result")


@dataclass
class Fault:
    """Why a candidate diverged. ``cells`` are (row, col, expected, got) of wrong results."""

    kind: str
    summary: str
    details: list[str] = field(default_factory=list)
    cells: list[tuple[int, int, int, int]] = field(default_factory=list)

    def describe(self, limit: int = 12) -> str:
        lines = [f"fault: {self.kind}: {self.summary}"]
        lines += [f"  {d}" for d in self.details[:limit]]
        if len(self.details) > limit:
            lines.append(f"  ... and {len(self.details) - limit} more")
        return "\n".join(lines)


def involved_requests(batch: KernelBatch, fault: Fault) -> list[int]:
    """The requests that a fault's wrong cells belong to (to show them in a long batch)."""
    found: list[int] = []
    ends = [sum(batch.extend_lens[: i + 1]) for i in range(batch.bs)]
    for row, col, _, _ in fault.cells:
        if batch.target == "write_cache_indices":
            index = batch.rows.index(row) if row in batch.rows else None
        elif batch.target == "get_last_loc":
            index = col
        else:
            index = next((i for i, end in enumerate(ends) if col < end), None)
        if index is not None and index not in found:
            found.append(index)
    return found


def _guard_hits(g: Guarded, got: list[int]) -> list[str]:
    hits = []
    for k in list(range(g.lo)) + list(range(g.hi, len(got))):
        if got[k] != GUARD:
            hits.append(f"{g.name}: guard {_where(g, k)} holds {got[k]} (guard value {GUARD})")
    return hits


def _where(g: Guarded, k: int) -> str:
    offset = k - g.lo
    if g.width:
        row, col = divmod(offset, g.width)
        side = "before the table" if offset < 0 else "after the table"
        return f"at row {row}, col {col} ({side})"
    return f"at index {offset} ({'before' if offset < 0 else 'after'} the tensor of {g.hi - g.lo})"


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
    if want.returned is not None:
        fault = _compare_return(got.returned or {"type": "nothing"}, want.returned)
        if fault:
            return fault
    for g in layout:
        if g.role == "output":
            diffs = _cell_diffs(g, got.buffers[g.name], want.buffers[g.name])
            if diffs:
                return _wrong_cells(g.name, diffs, table=bool(g.width))
    return None


def _compare_return(got: dict[str, Any], want: dict[str, Any]) -> Fault | None:
    for key in ("type", "dtype", "shape", "device"):
        if got.get(key) != want.get(key):
            return Fault("wrong_return", f"returned {key} {got.get(key)}, expected {want.get(key)}",
                         [f"returned: {_short(got)}", f"expected: {_short(want)}"])
    diffs = [(0, i, w, g) for i, (g, w) in enumerate(zip(got["values"], want["values"])) if g != w]
    return _wrong_cells("returned tensor", diffs, table=False) if diffs else None


def _short(ret: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in ret.items() if k != "values")


def _wrong_cells(name: str, diffs: list[tuple[int, int, int, int]], table: bool) -> Fault:
    return Fault("wrong_result", f"{name}: {len(diffs)} cell(s) differ from the legacy reference",
                 [_cell_text(d, table) for d in diffs], diffs)


def _cell_text(d: tuple[int, int, int, int], table: bool) -> str:
    row, col, want, got = d
    where = f"row {row}, col {col}" if table else f"index {col}"
    note = " (POISON: never written)" if got == POISON else " (GUARD value: read out of bounds)" if got == GUARD else ""
    return f"{where}: expected {want}, got {got}{note}"


def _cells_text(diffs: list[tuple[int, int, int, int]], table: bool, limit: int = 4) -> str:
    shown = "; ".join(_cell_text(d, table) for d in diffs[:limit])
    return f"{len(diffs)} cell(s) changed: {shown}" + (" ..." if len(diffs) > limit else "")
