"""The traffic classes (``kvparity.model.classes.TRAFFIC_REQUIRED``) a scheduler-driven run reached,
read from its iteration records (``run_traffic``'s, or kvparity's model loop's) and the scenario:
what the scheduler decided, not what the scenario meant it to."""

from __future__ import annotations

from kvparity.engine.traffic_run import TrafficRun
from kvparity.model.classes import (
    TRAFFIC_BUDGET_STOP,
    TRAFFIC_CHUNKED,
    TRAFFIC_RADIX_HIT_RUNNING,
    TRAFFIC_REORDERED,
    TRAFFIC_RETRACTION,
)
from kvparity.model.traffic import TrafficScenario
from kvparity.model.traffic_records import Decision


def traffic_classes(scenario: TrafficScenario, result: TrafficRun) -> set[str]:
    arrival = {a.rid: i for i, a in enumerate(a for group in scenario.arrivals for a in group)}
    prompts = {a.rid: a.tokens for group in scenario.arrivals for a in group}
    sequences = {rid: tuple(prompts[rid]) + tuple(result.outputs.get(rid, ())) for rid in prompts}
    found: set[str] = set()
    admitted: set[str] = set()
    finished: set[str] = set()
    for rec in result.decisions:
        if rec.retracted:
            found.add(TRAFFIC_RETRACTION)
        if rec.mode == "EXTEND":
            if rec.chunked is not None:
                found.add(TRAFFIC_CHUNKED)
            running = admitted - finished
            if _hit_on_running(rec, running, prompts, sequences):
                found.add(TRAFFIC_RADIX_HIT_RUNNING)
            new = [rid for rid in rec.rids if rid not in admitted]
            never_admitted = [rid for rid in rec.waiting if rid not in admitted]
            order = [arrival[rid] for rid in new + never_admitted]
            if scenario.config.schedule_policy != "fcfs" and order != sorted(order):
                found.add(TRAFFIC_REORDERED)
            admitted.update(rec.rids)
            running_after = admitted - finished - set(rec.waiting)
            if rec.waiting and len(running_after) < scenario.config.max_running_requests:
                found.add(TRAFFIC_BUDGET_STOP)  # rows were left, a request waited: a token budget stopped it
        finished.update(rec.finished)
    return found


def _hit_on_running(rec: Decision, running: set[str], prompts: dict[str, tuple[int, ...]],
                    sequences: dict[str, tuple[int, ...]]) -> bool:
    """A request of this batch matched a cached prefix that a request still running shares."""
    for rid, prefix_len in zip(rec.rids, rec.prefix_lens):
        if prefix_len == 0 or rid in running:
            continue
        head = prompts[rid][:prefix_len]
        if any(other != rid and sequences[other][:prefix_len] == head for other in running):
            return True
    return False
