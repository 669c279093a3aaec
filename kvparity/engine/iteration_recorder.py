"""What every scheduler-driven player does beside its scheduler's loop, alike for SGLang's own loop
in the scheduler shell (``kvparity.engine.real.scheduler_shell``) and kvparity's model of it
(``kvparity.engine.traffic_loop``): the replaced forward's KV canary (``kvparity.engine.canary``),
and after every iteration a snapshot of memory (``kvparity.engine.snapshot.iteration_snapshot``),
the same state the harness drive snapshots after every stage.

The player says what it knows and the recorder does not: which requests exist and in which state
(``RequestState``), each batch's forward inputs, the accounting its admission used. The recorder
knows each request's live columns (the sequence length of the last forward that included it).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from kvparity.engine.canary import ForwardRequest, Launch, canary_for, hybrid_views
from kvparity.engine.scheduler import StageRecord
from kvparity.engine.snapshot import RequestView, Snapshot, full_allocator, iteration_snapshot, memory_view
from kvparity.model.poison import POISON
from kvparity.model.traffic_records import Decision

LIVE = ("running", "chunked")  # the statuses of a request that holds a row and KV
# The PrefillAdder's starting budgets, where a release has them: the prompt tokens it may admit, the
# chunk, what the running requests' outputs reserve (at new_token_ratio), and the KV it may use.
ADMISSION_BUDGET = ("rem_input_tokens", "rem_chunk_tokens", "rem_total_token_offset", "rem_total_tokens")


def admission_budget(adder: Any) -> tuple[tuple[str, float], ...]:
    """What a PrefillAdder was given, as it starts (those of ``ADMISSION_BUDGET`` it has)."""
    out = []
    for name in ADMISSION_BUDGET:
        try:
            value = getattr(adder, name)
        except Exception:  # a property this release cannot compute yet
            continue
        if isinstance(value, (int, float)):
            out.append((name, float(value)))
    return tuple(out)


@dataclass(frozen=True)
class RequestState:
    """A request as its scheduler holds it at the end of an iteration: ``status`` "waiting"
    (arrived, or retracted, and not running), "running", "chunked" or "finished"; a live one's
    ``row`` and the length of its prefix the tree owns (``protected_len``: SGLang's
    ``last_matched_prefix_len``, later ``cache_protected_len``); its outputs so far."""

    status: str
    row: int | None = None
    protected_len: int = 0
    output_len: int = 0


class IterationRecorder:
    def __init__(self, world: Any, *, radix: bool, kv_slots: int, page_size: int, width: int) -> None:
        """``world``: the pools, allocator and tree (``release_pages``, ``tree_contents`` and
        ``all_tree_slots`` as a world answers them); ``width``: the table columns a snapshot keeps
        (every sequence of the run fits)."""
        self.world = world
        self.radix = radix
        self.width = width
        self.canary = canary_for(world)
        self.slotted: dict[str, int] = {}
        self.seconds = 0.0  # spent on canaries and snapshots (the cost the report states)

    # ---- the forward -----------------------------------------------------------------------------
    def launch(self, iteration: int, requests: list[ForwardRequest]) -> Launch:
        """A batch's forward reads the table now (as it is launched) and stamps its new slots."""
        t0 = time.perf_counter()
        table = self.world.req_to_token_pool.req_to_token.numpy(force=True)  # a view on the CPU
        launch = self.canary.launch(iteration, requests, {r.row: table[r.row] for r in requests},
                                    *hybrid_views(self.world, requests))
        for req in requests:
            self.slotted[req.rid] = req.seq_len
        self.seconds += time.perf_counter() - t0
        return launch

    def land(self, launch: Launch, changed: list[tuple[str, int, int]]) -> list[bool]:
        t0 = time.perf_counter()
        harmful = self.canary.land(launch, changed)
        self.seconds += time.perf_counter() - t0
        return harmful

    # ---- after every iteration ---------------------------------------------------------------------
    def snapshot(self, decision: Decision, out_cache_loc: Sequence[int] | None, launch: Launch | None,
                 requests: dict[str, RequestState], accounting: tuple[tuple[str, float], ...] = (),
                 reqs: Iterable[Any] = ()) -> Snapshot:
        """Memory after the iteration whose batch is ``decision`` (its forward ``launch``); ``reqs``:
        the player's waiting SGLang requests (a Mamba model's may hold a state slot)."""
        t0 = time.perf_counter()
        table = self.world.req_to_token_pool.req_to_token
        pending = self._pending(requests)
        views = {rid: self._view(rid, state, table, pending.get(rid, ())) for rid, state in requests.items()}
        record = StageRecord(
            step=decision.iteration, kind=(decision.mode or "idle").lower(), rids=decision.rids, rows=decision.rows,
            seq_lens=decision.seq_lens, extend_lens=decision.extend_lens,
            out_cache_loc=None if out_cache_loc is None else tuple(int(s) for s in out_cache_loc),
            canary=tuple(launch.violations) if launch is not None else (),
        )
        snap = iteration_snapshot(self.world, self.radix, record, views, width=self.width, accounting=accounting,
                                  reqs=reqs)
        self.seconds += time.perf_counter() - t0
        return snap

    def written_past_width(self) -> int:
        """Cells past the columns snapshots keep that are not the poison any more: none may be (no
        sequence of the run reaches them). Checked once, at the end of a run: a cell written there
        stays written."""
        table = self.world.req_to_token_pool.req_to_token
        return int((table[:, self.width:] != POISON).sum()) if table.shape[1] > self.width else 0

    def _pending(self, requests: dict[str, RequestState]) -> dict[str, tuple[int, ...]]:
        """The slots a batch still in flight allocated for a request that is no longer live (it
        finished, or was retracted, on an earlier batch's result), and that are not free yet: a
        release frees them when that batch lands (SGLang drops the request's token there), so until
        then they are in flight, not leaked. A slot still pending after its batch landed is a leak."""
        gone = {req.rid: req.out_slots for launch in self.canary.in_flight for req in launch.requests
                if requests.get(req.rid, RequestState("waiting")).status not in LIVE}
        if not gone:
            return {}
        allocator = full_allocator(self.world.allocator)
        page_size = int(getattr(allocator, "page_size", 1))
        free = set(allocator.free_pages.tolist()) | set(self.world.release_pages().tolist())
        return {rid: tuple(s for s in slots if s // page_size not in free) for rid, slots in gone.items()}

    def _view(self, rid: str, state: RequestState, table: Any, pending: tuple[int, ...]) -> RequestView:
        if state.status not in LIVE or state.row is None:
            return memory_view(state.status, None, 0, state.output_len, pending, 0)
        slotted = self.slotted.get(rid, 0)
        start = min(state.protected_len, slotted)
        held = tuple(int(s) for s in table[state.row, start:slotted].tolist())
        return memory_view(state.status, state.row, state.protected_len, state.output_len, held, slotted)


def extend_requests(rids: Sequence[str], rows: Sequence[int], seq_lens: Sequence[int], prefix_lens: Sequence[int],
                    input_ids: Sequence[int], out_cache_loc: Sequence[int],
                    known: Sequence[tuple[int, ...]]) -> list[ForwardRequest]:
    """An extend batch's forward inputs, per request: its new tokens and slots are its share of the
    batch's ``input_ids`` and ``out_cache_loc`` (in batch order)."""
    out, offset = [], 0
    for rid, row, seq, prefix, own in zip(rids, rows, seq_lens, prefix_lens, known):
        n = seq - prefix
        out.append(ForwardRequest(rid, row, seq, prefix, tuple(input_ids[offset:offset + n]),
                                  tuple(out_cache_loc[offset:offset + n]), own))
        offset += n
    return out


def decode_requests(rids: Sequence[str], rows: Sequence[int], seq_lens: Sequence[int], input_ids: Sequence[int],
                    out_cache_loc: Sequence[int], known: Sequence[tuple[int, ...]]) -> list[ForwardRequest]:
    """A decode batch's: one new token per request, at its last position."""
    return [ForwardRequest(rid, row, seq, seq - 1, (token,), (slot,), own)
            for rid, row, seq, token, slot, own in zip(rids, rows, seq_lens, input_ids, out_cache_loc, known)]
