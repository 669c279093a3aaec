"""What one run of a traffic scenario decided and found, as typed plain data (the scheduler shell
sends them back from a worker as JSON: ``to_plain`` / ``from_plain``): per iteration of the loop the
``Decision`` (the batch formed and the waiting queue), each in-flight finding (``InflightFinding``)
and the error the scheduler stopped on (``StopError``). The run itself, with its memory snapshots,
is ``kvparity.engine.traffic_run.TrafficRun``."""

from __future__ import annotations

import dataclasses
import traceback
from dataclasses import dataclass
from typing import Any

# The fields of a Decision that are decisions (compared between two runs, in this order); the rest
# are how the decision was carried out (rows, sequence lengths) or observed (finishes, timing).
DECISIONS = ("mode", "rids", "prefix_lens", "extend_lens", "chunked", "waiting")
# How bad an in-flight finding is, read by the KV canary when the batch lands (``kvparity.engine.canary``).
WRONG_KV = "wrong KV"  # a read through the changed table would see another token's KV
TABLE_ONLY = "table only"  # the table changed, over slots that hold the same KV
HARMS = (WRONG_KV, TABLE_ONLY)


def _tuples(data: dict[str, Any]) -> dict[str, Any]:
    """A record's fields from plain data: JSON's lists back to tuples."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}


@dataclass(frozen=True)
class Decision:
    """One pass of the scheduler's loop: the batch it formed (``mode`` "EXTEND" or "DECODE", None
    for none) and the queue left waiting; then what the pass's results finished."""

    iteration: int
    mode: str | None = None
    rids: tuple[str, ...] = ()
    prefix_lens: tuple[int, ...] = ()
    extend_lens: tuple[int, ...] = ()
    seq_lens: tuple[int, ...] = ()
    rows: tuple[int, ...] = ()
    chunked: str | None = None
    retracted: int = 0
    waiting: tuple[str, ...] = ()
    finished: tuple[str, ...] = ()
    ms: float = 0.0

    def to_plain(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_plain(cls, data: dict[str, Any]) -> Decision:
        return cls(**_tuples(data))


@dataclass(frozen=True)
class InflightFinding:
    """While batch ``batch_iteration`` was in flight (its run to its result), a cell its request
    ``rid`` reads changed (``kind`` "cell": ``columns`` of ``row``, ``old`` -> ``new`` slots), or its
    row was given to another request (``kind`` "row", ``taken_by``); seen at ``detected_iteration``
    in ``detected_step``. ``cls``: SGLang's own criterion for that request's token of the batch:
    "live" (kept), "finished" or "retracted" (dropped). ``harm``: ``WRONG_KV`` or ``TABLE_ONLY``."""

    kind: str
    cls: str
    harm: str
    batch_iteration: int
    rid: str
    row: int
    detected_iteration: int
    detected_step: str
    columns: tuple[int, ...] = ()
    old: tuple[int, ...] = ()
    new: tuple[int, ...] = ()
    taken_by: str | None = None

    @property
    def identity(self) -> tuple[Any, ...]:
        """What makes two runs' findings the same finding."""
        return (self.kind, self.cls, self.batch_iteration, self.rid, self.row, self.columns, self.taken_by)

    @property
    def key(self) -> tuple[str, str, str]:
        """How findings are counted: (kind, class, harm)."""
        return self.kind, self.cls, self.harm

    def line(self) -> str:
        """In words: which batch, request, row and cells, when it was seen, and what a read would see."""
        where = f"batch of iteration {self.batch_iteration}, request {self.rid}, row {self.row}"
        seen = f"seen at iteration {self.detected_iteration} in {self.detected_step}"
        what = (f"row given to {self.taken_by} while in flight" if self.kind == "row"
                else f"cells {list(self.columns)} changed {list(self.old)} -> {list(self.new)} while in flight")
        return f"{self.cls}, {self.harm}: {what} ({where}; {seen})"

    def to_plain(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_plain(cls, data: dict[str, Any]) -> InflightFinding:
        return cls(**_tuples(data))


TRACEBACK_FRAMES = 8  # the innermost frames of a scheduler's traceback a report shows


@dataclass(frozen=True)
class StopError:
    """The scheduler raised inside its loop (SGLang's own leak check, an assertion): at which
    iteration, the message, where (the innermost frame in SGLang's code), and the traceback's last
    frames as Python prints them (what a report shows under the defect)."""

    iteration: int
    message: str
    where: str | None = None
    traceback: str = ""

    @classmethod
    def of(cls, iteration: int, exc: BaseException, where: str | None) -> StopError:
        """What ``exc``, raised at ``iteration``, is recorded as (its innermost frames kept)."""
        shown = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-TRACEBACK_FRAMES))
        return cls(iteration, f"{type(exc).__name__}: {exc}".strip()[:500], where, shown[-4000:])

    def to_plain(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_plain(cls, data: dict[str, Any]) -> StopError:
        return cls(**data)
