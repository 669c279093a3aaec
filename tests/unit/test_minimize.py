"""Reported counterexamples are minimal: no request, step, name or token can be removed with the
failure kept (``kvparity.run.minimize``, the sweep's only shrinker, with the step scenarios'
candidates of ``kvparity.run.candidates``). Shrinking cuts big first and stops when its time budget
is spent, saying so."""

from __future__ import annotations

import torch

from kvparity.model.scenario import Decode, Extend, RequestSpec, Retract, Scenario
from kvparity.model.worlds import Geometry
from kvparity.refactored import schedule_batch
from kvparity.run.candidates import smaller, step_candidates
from kvparity.run.harness_drive import check_harness
from kvparity.run.minimize import failure_kind, minimize
from kvparity.run.runner import run_scenario

TORCH_WORLDS = (("legacy", "torch"), ("refactored", "torch"))


def test_minimize_keeps_only_what_the_failure_needs():
    """The failure: some request's prompt holds token 7. Everything else goes: the other
    requests, their steps, the other tokens."""
    scenario = Scenario(
        Geometry(4, 16, 64), "radix",
        (RequestSpec("a", (1, 2, 3)), RequestSpec("b", (5, 7, 9)), RequestSpec("c", (4,), arrival=2)),
        (Extend(("a", "b")), Decode(finish=("a",)), Extend(("c",)), Retract("c")),
    )
    shrunk = minimize(scenario, lambda s: any(7 in r.tokens for r in s.requests), candidates=step_candidates)
    assert shrunk.scenario.requests == (RequestSpec("b", (7,)),)
    assert len(shrunk.scenario.steps) == 1 and shrunk.complete


def test_big_cuts_come_first():
    """64 requests of which one matters: halves, quarters, ... find it in a few dozen plays, not
    the hundreds that single removals, restarted after each success, would take."""
    requests = tuple(RequestSpec(f"r{i}", (i + 1,)) for i in range(64))
    scenario = Scenario(Geometry(4, 16, 64), "radix", requests, (Extend(tuple(r.rid for r in requests)),))
    shrunk = minimize(scenario, lambda s: any(r.rid == "r37" for r in s.requests), candidates=step_candidates)
    assert [r.rid for r in shrunk.scenario.requests] == ["r37"] and shrunk.complete
    assert shrunk.tried <= 40, shrunk.tried
    first = next(step_candidates(scenario))
    assert len(first.requests) == 32  # the first candidate drops half the requests


def test_a_spent_budget_returns_the_smallest_so_far_and_says_so():
    scenario = Scenario(Geometry(4, 16, 64), "radix", (RequestSpec("a", (1, 2)), RequestSpec("b", (3,))),
                        (Extend(("a", "b")),))
    shrunk = minimize(scenario, lambda s: True, budget_s=0.0, candidates=step_candidates)
    assert shrunk.scenario == scenario and not shrunk.complete and shrunk.tried == 0


def test_progress_hears_of_every_candidate_played():
    scenario = Scenario(Geometry(4, 16, 64), "radix", (RequestSpec("a", (1,)), RequestSpec("b", (7,))),
                        (Extend(("a", "b")),))
    heard: list[tuple[int, int]] = []
    shrunk = minimize(scenario, lambda s: any(7 in r.tokens for r in s.requests), candidates=step_candidates,
                      progress=lambda tried, smallest: heard.append((tried, len(smallest.requests))))
    assert [tried for tried, _ in heard] == list(range(1, shrunk.tried + 1))
    assert heard[-1][1] == 1


def test_removing_a_step_moves_later_arrivals_earlier():
    scenario = Scenario(Geometry(4, 16, 64), "chunk", (RequestSpec("a", (1,)), RequestSpec("b", (2,), arrival=2)),
                        (Extend(("a",)), Decode(), Extend(("b",))))
    without_decode = [s for s in smaller(scenario) if s.steps == (Extend(("a",)), Extend(("b",)))]
    assert [s.request("b").arrival for s in without_decode] == [1]


def test_a_planted_bug_is_reported_with_nothing_removable(monkeypatch):
    """refactored last_loc from the second-to-last prefix element: the reported scenario fails, and
    no scenario one removal smaller does."""

    def second_to_last(prefix_tensors, device):
        pieces = [p[-2:-1] if len(p) > 1 else torch.tensor([-1], dtype=torch.int64, device=device) for p in prefix_tensors]
        return torch.cat([p.to(device) for p in pieces])

    monkeypatch.setattr(schedule_batch, "last_loc_from_prefixes", second_to_last)
    verdict = check_harness(TORCH_WORLDS, 60, None)
    assert verdict.verdict == "divergence" and verdict.shrunk is not None and verdict.shrunk.shrunk is not None
    reported = verdict.shrunk.shown.scenario
    kind = failure_kind(run_scenario(reported, TORCH_WORLDS))
    assert kind is not None
    survivors = [s for s in smaller(reported) if failure_kind(run_scenario(s, TORCH_WORLDS)) == kind]
    assert survivors == [], survivors[0].to_python()


def test_a_shrink_bounded_by_candidates_stops_at_the_same_scenario_however_slow_the_machine():
    """The release matrix bounds shrinking by candidates played, not seconds: a slow play changes
    the time it takes, not where it stops (so two runs write the same JSON)."""
    import time

    scenario = Scenario(
        Geometry(4, 16, 64), "radix",
        (RequestSpec("a", (1, 2, 3)), RequestSpec("b", (5, 7, 9)), RequestSpec("c", (4,), arrival=2)),
        (Extend(("a", "b")), Decode(finish=("a",)), Extend(("c",)), Retract("c")),
    )

    def fails(slow):
        def check(s):
            time.sleep(slow)
            return any(7 in r.tokens for r in s.requests)
        return check

    fast = minimize(scenario, fails(0.0), candidates=step_candidates, max_tried=3)
    slow = minimize(scenario, fails(0.02), candidates=step_candidates, max_tried=3)
    assert (fast.scenario, fast.tried, fast.complete) == (slow.scenario, 3, False)
