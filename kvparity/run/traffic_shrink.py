"""What is smaller than a traffic scenario, big cuts first: ``minimize``'s candidates for the second
scenario form (``kvparity.model.traffic``). Runs of requests (halves, quarters, ... single ones),
then whole iterations of arrivals, then a request's prompt cut from the end or the start (half,
a quarter, ... one token), its outputs cut to one, then a server configuration nearer the defaults
(chunked prefill off, page size 1, SGLang's default conservativeness). Every candidate is a valid
scenario the report can print."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from kvparity.model.traffic import Arrival, TrafficScenario
from kvparity.run.minimize import halvings


def traffic_candidates(scenario: TrafficScenario) -> Iterator[TrafficScenario]:
    rids = [a.rid for group in scenario.arrivals for a in group]
    for size in halvings(len(rids)):
        for start in range(0, len(rids), size):
            yield from _valid(lambda: without_requests(scenario, set(rids[start : start + size])))  # noqa: B023
    for index in range(len(scenario.arrivals)):
        yield from _valid(lambda: without_iteration(scenario, index))  # noqa: B023
    longest = max((len(a.tokens) for group in scenario.arrivals for a in group), default=0)
    for cut in halvings(longest - 1):
        for rid in rids:
            yield from _valid(lambda: with_arrival(scenario, rid, lambda a: replace(a, tokens=a.tokens[:-cut])))  # noqa: B023
            yield from _valid(lambda: with_arrival(scenario, rid, lambda a: replace(a, tokens=a.tokens[cut:])))  # noqa: B023
    for rid in rids:
        yield from _valid(lambda: with_arrival(scenario, rid, lambda a: replace(a, max_new_tokens=1)))  # noqa: B023
    for knob, value in (("chunked_prefill_size", None), ("page_size", 1), ("schedule_conservativeness", 1.0)):
        yield from _valid(lambda: with_config(scenario, knob, value))  # noqa: B023


def without_requests(scenario: TrafficScenario, rids: set[str]) -> TrafficScenario:
    arrivals = tuple(tuple(a for a in group if a.rid not in rids) for group in scenario.arrivals)
    if not any(arrivals):
        raise ValueError("a traffic scenario needs a request")
    return replace(scenario, arrivals=_trimmed(arrivals))


def without_iteration(scenario: TrafficScenario, index: int) -> TrafficScenario:
    """Arrivals one iteration earlier from ``index`` on (its own requests gone)."""
    return without_requests(replace(scenario, arrivals=scenario.arrivals[:index] + scenario.arrivals[index + 1 :]), set())


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


def _trimmed(arrivals: tuple[tuple[Arrival, ...], ...]) -> tuple[tuple[Arrival, ...], ...]:
    """Trailing idle iterations say nothing: the loop runs until everything has finished anyway."""
    end = len(arrivals)
    while end and not arrivals[end - 1]:
        end -= 1
    return arrivals[:end]


def _valid(make: Callable[[], TrafficScenario]) -> Iterator[TrafficScenario]:
    try:
        yield make()
    except ValueError:  # not a change, or not a valid scenario (an empty prompt, no request)
        return
