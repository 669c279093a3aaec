"""kvparity's model of SGLang 0.5.3's ``PrefillAdder`` (``kvparity.mem_cache.prefill_adder``), one
rule a test: which request gets into a prefill batch, which is cut into a chunk, and why admission
stops. Played on a fresh legacy world (the adder is the same in both versions)."""

from __future__ import annotations

import pytest

from kvparity.engine.world import build_world
from kvparity.mem_cache.prefill_adder import AddReqResult, PrefillAdder
from kvparity.mem_cache.radix_cache import RadixKey
from kvparity.model.worlds import Geometry


def world(kv_slots: int = 100, page_size: int = 1):
    return build_world("legacy", "torch", Geometry(8, 256, kv_slots, page_size), "radix")


def waiting(w, rid: str, tokens, max_new_tokens: int):
    """A waiting request as the scheduler hands it to the adder: matched against the tree."""
    req = w.new_req(rid, list(tokens), max_new_tokens=max_new_tokens)
    w.init_next_round_input(req)
    return req


def running(w, rid: str, max_new_tokens: int, outputs: int):
    """A running request, as far as the adder reads one: its max_new_tokens and outputs so far."""
    req = w.new_req(rid, [1, 2, 3], max_new_tokens=max_new_tokens)
    req.output_ids = list(range(100, 100 + outputs))
    return req


def adder(w, running_reqs=(), ratio: float = 0.7, max_prefill_tokens: int = 4096, chunk: int | None = None):
    return PrefillAdder(w.allocator.page_size, w.tree_cache, w.allocator, list(running_reqs), ratio,
                        max_prefill_tokens, chunk)


def test_the_first_request_gets_in_however_large():
    """``--max-prefill-tokens`` never keeps a batch empty: the first request is admitted even when
    it alone is over the budget; the spent budget then stops admission (OTHER)."""
    w = world()
    a = adder(w, max_prefill_tokens=4)
    req = waiting(w, "big", range(10, 20), 2)
    assert a.add_one_req(req) == AddReqResult.OTHER
    assert a.can_run_list == [req] and a.rem_input_tokens == -6


def test_admission_stops_at_the_first_request_over_the_prefill_budget():
    """A later request must fit strictly below what is left of the prefill budget: 6 of 11 tokens
    are taken, a 5-token request (exactly the rest) is refused with OTHER, and the scheduler stops
    there, before a 1-token request that would have fitted."""
    w = world()
    a = adder(w, max_prefill_tokens=11)
    assert a.add_one_req(waiting(w, "a", range(10, 16), 2)) == AddReqResult.CONTINUE
    assert a.rem_input_tokens == 5
    assert a.add_one_req(waiting(w, "b", range(20, 25), 2)) == AddReqResult.OTHER
    assert [r.rid for r in a.can_run_list] == ["a"]


@pytest.mark.parametrize("max_new_tokens, admitted", [(49, True), (50, False)])
def test_a_request_needs_its_prompt_and_all_its_outputs_strictly_below_the_free_memory(max_new_tokens, admitted):
    """100 free slots: a 50-token prompt with 49 outputs gets in, with 50 (exactly the pool) it
    does not (NO_TOKEN: the scheduler then marks the running batch full)."""
    w = world(kv_slots=100)
    a = adder(w)
    result = a.add_one_req(waiting(w, "r", range(10, 60), max_new_tokens))
    assert (result != AddReqResult.NO_TOKEN, len(a.can_run_list)) == (admitted, int(admitted))


def test_running_requests_reserve_their_remaining_outputs_times_the_ratio():
    """A running request with 40 outputs to go, at new_token_ratio 0.5, holds 20 slots of the
    budget back: of 100 free slots 80 are left, and a request needing 80 is refused."""
    w = world(kv_slots=100)
    a = adder(w, [running(w, "run", 50, 10)], ratio=0.5)
    assert a.rem_total_tokens == 80.0
    assert a.add_one_req(waiting(w, "r", range(10, 40), 50)) == AddReqResult.NO_TOKEN
    assert adder(w, [running(w, "run", 50, 10)], ratio=0.5).add_one_req(
        waiting(w, "r", range(10, 40), 49)) == AddReqResult.CONTINUE


def test_inputs_take_whole_pages():
    """Page size 4: a 5-token prompt takes 8 tokens of every budget; its outputs are not rounded."""
    w = world(kv_slots=64, page_size=4)
    a = adder(w, max_prefill_tokens=32)
    a.add_one_req(waiting(w, "r", range(10, 15), 3))
    assert (a.rem_input_tokens, a.cur_rem_token_offset, a.rem_total_token_offset) == (24, 8, 11)


def test_a_request_over_the_chunk_budget_is_cut_to_whole_pages():
    """Chunked prefill of 10 tokens, page size 4: a 30-token prompt is cut to 8 (whole pages of the
    10), becomes the new chunked request, and none of its outputs are reserved yet."""
    w = world(kv_slots=64, page_size=4)
    a = adder(w, chunk=10)
    req = waiting(w, "long", range(10, 40), 5)
    assert a.add_one_req(req) == AddReqResult.CONTINUE  # 2 chunk tokens are left
    assert a.new_chunked_req is req and req.extend_input_len == 8 and len(req.fill_ids) == 8
    assert a.rem_total_token_offset == 8


def test_the_chunked_request_continues_cut_to_the_budget_not_to_pages():
    """The chunked request's next chunk is cut to the chunk budget itself (10, not 8), yet takes
    whole pages of it (12); its last chunk reserves its outputs and ends the chunking (None)."""
    w = world(kv_slots=64, page_size=4)
    req = waiting(w, "long", range(10, 40), 5)
    a = adder(w, chunk=10)
    assert a.add_chunked_req(req) is req
    assert req.extend_input_len == 10 and a.rem_chunk_tokens == -2 and a.rem_total_token_offset == 12
    req.extend_input_len = 4  # what its last chunk leaves
    last = adder(w, chunk=10)
    assert last.add_chunked_req(req) is None and last.rem_total_token_offset == 4 + 5


def test_the_matched_prefix_once_locked_is_no_longer_room():
    """The tree holds a 40-token prompt (evictable: it counts as room). A request extending it by
    10 tokens, with 55 outputs, fits the 60 free + 40 evictable slots; but while it is weighed its
    match is locked, the 40 are no longer evictable, and 65 does not fit below 60. It is refused and
    leaves no lock; with 45 outputs it is admitted and keeps one."""
    w = world(kv_slots=100)
    prompt = list(range(1000, 1040))
    w.tree_cache.insert(RadixKey(prompt), w.allocator.alloc(40))
    refused = waiting(w, "r", prompt + list(range(5000, 5010)), 55)
    a = adder(w)
    assert a.rem_total_tokens == 100 and a.add_one_req(refused) == AddReqResult.NO_TOKEN
    assert refused.last_node.lock_ref == 0 and w.tree_cache.evictable_size() == 40
    admitted = waiting(w, "r", prompt + list(range(5000, 5010)), 45)
    assert adder(w).add_one_req(admitted) == AddReqResult.CONTINUE
    assert admitted.last_node.lock_ref == 1 and w.tree_cache.evictable_size() == 0
