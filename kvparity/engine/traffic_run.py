"""One run of a traffic scenario by one player, as typed data: the decisions of every iteration,
the memory after every iteration (harness-drive ``Snapshot``s), the outputs, the in-flight
findings, the error the scheduler stopped on, and what it cost. A real release's scheduler shell
sends it from its worker as plain data (``to_plain``); kvparity's model builds it directly."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvparity.engine.snapshot import Snapshot, snapshot_from_plain, snapshot_to_plain
from kvparity.model.traffic_records import Decision, InflightFinding, StopError


@dataclass
class TrafficRun:
    loop: str  # the event loop played: "normal" or "overlap"
    decisions: tuple[Decision, ...]
    memory: tuple[Snapshot, ...]  # after each iteration, parallel to ``decisions``
    outputs: dict[str, tuple[int, ...]]  # each finished request's output ids, in finishing order
    inflight: tuple[InflightFinding, ...] = ()
    error: StopError | None = None
    # The nemesis's aborts as played: (iteration, request, the state it was in: a key of
    # ``kvparity.model.classes.TRAFFIC_ABORTS``, or "finished").
    aborts: tuple[tuple[int, str, str], ...] = ()
    build_s: float = 0.0
    loop_s: float = 0.0
    record_s: float = 0.0  # of ``loop_s``: the canary forward and the snapshots
    cells_past_width: int = 0  # table cells past every sequence that were written (none may be)
    # Who played it (a real release's shell: its release, adapter, scheduler generation and tree).
    player: dict[str, str] = field(default_factory=dict)

    @property
    def canary(self) -> list[Any]:
        """Every read of wrong KV at a launch, in iteration order."""
        return [read for snap in self.memory for read in snap.record.canary]

    def to_plain(self) -> dict[str, Any]:
        return {"loop": self.loop, "decisions": [d.to_plain() for d in self.decisions],
                "memory": [snapshot_to_plain(s) for s in self.memory], "outputs": {k: list(v) for k, v in self.outputs.items()},
                "inflight": [f.to_plain() for f in self.inflight],
                "error": None if self.error is None else self.error.to_plain(),
                "aborts": [list(a) for a in self.aborts], "build_s": self.build_s,
                "loop_s": self.loop_s, "record_s": self.record_s, "cells_past_width": self.cells_past_width,
                "player": dict(self.player)}

    @classmethod
    def from_plain(cls, data: dict[str, Any]) -> TrafficRun:
        return cls(data["loop"], tuple(Decision.from_plain(d) for d in data["decisions"]),
                   tuple(snapshot_from_plain(s) for s in data["memory"]),
                   {str(k): tuple(v) for k, v in data["outputs"].items()},
                   tuple(InflightFinding.from_plain(f) for f in data["inflight"]),
                   None if data["error"] is None else StopError.from_plain(data["error"]),
                   tuple((int(i), str(rid), str(state)) for i, rid, state in data.get("aborts", ())),
                   data["build_s"], data["loop_s"], data["record_s"], data["cells_past_width"], dict(data["player"]))
