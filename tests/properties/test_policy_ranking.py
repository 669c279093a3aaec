"""The waiting queue's ranking under SGLang's policies (issue 26, a first step): the one line of
pull request #11200 outside ``schedule_batch.py``. kvparity's legacy and refactored rank through
``kvparity.mem_cache.schedule_policy.calc_priority`` with their own key; real 0.5.3 and
0.5.3.post1 rank through their own ``SchedulePolicy`` (``kvparity.engine.real.policy_probe``)."""

from __future__ import annotations

from dataclasses import asdict

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from kvparity.engine.world import build_world
from kvparity.mem_cache.radix_cache import RadixKey
from kvparity.mem_cache.schedule_policy import POLICIES, calc_priority
from kvparity.model.worlds import Geometry

GEOMETRY = Geometry(pool_rows=8, max_context_len=160, kv_slots=1024, page_size=1)
RELEASE_OF = {"legacy": "0.5.3", "refactored": "0.5.3.post1"}
A = list(range(1000, 1040))
# The minimal case: the tree holds A (40 tokens); r1 (A's first 39 tokens and 11 new ones)
# waits before r0 (A itself).
MINIMAL = ([A], [{"rid": "r1", "tokens": A[:39] + list(range(5000, 5011))}, {"rid": "r0", "tokens": A}])


def model_order(version: str, policy: str, cached: list[list[int]], queue: list[dict]) -> list[str]:
    world = build_world(version, "torch", GEOMETRY, "radix")
    for tokens in cached:
        world.tree_cache.insert(RadixKey(list(tokens), None), world.allocator.alloc(len(tokens)))
    reqs = [world.new_req(r["rid"], list(r["tokens"])) for r in queue]
    calc_priority(policy, reqs, world.tree_cache)
    return [r.rid for r in reqs]


@pytest.fixture
def real(scheduler_workers):
    return scheduler_workers


def real_order(workers: dict, release: str, policy: str, cached: list[list[int]], queue: list[dict]) -> list[str]:
    return workers[release].call("rank_waiting_queue", policy=policy, geometry=asdict(GEOMETRY), cached=cached,
                                 queue=queue)["order"]


@pytest.mark.parametrize("policy, legacy, refactored", [
    ("fcfs", ["r1", "r0"], ["r1", "r0"]),  # arrival order: no key is matched
    ("lpm", ["r1", "r0"], ["r0", "r1"]),  # legacy: both keys match 39 tokens (a tie keeps arrival order)
    ("dfs-weight", ["r1", "r0"], ["r0", "r1"]),  # refactored: r0's whole input matches 40, below r1's node
])
def test_the_ranking_key_reorders_the_minimal_case(policy, legacy, refactored, real):
    cached, queue = MINIMAL
    assert model_order("legacy", policy, cached, queue) == legacy
    assert model_order("refactored", policy, cached, queue) == refactored
    assert real_order(real, "0.5.3", policy, cached, queue) == legacy
    assert real_order(real, "0.5.3.post1", policy, cached, queue) == refactored


@st.composite
def queues(draw):
    """A tree of a sequence from each of two stems (sibling subtrees, weighed by dfs-weight) and
    maybe a third, and two to six waiting requests: cuts of the cached sequences (often ending at
    or one short of a cached end) with tokens of their own."""
    stems = [list(range(100_000 * (k + 1), 100_000 * (k + 1) + 60)) for k in range(2)]
    picked = stems + [draw(st.sampled_from(stems))] * draw(st.integers(0, 1))
    cached = [stem[: draw(st.integers(1, 60))] for stem in picked]
    queue = []
    for i in range(draw(st.integers(2, 6))):
        base = draw(st.sampled_from(cached))
        cut = draw(st.sampled_from((len(base), len(base) - 1, draw(st.integers(0, len(base))))))
        own = list(range(10_000 * (i + 1), 10_000 * (i + 1) + draw(st.integers(0 if cut else 1, 12))))
        queue.append({"rid": f"r{i}", "tokens": base[:max(cut, 0)] + own})
    return cached, queue


@pytest.mark.parametrize("policy", POLICIES)
def test_the_model_ranks_as_real_sglang(policy, real):
    @settings(max_examples=25, deadline=None)
    @given(drawn=queues())
    def ranks_alike(drawn):
        cached, queue = drawn
        orders = {}
        for version, release in RELEASE_OF.items():
            orders[version] = model_order(version, policy, cached, queue)
            assert orders[version] == real_order(real, release, policy, cached, queue), (version, drawn)
        event(f"the refactor {'reorders' if orders['legacy'] != orders['refactored'] else 'keeps'} the queue")

    ranks_alike()
