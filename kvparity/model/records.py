"""What one stage of the scheduler loop did, as typed plain values: the ``StageRecord`` every
snapshot carries, how the stage ended (``Outcome``, and for out of memory what ran out) and what it
observed for the scenario classes (``Note``, ``LogprobAdmission``).

Records cross process boundaries (a real SGLang worker sends them back as JSON), so they turn
into plain data and back (``StageRecord.to_plain`` / ``from_plain``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from kvparity.mem_cache.errors import Exhausted, OutOfMemory
from kvparity.model.canary import CanaryRead

# How a stage ended: "ok"; "oom", the world's out-of-memory error (``StageRecord.exhausted`` says
# of what); "error", anything else a (broken) version raised. Plain strings, checked by mypy:
# golden files and plain records hold them as they are.
Outcome = Literal["ok", "oom", "error"]


class Note(StrEnum):
    """A simple observation of a stage (its value is how reports name it)."""

    RADIX_HIT = "radix hit"
    EXACT_REPEAT = "exact repeat"
    RADIX_HIT_ON_RUNNING = "radix hit on a running request"
    READMITTED = "re-admitted"
    NODE_SPLIT = "node split"
    MERGE_BEFORE_ALLOC = "merge before alloc"  # page size 1
    MERGE_BEFORE_ALLOC_EXTEND = "merge before alloc_extend"
    MERGE_BEFORE_ALLOC_DECODE = "merge before alloc_decode"
    EXTEND_EVICTED = "extend evicted from the tree"
    ROW_REUSE = "row reuse"
    ROW_REUSE_BY_ANOTHER = "row reuse by another request"
    DECODE_RETRACT = "decode retract under memory pressure"
    PAGED_FINISHES_IN_ONE_GROUP = "paged finishes in one free group"
    DECODE_REPLACED_BY_CHUNK = "decode replaced by the pending chunk"
    EMPTY_EXTEND = "empty extend"
    EMPTY_DECODE = "empty decode"
    RETRACT_NOT_RUNNING = "retract of a request not running"
    EVICT_WITHOUT_RADIX = "evict without a radix cache"


@dataclass(frozen=True)
class LogprobAdmission:
    """The admission of a request with logprobs: the start it asked for (``requested``), the
    start the server made of it (``start``) and how many tokens the cache supplied (``matched``)."""

    rid: str
    requested: int
    start: int
    matched: int


Observation = Note | LogprobAdmission


@dataclass
class StageRecord:
    """What one stage did, in plain values (for oracles, classes and reports)."""

    step: int
    # cache_unfinished | extend | prefill_result | decode_retract | decode | decode_finish
    # | retract | evict | skip
    kind: str
    rids: tuple[str, ...] = ()
    rows: tuple[int, ...] = ()
    prefix_values: tuple[tuple[int, ...], ...] = ()  # captured BEFORE the stage ran
    seq_lens: tuple[int, ...] = ()
    extend_lens: tuple[int, ...] = ()
    out_cache_loc: tuple[int, ...] | None = None
    last_loc: tuple[int, ...] | None = None
    # The dtypes of the batch tensors behind the two, e.g. "int64" (golden files pin them); None with no value.
    out_cache_loc_dtype: str | None = None
    last_loc_dtype: str | None = None
    outcome: Outcome = "ok"
    exhausted: Exhausted | None = None  # with outcome "oom": what ran out
    error: str | None = None
    contract_violations: tuple[str, ...] = ()
    # cells this stage may write: (row, first column, end column)
    write_region: tuple[tuple[int, int, int], ...] = ()
    finished: tuple[str, ...] = ()  # requests of ``rids`` that finished in this stage
    notes: tuple[Observation, ...] = ()  # observations for scenario classes
    canary: tuple[CanaryRead, ...] = ()  # reads of wrong KV by this stage's forward (``kvparity.engine.canary``)

    def describe(self) -> str:
        what = f"step {self.step} {self.kind}"
        if self.rids:
            what += f" {list(self.rids)}"
        if self.outcome != "ok":
            what += f" -> {self.outcome}: {self.error}"
        return what

    @property
    def cached_unfinished(self) -> tuple[str, ...]:
        """Requests this stage cached with ``cache_unfinished_req`` (their rows were repointed)."""
        if self.kind == "cache_unfinished":
            return self.rids
        if self.kind == "prefill_result":
            return tuple(rid for rid in self.rids if rid not in self.finished)
        return ()

    def fail(self, outcome: Outcome, exc: BaseException, exhausted: Exhausted | None = None) -> None:
        """The stage raised ``exc``: record how it ended, in SGLang's words."""
        self.outcome, self.exhausted, self.error = outcome, exhausted, error_text(exc)

    def to_plain(self) -> dict[str, Any]:
        """Ints, strings, lists and dicts (JSON): each observation a string, or a dict for a
        logprob admission."""
        plain = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        plain["notes"] = [n if isinstance(n, Note) else dataclasses.asdict(n) for n in self.notes]
        plain["canary"] = [read.to_plain() for read in self.canary]
        return plain

    @classmethod
    def from_plain(cls, plain: dict[str, Any]) -> StageRecord:
        """The inverse of ``to_plain`` (lists come back as tuples)."""
        fields = {k: (_tuples(v) if isinstance(v, list) else v) for k, v in plain.items()}
        if fields.get("exhausted") is not None:
            fields["exhausted"] = Exhausted(fields["exhausted"])
        fields["notes"] = tuple(
            LogprobAdmission(**n) if isinstance(n, dict) else Note(n) for n in plain.get("notes", ())
        )
        fields["canary"] = tuple(CanaryRead.from_plain(read) for read in plain.get("canary", ()))
        return cls(**fields)


def error_text(exc: BaseException) -> str:
    """``Type: message`` as SGLang would print it: kvparity's typed out-of-memory errors are
    SGLang's ``RuntimeError`` (``mem_cache.errors``), so they print as one."""
    name = "RuntimeError" if isinstance(exc, OutOfMemory) else type(exc).__name__
    return f"{name}: {exc}"


def _tuples(value: Any) -> Any:
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value
