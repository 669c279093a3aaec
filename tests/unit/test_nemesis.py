"""The nemesis's client aborts (issue 48): drawn into traffic scenarios after their requests arrive,
carried to the scheduler after that pass's arrivals, shrunk before the requests are, and played
through SGLang's own ``Scheduler.abort_request``."""

from __future__ import annotations

import pytest

from kvparity.engine.traffic_run import TrafficRun
from kvparity.judge.admission import traffic_problems
from kvparity.judge.traffic_classes import traffic_classes
from kvparity.model.classes import TRAFFIC_ABORTS
from kvparity.model.traffic import Arrival, ServerConfig, TrafficScenario, traffic_from_dict, traffic_to_dict
from kvparity.run.candidates import traffic_candidates

A = tuple(range(1000, 1010))
# w waits behind a long prompt that takes the whole prefill budget; d decodes 8 tokens.
SCENARIO = TrafficScenario(ServerConfig(max_prefill_tokens=12), (
    (Arrival("long", tuple(range(3000, 3012)), 2), Arrival("w", A, 2), Arrival("d", (7, 8), 8)),
), aborts=((("w",)), (), (), (), ("d",)))


def test_an_abort_comes_after_its_request_arrives():
    with pytest.raises(ValueError, match="request 'w' is aborted at iteration 0, before it arrives"):
        TrafficScenario(ServerConfig(), ((), (Arrival("w", A, 2),)), aborts=(("w",),))


def test_aborts_reach_the_scheduler_after_that_passs_arrivals():
    _, groups = SCENARIO.to_plain()
    assert [[spec.get("rid", spec.get("abort")) for spec in group] for group in groups] == [
        ["long", "w", "d", "w"], [], [], [], ["d"]]


def test_a_scenario_with_aborts_round_trips_through_json_and_python():
    from kvparity.model import traffic

    assert traffic_from_dict(traffic_to_dict(SCENARIO)) == SCENARIO
    assert eval(SCENARIO.to_python(), vars(traffic)) == SCENARIO
    plain = TrafficScenario(ServerConfig(), ((Arrival("r", A, 1),),))
    assert "aborts" not in traffic_to_dict(plain)["traffic"]  # a scenario without the nemesis is written as before


def test_shrinking_drops_an_abort_before_touching_the_requests():
    first = next(traffic_candidates(SCENARIO))
    assert first.arrivals == SCENARIO.arrivals and first.aborts == ((), (), (), (), ("d",))


def test_sglangs_own_abort_path_ends_a_waiting_and_a_decoding_request(scheduler_workers):
    config, groups = SCENARIO.to_plain()
    run = TrafficRun.from_plain(scheduler_workers["0.5.3"].call("run_traffic", config=config, arrivals=groups))
    assert run.error is None
    assert run.aborts == ((0, "w", "waiting"), (4, "d", "decoding"))
    assert run.outputs["w"] == () and 0 < len(run.outputs["d"]) < 8  # d stopped short of its 8 tokens
    assert {TRAFFIC_ABORTS["waiting"], TRAFFIC_ABORTS["decoding"]} <= traffic_classes(SCENARIO, run)
    assert not traffic_problems(SCENARIO, run)  # every slot and row came back
