"""What is smaller than a scenario, big cuts first: ``kvparity.run.minimize``'s candidates, one
function per scenario form. Every candidate is a valid scenario the report can print.

- ``step_candidates`` (the harness drive's step scenarios): runs of requests, then runs of steps
  (halves, quarters, ... single ones), then single names in steps, then the requests' tokens cut
  from either end (half the longest, a quarter, ... one token).
- ``traffic_candidates`` (the scheduler drive's traffic scenarios): runs of requests, then whole
  iterations of arrivals, then a request's prompt cut from the end or the start, its outputs cut to
  one, then a server configuration nearer the defaults (chunked prefill off, page size 1, SGLang's
  default conservativeness).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any, TypeVar

from kvparity.model.scenario import Decode, Evict, Extend, Retract, Scenario, Step
from kvparity.model.traffic import Arrival, TrafficScenario
from kvparity.run.minimize import halvings

T = TypeVar("T")


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


def _valid(make: Callable[[], T]) -> Iterator[T]:
    try:
        yield make()
    except ValueError:
        return


# ---- traffic scenarios ------------------------------------------------------------------------


def traffic_candidates(scenario: TrafficScenario) -> Iterator[TrafficScenario]:
    aborted = [rid for group in scenario.aborts for rid in group]
    if scenario.config.forced_retraction is not None:  # a fault the difference does not need goes first
        yield from _valid(lambda: with_config(scenario, "forced_retraction", None))
    for rid, _ in scenario.abort_when:
        yield from _valid(lambda: replace(scenario, abort_when=tuple(p for p in scenario.abort_when if p[0] != rid)))  # noqa: B023
    for rid in aborted:
        yield from _valid(lambda: without_abort(scenario, rid))  # noqa: B023
    for rid in aborted:  # else the same abort one iteration sooner
        yield from _valid(lambda: abort_sooner(scenario, rid))  # noqa: B023
    rids = [a.rid for group in scenario.arrivals for a in group]
    for size in halvings(len(rids)):
        for start in range(0, len(rids), size):
            yield from _valid(lambda: traffic_without_requests(scenario, set(rids[start : start + size])))  # noqa: B023
    for index in range(len(scenario.arrivals)):
        yield from _valid(lambda: without_iteration(scenario, index))  # noqa: B023
    longest = max((len(a.tokens) for group in scenario.arrivals for a in group), default=0)
    for cut in halvings(longest - 1):
        for rid in rids:
            yield from _valid(lambda: with_arrival(scenario, rid, lambda a: replace(a, tokens=a.tokens[:-cut])))  # noqa: B023
            yield from _valid(lambda: with_arrival(scenario, rid, lambda a: replace(a, tokens=a.tokens[cut:])))  # noqa: B023
    for rid in rids:
        yield from _valid(lambda: with_arrival(scenario, rid, lambda a: replace(a, max_new_tokens=1)))  # noqa: B023
    for knob, value in (("chunked_prefill_size", None), ("page_size", 1), ("schedule_conservativeness", 1.0),
                        ("hicache_storage_failure", 0.0), ("hicache_ack_delay", 0),
                        ("hicache_prefetch_policy", "wait_complete")):
        yield from _valid(lambda: with_config(scenario, knob, value))  # noqa: B023


def traffic_without_requests(scenario: TrafficScenario, rids: set[str]) -> TrafficScenario:
    """The scenario without the requests ``rids`` (their aborts gone with them)."""
    arrivals = tuple(tuple(a for a in group if a.rid not in rids) for group in scenario.arrivals)
    if not any(arrivals):
        raise ValueError("a traffic scenario needs a request")
    aborts = tuple(tuple(rid for rid in group if rid not in rids) for group in scenario.aborts)
    when = tuple((rid, state) for rid, state in scenario.abort_when if rid not in rids)
    return replace(scenario, arrivals=_trimmed(arrivals), aborts=_trimmed(aborts), abort_when=when)


def without_iteration(scenario: TrafficScenario, index: int) -> TrafficScenario:
    """Arrivals and aborts one iteration earlier from ``index`` on (its own requests and aborts gone)."""
    gone = {a.rid for a in scenario.arrivals[index]} if index < len(scenario.arrivals) else set()
    shortened = replace(scenario, arrivals=scenario.arrivals[:index] + scenario.arrivals[index + 1 :],
                        aborts=scenario.aborts[:index] + scenario.aborts[index + 1 :])
    return traffic_without_requests(shortened, gone)


def without_abort(scenario: TrafficScenario, rid: str) -> TrafficScenario:
    return replace(scenario, aborts=_trimmed(tuple(tuple(r for r in group if r != rid) for group in scenario.aborts)))


def abort_sooner(scenario: TrafficScenario, rid: str) -> TrafficScenario:
    """``rid``'s abort one iteration sooner (a ValueError where that is before it arrives)."""
    at = next(i for i, group in enumerate(scenario.aborts) if rid in group)
    if at == 0:
        raise ValueError("no sooner iteration")
    groups = [tuple(r for r in group if r != rid) for group in scenario.aborts]
    groups[at - 1] += (rid,)
    return replace(scenario, aborts=_trimmed(tuple(groups)))


def with_arrival(scenario: TrafficScenario, rid: str, change: Callable[[Arrival], Arrival]) -> TrafficScenario:
    def changed(a: Arrival) -> Arrival:
        if a.rid != rid:
            return a
        new = change(a)
        if new == a:
            raise ValueError("no change")
        return new

    return replace(scenario, arrivals=tuple(tuple(changed(a) for a in group) for group in scenario.arrivals))


def with_config(scenario: TrafficScenario, knob: str, value: Any) -> TrafficScenario:
    if getattr(scenario.config, knob) == value:
        raise ValueError("no change")
    changes: dict[str, Any] = {knob: value}
    return replace(scenario, config=replace(scenario.config, **changes))


def _trimmed(arrivals: tuple[tuple[Any, ...], ...]) -> tuple[tuple[Any, ...], ...]:
    """Trailing idle iterations say nothing: the loop runs until everything has finished anyway."""
    end = len(arrivals)
    while end and not arrivals[end - 1]:
        end -= 1
    return arrivals[:end]
