"""Shrinking what a sweep found: its first failure (``shrunk_failure``, within the plan's budget)
and each known defect's first example (``shrink_examples``), replaying as few worlds as keep them
(``replay_worlds``). The shrinker itself is ``kvparity.run.minimize``."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from kvparity.model.scenario import Scenario
from kvparity.model.worlds import WorldId
from kvparity.run.events import FindingExample, SweepEvents
from kvparity.run.minimize import Shrunk, failure_kind, minimize
from kvparity.run.plan import TemplateOutcome, TemplatePlan
from kvparity.run.runner import RunResult, run_scenario


def replay_worlds(result: RunResult) -> frozenset[str] | None:
    """The worlds a shrinker replays to keep a failure: the reference and one world that failed in
    the same way, a torch one where there is one (several times cheaper than Triton's interpreter); None (every
    world) when only the reference is named, as in a stage-count mismatch."""
    reference = result.worlds[0]
    # A world that fails in the same way: a disagreement is kept by a world that disagreed (one
    # that only broke an oracle would turn it into an oracle failure).
    same_way = {d.world for d in result.divergences} if result.divergences else failed_worlds(result)
    failed = [w for w in result.worlds if w != reference and w in same_way]
    if not failed:
        return frozenset({reference}) if not result.divergences else None
    cheapest = min(failed, key=lambda w: not w.rpartition("/")[2].startswith("torch"))
    return frozenset({reference, cheapest})


def failed_worlds(result: RunResult) -> set[str]:
    return {d.world for d in result.divergences} | {v.world for v in result.violations}


def _player(plan: TemplatePlan, lane: Any, only: frozenset[str] | None) -> Callable[[Scenario], RunResult]:
    """``run_scenario`` in the plan's worlds, the real ones limited to ``only`` (the modelled ones
    too, but for the reference and, when the lane is the reference, the one that bounds its path;
    None: every world)."""
    modelled = plan.worlds
    if only is not None and not plan.real_reference:
        modelled = tuple(w for i, w in enumerate(plan.worlds) if i == 0 or str(WorldId.modelled(*w)) in only)
    return functools.partial(run_scenario, worlds=modelled, lane=lane, real_reference=plan.real_reference, only=only)


def shrunk_failure(scenario: Scenario, result: RunResult, plan: TemplatePlan, lane: Any,
            events: SweepEvents) -> tuple[tuple[Scenario, RunResult], Shrunk | None]:
    """The failure shrunk within the plan's budget, replaying only the worlds it involves; the
    smallest is played once more in every world, for the report."""
    if plan.shrink_budget_s is None:
        return (scenario, result), None
    kind = failure_kind(result)
    replay = _player(plan, lane, replay_worlds(result))
    shrunk = minimize(scenario, lambda c: failure_kind(replay(c)) == kind, budget_s=plan.shrink_budget_s,
                      progress=events.shrinking)
    if shrunk.scenario == scenario:
        return (scenario, result), shrunk
    final = run_scenario(shrunk.scenario, plan.worlds, lane=lane, real_reference=plan.real_reference)
    return (shrunk.scenario, final), shrunk


def shrink_examples(outcome: TemplateOutcome, plan: TemplatePlan, lane: Any, events: SweepEvents) -> None:
    """Each known defect's first example, shrunk to what still reaches the defect (once per run,
    by the process that claims it first)."""
    if plan.finding_budget_s <= 0:
        return
    for defect, example in list(outcome.examples.items()):
        if not events.cancelled() and events.claim(defect):
            outcome.examples[defect] = _shrunk_example(defect, example, plan, lane)


def _shrunk_example(defect: str, example: FindingExample, plan: TemplatePlan, lane: Any) -> FindingExample:
    """``example`` shrunk within the plan's budget, replaying the reference and the world it was seen in."""
    replay = _player(plan, lane, frozenset({example.world}))
    found: dict[Scenario, RunResult] = {}

    def reaches(candidate: Scenario) -> bool:
        found[candidate] = replay(candidate)
        return any(d.known_defect == defect for d in found[candidate].findings)

    shrunk = minimize(example.scenario, reaches, budget_s=plan.finding_budget_s)
    if shrunk.scenario == example.scenario:
        return example
    seen = next(d for d in found[shrunk.scenario].findings if d.known_defect == defect)
    return FindingExample(shrunk.scenario, seen.what, seen.detail, seen.world, example.scenario)
