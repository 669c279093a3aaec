"""Make a failing scenario minimal after Hypothesis has shrunk it: remove requests, steps and
tokens one at a time while the failure is kept, until nothing more can go. Hypothesis shrinks the
draws, and a scenario drawn with 13 requests can keep 11 that play no part; this pass works on
the scenario itself, so the report shows only what the failure needs.

``fails(scenario) -> bool`` says whether a candidate still fails in the same way (the caller
decides what "the same" is: a disagreement stays a disagreement). The pass is greedy and bounded
by ``budget_s``; each candidate is a valid ``Scenario`` (invalid ones are skipped).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import replace

from kvparity.model.scenario import Decode, Evict, Extend, Retract, Scenario, Step


def failure_kind(result) -> str | None:
    """"disagree" (some world differs), "oracle" (all agree, an oracle failed) or None (it passed)."""
    if result.divergences:
        return "disagree"
    return "oracle" if result.violations else None


def minimize(scenario: Scenario, fails: Callable[[Scenario], bool], *, budget_s: float = 30.0) -> Scenario:
    """The smallest scenario reachable from ``scenario`` by single removals that still fails."""
    deadline = time.monotonic() + budget_s
    improved = True
    while improved and time.monotonic() < deadline:
        improved = False
        for candidate in smaller(scenario):
            if time.monotonic() >= deadline:
                break
            if fails(candidate):
                scenario, improved = candidate, True
                break
    return scenario


def smaller(scenario: Scenario) -> Iterator[Scenario]:
    """Every valid scenario one removal away: a request, a step, a name in a step, a token."""
    # (noqa B023 below: ``yield from _valid(f)`` calls f at once, before the loop moves on, and drops it.)
    for request in scenario.requests:
        yield from _valid(lambda: without_request(scenario, request.rid))  # noqa: B023
    for index in range(len(scenario.steps)):
        yield from _valid(lambda: without_step(scenario, index))  # noqa: B023
    for index, step in enumerate(scenario.steps):
        for names in _names_of(step):
            for rid in names:
                yield from _valid(lambda: _with_step(scenario, index, _without_name(step, rid)))  # noqa: B023
    for i, request in enumerate(scenario.requests):
        if len(request.tokens) > 1:
            for tokens in (request.tokens[:-1], request.tokens[1:]):
                yield from _valid(lambda: _with_request(scenario, i, replace(request, tokens=tokens)))  # noqa: B023


def without_request(scenario: Scenario, rid: str) -> Scenario:
    steps = []
    for step in scenario.steps:
        if isinstance(step, Retract) and step.rid == rid:
            step = Evict(0)  # a no-op that keeps the step count (arrivals refer to step indices)
        steps.append(_without_name(step, rid))
    requests = tuple(r for r in scenario.requests if r.rid != rid)
    if not requests:
        raise ValueError("a scenario needs a request")
    return replace(scenario, requests=requests, steps=tuple(steps))


def without_step(scenario: Scenario, index: int) -> Scenario:
    """Drop step ``index``; arrivals after it move one step earlier."""
    steps = scenario.steps[:index] + scenario.steps[index + 1 :]
    if not steps:
        raise ValueError("a scenario needs a step")
    requests = tuple(replace(r, arrival=r.arrival - 1) if r.arrival > index else r for r in scenario.requests)
    return replace(scenario, requests=requests, steps=steps)


def _names_of(step: Step) -> tuple[tuple[str, ...], ...]:
    if isinstance(step, Extend):
        return (step.admit,)
    if isinstance(step, Decode):
        return (step.finish,)
    return ()


def _without_name(step: Step, rid: str) -> Step:
    if isinstance(step, Extend):
        return replace(step, admit=tuple(r for r in step.admit if r != rid))
    if isinstance(step, Decode):
        return replace(step, finish=tuple(r for r in step.finish if r != rid))
    return step


def _with_step(scenario: Scenario, index: int, step: Step) -> Scenario:
    if step == scenario.steps[index]:
        raise ValueError("no change")
    return replace(scenario, steps=scenario.steps[:index] + (step,) + scenario.steps[index + 1 :])


def _with_request(scenario: Scenario, index: int, request) -> Scenario:
    return replace(scenario, requests=scenario.requests[:index] + (request,) + scenario.requests[index + 1 :])


def _valid(make: Callable[[], Scenario]) -> Iterator[Scenario]:
    try:
        yield make()
    except ValueError:
        return
