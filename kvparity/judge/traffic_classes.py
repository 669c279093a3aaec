"""The traffic classes (``kvparity.model.classes.TRAFFIC_REQUIRED``) a scheduler-driven run reached,
read from its iteration records (``run_traffic``'s, or kvparity's model loop's) and the scenario:
what the scheduler decided, not what the scenario meant it to."""

from __future__ import annotations

from kvparity.caches.host_pool import HostState
from kvparity.engine.traffic_run import TrafficRun
from kvparity.model.classes import (
    TRAFFIC_ABORTS,
    TRAFFIC_BACKUP_REFUSED,
    TRAFFIC_BUDGET_STOP,
    TRAFFIC_CHUNK_IN_FLIGHT_FREED,
    TRAFFIC_CHUNKED,
    TRAFFIC_FORCED_RETRACTION,
    TRAFFIC_HOST_DEMOTED,
    TRAFFIC_HOST_EVICTED,
    TRAFFIC_HOST_LOAD_BACK,
    TRAFFIC_HOST_RETRACTION,
    TRAFFIC_LOAD_BACK_REFUSED,
    TRAFFIC_OVERLAP_RETRACTION,
    TRAFFIC_PREFETCH_CUT,
    TRAFFIC_PYTHON_CORE,
    TRAFFIC_RADIX_HIT_RUNNING,
    TRAFFIC_REORDERED,
    TRAFFIC_RETRACTED_HIT,
    TRAFFIC_RETRACTION,
    TRAFFIC_ROWS_FULL,
    TRAFFIC_STATE_EVICTED,
    TRAFFIC_STATE_LOAD_BACK,
    TRAFFIC_STATE_RESTORED,
    TRAFFIC_STATE_RETRACTED_RESTORED,
    TRAFFIC_STATE_RETRACTION,
    TRAFFIC_STORAGE_FAULT,
    TRAFFIC_STORAGE_HIT,
    TRAFFIC_STORAGE_READ_FAULT,
    TRAFFIC_TOMBSTONE,
    TRAFFIC_TOMBSTONE_HIT,
    TRAFFIC_WINDOW_BELOW_PAGE,
    TRAFFIC_WINDOW_EVICTED,
    TRAFFIC_WINDOW_OFF_PAGE,
    TRAFFIC_WINDOW_RETRACTION,
)
from kvparity.model.traffic import BELOW_A_PAGE, TrafficScenario
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
    window = window_classes(result)
    return (found | {name for name, count in rare_counts(result).items() if count} | window
            | window_geometry_classes(scenario, window) | state_classes(result) | host_classes(result)
            | abort_classes(result) | core_classes(scenario, result))


def core_classes(scenario: TrafficScenario, result: TrafficRun) -> set[str]:
    """The Python radix-tree core, where the scenario asked for it and the run built it."""
    tree = str(result.player.get("tree", ""))
    return {TRAFFIC_PYTHON_CORE} if scenario.config.tree_core == "python" and tree.startswith("unified/python") else set()


def window_geometry_classes(scenario: TrafficScenario, window_met: set[str]) -> set[str]:
    """The window's geometry against the page, where the run's window freed slots (``window_met``,
    its ``window_classes``: its frontier was computed under it): smaller than a page, or past one
    and not a whole number of them."""
    odds = scenario.config.window_at_odds
    if odds is None or not window_met & {TRAFFIC_WINDOW_EVICTED, TRAFFIC_TOMBSTONE}:
        return set()
    return {TRAFFIC_WINDOW_BELOW_PAGE if odds == BELOW_A_PAGE else TRAFFIC_WINDOW_OFF_PAGE}


def abort_classes(result: TrafficRun) -> set[str]:
    """The states the nemesis's aborts found their requests in. A request whose prefix is fetched
    from storage is waiting too (in the queue, with no row): an abort of it counts as both."""
    states = {state for _, _, state in result.aborts}
    if "prefetching" in states:
        states.add("waiting")
    return {TRAFFIC_ABORTS[state] for state in states if state in TRAFFIC_ABORTS}


def host_classes(result: TrafficRun) -> set[str]:
    """A host tier's shapes the run met (none without one): device KV kept on the host alone, a
    node the host kept alone holding device KV again after an iteration with a hit (loaded back),
    a node's host KV gone (host eviction), a retraction, tokens fetched from storage."""
    found: set[str] = set()
    before: dict[tuple[str | None, tuple[int, ...]], bool] = {}  # (extra key, path) -> on the host alone
    for rec, snap in zip(result.decisions, result.memory):
        if snap.host is None:
            return found
        now = _on_the_host_alone(snap.host)
        if any(now.values()):
            found.add(TRAFFIC_HOST_DEMOTED)
        if _loaded_back(rec, before, now):
            found.add(TRAFFIC_HOST_LOAD_BACK)
        if set(before) - set(now):
            found.add(TRAFFIC_HOST_EVICTED)
        if rec.retracted:
            found.add(TRAFFIC_HOST_RETRACTION)
        if snap.host.fetched:  # tokens brought from storage (slots held for a fetch may find nothing there)
            found.add(TRAFFIC_STORAGE_HIT)
        if snap.host.read_faults:
            found.add(TRAFFIC_STORAGE_READ_FAULT)
        if len(snap.host.storage_faults) > snap.host.read_faults:
            found.add(TRAFFIC_STORAGE_FAULT)
        if snap.host.prefetches_cut:
            found.add(TRAFFIC_PREFETCH_CUT)
        if snap.host.backups_refused:
            found.add(TRAFFIC_BACKUP_REFUSED)
        if snap.host.loads_refused:
            found.add(TRAFFIC_LOAD_BACK_REFUSED)
        before = now
    return found | _state_load_backs(result)


def _state_load_backs(result: TrafficRun) -> set[str]:
    """A Mamba model's state the host kept alone (no device slot) holding a device slot again after
    an iteration with a hit: loaded back."""
    before: dict[tuple[str | None, tuple[int, ...]], bool] = {}
    for rec, snap in zip(result.decisions, result.memory):
        if snap.state_host is None:
            return set()
        now = _on_the_host_alone(snap.state_host)
        if _loaded_back(rec, before, now):
            return {TRAFFIC_STATE_LOAD_BACK}
        before = now
    return set()


def _on_the_host_alone(host: HostState) -> dict[tuple[str | None, tuple[int, ...]], bool]:
    """Each node a host pool backs, by (extra key, path): whether the device has evicted it."""
    return {(node.extra_key, node.path): node.device is None for node in host.nodes}


def _loaded_back(rec: Decision, before: dict[tuple[str | None, tuple[int, ...]], bool],
                 now: dict[tuple[str | None, tuple[int, ...]], bool]) -> bool:
    """An iteration with a hit after which a node the host kept alone holds device slots again."""
    hit = rec.mode == "EXTEND" and any(n > 0 for n in rec.prefix_lens)
    return hit and any(alone and now.get(path) is False for path, alone in before.items())


def window_classes(result: TrafficRun) -> set[str]:
    """A sliding-window model's shapes the run met (none for full attention): window slots freed
    under a running request (a slot it holds maps to no window slot), a tombstone (a tree slot that
    maps to none), a radix hit while the tree held one, a retraction."""
    found: set[str] = set()
    tombstoned = False
    for rec, snap in zip(result.decisions, result.memory):
        if snap.window is None:
            return found
        if rec.mode == "EXTEND" and tombstoned and any(hit > 0 for hit in rec.prefix_lens):
            found.add(TRAFFIC_TOMBSTONE_HIT)
        mapped = {full for full, _ in snap.window.mapped}
        tombstoned = any(slot not in mapped for slot in snap.tree_slots)
        if tombstoned:
            found.add(TRAFFIC_TOMBSTONE)
        if any(view.status in ("running", "chunked") and any(s not in mapped for s in view.held)
               for view in snap.requests.values()):
            found.add(TRAFFIC_WINDOW_EVICTED)
        if rec.retracted:
            found.add(TRAFFIC_WINDOW_RETRACTION)
    return found


def state_classes(result: TrafficRun) -> set[str]:
    """A Mamba model's shapes the run met (none for any other model): a radix hit whose request runs
    in a slot of its own (its state copied from the one the tree keeps), a slot the tree kept and
    freed after (evicted), a retraction, and a retracted request readmitted on such a hit."""
    found: set[str] = set()
    admitted: set[str] = set()
    retracted: set[str] = set()
    kept: set[int] = set()
    for rec, snap in zip(result.decisions, result.memory):
        states = snap.states
        if states is None:
            return found
        if kept & set(states.free):
            found.add(TRAFFIC_STATE_EVICTED)
        kept = set(states.tree)
        retracted.update(rid for rid in rec.waiting if rid in admitted)
        if rec.retracted:
            found.add(TRAFFIC_STATE_RETRACTION)
        if rec.mode == "EXTEND":
            slot_of = dict(states.rows)
            restored = [rid for rid, row, hit in zip(rec.rids, rec.rows, rec.prefix_lens)
                        if hit > 0 and slot_of.get(row) not in (None, *kept)]
            if restored:
                found.add(TRAFFIC_STATE_RESTORED)
            if any(rid in retracted for rid in restored):
                found.add(TRAFFIC_STATE_RETRACTED_RESTORED)
            admitted.update(rec.rids)
    return found


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
