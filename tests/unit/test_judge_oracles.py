"""The oracles of ``kvparity.judge.oracles`` not covered by ``test_oracles_units.py``, one rule per test, on
hand-built snapshots (``judge_cases``): a stage that keeps the rule gives no violation, one that
breaks it gives the exact message written out here. Also which oracles ``check_stage`` runs on
which stage, and how it labels what they find."""

from __future__ import annotations

import pytest

from kvparity.caches.window_pool import WindowState
from kvparity.judge.oracles import (
    cached_row_names_prefix,
    check_stage,
    extend_lens_positive,
    last_loc_matches_prefix,
    logprob_start_respected,
    pages_a_failed_decode_kept,
    rows_hold_prefix_then_new_slots,
    stale_row_defects,
)

from judge_cases import (
    START,
    cache_unfinished,
    changed,
    extend,
    logprob,
    note,
    observed,
    out_of_memory,
    scenario,
    snap,
    stage,
    view,
    violating,
    with_cells,
)

# ---- check_stage: which oracles run where ------------------------------------------------------
# Slots 1..8 (slot 0 reserved): before the stage all free; r0 extends into row 0 with slots 1, 2, 3.
BEFORE = snap(START, free=list(range(1, 9)))
AFTER = snap(extend(), rows={0: [1, 2, 3]}, free=[4, 5, 6, 7, 8], requests={"r0": view(0, held=(1, 2, 3))})


def test_check_stage_passes_a_stage_that_keeps_every_rule():
    """A consistent extend (row = prefix then new slots, pages taken, all counted) has no violation."""
    assert check_stage(scenario(), BEFORE, AFTER) == []


def test_check_stage_reports_the_stages_contract_violations_labelled_with_the_stage():
    """The SPEC 8 violations a stage recorded are reported, each prefixed with its step and kind."""
    after = snap(violating(extend(), "seq_lens[0] 3 != prefix 0 + extend 2"), rows={0: [1, 2, 3]},
                 free=[4, 5, 6, 7, 8], requests={"r0": view(0, held=(1, 2, 3))})
    assert check_stage(scenario(), BEFORE, after) == ["step 0 extend: seq_lens[0] 3 != prefix 0 + extend 2"]


@pytest.mark.parametrize(("kind", "outcome", "expected"), [
    ("extend", "ok", ["step 0 extend: request r0 row 0 columns [2]: got [9], expected [3]"]),
    ("extend", "oom", []),  # a failed extend's rows are not read (SPEC 4)
    ("decode", "ok", []),  # a decode writes one column: the row check is the extend's
])
def test_check_stage_reads_the_row_only_after_an_ok_extend(kind, outcome, expected):
    """The row check (prefix then new slots) runs only on an extend that succeeded."""
    record = stage(kind, rids=("r0",), rows=(0,), prefix_values=((),), seq_lens=(3,), extend_lens=(3,),
                   out_cache_loc=(1, 2, 3), write_region=((0, 0, 3),), outcome=outcome)
    after = snap(record, rows={0: [1, 2, 9]}, free=[4, 5, 6, 7, 8], requests={"r0": view(0, held=(1, 2, 3))})
    assert check_stage(scenario(), BEFORE, after) == expected


@pytest.mark.parametrize(("kind", "outcome", "expected"), [
    ("decode", "ok", ["step 1 decode: pages of new slots still listed as free: [4]"]),
    ("decode", "oom", []),  # a failed decode handed out nothing
    ("decode_retract", "ok", []),
])
def test_check_stage_checks_new_slots_after_an_ok_extend_or_decode(kind, outcome, expected):
    """Fresh new slots are required of an extend or a decode that succeeded, of no other stage."""
    record = stage(kind, 1, rids=("r0",), rows=(0,), seq_lens=(4,), out_cache_loc=(4,), outcome=outcome)
    after = snap(record, rows={0: [1, 2, 3]}, free=[4, 5, 6, 7, 8], requests={"r0": view(0, held=(1, 2, 3))})
    assert check_stage(scenario(), AFTER, after) == expected


def test_check_stage_checks_conservation_after_every_stage():
    """Every page free or held exactly once, after any stage (here an eviction that lost page 8)."""
    assert check_stage(scenario(), AFTER, snap(stage("evict", 2), rows={0: [1, 2, 3]}, free=[4, 5, 6, 7, 8],
                                               requests=AFTER.requests)) == []
    lost = snap(stage("evict", 2), rows={0: [1, 2, 3]}, free=[4, 5, 6, 7], requests=AFTER.requests)
    assert check_stage(scenario(), AFTER, lost) == ["step 2 evict: 4 free + 3 held pages != 8 (leak or double count)"]


def test_a_window_models_decode_that_ran_out_keeps_its_full_page_as_a_named_hazard_not_a_leak():
    """SGLang's window allocator takes the full page before it finds no window page, and keeps it
    when the decode fails (the server stops there). After such a decode, one page per request that
    was free and is now neither free nor held is the failed decode's; with no window, or after a
    decode that succeeded, the same page is a leak."""
    window = WindowState(slots=3, page_size=1, mapped=((1, 1), (2, 2), (3, 3)), free=(), available_size=0)
    failed = out_of_memory("decode", step=1, seq_lens=(4,), extend_lens=())
    kept = snap(failed, rows={0: [1, 2, 3]}, free=[5, 6, 7, 8], requests=AFTER.requests, window=window)
    assert check_stage(scenario(), changed(AFTER, window=window), kept) == []
    assert pages_a_failed_decode_kept(scenario().geometry, changed(AFTER, window=window), kept) == {4}
    leak = "4 free + 3 held pages != 8 (leak or double count)"
    assert check_stage(scenario(), AFTER, changed(kept, window=None)) == [f"step 1 decode: {leak}"]
    two = snap(failed, rows={0: [1, 2, 3]}, free=[6, 7, 8], requests=AFTER.requests, window=window)
    assert check_stage(scenario(), changed(AFTER, window=window), two) == [
        "step 1 decode: 3 free + 3 held pages != 8 (leak or double count)"]  # one request asks for one page


# ---- rows_hold_prefix_then_new_slots -----------------------------------------------------------
# r0 (row 0) keeps its prefix [7] and gets 2 new slots, r1 (row 1) gets 2 from an empty prefix:
# out_cache_loc is r0's share then r1's.
TWO = stage("extend", rids=("r0", "r1"), rows=(0, 1), prefix_values=((7,), ()), seq_lens=(3, 2),
            extend_lens=(2, 2), out_cache_loc=(1, 2, 3, 4))


def test_rows_hold_their_prefix_then_their_share_of_out_cache_loc():
    """Row i, columns [0, seq_len): request i's prefix, then its extend_lens[i] slots of out_cache_loc in order."""
    assert rows_hold_prefix_then_new_slots(snap(TWO, rows={0: [7, 1, 2], 1: [3, 4]})) == []
    # Row 1 got its share in the wrong order; row 0 is right.
    assert rows_hold_prefix_then_new_slots(snap(TWO, rows={0: [7, 1, 2], 1: [4, 3]})) == [
        "request r1 row 1 columns [0, 1]: got [4, 3], expected [3, 4]"]


def test_rows_hold_prefix_says_when_out_cache_loc_and_extend_lens_disagree():
    """out_cache_loc holds exactly sum(extend_lens) slots."""
    longer = stage("extend", rids=("r0", "r1"), rows=(0, 1), prefix_values=((7,), ()), seq_lens=(3, 2),
                   extend_lens=(2, 2), out_cache_loc=(1, 2, 3, 4, 5))
    assert rows_hold_prefix_then_new_slots(snap(longer, rows={0: [7, 1, 2], 1: [3, 4]})) == [
        "out_cache_loc has 5 slots, extend_lens sum to 4"]


# ---- extend_lens_positive ----------------------------------------------------------------------
def test_every_scheduled_request_extends_by_at_least_one_token():
    """A request in an extend batch has extend_input_len >= 1."""
    assert extend_lens_positive(snap(stage("extend", rids=("r0", "r1"), extend_lens=(1, 2)))) == []
    assert extend_lens_positive(snap(stage("extend", rids=("r0", "r1"), extend_lens=(1, 0)))) == [
        "request r1 scheduled with extend_input_len 0"]


# ---- last_loc_matches_prefix -------------------------------------------------------------------
def paged(prefixes: tuple[tuple[int, ...], ...], last_loc: tuple[int, ...] | None):
    return snap(stage("extend", rids=tuple(f"r{i}" for i in range(len(prefixes))), prefix_values=prefixes,
                      last_loc=last_loc))


@pytest.mark.parametrize(("prefixes", "last_loc", "expected"), [
    (((4, 5, 6), ()), (6, -1), []),  # the prefix's last slot; -1 for an empty prefix
    (((4, 5, 6),), (5,), ["request r0: last_loc 5, prefix of 3 ends with 6"]),  # not its last slot
    (((),), (0,), ["request r0: last_loc 0, prefix of 0 ends with -1"]),  # an empty prefix has none
    # Its last slot, but slot 7 sits at offset 1 of page 3 while 3 tokens end at offset 0 of a page.
    (((4, 5, 7),), (7,), ["request r0: last_loc 7, prefix of 3 ends with 7"]),
])
def test_last_loc_is_the_prefixs_last_slot_at_the_prefixs_page_offset(prefixes, last_loc, expected):
    """Paged: last_loc is the prefix's last slot (-1 for none) and (last_loc + 1) % page == len(prefix) % page."""
    assert last_loc_matches_prefix(scenario(page_size=2), paged(prefixes, last_loc)) == expected


@pytest.mark.parametrize(("page_size", "last_loc"), [(1, (5,)), (2, None)])
def test_last_loc_is_not_checked_unpaged_or_when_absent(page_size, last_loc):
    """Page size 1 uses no last_loc, and a stage without one has nothing to check."""
    assert last_loc_matches_prefix(scenario(page_size=page_size), paged(((4, 5, 6),), last_loc)) == []


# ---- logprob_start_respected -------------------------------------------------------------------
@pytest.mark.parametrize(("observation", "expected"), [
    (logprob(5, 3, 3), []),  # the cache supplies up to the start
    (logprob(5, 3, 4), ["cache matched 4 tokens past logprob_start_len 3"]),
    (logprob(-1, -1, 0), []),  # start -1 (the server default) counts as 0: the cache supplies nothing
    (logprob(-1, -1, 1), ["cache matched 1 tokens past logprob_start_len -1"]),
    (note("radix hit"), []),  # other observations say nothing of logprobs
])
def test_with_logprobs_the_cache_stops_at_the_logprob_start(observation, expected):
    """With logprobs on, the cache supplies at most max(logprob_start_len, 0) tokens."""
    assert logprob_start_respected(snap(observed(extend(), observation))) == expected


# ---- cached_row_names_prefix / stale_row_defects: the cases test_oracles_units leaves ------------
def test_a_stale_row_of_a_request_that_keeps_running_matters():
    """The stale-row defect on a request still running (not chunked) is reported as one that matters."""
    running = {"r0": view(0, prefix=(1, 2, 3, 4), status="running")}
    stale = snap(cache_unfinished((1, 6)), rows={0: [1, 6, 3, 4]}, free=[6], requests=running)
    assert stale_row_defects(scenario(), stale) == [
        "request r0 row 0 columns [1] name freed slots [6] (stale: it keeps running on this row)"]


def test_a_stale_cell_whose_page_is_not_free_is_a_violation():
    """The defect excuses only cells naming a freed page: a wrong cell before the old prefix length
    whose page is held is a violation."""
    chunked = {"r0": view(0, prefix=(1, 2, 3, 4), status="chunked")}
    wrong = snap(cache_unfinished((1, 6)), rows={0: [1, 6, 3, 4]}, requests=chunked)
    assert stale_row_defects(scenario(), wrong) == []
    assert cached_row_names_prefix(scenario(), wrong) == ["cached r0: row 0 columns [1] hold [6], its prefix is [2]"]


@pytest.mark.parametrize(("finished", "expected"), [
    ((), ["cached r0: row 0 columns [3] hold [9], its prefix is [4]"]),  # it keeps running: cached unfinished
    (("r0",), []),  # it finished: cache_finished_req, whose row is freed, not repointed
])
def test_a_prefill_result_caches_only_the_requests_that_did_not_finish(finished, expected):
    """After a prefill, the rows of requests that did not finish hold their new prefix."""
    record = stage("prefill_result", 1, rids=("r0",), rows=(0,), prefix_values=((1, 2),), finished=finished)
    after = snap(record, rows={0: [1, 2, 3, 9]}, free=[9], requests={"r0": view(0, prefix=(1, 2, 3, 4))})
    assert cached_row_names_prefix(scenario(), after) == expected
    # The same row, right: no violation either way.
    assert cached_row_names_prefix(scenario(), with_cells(after, {(0, 3): 4})) == []
