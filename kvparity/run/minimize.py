"""Shrink a failing scenario: remove requests, steps, names and tokens while the failure is kept,
until nothing more can go or the time budget is spent. This is kvparity's only shrinker (the
sweep stops Hypothesis at its first failure and reports it before shrinking): it works on the
scenario itself, so every candidate is a valid scenario the report can print, and it cuts big
first (delta debugging's halves before single removals), so a scenario drawn with 100 requests
loses most of them in a few plays.

``fails(scenario) -> bool`` says whether a candidate still fails in the same way (the caller
decides what "the same" is: a disagreement stays a disagreement). ``minimize``'s loop is the same
for both scenario forms; what is smaller comes from ``candidates`` (a step scenario's, below, by
default; a traffic scenario's from ``kvparity.run.traffic_shrink``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from kvparity.model.scenario import Decode, Evict, Extend, Retract, Scenario, Step

S = TypeVar("S")


def failure_kind(result) -> str | None:
    """"disagree" (some world differs), "oracle" (all agree, an oracle failed) or None (it passed)."""
    if result.divergences:
        return "disagree"
    return "oracle" if result.violations else None


# Seconds a counterexample's shrinking may take by default (``kvparity check --shrink-budget``). Measured
# on the real-SGLang mutants (scripts/bench_real_mutants.py, docs/perf/fast-answers.md, 2 cores):
# the slowest reached its minimum in 17 s, replaying the reference and one failed world.
DEFAULT_BUDGET_S = 45.0


@dataclass(frozen=True)
class Shrunk:
    """What shrinking made of a failing scenario."""

    scenario: Any  # the smallest failing scenario found (a Scenario, or a TrafficScenario)
    tried: int  # smaller candidates played
    complete: bool  # True: nothing one removal smaller fails; False: the budget ran out first
    seconds: float


Progress = Callable[[int, Any], None]  # (candidates tried so far, the smallest failing one)


def minimize(scenario: S, fails: Callable[[S], bool], *, budget_s: float = DEFAULT_BUDGET_S,
             progress: Progress | None = None, candidates: Callable[[S], Iterator[S]] | None = None) -> Shrunk:
    """The smallest scenario reachable from ``scenario`` by removals that still fails, within
    ``budget_s``. Candidates come biggest cut first (half the requests, half the steps, ... down
    to one; then single names and tokens), each candidate is played once (a repeat is answered
    from memory), and the first that fails is taken; then the search starts again from the
    biggest cuts (a bigger cut may work now). When none fails, the scenario is minimal. (Going on
    from the cut just made plays about half as many candidates, but on the real-SGLang mutants it
    settled in local minima up to twice as large: 7 requests and 7 steps where this finds 5 and 3.)"""
    start = time.monotonic()
    smaller_ones: Callable[[Any], Iterator[Any]] = candidates or step_candidates
    known: dict[S, bool] = {}
    tried = 0
    while True:
        for candidate in smaller_ones(scenario):
            if time.monotonic() - start >= budget_s:
                return Shrunk(scenario, tried, False, time.monotonic() - start)
            if candidate not in known:
                known[candidate] = fails(candidate)
                tried += 1
                if progress is not None:
                    progress(tried, candidate if known[candidate] else scenario)
            if known[candidate]:
                scenario = candidate
                break
        else:
            return Shrunk(scenario, tried, True, time.monotonic() - start)


def step_candidates(scenario: Scenario) -> Iterator[Scenario]:
    """Smaller scenarios, big cuts first: runs of requests, then runs of steps (halves, quarters,
    ... single ones), then single names in steps, then the requests' tokens cut from either end
    (half the longest, a quarter, ... one token). The single removals are ``smaller``'s."""
    for size in halvings(len(scenario.requests)):
        yield from _chunk_cuts(scenario, [r.rid for r in scenario.requests], size, _without_requests)
    for size in halvings(len(scenario.steps)):
        yield from _chunk_cuts(scenario, list(range(len(scenario.steps))), size, _without_steps)
    for index, step in enumerate(scenario.steps):
        for names in _names_of(step):
            for rid in names:
                yield from _valid(lambda: _with_step(scenario, index, _without_name(step, rid)))  # noqa: B023
    longest = max((len(r.tokens) for r in scenario.requests), default=0)
    for cut in halvings(longest - 1):
        for i, request in enumerate(scenario.requests):
            if len(request.tokens) > cut:
                for tokens in (request.tokens[:-cut], request.tokens[cut:]):
                    yield from _valid(lambda: _with_request(scenario, i, replace(request, tokens=tokens)))  # noqa: B023


def halvings(n: int) -> list[int]:
    """The sizes of the cuts to try, biggest first: n itself, then n//2, n//4, ..., 1."""
    sizes: list[int] = []
    size = n // 2 if n > 1 else n
    while size >= 1:
        sizes.append(size)
        size //= 2
    return ([n] if n >= 1 and n not in sizes else []) + sizes


def _chunk_cuts(scenario: Scenario, items: list, size: int, remove: Callable[[Scenario, list], Scenario]) -> Iterator[Scenario]:
    """``scenario`` without each run of ``size`` of ``items``."""
    for start in range(0, len(items), size):
        yield from _valid(lambda: remove(scenario, items[start : start + size]))  # noqa: B023


def _without_requests(scenario: Scenario, rids: list[str]) -> Scenario:
    for rid in rids:
        scenario = without_request(scenario, rid)
    return scenario


def _without_steps(scenario: Scenario, indices: list[int]) -> Scenario:
    for index in sorted(indices, reverse=True):  # the later first: earlier indices stay valid
        scenario = without_step(scenario, index)
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
