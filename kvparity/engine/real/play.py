"""Worker plugin: play a whole scenario on a real SGLang world with kvparity's own scheduler loop
(``kvparity.engine.scheduler.Scheduler``, the same loop the modelled worlds use) and send back a snapshot
after every stage, as plain data (``kvparity.engine.snapshot.snapshot_to_plain``).

Loaded with ``RealWorker(source, plugins=("kvparity.engine.real.play",))``. Before each step the worker
writes ``kvparity-step: {"index": ..., "step": ...}`` (JSON) to its stderr (index -1 before the world is
built), so that when a real kernel kills the process, or SGLang raises, the parent can say at which step
and in which operation.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from typing import Any

from kvparity.engine.real.adapter import build_real_world
from kvparity.engine.real.worker import Context, remote
from kvparity.engine.scheduler import Scheduler, StageRecord
from kvparity.engine.snapshot import snapshot_to_plain, take_snapshot
from kvparity.kernels import runtime
from kvparity.model.scenario import scenario_from_dict
from kvparity.model.worlds import Geometry

STEP_MARK = "kvparity-step: "  # then the step as JSON: {"index": 3, "step": "Extend(...)"}


def _mark(index: int, step: Any) -> None:
    sys.stderr.write(STEP_MARK + json.dumps({"index": index, "step": str(step)}) + "\n")
    sys.stderr.flush()


@remote
def play(ctx: Context, backend: str, scenario: dict[str, Any], stop_before: int | None = None,
         options: dict[str, Any] | None = None, facts: dict[str, bool] | None = None) -> dict[str, Any]:
    """Play ``scenario`` (``scenario_to_dict`` form) on this worker's SGLang with ``backend`` (and
    the world ``options`` its generation offers, e.g. ``tree_core``), up to (not including) step
    ``stop_before``; return every stage's snapshot (the start first) and which kernels ran.
    ``facts``: the release's adapter facts to play with other values (a named change undone)."""
    entry = dataclasses.replace(ctx.require_sglang(), **(facts or {}))
    parsed = scenario_from_dict(scenario)
    started = time.monotonic()
    device = str(runtime.DEVICE)  # the CPU under Triton's interpreter, or the GPU (compiled Triton)
    world = build_real_world(entry, backend, Geometry(**scenario["geometry"]), parsed.cache_kind, device, **(options or {}))
    _mark(-1, "build")  # this play's first mark: a mark before it is an earlier scenario's
    scheduler = Scheduler(world, parsed)
    snapshots = [snapshot_to_plain(take_snapshot(scheduler, StageRecord(step=-1, kind="start")))]
    for index, step in enumerate(parsed.steps):
        if scheduler.halted or (stop_before is not None and index >= stop_before):
            break
        _mark(index, step)
        for record in scheduler.apply(index, step):
            snapshots.append(snapshot_to_plain(take_snapshot(scheduler, record)))
    return {"world": world.name, "snapshots": snapshots, "seconds": round(time.monotonic() - started, 4),
            "kernels": getattr(world, "kernels", None)}
