"""The order classes (issue 25): whether a run's batches looked like a long-running server's.

A fresh pool hands out rows and pages in ascending order; a server's does not. Each rule is read
from a world's snapshots (``kvparity.judge.order``), the real reference's in a ``--sglang`` run.
"""

from __future__ import annotations

import pytest

from kvparity.engine.real.lane import RealLane
from kvparity.golden.scenarios import GOLDENS
from kvparity.judge.order import pages_contiguous
from kvparity.model.classes import (
    ORDER_CLASSES,
    ORDER_MIXED_FREE_TIMES,
    ORDER_PAGES_NOT_CONTIGUOUS,
    ORDER_ROWS_NOT_ASCENDING,
    ORDER_WRAPPED_FREE_LIST,
    REQUIRED,
)
from kvparity.model.scenario import Decode, Extend, RequestSpec, Scenario
from kvparity.model.worlds import Geometry
from kvparity.run.runner import run_scenario

REFERENCE = (("legacy", "torch"),)


def _classes(scenario: Scenario) -> set[str]:
    return run_scenario(scenario, REFERENCE, oracles=False).classes & set(ORDER_CLASSES)


def test_pages_are_contiguous_when_each_follows_the_last():
    assert pages_contiguous([4, 5, 6, 7, 8, 9], 4)  # pages 1, 2
    assert not pages_contiguous([4, 5, 6, 7, 12, 13], 4)  # pages 1, 3: page 2 skipped
    assert not pages_contiguous([8, 9, 4, 5], 2)  # pages 4, 2: out of order
    assert not pages_contiguous([2, 5], 1)  # page size 1: a slot is a page


def test_one_request_at_a_time_on_a_fresh_pool_reaches_no_order_class():
    # r0: row 0, slots 1-4; r1: row 1 (row 0 went to the back of the free rows), slots 5-7.
    scenario = Scenario(Geometry(pool_rows=4, max_context_len=16, kv_slots=64), "radix",
                        (RequestSpec("r0", (1, 2, 3)), RequestSpec("r1", (4, 5))),
                        (Extend(("r0",)), Decode(finish=("r0",)), Extend(("r1",)), Decode(finish=("r1",))))
    assert _classes(scenario) == set()


def test_two_requests_decoding_side_by_side_split_each_others_slots():
    # Page size 1: r0 holds slots 1-3, r1 4-5; the decode gives r0 slot 6, so r0's slots skip 4-5.
    scenario = Scenario(Geometry(pool_rows=4, max_context_len=16, kv_slots=64), "radix",
                        (RequestSpec("r0", (1, 2, 3)), RequestSpec("r1", (4, 5))),
                        (Extend(("r0", "r1")), Decode(), Decode(finish=("r0", "r1"))))
    assert _classes(scenario) == {ORDER_PAGES_NOT_CONTIGUOUS}


def test_rows_given_back_apart_come_out_of_order():
    # w2 then w3 give rows 0 and 1 back at different steps; the next batch takes rows 2, 0, 1.
    assert _classes(GOLDENS["warm-rows-freed-apart"]) == {
        ORDER_ROWS_NOT_ASCENDING, ORDER_MIXED_FREE_TIMES, ORDER_WRAPPED_FREE_LIST, ORDER_PAGES_NOT_CONTIGUOUS}


def test_a_prefix_matched_across_two_allocations_is_not_contiguous():
    # r4's cached prefix is (2, 5): w6's slot, then r0's own.
    assert ORDER_PAGES_NOT_CONTIGUOUS in _classes(GOLDENS["warm-scattered-prefix"])


def test_order_classes_are_required():
    assert set(ORDER_CLASSES) <= set(REQUIRED)


@pytest.mark.parametrize("golden", ["warm-rows-freed-apart", "warm-scattered-prefix"])
def test_real_sglang_reaches_the_same_order_classes(golden):
    """In a ``--sglang`` run the classes come from the real reference's own snapshots."""
    with RealLane(["0.5.3", "0.5.3.post1"], backends=("torch",)) as lane:
        result = run_scenario(GOLDENS[golden], REFERENCE, lane=lane, real_reference=True)
    assert result.ok
    assert result.classes & set(ORDER_CLASSES) == _classes(GOLDENS[golden])
