"""Traffic scenarios through SGLang's own scheduler loop (issue 26, a first step): real 0.5.3
against real 0.5.3.post1, every decision compared (``kvparity.judge.admission``). Under ``fcfs``
the two decide alike; under ``lpm`` and ``dfs-weight`` Hypothesis finds, and shrinks, a mix where
pull request #11200's ranking key makes them admit differently."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, find, given, settings

from kvparity.judge.admission import first_decision_difference
from kvparity.model.traffic import TrafficScenario
from kvparity.model.traffic_strategies import traffic_scenarios

RELEASES = ("0.5.3", "0.5.3.post1")


@pytest.fixture
def workers(scheduler_workers):
    return scheduler_workers


def decisions(workers: dict, release: str, scenario: TrafficScenario) -> list[dict]:
    config, arrivals = scenario.to_plain()
    return workers[release].call("run_traffic", config=config, arrivals=arrivals)["iterations"]


def difference(workers: dict, scenario: TrafficScenario):
    return first_decision_difference(*(decisions(workers, r, scenario) for r in RELEASES))


def test_fcfs_decides_alike_in_both_releases(workers):
    @settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(scenario=traffic_scenarios(policies=("fcfs",)))
    def alike(scenario):
        found = difference(workers, scenario)
        assert found is None, f"{found.line()}\n{scenario.to_python()}"

    alike()


@pytest.mark.parametrize("policy", ["lpm", "dfs-weight"])
def test_the_ranking_key_changes_admission_and_shrinks(workers, policy):
    quick = settings(max_examples=300, deadline=None, database=None, derandomize=True,
                     suppress_health_check=list(HealthCheck))
    found = find(traffic_scenarios(policies=(policy,)), lambda s: (d := difference(workers, s)) is not None and d.admission,
                 settings=quick)
    burst = found.arrivals[-1]
    # Shrunk: one cached prompt and two requests (r1 ranked above r0 in one release only).
    assert len(found.arrivals) == 3 and len(burst) == 2, found.to_python()
    assert difference(workers, found).admission
