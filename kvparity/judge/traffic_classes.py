"""The traffic classes (``kvparity.model.classes.TRAFFIC_REQUIRED``) a scheduler-driven run reached,
read from its iteration records (``run_traffic``'s, or kvparity's model loop's) and the scenario:
what the scheduler decided, not what the scenario meant it to. The shapes of a cache kind's own
(its window's, its states', its host tier's) are the kind's to read (``CacheKind.reached``)."""

from __future__ import annotations

from kvparity import caches
from kvparity.engine.traffic_run import TrafficRun
from kvparity.model.classes import (
    TRAFFIC_ABORTS,
    TRAFFIC_BUDGET_STOP,
    TRAFFIC_CHUNK_IN_FLIGHT_FREED,
    TRAFFIC_CHUNKED,
    TRAFFIC_FORCED_RETRACTION,
    TRAFFIC_OVERLAP_RETRACTION,
    TRAFFIC_PYTHON_CORE,
    TRAFFIC_RADIX_HIT_RUNNING,
    TRAFFIC_REORDERED,
    TRAFFIC_RETRACTED_HIT,
    TRAFFIC_RETRACTION,
    TRAFFIC_ROWS_FULL,
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
            elif rec.waiting:
                found.add(TRAFFIC_ROWS_FULL)
        finished.update(rec.finished)
    if TRAFFIC_RETRACTION in found and scenario.config.forced_retraction is not None:
        found.add(TRAFFIC_FORCED_RETRACTION)
    own = caches.kind_of(scenario.config).reached(scenario, result.decisions, result.memory)
    return (found | {name for name, count in rare_counts(result).items() if count} | own
            | abort_classes(result) | core_classes(scenario, result))


def core_classes(scenario: TrafficScenario, result: TrafficRun) -> set[str]:
    """The Python radix-tree core, where the scenario asked for it and the run built it."""
    tree = str(result.player.get("tree", ""))
    return {TRAFFIC_PYTHON_CORE} if scenario.config.tree_core == "python" and tree.startswith("unified/python") else set()


def abort_classes(result: TrafficRun) -> set[str]:
    """The states the nemesis's aborts found their requests in. A request whose prefix is fetched
    from storage is waiting too (in the queue, with no row): an abort of it counts as both."""
    states = {state for _, _, state in result.aborts}
    if "prefetching" in states:
        states.add("waiting")
    return {TRAFFIC_ABORTS[state] for state in states if state in TRAFFIC_ABORTS}


def rare_counts(result: TrafficRun) -> dict[str, int]:
    """How often a run met each rare shape (``TRAFFIC_RARE``): iterations that free rows (a finish
    or a retraction) right after one that launched a chunked prefill, in the overlap loop (the chunk
    is still in flight); retractions in the overlap loop; readmissions of a retracted request that
    match a cached prefix."""
    overlap = result.loop == "overlap"
    counts = dict.fromkeys((TRAFFIC_CHUNK_IN_FLIGHT_FREED, TRAFFIC_OVERLAP_RETRACTION, TRAFFIC_RETRACTED_HIT), 0)
    admitted: set[str] = set()
    retracted: set[str] = set()
    previous_chunked = False
    for rec in result.decisions:
        frees = bool(rec.finished) or rec.retracted > 0
        if overlap and previous_chunked and frees:
            counts[TRAFFIC_CHUNK_IN_FLIGHT_FREED] += 1
        if overlap:
            counts[TRAFFIC_OVERLAP_RETRACTION] += rec.retracted
        retracted.update(rid for rid in rec.waiting if rid in admitted)  # admitted, then waiting again
        if rec.mode == "EXTEND":
            counts[TRAFFIC_RETRACTED_HIT] += sum(1 for rid, hit in zip(rec.rids, rec.prefix_lens)
                                                 if rid in retracted and hit > 0)
            admitted.update(rec.rids)
        previous_chunked = rec.mode == "EXTEND" and rec.chunked is not None
    return counts


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
