"""The replaced forward's KV: every slot a forward writes is stamped with its token's canary
(``kvparity.model.canary``), and every slot a request reads is checked against the canary of its
own token at that position (``../shared/kv-canary.md``).

One ``KVCanary`` per world (per run of a traffic scenario, per harness world): a side table of
three int64 lanes per KV slot, beside the world's own KV pool, and who stamped each slot.

Stream order. A forward is *launched* (``launch``: it reads the table and the KV, writes its new
slots, and returns the hash it read at each request's last position, from which the next token is
sampled) and later *lands* (``land``: its result is processed). On a GPU, batch N's kernels run
after every batch launched before it and before every batch launched after it, whatever the CPU
does meanwhile; so the KV a launch reads is every earlier launch's writes (``self.kv`` holds all
launched writes, in launch order) and none of a later one's. What the CPU changes in the table
while N is in flight (its window: the overlap loop prepares N+1 before N's result is processed)
is ordered neither before nor after N's kernels on a GPU (the scheduler's stream against the
forward stream): N may read the cell before or after the change. ``land`` reads each changed cell
as N would after the change, with the KV as of N's place in the stream (later launches' writes
undone), and says whether the change is harmless (the new slot holds the same canary: a table
change over the same KV) or a read of wrong KV. Launches land in launch order. In the normal loop
and the harness drive a forward launches and lands at once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvparity.model.canary import SEED, UNSTAMPED, Canary, CanaryRead, mix


@dataclass(frozen=True)
class ForwardRequest:
    """One request of a batch, as the forward sees it: its row, ``seq_len`` (the columns it reads),
    ``start`` (its first new position: the prefix length of an extend, ``seq_len - 1`` of a
    decode), ``new_tokens`` (the forward's input ids for ``[start, seq_len)``) and ``out_slots``
    (their slots, the batch's ``out_cache_loc`` share). ``known`` is the request's own token list
    as the scheduler has it (prompt and outputs; at least ``start`` long): where the canary of each
    prefix position comes from."""

    rid: str
    row: int
    seq_len: int
    start: int
    new_tokens: tuple[int, ...]
    out_slots: tuple[int, ...]
    known: tuple[int, ...]


@dataclass(frozen=True)
class WindowView:
    """A sliding-window model's window layer as a forward is launched: its window (a query at
    position p reads the window layer's KV at positions ``[p - size, p]``) and SGLang's mapping of
    full slots to window slots (0: none), indexed by full slot."""

    size: int
    mapping: np.ndarray


@dataclass(frozen=True)
class StateView:
    """A hybrid linear (Mamba) model's recurrent states as a forward is launched: the state slot
    each request's row names (``slots``, by request id, as a model reads
    ``get_mamba_indices(req_pool_indices)``), and the pool read and written as canaries: a state
    after tokens ``t[0..n)`` is the KV canary of position ``n - 1`` (its chained hash covers the whole
    prefix); an empty state reads as ``UNSTAMPED`` lanes."""

    slots: dict[str, int]
    read: Callable[[np.ndarray], np.ndarray]  # slots -> (n, 3) canaries
    write: Callable[[np.ndarray, np.ndarray], None]  # slots, (n, 3) canaries


EMPTY_STATE: tuple[int, int, int] = (UNSTAMPED, UNSTAMPED, UNSTAMPED)  # the state before any token


def hybrid_views(world: Any, requests: list[ForwardRequest]) -> tuple[WindowView | None, StateView | None]:
    """A hybrid model's layers as a forward of ``requests`` sees them now, in ``world``: a
    sliding-window model's window layer, a Mamba model's state slots (None for what it lacks)."""
    window = getattr(world, "window", None)
    view = None if window is None else WindowView(window.size, world.allocator.full_to_swa_index_mapping.numpy(force=True))
    states = None if getattr(world, "mamba", None) is None else world.state_view({r.rid: r.row for r in requests})
    return view, states


def canary_for(world: Any) -> KVCanary:
    """The canary of a forward in ``world``: its KV kept where the world says (a host tier's, in
    the KV pool itself, whose copies then carry it), else on a side table."""
    store = getattr(world, "kv_canary_store", None)
    return KVCanary(store() if store is not None else None)


@dataclass
class Launch:
    """A launched forward: the requests, what each read, and its writes' undo log (the slots it
    wrote and what they held before), until it lands."""

    iteration: int
    requests: tuple[ForwardRequest, ...]
    undo: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    violations: list[CanaryRead] = field(default_factory=list)
    last_hashes: list[int] = field(default_factory=list)  # per request: the hash read at seq_len - 1
    read_ok: list[bool] = field(default_factory=list)  # per request: every read was right


class SlotStore:
    """Four int64 lanes per KV slot (token, position, hash, who stamped it). Dense (indexed by slot,
    grown as higher slots are written) while the slots written stay below ``DENSE_LIMIT``; past it,
    sparse (the slots written, sorted): any slot number works, however large the pool (the harness
    draws pools of up to 2**31 - 1 slots), and a batch's reads and writes are one NumPy call each."""

    LANES = 4
    DENSE_LIMIT = 1 << 20

    def __init__(self) -> None:
        self.dense: np.ndarray | None = np.full((0, self.LANES), UNSTAMPED, dtype=np.int64)
        self.keys = np.empty((0,), dtype=np.int64)  # sparse: the slots written, sorted
        self.values = np.empty((0, self.LANES), dtype=np.int64)

    def get(self, slots: np.ndarray) -> np.ndarray:
        """The lanes of ``slots``; ``UNSTAMPED`` in every lane of a slot never written (or not a slot)."""
        out = np.full((len(slots), self.LANES), UNSTAMPED, dtype=np.int64)
        if self.dense is not None:
            inside = (slots >= 0) & (slots < len(self.dense))
            out[inside] = self.dense[slots[inside]]
            return out
        if not len(self.keys) or not len(slots):
            return out
        at = np.minimum(np.searchsorted(self.keys, slots), len(self.keys) - 1)
        found = self.keys[at] == slots
        out[found] = self.values[at[found]]
        return out

    def put(self, slots: np.ndarray, values: np.ndarray) -> None:
        """Write ``values`` (one row per slot); the last write of a slot named twice wins. A negative
        slot (the poison, say) is no slot: nothing is written there."""
        keep = slots >= 0
        slots, values = slots[keep], values[keep]
        if not len(slots):
            return
        if self.dense is not None:
            top = int(slots.max())
            if top < self.DENSE_LIMIT:
                if top >= len(self.dense):
                    grown = np.full((max(top + 1, 2 * len(self.dense)), self.LANES), UNSTAMPED, dtype=np.int64)
                    grown[: len(self.dense)] = self.dense
                    self.dense = grown
                self.dense[slots] = values  # NumPy: the last of repeated indices wins
                return
            self._go_sparse()
        self._put_sparse(slots, values)

    def _go_sparse(self) -> None:
        assert self.dense is not None
        written = np.nonzero((self.dense != UNSTAMPED).any(axis=1))[0]
        self.keys, self.values, self.dense = written.astype(np.int64), self.dense[written], None

    def _put_sparse(self, slots: np.ndarray, values: np.ndarray) -> None:
        if len(np.unique(slots)) != len(slots):
            for k in range(len(slots)):
                self._put_sparse(slots[k : k + 1], values[k : k + 1])
            return
        at = np.searchsorted(self.keys, slots)
        present = (at < len(self.keys)) & (self.keys[np.minimum(at, max(len(self.keys) - 1, 0))] == slots) \
            if len(self.keys) else np.zeros(len(slots), dtype=bool)
        self.values[at[present]] = values[present]
        if (~present).any():
            order = np.argsort(slots[~present], kind="stable")
            new_slots, new_values = slots[~present][order], values[~present][order]
            where = np.searchsorted(self.keys, new_slots)
            self.keys = np.insert(self.keys, where, new_slots)
            self.values = np.insert(self.values, where, new_values, axis=0)


# Float lanes of a canary kept in a real pool's float32 tensor (a Mamba state slot, a HiCache world's
# KV): each int64 lane as itself, but the chained hash (lane 2) in four 16-bit parts, all exact in
# float32 while the others stay below FLOAT_EXACT.
FLOAT_EXACT = 1 << 24


def float_lanes(values: np.ndarray) -> np.ndarray:
    """``values`` (n, k >= 3 int64 lanes, the hash in lane 2) as (n, k + 3) float32 lanes; a row of
    ``UNSTAMPED`` lanes (never written) as zeros, as a cleared slot holds."""
    values = np.asarray(values, dtype=np.int64)
    plain = np.delete(values, 2, axis=1)
    unstamped = (values == UNSTAMPED).all(axis=1)
    if ((plain < 0) | (plain >= FLOAT_EXACT))[~unstamped].any():
        raise ValueError(f"a canary lane outside [0, {FLOAT_EXACT}) cannot be kept exact in float32")
    h = values[:, 2].astype(np.uint64)
    parts = [(h >> np.uint64(16 * k)) & np.uint64(0xFFFF) for k in range(4)]
    out = np.stack([values[:, 0], values[:, 1], *parts, *plain[:, 2:].T], axis=1).astype(np.float32)
    out[unstamped] = 0.0
    return out


def int_lanes(lanes: np.ndarray, k: int) -> np.ndarray:
    """The inverse of ``float_lanes``: (n, k) int64 lanes; an all-zero row reads ``UNSTAMPED``."""
    v = np.asarray(lanes)[:, : k + 3].astype(np.int64)
    h = np.zeros(len(v), dtype=np.int64)
    for j in range(4):
        h |= v[:, 2 + j] << (16 * j)
    out = np.concatenate([v[:, :2], h[:, None], v[:, 6:]], axis=1)
    out[(v == 0).all(axis=1)] = UNSTAMPED
    return out


class LaneStore:
    """``SlotStore``'s lanes kept in a real pool's KV instead of a side table (a HiCache world: its
    copies between device and host move the canary with the KV, so a load-back is read as it
    restored it). ``kv``: (slots, at least 7) float32, on the CPU (written in place)."""

    LANES = SlotStore.LANES

    def __init__(self, kv: Any) -> None:
        self.kv = np.asarray(kv)
        if self.kv.dtype != np.float32 or self.kv.ndim != 2 or self.kv.shape[1] < self.LANES + 3:
            raise ValueError(f"a lane store needs (slots, >= {self.LANES + 3}) float32, not {self.kv.dtype} {self.kv.shape}")

    def get(self, slots: np.ndarray) -> np.ndarray:
        out = np.full((len(slots), self.LANES), UNSTAMPED, dtype=np.int64)
        inside = (slots >= 0) & (slots < len(self.kv))
        out[inside] = int_lanes(self.kv[slots[inside]], self.LANES)
        return out

    def put(self, slots: np.ndarray, values: np.ndarray) -> None:
        keep = slots >= 0
        if (slots[keep] >= len(self.kv)).any():
            raise ValueError(f"slots {sorted(set(slots[slots >= len(self.kv)].tolist()))} are past the pool's {len(self.kv)}")
        self.kv[slots[keep], : self.LANES + 3] = float_lanes(values[keep])


class KVCanary:
    def __init__(self, store: SlotStore | LaneStore | None = None) -> None:
        self.store = SlotStore() if store is None else store
        self.window_store = SlotStore()  # a sliding-window model's window layer: its KV by window slot
        self.owners: list[str] = []  # who stamped a slot: its owner lane indexes this
        self._owner_ids: dict[str, int] = {}
        self.in_flight: deque[Launch] = deque()
        self._expected: dict[str, _Expected] = {}

    # ---- the forward ------------------------------------------------------------------------------
    def launch(self, iteration: int, requests: list[ForwardRequest], rows: dict[int, np.ndarray],
               window: WindowView | None = None, states: StateView | None = None) -> Launch:
        """Batch ``iteration``'s forward, reading the table ``rows`` (row -> its cells, at least
        ``seq_len`` long, as the batch is launched). As a model's forward: each request reads its
        prefix (from which its new positions' hashes chain on), the batch stores its new KV, then
        every request reads its new positions back through the table; with a ``window`` layer, its
        KV goes to the window slots too and each request reads its window through them; with
        ``states``, each request's state slot must hold the state after its first ``start`` tokens,
        and is left holding the state after ``seq_len``. Records each request's last hash (a wrong
        read anywhere changes it) and every read of wrong KV or state."""
        launch = Launch(iteration, tuple(requests))
        cells = [np.asarray(rows[r.row][: r.seq_len], dtype=np.int64) for r in requests]
        for r in requests:
            self._expected.setdefault(r.rid, _Expected()).update(r.known, r.start, r.new_tokens)
        prefix = self._read(launch, requests, [c[: r.start] for c, r in zip(cells, requests)],
                            [self.expected(r.rid, r.start) for r in requests], [0] * len(requests))
        written = [self._stamps(r, got) for r, got in zip(requests, prefix)]
        if requests:
            slots = np.concatenate([np.asarray(r.out_slots, dtype=np.int64) for r in requests])
            values = np.concatenate(written)
            launch.undo.append((slots, self.store.get(slots)))
            self.store.put(slots, values)
        new = self._read(launch, requests, [c[r.start:] for c, r in zip(cells, requests)],
                         [w[:, :3] for w in written], [r.start for r in requests])
        if window is not None and requests:
            self._window(launch, requests, cells, slots, values, window)
        if states is not None and requests:
            self._states(launch, requests, states)
        wrong = {read.rid: read for read in reversed(launch.violations)}  # each request's first wrong read
        for r, got in zip(requests, new):
            last = int(got[-1, 2]) if len(got) else SEED
            first_wrong = wrong.get(r.rid)
            launch.read_ok.append(first_wrong is None)
            launch.last_hashes.append(last if first_wrong is None else mix(last, first_wrong.position + 1))
        self.in_flight.append(launch)
        return launch

    def land(self, launch: Launch, changed: list[tuple[str, int, int]]) -> list[bool]:
        """``launch`` lands (the oldest in flight). ``changed``: table cells that changed while it was
        in flight, as (request, position, the slot the cell names now); returns, for each, whether a
        read through the new slot would see wrong KV (the KV as of this launch's place in the stream)."""
        assert self.in_flight and self.in_flight[0] is launch, "forwards land in launch order"
        self.in_flight.popleft()
        later = list(self.in_flight)
        harmful = []
        for rid, position, slot in changed:
            found = self._as_of(slot, later)[:3]
            harmful.append(not np.array_equal(found, self.expected(rid, position + 1)[position]))
        return harmful

    # ---- reading and writing -----------------------------------------------------------------------
    def _read(self, launch: Launch, requests: list[ForwardRequest], slots: list[np.ndarray],
              expected: list[np.ndarray], firsts: list[int]) -> list[np.ndarray]:
        """Every request's read of ``slots`` (its cells), in one lookup; each read of wrong KV (at
        most eight per request) goes into the launch. Returns what each request read."""
        if not requests:
            return []
        sizes = [len(x) for x in slots]
        got = self.store.get(np.concatenate(slots)) if sum(sizes) else np.empty((0, SlotStore.LANES), dtype=np.int64)
        bounds = np.cumsum([0] + sizes)
        reads = [got[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
        if sum(sizes):
            wrong = np.nonzero((got[:, :3] != np.concatenate(expected)).any(axis=1))[0]
            for k in wrong.tolist():
                i = int(np.searchsorted(bounds, k, side="right")) - 1
                self._report(launch, requests[i], firsts[i] + k - int(bounds[i]), int(slots[i][k - bounds[i]]),
                             got[k], expected[i][k - bounds[i]])
        return reads

    def _window(self, launch: Launch, requests: list[ForwardRequest], cells: list[np.ndarray], slots: np.ndarray,
                values: np.ndarray, window: WindowView) -> None:
        """The window layer: the batch's new KV is stored in its slots' window slots, and each
        request reads, through its cells' window slots, every position its new queries see
        (``[start - size, seq_len)``): a window slot freed (none mapped) or holding another token's
        KV is a read of wrong KV ("window")."""
        def peers(full: np.ndarray) -> np.ndarray:
            inside = (full >= 0) & (full < len(window.mapping))
            return np.where(inside, window.mapping[np.clip(full, 0, len(window.mapping) - 1)], 0)

        mapped = peers(slots)
        self.window_store.put(np.where(mapped > 0, mapped, -1), values)
        for r, c in zip(requests, cells):
            lo = max(0, r.start - window.size)
            peer = peers(c[lo : r.seq_len])
            got = self.window_store.get(np.where(peer > 0, peer, -1))
            expected = self.expected(r.rid, r.seq_len)[lo:]
            for k in np.nonzero((got[:, :3] != expected).any(axis=1) | (peer <= 0))[0].tolist():
                self._report(launch, r, lo + k, int(peer[k]), got[k], expected[k], when="window")

    def _states(self, launch: Launch, requests: list[ForwardRequest], states: StateView) -> None:
        """The Mamba layer: each request's state slot holds the state after its prefix (the empty
        state before any token); a state restored from the wrong node, copied from the wrong slot or
        not cleared is a read of wrong state ("state"). The forward leaves each slot holding the
        state after the request's ``seq_len`` tokens."""
        slots = np.array([states.slots[r.rid] for r in requests], dtype=np.int64)
        got = states.read(slots)
        for k, r in enumerate(requests):
            expected = self.expected(r.rid, r.start)[-1] if r.start else np.array(EMPTY_STATE, dtype=np.int64)
            if not np.array_equal(got[k], expected):
                lanes = np.append(got[k], -1)  # a state slot records no writer
                self._report(launch, r, r.start - 1, int(slots[k]), lanes, expected, when="state")
        states.write(slots, np.stack([self.expected(r.rid, r.seq_len)[-1] for r in requests]))

    def _stamps(self, req: ForwardRequest, prefix: np.ndarray) -> np.ndarray:
        """What the request's new positions are stamped with, chaining on from the hash its prefix
        read last (the seed for none), with its owner lane: its own canaries when that hash is its
        own (they are known already), else the chain recomputed from the wrong hash."""
        owner = self._owner_ids.setdefault(req.rid, len(self._owner_ids))
        if owner == len(self.owners):
            self.owners.append(req.rid)
        written = np.empty((len(req.new_tokens), SlotStore.LANES), dtype=np.int64)
        written[:, 3] = owner
        own = self._expected[req.rid].canaries
        h = int(prefix[-1, 2]) if len(prefix) else SEED
        if h == (int(own[req.start - 1, 2]) if req.start else SEED):
            written[:, :3] = own[req.start : req.start + len(req.new_tokens)]
            return written
        for k, token in enumerate(req.new_tokens):
            h = mix(h, token)
            written[k, :3] = (token, req.start + k, h)
        return written

    def _report(self, launch: Launch, req: ForwardRequest, position: int, slot: int, got: np.ndarray,
                expected: np.ndarray, when: str = "launch") -> None:
        if sum(1 for v in launch.violations if v.rid == req.rid) >= 8:
            return
        found = None if (got == UNSTAMPED).all() else _as_canary(got[:3])
        owner = int(got[3])
        launch.violations.append(CanaryRead(req.rid, req.row, position, slot, _as_canary(expected), found,
                                            self.owners[owner] if owner >= 0 else None, launch.iteration, when))

    def _as_of(self, slot: int, later: list[Launch]) -> np.ndarray:
        """What ``slot`` holds before any of the ``later`` launches wrote it."""
        value = self.store.get(np.array([slot], dtype=np.int64))[0]
        for launch in reversed(later):
            for slots, before in reversed(launch.undo):
                hit = np.nonzero(slots == slot)[0]
                if len(hit):
                    value = before[hit[0]]
        return value

    # ---- what each request's KV should hold --------------------------------------------------------
    def expected(self, rid: str, n: int) -> np.ndarray:
        """The canaries of request ``rid``'s first ``n`` positions (as far as its tokens are known)."""
        return self._expected[rid].canaries[:n]


def _as_canary(lanes: np.ndarray) -> Canary:
    t, p, h = (int(v) for v in lanes)
    return t, p, h


class _Expected:
    """A request's canaries, grown as its tokens become known. A token can be taken back: in the
    overlap loop a request retracted (or finished) while a batch was in flight drops that batch's
    token, so its next forward may give another token at that position; the canaries follow the
    tokens as the request now has them."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.canaries = np.empty((0, 3), dtype=np.int64)

    def update(self, known: tuple[int, ...], start: int, new: tuple[int, ...]) -> None:
        """Positions ``[0, start)`` are the request's ``known`` tokens, ``[start, start + len(new))``
        the forward's ``new`` ones. Only what is not held yet, or differs, is chained (a prefix the
        request had before is not compared again: a token is taken back only where it was new)."""
        if len(self.tokens) < start:
            self._truncate_and_append(len(self.tokens), known[len(self.tokens):start])
        held = self.tokens[start:start + len(new)]
        if held != list(new[:len(held)]):
            first = next(k for k, (a, b) in enumerate(zip(held, new)) if a != b)
            self._truncate_and_append(start + first, new[first:])
        elif len(held) < len(new):
            self._truncate_and_append(start + len(held), new[len(held):])

    def _truncate_and_append(self, at: int, tokens: tuple[int, ...]) -> None:
        del self.tokens[at:]
        self.canaries = self.canaries[:at]
        h = int(self.canaries[-1, 2]) if at else SEED
        grown = np.empty((len(tokens), 3), dtype=np.int64)
        for k, token in enumerate(tokens):
            h = mix(h, token)
            grown[k] = (token, at + k, h)
        self.tokens.extend(tokens)
        self.canaries = np.concatenate([self.canaries, grown])
