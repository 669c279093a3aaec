"""Hypothesis strategies for traffic scenarios (``kvparity.model.traffic``): a few requests arrive
one at a time and finish, filling the radix tree; then a burst arrives together, cuts of those
prompts (often ending at, or one short of, a cached end) with tokens of their own, under a prefill
budget small enough that admission stops on it. Everything shrinks towards one short burst."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from kvparity.mem_cache.schedule_policy import POLICIES
from kvparity.model.traffic import Arrival, ServerConfig, TrafficScenario

_STEM = 60


@st.composite
def server_configs(draw: Any, policies: tuple[str, ...] = POLICIES) -> ServerConfig:
    page_size = draw(st.sampled_from((1, 4)))
    rows = draw(st.integers(4, 8))
    chunked = draw(st.one_of(st.none(), st.integers(2, 8).map(lambda pages: pages * page_size)))
    return ServerConfig(
        schedule_policy=draw(st.sampled_from(policies)),
        page_size=page_size,
        pool_rows=rows,
        kv_slots=draw(st.sampled_from((256, 512, 1024))),
        max_prefill_tokens=draw(st.integers(4, 32)),
        chunked_prefill_size=chunked,
        max_running_requests=rows,
        schedule_conservativeness=draw(st.sampled_from((1.0, 0.3))),
    )


@st.composite
def traffic_scenarios(draw: Any, policies: tuple[str, ...] = POLICIES) -> TrafficScenario:
    config = draw(server_configs(policies))
    stems = [tuple(range(100_000 * (k + 1), 100_000 * (k + 1) + _STEM)) for k in range(2)]
    cached = [draw(st.sampled_from(stems))[: draw(st.integers(4, _STEM))] for _ in range(draw(st.integers(1, 3)))]
    arrivals: list[tuple[Arrival, ...]] = [(Arrival(f"c{i}", p, 1),) for i, p in enumerate(cached)]
    arrivals.append(())  # an idle iteration: the warm-up has finished
    burst = []
    for i in range(draw(st.integers(2, 6))):
        base = draw(st.sampled_from(cached))
        cut = draw(st.sampled_from((len(base), len(base) - 1, draw(st.integers(0, len(base))))))
        own = tuple(range(10_000 * (i + 1), 10_000 * (i + 1) + draw(st.integers(0 if cut else 1, 12))))
        burst.append(Arrival(f"r{i}", base[:cut] + own, draw(st.integers(1, 6))))
    arrivals.append(tuple(burst))
    return TrafficScenario(config, tuple(arrivals))
