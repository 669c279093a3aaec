"""Reproducible by construction: the same command and seed give the same verdict JSON, apart from
times, whatever ``--jobs`` shares the tasks out over; and a real release's worker plays a scenario
the same whatever it played before (it carries nothing from one scenario to the next)."""

import json

import pytest

from kvparity.cli.main import main

# What may vary from run to run: wall times (of a run, a task, an iteration), and nothing else.
TIMES = ("seconds", "found_after_s", "build_s", "loop_s", "record_s", "ms")


def _without_times(value):
    if isinstance(value, dict):
        return {k: _without_times(v) for k, v in value.items() if k not in TIMES}
    if isinstance(value, list):
        return [_without_times(v) for v in value]
    return value


def _verdict(tmp_path, argv, jobs):
    out = tmp_path / f"jobs{jobs}.json"
    main(["check", *argv, "--seed", "3", "--jobs", str(jobs), "--json", str(out)])
    return _without_times(json.loads(out.read_text()))


@pytest.mark.parametrize("argv", [["--drive", "scheduler", "--traffic-examples", "2"],
                                  ["--backend", "torch", "--examples", "22"]], ids=["scheduler", "harness"])
def test_the_same_seed_gives_the_same_verdict_on_one_job_and_on_two(tmp_path, argv):
    one = _verdict(tmp_path, argv, 1)
    assert one == _verdict(tmp_path, argv, 2)
    assert one["scenarios"] > 0


def test_a_real_worker_plays_a_scenario_alike_after_another(tmp_path):
    """Two scenarios in one worker, then the first again: the same run, to the last snapshot."""
    from kvparity.engine.real.install import resolve
    from kvparity.engine.real.players import RealTrafficPlayer
    from kvparity.model.traffic import Arrival, ServerConfig, TrafficScenario

    first = TrafficScenario(ServerConfig(kv_slots=128, max_prefill_tokens=64, loop="overlap"),
                            ((Arrival("a", tuple(range(100000, 100009)), 6), Arrival("b", (100000, 7), 3)),))
    other = TrafficScenario(ServerConfig(kv_slots=64, page_size=4, chunked_prefill_size=8, max_prefill_tokens=16),
                            ((Arrival("x", tuple(range(200000, 200021)), 4),), (Arrival("y", (200000, 5), 9),)))
    player = RealTrafficPlayer(resolve("0.5.3.post1"))
    try:
        before = player.play(first).to_plain()
        player.play(other)
        after = player.play(first).to_plain()
    finally:
        player.close()
    assert _without_times(before) == _without_times(after)
    assert before["decisions"] and before["memory"]
