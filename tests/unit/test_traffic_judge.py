"""Judging two runs of a traffic scenario (``kvparity.judge.admission``), reading the traffic classes
from a run's records (``kvparity.judge.traffic_classes``) and shrinking a traffic scenario
(``kvparity.run.candidates.traffic_candidates``), on hand-built runs: no scheduler is played here."""

from __future__ import annotations

from kvparity.engine.traffic_run import TrafficRun
from kvparity.judge import admission
from kvparity.judge.traffic_classes import traffic_classes
from kvparity.model.classes import (
    TRAFFIC_BUDGET_STOP,
    TRAFFIC_CHUNK_IN_FLIGHT_FREED,
    TRAFFIC_CHUNKED,
    TRAFFIC_OVERLAP_RETRACTION,
    TRAFFIC_RADIX_HIT_RUNNING,
    TRAFFIC_REORDERED,
    TRAFFIC_RETRACTION,
    TRAFFIC_ROWS_FULL,
)
from kvparity.model.traffic import (
    Arrival,
    HostOffer,
    ServerConfig,
    TrafficScenario,
    traffic_from_dict,
    traffic_to_dict,
)
from kvparity.model.traffic_records import TABLE_ONLY, WRONG_KV, Decision, InflightFinding, StopError
from kvparity.model.worlds import WorldId
from kvparity.run.candidates import traffic_candidates
from kvparity.run.minimize import minimize

# The runs here are hand-built: no memory snapshots, so only decisions, outputs, in-flight findings
# and errors are judged. Two modelled worlds of one version: any memory would be compared exactly.
SCENARIO = TrafficScenario(ServerConfig(), ())
WORLD = WorldId.modelled("legacy", "torch")


def rec(i, mode=None, rids=(), prefix=(), extend=(), waiting=(), chunked=None, retracted=0, finished=()):
    return Decision(i, mode, tuple(rids), tuple(prefix), tuple(extend), chunked=chunked, retracted=retracted,
                    waiting=tuple(waiting), finished=tuple(finished))


def run(*records, outputs=None, inflight=(), error=None):
    return TrafficRun("overlap", tuple(records), (), {rid: tuple(out) for rid, out in (outputs or {}).items()},
                      tuple(inflight), error)


def judge_traffic(reference, other):
    return admission.judge_traffic(SCENARIO, reference, other, WORLD, WORLD)


def cell(batch_iteration, detected, rid="a", row=1, columns=(0,), cls="live", harm=TABLE_ONLY):
    return InflightFinding("cell", cls, harm, batch_iteration, rid, row, detected, "run_batch", tuple(columns), (2,),
                           (1,))


def test_the_same_decisions_outputs_and_findings_agree():
    one = run(rec(0, "EXTEND", ["a"], [0], [3]), outputs={"a": [7]}, inflight=[cell(0, 1)])
    assert judge_traffic(one, run(*one.decisions, outputs={"a": [7]}, inflight=[cell(0, 1)])).agree


def test_another_batch_order_is_an_admission_difference():
    ref = run(rec(0, "EXTEND", ["a", "b"], [0, 0], [3, 3]))
    got = run(rec(0, "EXTEND", ["b", "a"], [0, 0], [3, 3]))
    judgement = judge_traffic(ref, got)
    assert judgement.admission and judgement.line() == "iteration 0: rids ['a', 'b'] != ['b', 'a']"


def test_a_finding_only_the_checked_run_has_is_a_difference_and_shown_first_when_earliest():
    ref = run(rec(0, "EXTEND", ["a"], [0], [3]), rec(1, "DECODE", ["a"]))
    got = run(rec(0, "EXTEND", ["a"], [0], [3]), rec(1, "DECODE", ["b"]), inflight=[cell(0, 0)])
    judgement = judge_traffic(ref, got)
    assert judgement.kind == "inflight" and "cells [0] changed [2] -> [1]" in judgement.line()
    assert judgement.inflight_only_other == (cell(0, 0),)
    assert judge_traffic(got, got).agree  # the same finding in both runs: a property of both, not a difference
    dropped = run(*got.decisions, inflight=[cell(0, 0, cls="finished")])
    assert judge_traffic(ref, dropped).kind == "decision"  # a finished request's token is dropped: not a divergence
    # ... unless a read through the changed table would see wrong KV: that diverges whatever the class.
    misread = run(*got.decisions, inflight=[cell(0, 0, cls="finished", harm=WRONG_KV)])
    assert judge_traffic(ref, misread).kind == "inflight"


def test_a_scheduler_that_raised_where_the_reference_did_not_differs():
    ref = run(rec(0, "EXTEND", ["a"], [0], [3]))
    got = run(rec(0, "EXTEND", ["a"], [0], [3]), error=StopError(0, "ValueError: leak"))
    assert judge_traffic(ref, got).line() == "iteration 0: the scheduler raised ValueError: leak"
    assert judge_traffic(got, got).agree  # both stopped alike


def test_traffic_classes_are_read_from_what_the_scheduler_did():
    # c0 runs; r1 (arrived first) waits while r2 shares c0's prompt and is admitted with a cached prefix.
    scenario = TrafficScenario(ServerConfig(schedule_policy="lpm", pool_rows=4, max_running_requests=4), (
        (Arrival("c0", (1, 2, 3, 4), 4),), (Arrival("r1", (9, 9), 1), Arrival("r2", (1, 2, 3, 5), 1))))
    result = run(rec(0, "EXTEND", ["c0"], [0], [4]),
                 rec(1, "EXTEND", ["r2"], [3], [1], waiting=["r1"], chunked="r2"),
                 rec(2, "DECODE", ["c0", "r2"], retracted=1, finished=["c0", "r2"]),
                 outputs={"c0": [5, 6, 7, 8], "r2": [5]})
    # (in the overlap loop: a retraction there, and rows freed right after r2's chunk was launched)
    assert traffic_classes(scenario, result) == {TRAFFIC_RADIX_HIT_RUNNING, TRAFFIC_REORDERED, TRAFFIC_BUDGET_STOP,
                                                 TRAFFIC_CHUNKED, TRAFFIC_RETRACTION, TRAFFIC_OVERLAP_RETRACTION,
                                                 TRAFFIC_CHUNK_IN_FLIGHT_FREED}
    fcfs = TrafficScenario(ServerConfig(), scenario.arrivals)
    assert TRAFFIC_REORDERED not in traffic_classes(fcfs, result)  # fcfs ranks nothing


def test_a_traffic_scenario_shrinks_to_what_keeps_the_failure_and_round_trips():
    scenario = TrafficScenario(ServerConfig(page_size=4, chunked_prefill_size=8, schedule_conservativeness=0.3), (
        (Arrival("c0", tuple(range(10, 50)), 3),), (), (Arrival("r0", (7, 8, 9), 5), Arrival("r1", tuple(range(100, 120)), 2))))
    shrunk = minimize(scenario, lambda s: any(7 in a.tokens for g in s.arrivals for a in g),
                      candidates=traffic_candidates).scenario
    assert shrunk == TrafficScenario(ServerConfig(), ((Arrival("r0", (7,), 1),),))
    assert traffic_from_dict(traffic_to_dict(scenario)) == scenario


def test_the_verdict_line_says_what_differs_under_which_policy_and_loop():
    from types import SimpleNamespace

    from kvparity.judge.verdict import Row, Verdict
    from kvparity.model.classes import TRAFFIC_REQUIRED
    from kvparity.run.scheduler_drive import PlayerSpec, SchedulerDrive, SchedulerSpec

    players = tuple(SimpleNamespace(name=name, release="0.5.3", loops=("normal", "overlap"), caches=("full",), paged_windows=False, host_offer=HostOffer(), tree_cores=(),
                                    world_id=WORLD) for name in ("a", "b"))
    spec = SchedulerSpec(PlayerSpec("model", "legacy"), PlayerSpec("model", "refactored"), ("fcfs", "lpm"),
                         ("normal", "overlap"))
    drive = SchedulerDrive(spec, players=players)  # stand-ins: the drive only judges the hand-built runs here
    scenario = TrafficScenario(ServerConfig(), ((Arrival("a", (1, 2), 1), Arrival("b", (3, 4), 1)),))
    try:
        order = drive.judged(scenario, (run(rec(0, "EXTEND", ["a", "b"])), run(rec(0, "EXTEND", ["b", "a"]))), players[1])
        rewrite = drive.judged(scenario, (run(rec(0)), run(rec(0), inflight=[cell(0, 0)])), players[1])
        assert (order.kind, rewrite.kind) == ("admission", "inflight")
        rows = [Row(f"{policy}, {loop} loop", (i, j)) for i, loop in enumerate(spec.loops)
                for j, policy in enumerate(spec.policies)]

        def verdict() -> Verdict:
            return Verdict("scheduler", drive.reference, drive.checked, rows, TRAFFIC_REQUIRED, counts_all=True)

        rows[1].count(order, rows[1].task)
        rows[3].count(order, rows[3].task)
        assert drive.summary(verdict()) == "DIVERGENCE: admission differs under lpm; parity under fcfs"
        rows[2].count(rewrite, rows[2].task)
        assert drive.summary(verdict()) == (
            "DIVERGENCE: admission differs under lpm; in-flight findings the reference lacks under fcfs (overlap loop)")
        rows[3].count(rewrite, rows[3].task)  # a second kind in one row: named too, in the order of the kinds
        assert drive.summary(verdict()) == ("DIVERGENCE: admission differs under lpm; in-flight findings the "
                                            "reference lacks under fcfs, lpm (overlap loop)")
    finally:
        drive.close()


def test_the_rare_shapes_are_counted_from_a_runs_records():
    """Overlap loop: ``a`` launched as a chunk at iteration 0 while ``b`` finishes at iteration 1
    (rows freed under a chunk in flight); ``c`` retracted at 2 (back in the queue), readmitted at 3
    on a two-token hit."""
    from kvparity.judge.traffic_classes import rare_counts
    from kvparity.model.classes import (
        TRAFFIC_CHUNK_IN_FLIGHT_FREED,
        TRAFFIC_OVERLAP_RETRACTION,
        TRAFFIC_RETRACTED_HIT,
    )

    records = (rec(0, "EXTEND", ["a", "b", "c"], [0, 0, 0], [4, 2, 2], chunked="a"),
               rec(1, "DECODE", ["b", "c"], finished=["b"]),
               rec(2, "DECODE", ["c"], waiting=["c"], retracted=1),
               rec(3, "EXTEND", ["c"], [2], [1]))
    assert rare_counts(run(*records)) == {TRAFFIC_CHUNK_IN_FLIGHT_FREED: 1, TRAFFIC_OVERLAP_RETRACTION: 1,
                                          TRAFFIC_RETRACTED_HIT: 1}
    normal = TrafficRun("normal", records, (), {})
    assert rare_counts(normal) == {TRAFFIC_CHUNK_IN_FLIGHT_FREED: 0, TRAFFIC_OVERLAP_RETRACTION: 0,
                                   TRAFFIC_RETRACTED_HIT: 1}


def test_a_difference_left_after_undo_changes_is_not_traced_to_a_change_already_undone():
    """``--undo-changes`` plays the checked release with its named changes undone; a difference
    that remains is not traced by undoing them again (the copy no longer holds their text: it
    stopped a check of 0.5.18 against 0.5.17 with exit 2)."""
    from types import SimpleNamespace

    from kvparity.engine.releases import changes_between
    from kvparity.judge.verdict import Played
    from kvparity.run.scheduler_drive import PlayerSpec, SchedulerDrive, SchedulerSpec

    undone = tuple(c for c in changes_between("0.5.17", "0.5.18") if c.undo)
    assert undone
    tried: list = []
    players = tuple(SimpleNamespace(name=name, release=release, loops=("normal",), caches=("full",),
                                    paged_windows=False, host_offer=HostOffer(), tree_cores=(), world_id=WORLD,
                                    undone=lambda changes: tried.append(changes), close=lambda: None)
                    for name, release in (("a", "0.5.17"), ("b", "0.5.18")))
    drive = SchedulerDrive(SchedulerSpec(PlayerSpec("real", "0.5.17"), PlayerSpec("real", "0.5.18")), players=players)
    drive.undone = undone
    scenario = TrafficScenario(ServerConfig(), ((Arrival("a", (1, 2), 1),),))
    try:
        assert drive._named_change(Played(scenario, False, "memory", "")) is None
    finally:
        drive.close()
    assert all(change not in undone for changes in tried for change in changes), tried


def test_a_request_left_waiting_with_every_row_taken_is_row_exhaustion_not_a_budget_stop():
    # Two rows: a and b run; c waits though its prompt fits any token budget.
    scenario = TrafficScenario(ServerConfig(pool_rows=2, max_running_requests=2), (
        (Arrival("a", (1, 2), 3), Arrival("b", (3, 4), 3), Arrival("c", (5, 6), 3)),))
    result = run(rec(0, "EXTEND", ["a", "b"], [0, 0], [2, 2], waiting=["c"]), outputs={"a": [7], "b": [8]})
    found = traffic_classes(scenario, result)
    assert TRAFFIC_ROWS_FULL in found and TRAFFIC_BUDGET_STOP not in found
