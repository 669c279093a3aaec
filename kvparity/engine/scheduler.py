"""The scheduler loop of SPEC section 6, played on one world.

``Scheduler.apply(step)`` is a generator: it yields a ``StageRecord`` after every stage that can
change state (caching the chunked request, the extend batch, processing the prefill results, a
decode step's retractions, the decode itself, its finishes, ...), so that the runner can snapshot
all worlds between stages. Every world uses this same loop; only the world's ``Req``,
``ScheduleBatch`` and caches differ. It follows every rule SPEC 6 marks "must":

- after every prefill, a request that is not finished and not chunked is cached with
  ``cache_unfinished_req`` (so that later requests can match its prompt), a finished one with
  ``cache_finished_req``;
- no decode runs while a chunked request is pending (a ``Decode`` step then runs its next chunk);
- a decode step checks memory first and retracts, in SGLang's order, until the rest fits;
- the finishes of a decode step are freed inside one free group.

Harmless widenings (SPEC 6 allows them; every world gets the same steps): ``Retract`` at any time,
``Evict`` at any time, chunk sizes that are not page multiples, the chunked request placed last
(``Extend.chunked_last``), and admission that checks rows but not memory, so that a prefill may
run out of memory: that is an off-path class, labelled as such, after which a scenario stops.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch

from kvparity.engine.canary import ForwardRequest, canary_for, hybrid_views
from kvparity.engine.interface import SchedulerWorld
from kvparity.mem_cache.errors import Exhausted
from kvparity.model.contract import batch_prefix_violations
from kvparity.model.records import LogprobAdmission, Note, Observation, StageRecord
from kvparity.model.scenario import Decode, Evict, Extend, Retract, Scenario, Step

__all__ = ["Scheduler", "StageRecord", "ceil_to_page", "retract_order", "sampled_token"]


def sampled_token(request_index: int, position: int, read_ok: bool = True, read_hash: int = 0) -> int:
    """The token a request "samples" at ``position``: deterministic, the same in every world, and a
    function of what its forward read: after a read of wrong KV (the canary's) it is another one,
    outside the range right reads give, from the hash read."""
    if not read_ok:
        return 1097 + read_hash % 97
    return 1000 + (request_index * 31 + position * 7) % 97


def ceil_to_page(n: int, page_size: int) -> int:
    return -(-n // page_size) * page_size


def retract_order(reqs: list[Any]) -> list[int]:
    """SGLang's ``retract_decode`` order, as a stack: the LAST index is retracted first. It pops
    the fewest output tokens first, then the longest prompt, then the latest in the batch."""
    order = list(range(len(reqs)))
    order.sort(key=lambda i: (len(reqs[i].output_ids), -len(reqs[i].origin_input_ids)), reverse=True)
    return order


class Scheduler:
    def __init__(self, world: SchedulerWorld, scenario: Scenario) -> None:
        # ``world``: a kvparity.engine.world.World, or a real-SGLang world of one generation's adapter
        # (built in a worker process): the interface of kvparity.engine.interface.
        self.world = world
        self.scenario = scenario
        self.page_size = scenario.geometry.page_size
        self.reqs: dict[str, Any] = {}
        self.index: dict[str, int] = {}
        for i, spec in enumerate(scenario.requests):
            self.reqs[spec.rid] = world.new_req(
                spec.rid,
                list(spec.tokens),
                return_logprob=spec.return_logprob,
                logprob_start_len=spec.logprob_start_len,
                max_new_tokens=spec.max_new_tokens,
                extra_key=spec.extra_key,
            )
            self.index[spec.rid] = i
        # waiting | scheduled (in the batch just run) | chunked | running | finished
        self.status: dict[str, str] = {rid: "waiting" for rid in self.reqs}
        self.slotted: dict[str, int] = {rid: 0 for rid in self.reqs}  # tokens with a KV slot
        self.running: list[str] = []
        self.chunked: str | None = None
        self.chunked_has_row = False
        self.chunk_to_stash = False  # the chunked request ran a chunk that is not cached yet
        self.finished_prompts: set[tuple[int, ...]] = set()
        self.retracted: set[str] = set()
        self.halted: str | None = None
        self._freed_chunk_row: tuple[int | None, str | None] = (None, None)
        # The replaced forward's KV canary (kvparity.engine.canary): each request's last read.
        self.canary = canary_for(world)
        self.last_read: dict[str, tuple[bool, int]] = {}

    # ---- helpers ---------------------------------------------------------------------------------
    @property
    def cache(self) -> Any:
        return self.world.tree_cache

    @property
    def pool(self) -> Any:
        return self.world.req_to_token_pool

    @property
    def allocator(self) -> Any:
        return self.world.allocator

    @property
    def radix(self) -> bool:
        return self.scenario.cache_kind == "radix"

    def _lock(self, req: Any) -> None:
        self.world.lock(req)  # the PrefillAdder's admission lock, in the world's own terms

    def _sample(self, rid: str) -> None:
        req = self.reqs[rid]
        ok, read_hash = self.last_read.get(rid, (True, 0))
        req.output_ids.append(sampled_token(self.index[rid], len(req.output_ids), ok, read_hash))

    def _forward(self, record: StageRecord, seq_lens: Sequence[int], starts: Sequence[int],
                 new_tokens: list[tuple[int, ...]]) -> None:
        """The forward of the batch ``record`` prepared, launched and landed at once: every request
        reads its row's columns ``[0, seq_len)`` and stamps its new slots (``out_cache_loc``, in
        batch order, from its position ``start``); reads of wrong KV go into the record."""
        out = record.out_cache_loc or ()
        requests, offset = [], 0
        for rid, row, seq, start, tokens in zip(record.rids, record.rows, seq_lens, starts, new_tokens):
            req = self.reqs[rid]
            known = tuple(req.origin_input_ids) + tuple(req.output_ids)
            requests.append(ForwardRequest(rid, row, seq, start, tokens, tuple(out[offset:offset + len(tokens)]), known))
            offset += len(tokens)
        table = self.pool.req_to_token
        rows = sorted({r.row for r in requests})
        read = dict(zip(rows, table[rows].numpy(force=True))) if rows else {}
        launch = self.canary.launch(record.step, requests, read, *hybrid_views(self.world, requests))
        self.canary.land(launch, [])
        record.canary = tuple(launch.violations)
        for req, ok, h in zip(requests, launch.read_ok, launch.last_hashes):
            self.last_read[req.rid] = (ok, h)

    def _reached_max_new_tokens(self, rid: str) -> bool:
        return len(self.reqs[rid].output_ids) >= self.scenario.request(rid).max_new_tokens

    def _counter(self, obj: Any, name: str) -> int:
        return getattr(obj, name, 0)

    def _fail(self, record: StageRecord, exc: Exception) -> None:
        """Out of memory when the world says ``exc`` is its out-of-memory error (and of what),
        else an error; the scenario halts."""
        exhausted: Exhausted | None = self.world.out_of_memory(exc)
        record.fail("oom" if exhausted is not None else "error", exc, exhausted)
        self.halted = record.error

    # ---- steps -------------------------------------------------------------------------------------
    def apply(self, step_index: int, step: Step) -> Iterator[StageRecord]:
        if self.halted:
            return
        self.world.host_events()  # as a server's pass starts: a host tier's finished transfers
        if isinstance(step, Extend):
            yield from self._extend(step_index, step)
        elif isinstance(step, Decode):
            yield from self._decode_step(step_index, step)
        elif isinstance(step, Retract):
            yield self._retract(step_index, step.rid)
        elif isinstance(step, Evict):
            yield self._evict(step_index, step.num_tokens)
        else:
            raise TypeError(f"unknown step {step!r}")

    # ---- prefill -----------------------------------------------------------------------------------
    def _extend(self, step_index: int, step: Extend, notes: tuple[Note, ...] = ()) -> Iterator[StageRecord]:
        if self.chunked is not None and self.chunk_to_stash:
            yield self._cache_chunked(step_index)
        splits_before = self._counter(self.cache, "num_splits")
        batch, admission_notes = self._form_batch(step_index, step)
        if not batch:
            yield StageRecord(step_index, "skip", notes=notes + (Note.EMPTY_EXTEND,))
            return
        observed: list[Observation] = [*notes, *admission_notes]
        record = self._run_extend(step_index, batch, observed, splits_before)
        yield record
        if record.outcome == "ok":
            result = self._process_prefill(step_index, batch)
            if result is not None:
                yield result

    def _cache_chunked(self, step_index: int) -> StageRecord:
        """SPEC 6: before the next batch, cache the chunked request and free its row."""
        rid = self.chunked
        assert rid is not None  # called only while a chunked request waits to be cached
        req = self.reqs[rid]
        row, prefix, fill_len = req.req_pool_idx, _values(req.prefix_indices), len(req.fill_ids)
        self.world.cache_unfinished_req(req, chunked=True)
        self.chunk_to_stash = False
        if self.world.stash_frees_row:
            self.pool.free(row)
            self._freed_chunk_row = (row, rid)
            self.chunked_has_row = False
        self.world.init_next_round_input(req, use_tree_cache=False)
        return StageRecord(
            step_index,
            "cache_unfinished",
            rids=(rid,),
            rows=(row,),
            prefix_values=(tuple(prefix),),
            write_region=((row, len(prefix), fill_len),),
        )


    def _form_batch(self, step_index: int, step: Extend) -> tuple[list[str], list[Observation]]:
        """SGLang's ``PrefillAdder``, rows checked, memory not (see the module docstring): the
        chunked request first, cut to the budget with no page rounding; then waiting requests,
        each taking ``ceil_to_page(extend_input_len)`` of the budget; the first that does not fit
        is cut to whole pages of what is left and becomes the chunked request, and admission stops."""
        ps = self.page_size
        budget: float = self.scenario.chunk_size or float("inf")
        batch: list[str] = []
        notes: list[Observation] = []
        new_chunked: str | None = None
        carried = self.chunked
        if carried is not None and not step.chunked_last:
            budget -= self._take_chunked(carried, budget)
            batch.append(carried)
        # With chunked_last, new requests must fit whole and leave room for the chunked one.
        reserve = 1 if (carried is not None and step.chunked_last) else 0
        for rid in step.admit:
            if self.status[rid] != "waiting" or self.scenario.request(rid).arrival > step_index:
                continue
            if budget - reserve <= 0 or new_chunked is not None:
                break
            rows_needed = len(batch) + 1 + (1 if carried is not None and carried not in batch else 0)
            if self.pool.available_size() < rows_needed:
                break  # no request row left for it (SGLang's admission checks rows too)
            req = self.reqs[rid]
            self.world.init_next_round_input(req)
            notes += self._admission_notes(rid, req)
            self.world.load_back(req)  # a host hit: the PrefillAdder loads it back before cutting
            need = ceil_to_page(req.extend_input_len, ps)
            if need > budget - reserve:
                if reserve:
                    self.world.refuse(req)
                    continue
                cut = int(budget) // ps * ps
                if cut <= 0:
                    self.world.refuse(req)
                    break  # SGLang admits nothing more in this batch
                self.world.admit(req, cut, continuing=False)
                new_chunked = rid
                need = cut
            else:
                self.world.admit(req, None, continuing=False)
            self._lock(req)
            budget -= need
            batch.append(rid)
            self.status[rid] = "scheduled"
        if carried is not None and step.chunked_last:
            self._take_chunked(carried, budget)
            batch.append(carried)
        if new_chunked is not None:
            self.chunked = new_chunked
        elif carried is not None and len(self.reqs[carried].fill_ids) == self.reqs[carried].seqlen:
            self.chunked = None  # its last chunk is in this batch
        return batch, notes

    def _take_chunked(self, rid: str, budget: float) -> int:
        """The chunked request's next chunk: what is left of its prompt, cut to the budget with no
        page rounding. Returns the budget it takes (whole pages)."""
        req = self.reqs[rid]
        self.world.admit(req, int(budget) if req.extend_input_len > budget else None, continuing=True)
        self.status[rid] = "scheduled"
        return ceil_to_page(req.extend_input_len, self.page_size)

    def _admission_notes(self, rid: str, req: Any) -> list[Observation]:
        notes: list[Observation] = []
        if req.last_matched_prefix_len > 0:
            notes.append(Note.RADIX_HIT)
            if tuple(req.origin_input_ids) in self.finished_prompts:
                notes.append(Note.EXACT_REPEAT)
            # Locked before this request locks it: a running (or chunked) request holds the node.
            if getattr(req.last_node, "lock_ref", 0) > 0:
                notes.append(Note.RADIX_HIT_ON_RUNNING)
        if rid in self.retracted:
            notes.append(Note.READMITTED)
        if req.return_logprob:
            requested = self.scenario.request(rid).logprob_start_len
            notes.append(LogprobAdmission(rid, requested, req.logprob_start_len, req.last_matched_prefix_len))
        return notes

    def _run_extend(self, step_index: int, batch: list[str], notes: list[Observation], splits_before: int) -> StageRecord:
        reqs = [self.reqs[rid] for rid in batch]
        free_rows_before = list(self.pool.free_slots)
        prefixes = tuple(tuple(_values(r.prefix_indices)) for r in reqs)
        violations: tuple[str, ...] = ()
        if self.world.family == "refactored":
            violations = tuple(batch_prefix_violations(reqs, self.pool.device))
        schedule_batch = self.world.batch(reqs)
        record = StageRecord(
            step_index,
            "extend",
            rids=tuple(batch),
            prefix_values=prefixes,
            seq_lens=tuple(len(r.fill_ids) for r in reqs),
            extend_lens=tuple(r.extend_input_len for r in reqs),
            contract_violations=violations,
        )
        merges_before = self._counter(self.allocator, "num_merges")
        evicted_before = self._counter(self.cache, "num_evicted")
        try:
            schedule_batch.prepare_for_extend()
        except Exception as exc:  # a broken version may fail in any way: report, never crash
            return self._halt(record, exc, free_rows_before)
        record.rows = tuple(r.req_pool_idx for r in reqs)
        record.out_cache_loc = tuple(schedule_batch.out_cache_loc.tolist())
        record.out_cache_loc_dtype = dtype_name(schedule_batch.out_cache_loc)
        if schedule_batch.last_loc is not None:
            record.last_loc = tuple(schedule_batch.last_loc.tolist())
            record.last_loc_dtype = dtype_name(schedule_batch.last_loc)
        record.write_region = tuple((row, 0, seq) for row, seq in zip(record.rows, record.seq_lens))
        starts = [len(p) for p in prefixes]
        self._forward(record, record.seq_lens, starts,
                      [tuple(r.fill_ids[p:n]) for r, p, n in zip(reqs, starts, record.seq_lens)])
        if self._counter(self.cache, "num_splits") > splits_before:
            notes.append(Note.NODE_SPLIT)
        if self._counter(self.allocator, "num_merges") > merges_before:
            notes.append(Note.MERGE_BEFORE_ALLOC_EXTEND if self.page_size > 1 else Note.MERGE_BEFORE_ALLOC)
        if self._counter(self.cache, "num_evicted") > evicted_before:
            notes.append(Note.EXTEND_EVICTED)
        record.notes = tuple(notes) + self._row_reuse_notes(batch, record.rows)
        self._freed_chunk_row = (None, None)
        for rid, seq in zip(batch, record.seq_lens):
            self.slotted[rid] = seq
        return record

    def _row_reuse_notes(self, batch: list[str], rows: tuple[int, ...]) -> tuple[Note, ...]:
        """The chunked request's row, freed just before this batch, taken again in it."""
        freed, owner = self._freed_chunk_row
        if freed is None or freed not in rows:
            return ()
        taker = batch[rows.index(freed)]
        return (Note.ROW_REUSE,) + ((Note.ROW_REUSE_BY_ANOTHER,) if taker != owner else ())

    def _halt(self, record: StageRecord, exc: Exception, free_rows_before: list[int]) -> StageRecord:
        self._fail(record, exc)
        # Rows the failed batch took (legacy also wrote its prefixes into them: SPEC section 4).
        taken = [row for row in free_rows_before if row not in self.pool.free_slots]
        record.rows = tuple(taken)
        record.write_region = tuple((row, 0, len(p)) for row, p in zip(taken, record.prefix_values))
        return record

    def _process_prefill(self, step_index: int, batch: list[str]) -> StageRecord | None:
        """SGLang's prefill result processing, in batch order: the chunked request discards its
        token; every other request samples one, then is cached finished (``max_new_tokens``
        reached) or unfinished ("so that others can match"), and joins the running batch."""
        done = [rid for rid in batch if rid != self.chunked]
        for rid in batch:
            if rid == self.chunked:
                self.status[rid] = "chunked"
                self.chunked_has_row = True
                self.chunk_to_stash = True
        if not done:
            return None
        reqs = [self.reqs[rid] for rid in done]
        record = StageRecord(
            step_index,
            "prefill_result",
            rids=tuple(done),
            rows=tuple(r.req_pool_idx for r in reqs),
            prefix_values=tuple(tuple(_values(r.prefix_indices)) for r in reqs),
        )
        finished, region = [], []
        for rid, req in zip(done, reqs):
            self._sample(rid)
            if self._reached_max_new_tokens(rid):
                region.append(self._finish_region(rid))
                self._finish(rid)
                finished.append(rid)
                continue
            # The tree inserts whole pages: where the prefix ends inside a page (a sliding-window
            # tree's may), the dedup repoints that page from its start.
            ps = self.scenario.geometry.page_size
            region.append((req.req_pool_idx, len(req.prefix_indices) // ps * ps, len(req.fill_ids)))
            self.world.cache_unfinished_req(req)
            self.status[rid] = "running"
            self.running.append(rid)
        record.finished = tuple(finished)
        record.write_region = tuple(region)
        return record

    def _finish_region(self, rid: str) -> tuple[int, int, int]:
        """What a finish may write: the request's own slotted columns of its own row, before the row
        is freed (SGLang 0.5.22+ repoint them onto the tree's slots; earlier releases write nothing)."""
        return (self.reqs[rid].req_pool_idx, 0, self.slotted[rid])

    def _finish(self, rid: str) -> None:
        req = self.reqs[rid]
        self.world.cache_finished_req(req)
        if rid in self.running:
            self.running.remove(rid)
        self.status[rid] = "finished"
        self.finished_prompts.add(tuple(req.origin_input_ids))

    # ---- decode ------------------------------------------------------------------------------------
    def _decode_step(self, step_index: int, step: Decode) -> Iterator[StageRecord]:
        if self.chunked is not None:
            # (must) No decode while a chunked request is pending: SGLang runs its next chunk.
            yield from self._extend(step_index, Extend(()), notes=(Note.DECODE_REPLACED_BY_CHUNK,))
            return
        if not self.running:
            yield StageRecord(step_index, "skip", notes=(Note.EMPTY_DECODE,))
            return
        retracted = self._retract_for_decode(step_index)
        if retracted is not None:
            yield retracted
        record = self._decode(step_index)
        yield record
        if record.outcome == "ok":
            finishes = self._process_decode(step_index, step)
            if finishes is not None:
                yield finishes

    def _retract_for_decode(self, step_index: int) -> StageRecord | None:
        """(must) Memory first: when the next decode does not fit even after eviction, retract in
        SGLang's order until the rest fits; never the last request left."""
        rids = list(self.running)
        reqs = [self.reqs[rid] for rid in rids]
        rows = [r.req_pool_idx for r in reqs]
        batch = self.world.batch(reqs)
        if batch.check_decode_mem():
            return None
        order = retract_order(reqs)
        gone: list[int] = []
        first = True
        while first or not batch.check_decode_mem(selected_indices=order):
            if len(order) == 1:
                break  # SGLang keeps the last one (and asserts some memory is left)
            first = False
            idx = order.pop()
            gone.append(idx)
            batch.release_req(idx, len(order))
        if not gone:
            return None
        for idx in gone:
            self._back_to_waiting(rids[idx])
        return StageRecord(
            step_index,
            "decode_retract",
            rids=tuple(rids[i] for i in gone),
            rows=tuple(rows[i] for i in gone),
            notes=(Note.DECODE_RETRACT,),
        )

    def _back_to_waiting(self, rid: str) -> None:
        self.running.remove(rid)
        self.status[rid] = "waiting"
        self.slotted[rid] = 0
        self.retracted.add(rid)

    def _decode(self, step_index: int) -> StageRecord:
        reqs = [self.reqs[rid] for rid in self.running]
        positions = tuple(self.slotted[rid] for rid in self.running)
        record = StageRecord(step_index, "decode", rids=tuple(self.running), rows=tuple(r.req_pool_idx for r in reqs))
        record.seq_lens = positions
        merges_before = self._counter(self.allocator, "num_merges")
        try:
            out = self.world.batch(reqs).prepare_for_decode()
        except Exception as exc:
            self._fail(record, exc)
            return record
        if self._counter(self.allocator, "num_merges") > merges_before:
            record.notes = (Note.MERGE_BEFORE_ALLOC_DECODE if self.page_size > 1 else Note.MERGE_BEFORE_ALLOC,)
        record.out_cache_loc = tuple(out.tolist())
        record.out_cache_loc_dtype = dtype_name(out)
        record.write_region = tuple((row, pos, pos + 1) for row, pos in zip(record.rows, positions))
        for rid in self.running:
            self.slotted[rid] += 1
        own = [tuple(r.origin_input_ids) + tuple(r.output_ids) for r in reqs]  # the new token is the last output
        self._forward(record, [p + 1 for p in positions], positions, [(tokens[p],) for tokens, p in zip(own, positions)])
        return record

    def _process_decode(self, step_index: int, step: Decode) -> StageRecord | None:
        """(must) Inside ONE free group: every running request samples its token; those that
        sampled a stop token (``step.finish``) or reached ``max_new_tokens`` are cached finished."""
        finishing, region = [], []
        self.allocator.free_group_begin()
        for rid in list(self.running):
            self._sample(rid)
            if rid in step.finish or self._reached_max_new_tokens(rid):
                row = self.reqs[rid].req_pool_idx
                region.append(self._finish_region(rid))
                self._finish(rid)
                finishing.append((rid, row))
        self.allocator.free_group_end()
        if not finishing:
            return None
        notes: tuple[Note, ...] = ()
        if len(finishing) >= 2 and self.page_size > 1:
            notes = (Note.PAGED_FINISHES_IN_ONE_GROUP,)
        return StageRecord(
            step_index,
            "decode_finish",
            rids=tuple(rid for rid, _ in finishing),
            rows=tuple(row for _, row in finishing),
            finished=tuple(rid for rid, _ in finishing),
            notes=notes,
            write_region=tuple(region),
        )

    # ---- widenings -----------------------------------------------------------------------------------
    def _retract(self, step_index: int, rid: str) -> StageRecord:
        """Retract one running request at any time (a widening of SGLang's retract under memory
        pressure: the same ``release_req``)."""
        if self.status[rid] != "running":
            return StageRecord(step_index, "skip", rids=(rid,), notes=(Note.RETRACT_NOT_RUNNING,))
        rids = list(self.running)
        row = self.reqs[rid].req_pool_idx
        self.world.batch([self.reqs[r] for r in rids]).release_req(rids.index(rid), len(rids) - 1)
        self._back_to_waiting(rid)
        return StageRecord(step_index, "retract", rids=(rid,), rows=(row,))

    def _evict(self, step_index: int, num_tokens: int) -> StageRecord:
        if self.scenario.cache_kind != "radix":
            return StageRecord(step_index, "skip", notes=(Note.EVICT_WITHOUT_RADIX,))
        self.world.evict(num_tokens)
        return StageRecord(step_index, "evict")

    # ---- what each request holds (for the conservation oracle) ------------------------------------
    def held_slots(self, rid: str, table: Any = None, prefix: Sequence[int] | None = None) -> list[int]:
        """The KV slots the request owns, the tree's excluded: the slotted columns of its row from
        ``last_matched_prefix_len`` on (before that, the tree supplies them; after
        ``cache_unfinished_req`` the row may keep stale cells there, SPEC 1 step 2). A chunked
        request whose row was freed owns its prefix from that length on (its unaligned tail, or
        everything with the chunk cache). A snapshot passes its host copy of the table (a tensor
        or a NumPy array) and the prefix's values it already read, so that nothing is read back
        from the device again."""
        req, status = self.reqs[rid], self.status[rid]
        if status in ("waiting", "finished"):
            return []
        start = req.last_matched_prefix_len
        if req.req_pool_idx is None or (status == "chunked" and not self.chunked_has_row):
            return (_values(req.prefix_indices) if prefix is None else list(prefix))[start:]
        slotted = self.slotted[rid]
        table = self.pool.req_to_token if table is None else table
        return table[req.req_pool_idx, start:slotted].tolist() if slotted > start else []


def dtype_name(tensor: torch.Tensor) -> str:
    """A tensor's dtype as golden files write it, without its module: "int64"."""
    return str(tensor.dtype).removeprefix("torch.")


def _values(prefix: Any) -> list[int]:
    return prefix.tolist() if isinstance(prefix, torch.Tensor) else [int(v) for v in prefix]
