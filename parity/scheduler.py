"""The scheduler loop of SPEC section 6, played on one world.

``Scheduler.apply(step)`` is a generator: it yields a ``StageRecord`` after every stage that can
change state (caching the chunked request, the extend batch, a decode step, ...), so that the
runner can snapshot all worlds between stages. Both versions use this same loop; only the world's
``Req``, ``ScheduleBatch`` and ``ChunkCache`` differ.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

import torch

from parity.contract import batch_prefix_violations
from parity.scenario import Decode, Evict, Extend, Finish, Retract, Scenario, Step
from parity.world import World


@dataclass
class StageRecord:
    """What one stage did, in plain values (for oracles, classes and reports)."""

    step: int
    kind: str  # cache_unfinished | extend | decode | finish | retract | evict | skip
    rids: tuple[str, ...] = ()
    rows: tuple[int, ...] = ()
    prefix_values: tuple[tuple[int, ...], ...] = ()  # captured BEFORE the stage ran
    seq_lens: tuple[int, ...] = ()
    extend_lens: tuple[int, ...] = ()
    out_cache_loc: tuple[int, ...] | None = None
    last_loc: tuple[int, ...] | None = None
    outcome: str = "ok"  # ok | oom | error
    error: str | None = None
    contract_violations: tuple[str, ...] = ()
    # cells this stage may write: (row, first column, end column)
    write_region: tuple[tuple[int, int, int], ...] = ()
    notes: tuple[str, ...] = ()  # observations for scenario classes

    def describe(self) -> str:
        what = f"step {self.step} {self.kind}"
        if self.rids:
            what += f" {list(self.rids)}"
        if self.outcome != "ok":
            what += f" -> {self.outcome}: {self.error}"
        return what


_LOGPROB_NOTE = "logprob requested {} start {} matched {}"


def logprob_note(requested: int, start: int, matched: int) -> str:
    """Admission note of a request with logprobs: what it asked for, what the server made of it,
    and how many tokens the cache supplied."""
    return _LOGPROB_NOTE.format(requested, start, matched)


def parse_logprob_note(note: str) -> tuple[int, int, int] | None:
    parts = note.split()
    if len(parts) != 7 or parts[:2] != ["logprob", "requested"]:
        return None
    return int(parts[2]), int(parts[4]), int(parts[6])


def sampled_token(request_index: int, position: int) -> int:
    """The token a request "samples" at ``position``: deterministic, the same in every world."""
    return 1000 + (request_index * 31 + position * 7) % 97


class Scheduler:
    def __init__(self, world: World, scenario: Scenario) -> None:
        self.world = world
        self.scenario = scenario
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
        self.status: dict[str, str] = {rid: "waiting" for rid in self.reqs}
        self.running: list[str] = []
        self.chunked: str | None = None
        self.chunked_has_row = False
        self.finished_prompts: set[tuple[int, ...]] = set()
        self.retracted: set[str] = set()
        self.halted: str | None = None
        self._freed_chunk_row: tuple[int | None, str | None] = (None, None)

    # ---- helpers ---------------------------------------------------------------------------------
    @property
    def cache(self) -> Any:
        return self.world.tree_cache

    @property
    def pool(self) -> Any:
        return self.world.req_to_token_pool

    def _lock(self, req: Any) -> None:
        if self.scenario.cache_kind == "radix":
            self.cache.inc_lock_ref(req.last_node)

    def _sample(self, rid: str) -> None:
        req = self.reqs[rid]
        req.output_ids.append(sampled_token(self.index[rid], len(req.output_ids)))

    # ---- steps -------------------------------------------------------------------------------------
    def apply(self, step_index: int, step: Step) -> Iterator[StageRecord]:
        if self.halted:
            return
        if isinstance(step, Extend):
            yield from self._extend(step_index, step)
        elif isinstance(step, Decode):
            yield self._decode(step_index)
        elif isinstance(step, Finish):
            yield self._finish(step_index, step.rid)
        elif isinstance(step, Retract):
            yield self._retract(step_index, step.rid)
        elif isinstance(step, Evict):
            yield self._evict(step_index, step.num_tokens)
        else:
            raise TypeError(f"unknown step {step!r}")

    def _extend(self, step_index: int, step: Extend) -> Iterator[StageRecord]:
        if self.chunked is not None and self.chunked_has_row:
            yield self._cache_chunked(step_index)
        self._splits_before = getattr(self.cache, "num_splits", 0)
        batch, notes = self._form_batch(step_index, step)
        if not batch:
            yield StageRecord(step_index, "skip", notes=("empty extend",))
            return
        yield self._run_extend(step_index, batch, notes)

    def _cache_chunked(self, step_index: int) -> StageRecord:
        """SPEC 6: before the next batch, cache the chunked request and free its row."""
        rid = self.chunked
        req = self.reqs[rid]
        row, old_pre, fill_len = req.req_pool_idx, len(req.prefix_indices), len(req.fill_ids)
        self.cache.cache_unfinished_req(req)
        self.pool.free(row)
        self._freed_chunk_row = (row, rid)
        self.chunked_has_row = False
        req.init_next_round_input()
        return StageRecord(step_index, "cache_unfinished", rids=(rid,), rows=(row,), write_region=((row, old_pre, fill_len),))

    def _budget_cut(self, req: Any, budget: float) -> bool:
        """Cut ``req`` to the remaining token budget; True when it was cut (it is now chunked)."""
        if req.extend_input_len <= budget:
            return False
        req.fill_ids = req.fill_ids[: len(req.prefix_indices) + int(budget)]
        req.extend_input_len = int(budget)
        return True

    def _form_batch(self, step_index: int, step: Extend) -> tuple[list[str], list[str]]:
        budget: float = self.scenario.chunk_size or float("inf")
        batch: list[str] = []
        notes: list[str] = []
        new_chunked: str | None = None
        carried = self.chunked
        if carried is not None and not step.chunked_last:
            self._budget_cut(self.reqs[carried], budget)
            budget -= self.reqs[carried].extend_input_len
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
            req.init_next_round_input(self.cache)
            notes += self._admission_notes(rid, req)
            if reserve and req.extend_input_len > budget - reserve:
                continue
            self._lock(req)
            if self._budget_cut(req, budget - reserve):
                new_chunked = rid
            budget -= req.extend_input_len
            batch.append(rid)
            self.status[rid] = "scheduled"
        if carried is not None and step.chunked_last:
            self._budget_cut(self.reqs[carried], budget)
            batch.append(carried)
        if new_chunked is not None:
            self.chunked = new_chunked
        elif carried is not None and len(self.reqs[carried].fill_ids) == self.reqs[carried].seqlen:
            self.chunked = None  # its last chunk is in this batch
        return batch, notes

    def _admission_notes(self, rid: str, req: Any) -> list[str]:
        notes = []
        if req.last_matched_prefix_len > 0:
            notes.append("radix hit")
            if tuple(req.origin_input_ids) in self.finished_prompts:
                notes.append("exact repeat")
        if rid in self.retracted:
            notes.append("re-admitted")
        if req.return_logprob:
            requested = self.scenario.request(rid).logprob_start_len
            notes.append(logprob_note(requested, req.logprob_start_len, req.last_matched_prefix_len))
        return notes

    def _run_extend(self, step_index: int, batch: list[str], notes: list[str]) -> StageRecord:
        reqs = [self.reqs[rid] for rid in batch]
        free_rows_before = list(self.pool.free_slots)
        prefixes = tuple(tuple(int(v) for v in _values(r.prefix_indices)) for r in reqs)
        violations = ()
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
        try:
            schedule_batch.prepare_for_extend()
        except RuntimeError as exc:
            return self._halt(record, "oom" if "out of" in str(exc) else "error", exc, reqs, free_rows_before)
        except Exception as exc:  # a broken version may fail in any way: report, never crash
            return self._halt(record, "error", exc, reqs, free_rows_before)
        record.rows = tuple(r.req_pool_idx for r in reqs)
        record.out_cache_loc = tuple(schedule_batch.out_cache_loc.tolist())
        if schedule_batch.last_loc is not None:
            record.last_loc = tuple(schedule_batch.last_loc.tolist())
        record.write_region = tuple((row, 0, seq) for row, seq in zip(record.rows, record.seq_lens))
        if getattr(self.cache, "num_splits", 0) > self._splits_before:
            notes.append("node split")
        record.notes = tuple(notes) + self._row_reuse_notes(batch, record.rows)
        self._freed_chunk_row = (None, None)
        self._after_extend(batch)
        return record

    def _row_reuse_notes(self, batch: list[str], rows: tuple[int, ...]) -> tuple[str, ...]:
        """The chunked request's row, freed just before this batch, taken again in it."""
        freed, owner = self._freed_chunk_row
        if freed is None or freed not in rows:
            return ()
        taker = batch[rows.index(freed)]
        return ("row reuse",) + (("row reuse by another request",) if taker != owner else ())

    def _halt(self, record: StageRecord, outcome: str, exc: Exception, reqs: list[Any], free_rows_before) -> StageRecord:
        record.outcome = outcome
        record.error = f"{type(exc).__name__}: {exc}"
        # Rows the failed batch took (legacy also wrote its prefixes into them: SPEC section 4).
        taken = [row for row in free_rows_before if row not in self.pool.free_slots]
        record.rows = tuple(taken)
        record.write_region = tuple(
            (row, 0, len(p)) for row, p in zip(taken, record.prefix_values)
        )
        self.halted = record.error
        return record

    def _after_extend(self, batch: list[str]) -> None:
        for rid in batch:
            if rid == self.chunked:
                self.status[rid] = "chunked"
                self.chunked_has_row = True
                continue
            # An extend that completes the prompt samples the first output token (SPEC 6).
            self._sample(rid)
            self.status[rid] = "running"
            if rid not in self.running:
                self.running.append(rid)

    def _decode(self, step_index: int) -> StageRecord:
        if not self.running:
            return StageRecord(step_index, "skip", notes=("empty decode",))
        reqs = [self.reqs[rid] for rid in self.running]
        positions = tuple(r.seqlen - 1 for r in reqs)
        record = StageRecord(step_index, "decode", rids=tuple(self.running), rows=tuple(r.req_pool_idx for r in reqs))
        record.seq_lens = positions
        try:
            out = self.world.batch(reqs).prepare_for_decode()
        except Exception as exc:
            record.outcome = "oom" if "out of" in str(exc) else "error"
            record.error = f"{type(exc).__name__}: {exc}"
            self.halted = record.error
            return record
        record.out_cache_loc = tuple(out.tolist())
        record.write_region = tuple((row, pos, pos + 1) for row, pos in zip(record.rows, positions))
        for rid in self.running:
            self._sample(rid)
        return record

    def _finish(self, step_index: int, rid: str) -> StageRecord:
        if self.status[rid] != "running":
            return StageRecord(step_index, "skip", rids=(rid,), notes=("finish of a request not running",))
        req = self.reqs[rid]
        row = req.req_pool_idx
        if self.cache is not None:
            self.cache.cache_finished_req(req)
        else:
            slots = self.pool.req_to_token[row, : req.seqlen - 1].to(torch.int64)
            self.pool.free(row)
            self.world.allocator.free(slots)
        self.running.remove(rid)
        self.status[rid] = "finished"
        self.finished_prompts.add(tuple(req.origin_input_ids))
        return StageRecord(step_index, "finish", rids=(rid,), rows=(row,))

    def _retract(self, step_index: int, rid: str) -> StageRecord:
        """Free the request's own slots and its row, unlock its node, back to waiting. Slots the
        radix tree holds (the page-aligned part of its prefix) stay in the tree."""
        if self.status[rid] != "running":
            return StageRecord(step_index, "skip", rids=(rid,), notes=("retract of a request not running",))
        req = self.reqs[rid]
        row, slotted = req.req_pool_idx, req.seqlen - 1
        first_own = 0
        if self.scenario.cache_kind == "radix":
            page = self.world.allocator.page_size
            first_own = len(req.prefix_indices) // page * page
        slots = self.pool.req_to_token[row, first_own:slotted].to(torch.int64)
        self.world.allocator.free(slots)
        self.pool.free(row)
        if self.scenario.cache_kind == "radix":
            self.cache.dec_lock_ref(req.last_node)
        req.reset_for_retract()
        self.running.remove(rid)
        self.status[rid] = "waiting"
        self.retracted.add(rid)
        return StageRecord(step_index, "retract", rids=(rid,), rows=(row,))

    def _evict(self, step_index: int, num_tokens: int) -> StageRecord:
        if self.scenario.cache_kind != "radix":
            return StageRecord(step_index, "skip", notes=("evict without a radix cache",))
        self.cache.evict(num_tokens)
        return StageRecord(step_index, "evict")

    # ---- what each request holds (for the conservation oracle) ------------------------------------
    def held_slots(self, rid: str) -> list[int]:
        req, status = self.reqs[rid], self.status[rid]
        if status == "running":
            return self.pool.req_to_token[req.req_pool_idx, : req.seqlen - 1].tolist()
        if status == "chunked" and self.chunked_has_row:
            return self.pool.req_to_token[req.req_pool_idx, : len(req.fill_ids)].tolist()
        if status == "chunked":
            return [int(v) for v in _values(req.prefix_indices)]
        return []


def _values(prefix: Any) -> list[int]:
    return prefix.tolist() if isinstance(prefix, torch.Tensor) else list(prefix)
