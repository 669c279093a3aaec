"""What the comparison of two worlds (``kvparity.judge.compare``) and the comparison up to renumbering
(``kvparity.judge.renumber``) excuse, and nothing more, on hand-built snapshots (``judge_cases``).

Each excuse has a case it excuses and a near miss it does not: the prefix's type across versions,
what a failed allocation leaves, legacy's chunk-cache alias, the known differences of real
releases, and the renumberings of rows and pages. The difference lines are written out in full,
so a reader sees what a report would say. ``test_renumber.py`` has the renumbering of whole runs;
here are its rules one by one."""

from __future__ import annotations

import pytest

from kvparity.judge.compare import ALIAS_DEFECT, ALLOWED, compare
from kvparity.judge.renumber import Bijection, Mismatch, Renumbering, renumbering_verdict

from judge_cases import (
    LEGACY_TORCH,
    LEGACY_TRITON,
    POISON,
    REFACTORED_TORCH,
    changed,
    extend,
    out_of_memory,
    release_world,
    snap,
    view,
    with_cells,
    with_request,
)


def lines(ref_name, ref, name, got) -> list[str]:
    return [d.line() for d in compare(ref_name, ref, name, got)]


# r0 extended into row 0 with slots 1, 2, 3; r1 waits.
REF = snap(extend(), rows={0: [1, 2, 3]}, free=[4, 5],
           requests={"r0": view(0, held=(1, 2, 3)), "r1": view(None, status="waiting")})


# ---- exact comparison: everything SPEC 7 lists ---------------------------------------------------
def test_the_same_stage_in_two_worlds_has_no_difference():
    """Two snapshots equal in every field SPEC 7 lists compare equal."""
    assert compare(LEGACY_TORCH, REF, LEGACY_TRITON, changed(REF)) == []


def test_a_different_stage_is_the_only_difference_reported():
    """Stages that differ in kind, requests or outcome are one difference; nothing else is compared."""
    other = changed(with_cells(REF, {(0, 0): 9}), record=extend(rids=("r1",)))
    assert lines(LEGACY_TORCH, REF, LEGACY_TRITON, other) == [
        "legacy/triton vs legacy/torch: stage: \"step 0 extend ['r1']\" != \"step 0 extend ['r0']\""]


@pytest.mark.parametrize(("got", "expected"), [
    (changed(REF, record=extend(rows=(1,))), "rows: (1,) != (0,)"),
    (changed(REF, record=extend(out_cache_loc=(1, 2, 4))), "out_cache_loc: (1, 2, 4) != (1, 2, 3)"),
    (changed(REF, record=extend(last_loc=(3,))), "last_loc: (3,) != None"),
    (with_cells(REF, {(1, 5): 7}), "req_to_token: 1 cells differ"),
    (changed(REF, free_pages=REF.free_pages.flip(0)), "allocator free_pages: [5, 4] (torch.int64) != [4, 5] (torch.int64)"),
    (changed(REF, free_pages=REF.free_pages.int()), "allocator free_pages: [4, 5] (torch.int32) != [4, 5] (torch.int64)"),
    (changed(REF, release_pages=REF.free_pages), "allocator release_pages: [4, 5] (torch.int64) != [] (torch.int64)"),
    (changed(REF, available_size=3), "available_size: 3 != 2"),
    (changed(REF, free_rows=(1,)), "free_rows: (1,) != ()"),
    (changed(REF, tree=((None, (5,), (1,), 0),)), "tree: ((None, (5,), (1,), 0),) != ()"),
    (with_request(REF, "r0", cached_tokens=1), "request r0 cached_tokens: 1 != 0"),
    (with_request(REF, "r1", fill_ids=()), "request r1 fill_ids: () != (5, 6, 7)"),
])
def test_every_field_spec_7_lists_must_be_equal(got, expected):
    """Any one field that differs is one difference, named by the field, got != reference."""
    assert lines(LEGACY_TORCH, REF, LEGACY_TRITON, got) == [f"legacy/triton vs legacy/torch: {expected}"]


def test_a_table_difference_lists_its_cells_and_a_dtype_difference_is_one_unreadable_cell():
    """Differing cells are listed as (row, column, reference, got); a table of another dtype or
    shape cannot be read cell by cell: one cell (-1, -1, -1, -1)."""
    assert compare(LEGACY_TORCH, REF, LEGACY_TRITON, with_cells(REF, {(1, 5): 7}))[0].cells == [(1, 5, POISON, 7)]
    assert compare(LEGACY_TORCH, REF, LEGACY_TRITON, changed(REF, req_to_token=REF.req_to_token.long()))[0].cells == [
        (-1, -1, -1, -1)]


def test_allowed_names_the_four_excuses():
    """ALLOWED is the whole list of what SPEC 7 excuses (goldens name their excuses by these keys)."""
    assert set(ALLOWED) == {"prefix type", "adjust_max_prefix_ids", "after allocation failure", ALIAS_DEFECT}


# ---- ALLOWED "prefix type" -------------------------------------------------------------------------
LIST_PREFIX = with_request(REF, "r0", prefix_kind="list")


def test_the_prefix_type_may_differ_between_versions():
    """Legacy's [] against refactored's empty tensor: excused across versions."""
    assert compare(LEGACY_TORCH, LIST_PREFIX, REFACTORED_TORCH, REF) == []


def test_the_prefix_type_must_match_within_a_version():
    """The same version on another backend: even the prefix's type must match."""
    assert lines(LEGACY_TORCH, LIST_PREFIX, LEGACY_TRITON, REF) == [
        "legacy/triton vs legacy/torch: request r0 prefix type: torch.int64 cpu tensor != list"]


# ---- ALLOWED "after allocation failure" ------------------------------------------------------------
# r0's extend ran out of memory: legacy had already written its prefix into row 0 (the cells of
# the failed batch's region) and taken the row; refactored had not.
LEGACY_FAILED = snap(out_of_memory(write_region=((0, 0, 3),)), rows={0: [1, 2, 3]}, free=[4, 5],
                     requests={"r0": view(0), "r1": view(None, status="waiting")})
REFACTORED_FAILED = snap(out_of_memory(), free=[4, 5],
                         requests={"r0": view(None, status="waiting"), "r1": view(None, status="waiting")})


def test_after_a_failed_allocation_the_batchs_cells_and_requests_may_differ_between_versions():
    """Across versions, a failed stage's write region and its requests' fields are excused."""
    assert compare(LEGACY_TORCH, LEGACY_FAILED, REFACTORED_TORCH, REFACTORED_FAILED) == []


def test_after_a_failed_allocation_cells_of_either_worlds_region_are_excused():
    """The excused cells are those either world's failed batch may have written."""
    other = changed(with_cells(REFACTORED_FAILED, {(1, 0): 7}), record=out_of_memory(write_region=((1, 0, 1),)))
    assert compare(LEGACY_TORCH, LEGACY_FAILED, REFACTORED_TORCH, other) == []


def test_after_a_failed_allocation_nothing_else_is_excused():
    """Cells outside the region and requests outside the failed batch must still be equal."""
    other = with_request(with_cells(REFACTORED_FAILED, {(1, 0): 7}), "r1", cached_tokens=2)
    diffs = compare(LEGACY_TORCH, LEGACY_FAILED, REFACTORED_TORCH, other)
    assert [d.line() for d in diffs] == ["refactored/torch vs legacy/torch: req_to_token: 1 cells differ",
                                         "refactored/torch vs legacy/torch: request r1 cached_tokens: 2 != 0"]
    assert diffs[0].cells == [(1, 0, POISON, 7)]


def test_after_a_failed_allocation_nothing_is_excused_within_a_version():
    """Two backends of one version must fail alike, cell for cell."""
    assert lines(LEGACY_TORCH, LEGACY_FAILED, LEGACY_TRITON, REFACTORED_FAILED) == [
        "legacy/triton vs legacy/torch: req_to_token: 3 cells differ",
        "legacy/triton vs legacy/torch: request r0 status: waiting != running",
        "legacy/triton vs legacy/torch: request r0 req_pool_idx: None != 0"]


def test_a_stage_that_succeeded_has_no_failure_excuse():
    """The excuse is for a failed stage only: the same cells after an ok stage differ."""
    ok_legacy = changed(LEGACY_FAILED, record=extend())
    ok_refactored = changed(REFACTORED_FAILED, record=extend())
    assert lines(LEGACY_TORCH, ok_legacy, REFACTORED_TORCH, ok_refactored) == [
        "refactored/torch vs legacy/torch: req_to_token: 3 cells differ",
        "refactored/torch vs legacy/torch: request r0 status: waiting != running",
        "refactored/torch vs legacy/torch: request r0 req_pool_idx: None != 0"]


# ---- ALLOWED "legacy chunk-cache alias" ------------------------------------------------------------
def aliased(alias_row, status="running"):
    """r0 on row 0 whose legacy prefix (7, 8) is a view of row ``alias_row``."""
    return with_request(REF, "r0", prefix_values=(7, 8), alias_row=alias_row, status=status)


REFACTORED_PREFIX = with_request(REF, "r0", prefix_values=(1, 2))
ALIAS_LINE = "refactored/torch vs legacy/torch: request r0 prefix_values: (1, 2) != (7, 8)"


@pytest.mark.parametrize(("legacy", "tag"), [
    (aliased(1), f" [known defect: {ALIAS_DEFECT}]"),  # a view of a row it moved away from
    (aliased(0, "finished"), f" [known defect: {ALIAS_DEFECT}]"),  # a view of its own row, freed
    (aliased(0), ""),  # a view of the row it still owns: its prefix is real
    (aliased(None), ""),  # no view at all
])
def test_legacys_prefix_may_differ_only_when_it_views_a_row_the_request_left(legacy, tag):
    """A prefix difference is the known alias defect when legacy's view points into a row its
    request no longer owns; otherwise a plain divergence."""
    got = with_request(REFACTORED_PREFIX, "r0", status=legacy.requests["r0"].status)
    assert lines(LEGACY_TORCH, legacy, REFACTORED_TORCH, got) == [ALIAS_LINE + tag]


def test_the_alias_defect_is_read_from_the_legacy_side_either_way():
    """Legacy as the compared world (not the reference) is recognised too."""
    assert lines(REFACTORED_TORCH, REFACTORED_PREFIX, LEGACY_TORCH, aliased(1)) == [
        f"legacy/torch vs refactored/torch: request r0 prefix_values: (7, 8) != (1, 2) [known defect: {ALIAS_DEFECT}]"]


def test_the_alias_defect_is_not_excused_within_a_version():
    """Two backends of legacy both alias alike: a prefix difference between them is a divergence."""
    assert lines(LEGACY_TORCH, aliased(1), LEGACY_TRITON, REFACTORED_PREFIX) == [
        "legacy/triton vs legacy/torch: request r0 prefix_values: (1, 2) != (7, 8)"]


# ---- known differences of real releases ------------------------------------------------------------
RETRACTED = with_request(REF, "r1", req_pool_idx=None)
KEEPS_ROW = with_request(REF, "r1", req_pool_idx=1)
KEEPS_ROW_LINE = "request r1 req_pool_idx: 1 != None"


@pytest.mark.parametrize(("ref_release", "release", "tag"), [
    ("0.5.3", "0.5.4", " [known defect: 0.5.4 keeps req_pool_idx after retract]"),  # 0.5.4 made the change
    ("0.5.4", "0.5.5", ""),  # both after the change: it explains nothing between them
    ("0.5.2", "0.5.3", ""),  # both before it
])
def test_a_retracted_request_keeps_its_row_index_from_0_5_4_on(ref_release, release, tag):
    """A waiting request's req_pool_idx set on one side only is 0.5.4's change when exactly one
    of the two releases is 0.5.4 or later."""
    assert lines(release_world(ref_release), RETRACTED, release_world(release), KEEPS_ROW) == [
        f"sglang-{release}/torch vs sglang-{ref_release}/torch: {KEEPS_ROW_LINE}{tag}"]


def test_the_kept_row_index_is_excused_only_for_a_waiting_request_between_real_releases():
    """A running request's row index, two indices both set, or a modelled world: plain divergences."""
    running = with_request(REF, "r0", req_pool_idx=None)
    old, new = release_world("0.5.3"), release_world("0.5.4")
    assert lines(old, running, new, REF) == ["sglang-0.5.4/torch vs sglang-0.5.3/torch: request r0 req_pool_idx: 0 != None"]
    assert lines(old, with_request(REF, "r1", req_pool_idx=0), new, KEEPS_ROW) == [
        "sglang-0.5.4/torch vs sglang-0.5.3/torch: request r1 req_pool_idx: 1 != 0"]
    assert lines(LEGACY_TORCH, RETRACTED, new, KEEPS_ROW) == [f"sglang-0.5.4/torch vs legacy/torch: {KEEPS_ROW_LINE}"]


SWAPPED = changed(REF, free_pages=REF.free_pages.flip(0))


@pytest.mark.parametrize(("got", "release", "tag"), [
    (SWAPPED, "0.5.3.post2", " [known defect: 0.5.3.post2 frees the paged tail last]"),  # same pages, another order
    (SWAPPED, "0.5.4", " [known defect: 0.5.3.post2 frees the paged tail last]"),  # any release after it too
    (SWAPPED, "0.5.3.post1", ""),  # both before the change
    (changed(REF, free_pages=REF.free_pages + 1), "0.5.3.post2", ""),  # other pages: no reordering explains it
])
def test_the_paged_tail_freed_last_reorders_the_free_list_from_0_5_3_post2_on(got, release, tag):
    """A free list that differs only in order is 0.5.3.post2's change when exactly one of the two
    releases has it."""
    detail = f"{got.free_pages.tolist()} (torch.int64) != [4, 5] (torch.int64)"
    assert lines(release_world("0.5.3"), REF, release_world(release), got) == [
        f"sglang-{release}/torch vs sglang-0.5.3/torch: allocator free_pages: {detail}{tag}"]


# ---- renumbering: the bijections ------------------------------------------------------------------
def test_a_bijection_keeps_its_pairs():
    """A pair once made holds both ways: the same pair again is fine, another partner for either side is not."""
    rows = Bijection("row")
    rows.pair(0, 1, "here")
    rows.pair(0, 1, "again")
    with pytest.raises(Mismatch, match=r"^row map: later: reference 0 is 2 here, but was 1 before$"):
        rows.pair(0, 2, "later")
    with pytest.raises(Mismatch, match=r"^row map: later: 1 stands for reference 3 here, but for 0 before$"):
        rows.pair(3, 1, "later")


def test_sets_are_equal_under_the_map_with_as_many_unpaired_members():
    """Mapped members must map onto each other; unmapped ones must be as many on both sides."""
    pages = Bijection("page")
    pages.pair(1, 3, "w")
    pages.same_set([1, 5], [3, 6], "w")  # 5 and 6 may still pair
    with pytest.raises(Mismatch, match=r"^page sets differ: w: reference-only \[1\], other-only \(as reference\) \[\]$"):
        pages.same_set([1, 5], [6, 7], "w")
    with pytest.raises(Mismatch, match=r"^page sets differ: w: 1 unpaired in the reference, 2 here$"):
        pages.same_set([1, 5], [3, 6, 7], "w")


@pytest.mark.parametrize(("free_ref", "free_got", "repairs"), [
    ([1], [3], True),  # free on both sides: nobody holds it, it may be handed out anew
    ([1], [4], False),  # free on one side only: the pair stands
])
def test_a_pair_is_forgotten_once_both_sides_are_free(free_ref, free_got, repairs):
    """A page (or row) free in both runs may pair with another partner later."""
    pages = Bijection("page")
    pages.pair(1, 3, "w")
    pages.release(free_ref, free_got)
    if repairs:
        pages.pair(1, 4, "w")
    else:
        with pytest.raises(Mismatch, match="reference 1 is 4 here, but was 3 before"):
            pages.pair(1, 4, "w")


@pytest.mark.parametrize(("a", "b", "message"), [
    (POISON, POISON, None),
    (-1, -1, None),  # last_loc of an empty prefix
    (-1, 3, "slot map: w: reference -1, here 3"),
    (POISON, 3, f"slot map: w: reference {POISON}, here 3"),
    (5, 7, None),  # page 2 is page 3 (page size 2), both at offset 1
    (5, 6, "slot map: w: reference slot 5 is at offset 1 of its page, 6 at 0"),
])
def test_a_slot_maps_into_its_pages_partner_at_the_same_offset_and_no_number_is_not_renumbered(a, b, message):
    """Real slots map page to page keeping their offset; POISON and negatives must be equal as they are."""
    renumbering = Renumbering(page_size=2)
    if message is None:
        renumbering.slot(a, b, "w")
    else:
        with pytest.raises(Mismatch, match=f"^{message}$"):
            renumbering.slot(a, b, "w")


# ---- renumbering: a stage under the maps ------------------------------------------------------------
# r0 extended into row 0 with slots 1, 2 in the reference, 3, 4 here: one renumbering of pages.
def extended(slots, *, step=0, **request):
    record = extend(slots, region=((0, 0, 2),), step=step)
    r0 = view(0, fill_ids=(5, 6), slotted=2, **request)
    return snap(record, rows={0: list(slots)}, free=[s for s in (1, 2, 3, 4) if s not in slots], free_rows=(1,),
                requests={"r0": r0})


A, B = extended((1, 2)), extended((3, 4))


def detail(ref, got, page_size=1) -> str | None:
    """Which map failed where, or None when one renumbering explains the stage."""
    return renumbering_verdict([ref], [got], page_size, exact=False).detail


def test_a_stage_renumbered_consistently_is_explained():
    """Other slots everywhere (record, table, free list) under one page map: renumbered."""
    verdict = renumbering_verdict([A], [B], 1, exact=False)
    assert (verdict.verdict, verdict.pages, verdict.rows) == ("renumbered", {1: 3, 2: 4}, {0: 0})


@pytest.mark.parametrize(("got", "expected"), [
    (changed(B, record=extend((3, 4), region=((0, 0, 2),), rids=("r1",))),
     "stage: \"step 0 extend ['r1']\" against the reference's \"step 0 extend ['r0']\""),
    (with_cells(B, {(0, 1): 3}), "page map: step 0 extend ['r0'], row 0 (here 0) (slots 2 and 3): reference 2 is "
                                 "3 here, but was 4 before"),
    (with_cells(B, {(1, 0): 4}), "step 0 extend ['r0']: row 1, used by no request in either run, differs"),
    (changed(B, available_size=1), "step 0 extend ['r0']: available_size 1 against 2"),
    (changed(B, free_rows=()), "row sets differ: step 0 extend ['r0'], free rows: 1 unpaired in the reference, 0 here"),
    (with_request(B, "r0", req_pool_idx=None), "step 0 extend ['r0']: request r0 row None against 0"),
    (with_request(B, "r0", output_len=1), "step 0 extend ['r0']: request r0 output_len 1 against 0"),
])
def test_a_stage_no_renumbering_explains_says_which_map_failed_where(got, expected):
    """Anything that is no number must be equal, and numbers must follow one map."""
    assert detail(A, got) == expected


@pytest.mark.parametrize(("status", "expected"), [
    ("finished", None),  # nobody reads a finished request's scratch fields
    ("running", "step 0 extend ['r0']: request r0 fill_ids (9,) against (5, 6)"),
])
def test_scratch_fields_of_a_finished_request_are_not_compared(status, expected):
    """fill_ids and other per-round scratch of a finished request are no state of the server."""
    ref, got = with_request(A, "r0", status=status), with_request(B, "r0", status=status, fill_ids=(9,))
    assert detail(ref, got) == expected


def test_a_waiting_request_holds_no_row_whatever_its_index_says():
    """0.5.4 keeps a retracted request's req_pool_idx: not compared, not paired, while it waits."""
    ref = with_request(A, "r0", status="waiting", req_pool_idx=None)
    assert detail(ref, with_request(B, "r0", status="waiting", req_pool_idx=1)) is None


@pytest.mark.parametrize(("alias_row", "expected"), [
    (1, None),  # a view of a row it left: legacy's alias (ALLOWED), whose values are no one's
    (0, "page map: step 0 extend ['r0'], request r0 prefix[0] (slots 1 and 4): reference 1 is 4 here, "
        "but was 3 before"),
])
def test_a_prefix_viewing_a_row_its_request_left_is_not_renumbered(alias_row, expected):
    """Legacy's aliased prefix is skipped; any other prefix must follow the page map."""
    ref = with_request(A, "r0", prefix_values=(1,))
    got = with_request(B, "r0", prefix_values=(4,), alias_row=alias_row)
    assert detail(ref, got) == expected


TREE_A = changed(A, tree=((None, (5, 6), (1, 2), 0),))


@pytest.mark.parametrize(("tree", "expected"), [
    (((None, (5, 6), (3, 4), 0),), None),  # the same node, its slots under the map
    ((), "step 0 extend ['r0']: the tree has 0 nodes against the reference's 1"),
    (((None, (5, 6), (3, 4), 1),), "step 0 extend ['r0']: tree node (5, 6) (extra key None) is locked 1 against locked 0"),
    (((None, (5, 7), (3, 4), 0),), "step 0 extend ['r0']: tree node (5, 6) (extra key None) is None against locked 0"),
    (((None, (5, 6), (4, 3), 0),), "page map: step 0 extend ['r0'], tree node of 2 tokens[0] (slots 1 and 4): "
                                   "reference 1 is 4 here, but was 3 before"),
])
def test_the_tree_has_the_same_nodes_and_locks_with_its_slots_under_the_map(tree, expected):
    """Tree nodes match by token path and lock count; their slots follow the page map."""
    assert detail(TREE_A, changed(B, tree=tree)) == expected


def test_runs_of_different_lengths_are_divergent():
    """No renumbering explains a run with another number of stages."""
    assert renumbering_verdict([A, A], [B], 1, exact=False).detail == "stages: 0 against the reference's 1"
