"""kvparity's own model of SGLang's normal loop (``kvparity.engine.traffic_loop.play_traffic``)
against SGLang's own loop (``scheduler_shell.run_traffic``): on drawn traffic, legacy decides every
iteration exactly as real 0.5.3 does, refactored as real 0.5.3.post1 (each iteration record but
its time, and every output). Then one rule a test, on hand-made traffic, each checked against the
real release too: the prefill budget, the issue's minimal case of pull request #11200, the
reservation for running requests' outputs, chunked prefill, and retraction."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings

from kvparity.engine.traffic_loop import VOCAB_SIZE, play_traffic
from kvparity.engine.traffic_run import TrafficRun
from kvparity.mem_cache.schedule_policy import POLICIES
from kvparity.model.traffic import Arrival, ServerConfig, TrafficScenario
from kvparity.model.traffic_records import Decision
from kvparity.model.traffic_strategies import traffic_scenarios

PAIRS = (("legacy", "0.5.3"), ("refactored", "0.5.3.post1"))
RELEASE = dict(PAIRS)


@pytest.fixture
def workers(scheduler_workers):
    return scheduler_workers


def real(workers: dict, release: str, scenario: TrafficScenario) -> TrafficRun:
    config, arrivals = scenario.to_plain()
    return TrafficRun.from_plain(workers[release].call("run_traffic", config=config, arrivals=arrivals))


def without_time(decisions: tuple[Decision, ...]) -> list[Decision]:
    return [dataclasses.replace(rec, ms=0.0) for rec in decisions]


def first_difference(model: TrafficRun, reference: TrafficRun) -> str | None:
    """The first iteration record (time left out) or output where the model differs, as a line."""
    ours, theirs = without_time(model.decisions), without_time(reference.decisions)
    for i in range(max(len(ours), len(theirs))):
        a = ours[i] if i < len(ours) else None
        b = theirs[i] if i < len(theirs) else None
        if a != b:
            return f"iteration {i}:\n  model {a}\n  real  {b}"
    if model.outputs != reference.outputs:
        return f"outputs: model {model.outputs} != real {reference.outputs}"
    return None


def play_both(workers: dict, version: str, scenario: TrafficScenario) -> TrafficRun:
    """The model's run, after checking that the real release decided every iteration alike."""
    model = play_traffic(version, scenario)
    found = first_difference(model, real(workers, RELEASE[version], scenario))
    assert found is None, f"{version} vs {RELEASE[version]}: {found}\n{scenario.to_python()}"
    return model


def at(result: TrafficRun, iteration: int) -> Decision:
    return result.decisions[iteration]


# --------------------------------------------------------------------------- drawn traffic


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("version, release", PAIRS)
def test_the_model_decides_every_iteration_as_sglangs_own_loop(workers, version, release, policy):
    @settings(max_examples=10, deadline=None, database=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow])
    @given(scenario=traffic_scenarios(policies=(policy,)))
    def alike(scenario):
        found = first_difference(play_traffic(version, scenario), real(workers, release, scenario))
        assert found is None, f"{version} vs {release}: {found}\n{scenario.to_python()}"

    alike()


def test_the_forward_draws_from_the_shells_vocabulary():
    from kvparity.engine.real.adapter import VOCAB_SIZE as SHELL_VOCAB_SIZE

    assert VOCAB_SIZE == SHELL_VOCAB_SIZE


# --------------------------------------------------------------------------- one rule a test


def test_admission_stops_on_the_prefill_budget_at_the_first_request_that_does_not_fit(workers):
    """``max_prefill_tokens`` 11: a (6 tokens) gets in, b (5, exactly what is left) does not, and
    admission stops there: c (1 token) waits behind b, although it would fit. Both join the next
    batch, b first (a later request must fit strictly below what is left)."""
    scenario = TrafficScenario(ServerConfig(max_prefill_tokens=11), (
        (Arrival("a", tuple(range(10, 16)), 2), Arrival("b", tuple(range(20, 25)), 2), Arrival("c", (30,), 2)),))
    for version, _ in PAIRS:
        result = play_both(workers, version, scenario)
        assert (at(result, 0).rids, at(result, 0).waiting) == (("a",), ("b", "c"))
        assert (at(result, 1).mode, at(result, 1).rids) == ("EXTEND", ("b", "c"))


A = tuple(range(1000, 1040))
R1 = A[:39] + tuple(range(5000, 5011))


@pytest.mark.parametrize("policy, first_legacy, first_refactored", [
    ("fcfs", "r1", "r1"),
    ("lpm", "r1", "r0"),
])
def test_the_issues_minimal_case(workers, policy, first_legacy, first_refactored):
    """The tree holds A (40 tokens); r1 (A's first 39 and 11 new tokens), then r0 (A itself),
    arrive together under ``max_prefill_tokens`` 11, page size 1: only one fits. Under lpm, legacy
    ranks both by a match capped at len - 1 (39 each: arrival order, r1 first), refactored by the
    whole input (r0 matches 40 and goes first); admission itself matches r0 with 39 in both. Under
    fcfs nothing is ranked: r1 first in both."""
    config = ServerConfig(schedule_policy=policy, max_prefill_tokens=11, kv_slots=512)
    scenario = TrafficScenario(config, ((Arrival("a", A, 1),), (), (), (Arrival("r1", R1, 3), Arrival("r0", A, 3))))
    for version, first in (("legacy", first_legacy), ("refactored", first_refactored)):
        result = play_both(workers, version, scenario)
        admitted = at(result, 3)
        assert (admitted.rids, admitted.prefix_lens) == ((first,), (39,)), (version, admitted)
        assert at(result, 4).rids == ({"r0": "r1", "r1": "r0"}[first],)


@pytest.mark.parametrize("conservativeness, q1_admitted_at", [(1.0, 1), (1.5, 51)])
def test_running_requests_reserve_their_remaining_outputs_times_new_token_ratio(workers, conservativeness,
                                                                               q1_admitted_at):
    """100 KV slots; q0 (10 tokens, 50 outputs) runs, q1 (10 tokens, 31 outputs) arrives. q1 needs
    41 slots strictly below what is free (90) less q0's 49 remaining outputs × new_token_ratio. At
    ratio 0.7 (conservativeness 1.0) 55.7 are left: q1 gets in at once. At ratio 1.0
    (conservativeness 1.5, capped) 41 are left: q1 waits until q0 has finished and left the
    running batch (one idle pass after q0's last decode)."""
    scenario = TrafficScenario(ServerConfig(kv_slots=100, schedule_conservativeness=conservativeness), (
        (Arrival("q0", tuple(range(10, 20)), 50),), (Arrival("q1", tuple(range(30, 40)), 31),)))
    for version, _ in PAIRS:
        result = play_both(workers, version, scenario)
        admissions = [(rec.iteration, rec.rids) for rec in result.decisions if rec.mode == "EXTEND"]
        assert admissions == [(0, ("q0",)), (q1_admitted_at, ("q1",))], (version, admissions)
        assert sum(rec.retracted for rec in result.decisions) == 0


def test_a_chunked_request_continues_first_in_a_new_row(workers):
    """Chunked prefill of 8 tokens, page size 4. q0 (20 tokens) runs in chunks of 8, 8 and 4, each
    in a new row (0.5.3 frees the chunked request's row and caches its chunk, which its next chunk
    then matches). Its last chunk leaves 4 of the 8: q1 (6 tokens) is cut to those 4 (whole pages)
    and becomes the chunked request; its last 2 tokens follow alone. Then both decode."""
    config = ServerConfig(page_size=4, chunked_prefill_size=8, max_prefill_tokens=64)
    scenario = TrafficScenario(config, ((Arrival("q0", tuple(range(100, 120)), 2),
                                         Arrival("q1", tuple(range(200, 206)), 2)),))
    for version, _ in PAIRS:
        result = play_both(workers, version, scenario)
        batches = [(rec.rids, rec.prefix_lens, rec.extend_lens, rec.rows, rec.chunked) for rec in result.decisions[:4]]
        assert batches == [
            (("q0",), (0,), (8,), (0,), "q0"),
            (("q0",), (8,), (8,), (1,), "q0"),
            (("q0", "q1"), (16, 0), (4, 4), (2, 3), "q1"),
            (("q1",), (4,), (2,), (4,), None),
        ], version
        assert (at(result, 4).mode, at(result, 4).rids) == ("DECODE", ("q0", "q1"))


def test_retraction_is_reached_and_matches_sglang(workers):
    """Eight requests of 20 tokens and 40 outputs, 200 KV slots, conservativeness 0.3: admission
    reserves too little for the outputs, so decodes run short of memory and ``retract_decode``
    sends requests back to the queue (the fewest outputs first); every request still finishes with
    all 40 outputs. With conservativeness 1.0 nothing is retracted."""
    arrivals = (tuple(Arrival(f"q{i}", tuple(range(2000 + 100 * i, 2020 + 100 * i)), 40) for i in range(8)),)
    for version, _ in PAIRS:
        retracted = {}
        for conservativeness in (1.0, 0.3):
            config = ServerConfig(kv_slots=200, max_prefill_tokens=4096, schedule_conservativeness=conservativeness)
            result = play_both(workers, version, TrafficScenario(config, arrivals))
            retracted[conservativeness] = sum(rec.retracted for rec in result.decisions)
            assert sorted(len(out) for out in result.outputs.values()) == [40] * 8
        assert retracted[1.0] == 0 and retracted[0.3] > 0, (version, retracted)


def test_an_overlap_config_is_played_as_the_normal_loop():
    """The model has only the normal loop: a config naming the overlap loop gets the normal loop's
    decisions, and the result says which loop it played."""
    arrivals = ((Arrival("a", A, 3), Arrival("b", R1, 2)),)
    normal = play_traffic("legacy", TrafficScenario(ServerConfig(), arrivals))
    overlap = play_traffic("legacy", TrafficScenario(ServerConfig(loop="overlap"), arrivals))
    assert overlap.loop == normal.loop == "normal"
    assert without_time(overlap.decisions) == without_time(normal.decisions)


def test_a_prompt_that_leaves_no_room_for_outputs_is_refused():
    """SGLang clips a request's outputs to what its row and the pool leave (``max_req_len``); a
    server rejects a prompt that leaves none before queueing it. The model refuses to play one."""
    config = ServerConfig(kv_slots=256, max_prefill_tokens=4096)
    with pytest.raises(ValueError, match="no room for outputs"):
        play_traffic("legacy", TrafficScenario(config, ((Arrival("long", tuple(range(10, 264)), 4),),)))
