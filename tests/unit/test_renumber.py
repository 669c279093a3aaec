"""Comparison up to renumbering (``kvparity.judge.renumber``), on hand-built snapshots: a permutation of
free pages is "renumbered", a map that contradicts itself later is "divergent" (saying which map
and where), and a difference in anything that is no number is "divergent" too."""

from __future__ import annotations

import dataclasses

import torch

from kvparity.engine.scheduler import StageRecord
from kvparity.engine.snapshot import RequestView, Snapshot
from kvparity.judge.renumber import DIVERGENT, EXACT, RENUMBERED, renumbering_verdict
from kvparity.model.poison import POISON


def view(row, prefix=(), fill=(5, 6), status="running") -> RequestView:
    return RequestView(status=status, fill_ids=tuple(fill), extend_input_len=len(fill) - len(prefix), req_pool_idx=row,
                       cached_tokens=0, already_computed=len(fill), extend_logprob_start_len=0,
                       last_matched_prefix_len=0, output_len=1, prefix_values=tuple(prefix),
                       prefix_kind="torch.int64 cpu tensor", alias_row=None, held=())


def snap(record, table_rows, free, free_rows, requests, kv_slots=4) -> Snapshot:
    table = torch.full((2, 4), POISON, dtype=torch.int32)
    for row, cells in table_rows.items():
        table[row, : len(cells)] = torch.tensor(cells, dtype=torch.int32)
    return Snapshot(record=record, req_to_token=table, free_pages=torch.tensor(free, dtype=torch.int64),
                    release_pages=torch.empty(0, dtype=torch.int64), available_size=len(free),
                    free_rows=tuple(free_rows), tree=(), tree_slots=(), requests=requests)


START = StageRecord(step=-1, kind="start")


def extend(out):
    return StageRecord(step=0, kind="extend", rids=("r0",), rows=(0,), prefix_values=((),), seq_lens=(2,),
                       extend_lens=(2,), out_cache_loc=tuple(out))


def decode(out, pos=2):
    return StageRecord(step=1, kind="decode", rids=("r0",), rows=(0,), seq_lens=(pos,), out_cache_loc=tuple(out))


def run(first_two, third, *, fill=(5, 6)):
    """Start (slots 1..4 free), an extend of r0 into row 0 with slots ``first_two``, a decode
    with slot ``third``."""
    waiting = {"r0": view(None, status="waiting", fill=())}
    a, b = first_two
    rest = [s for s in (1, 2, 3, 4) if s not in first_two]
    return [
        snap(START, {}, [1, 2, 3, 4], [0, 1], waiting),
        snap(extend(first_two), {0: [a, b]}, rest, [1], {"r0": view(0, fill=fill)}),
        snap(decode([third]), {0: [a, b, third]}, [s for s in rest if s != third], [1], {"r0": view(0, fill=fill)}),
    ]


def test_same_run_is_exact():
    assert renumbering_verdict(run((1, 2), 3), run((1, 2), 3), 1, exact=True).verdict == EXACT


def test_a_permutation_of_free_pages_is_renumbered():
    verdict = renumbering_verdict(run((1, 2), 3), run((3, 1), 4), 1, exact=False)
    assert verdict.verdict == RENUMBERED, verdict.detail
    assert verdict.pages == {1: 3, 2: 1, 3: 4}


def test_a_map_that_contradicts_itself_later_is_divergent():
    """Reference slot 3 would have to be slot 1, which already stands for reference slot 2."""
    verdict = renumbering_verdict(run((1, 2), 3), run((3, 1), 1), 1, exact=False)
    assert verdict.verdict == DIVERGENT
    assert "page map" in verdict.detail and "step 1 decode" in verdict.detail and "but for 2 before" in verdict.detail


def test_a_structural_difference_is_divergent():
    verdict = renumbering_verdict(run((1, 2), 3), run((3, 1), 4, fill=(5, 7)), 1, exact=False)
    assert verdict.verdict == DIVERGENT and "request r0 fill_ids" in verdict.detail


def test_paged_slots_keep_their_offset_in_the_page():
    """Page size 2: slots 2, 3 (page 1) may not become 3, 2 (offsets swapped within the page)."""
    swapped = renumbering_verdict(run((2, 3), 4), run((3, 2), 4), 2, exact=False)
    assert swapped.verdict == DIVERGENT and "offset" in swapped.detail and "step 0 extend" in swapped.detail


def taller(snapshots, row_shift=1):
    """The same run on a table with one more row in front (SGLang 0.5.11 reserves row 0): every
    row index one higher, the reserved row never written."""
    out = []
    for s in snapshots:
        table = torch.full((s.req_to_token.shape[0] + 1, s.req_to_token.shape[1]), POISON, dtype=torch.int32)
        table[row_shift:] = s.req_to_token
        requests = {rid: dataclasses.replace(v, req_pool_idx=None if v.req_pool_idx is None else v.req_pool_idx + row_shift)
                    for rid, v in s.requests.items()}
        record = dataclasses.replace(s.record, rows=tuple(r + row_shift for r in s.record.rows))
        out.append(dataclasses.replace(s, record=record, req_to_token=table, requests=requests,
                                       free_rows=tuple(r + row_shift for r in s.free_rows)))
    return out


def test_a_reserved_row_in_front_is_renumbered():
    verdict = renumbering_verdict(run((1, 2), 3), taller(run((1, 2), 3)), 1, exact=False)
    assert verdict.verdict == RENUMBERED, verdict.detail
    assert verdict.rows == {0: 1}


def test_an_extra_row_that_was_written_is_divergent():
    other = taller(run((1, 2), 3))
    other[-1].req_to_token[0, 0] = 7  # the "reserved" row holds a slot
    verdict = renumbering_verdict(run((1, 2), 3), other, 1, exact=False)
    assert verdict.verdict == DIVERGENT and "more rows" in verdict.detail


def test_a_waiting_requests_scratch_fields_are_not_compared():
    """A waiting request's fill ids are recomputed at its next admission (0.5.15 empties them at
    a retraction, 0.5.14 keeps them): not a difference while it waits; once admitted, they are."""
    ref, got = run((1, 2), 3), run((1, 2), 3)
    got[0].requests["r0"] = dataclasses.replace(ref[0].requests["r0"], fill_ids=(9, 9, 9), extend_input_len=3)
    assert renumbering_verdict(ref, got, 1, exact=False).verdict != DIVERGENT
    got[1].requests["r0"] = view(0, fill=(9, 9))
    assert renumbering_verdict(ref, got, 1, exact=False).verdict == DIVERGENT


def test_a_freed_row_is_compared_as_far_as_its_owner_wrote():
    """r9 used row 1 (three columns) and finished; then r0 takes row 0 here and row 1 there (rows
    handed out in another order, as 0.5.18 does), so the other run's row keeps r9's third cell.
    Once r0 finished too, only r0's two columns are compared; a difference within them shows."""
    def stage(kind, rid, row):
        return StageRecord(step=1, kind=kind, rids=(rid,), rows=() if row is None else (row,))

    def req(rid, row, n, status="running"):
        return dataclasses.replace(view(row, fill=tuple(range(n)), status=status), slotted=n)

    def run(r0_row, r0_cells):
        other = 1 - r0_row
        waiting = {"r9": view(None, status="waiting", fill=()), "r0": view(None, status="waiting", fill=())}
        r9_done = req("r9", 1, 3, "finished")
        tables = [{}, {1: [5, 6, 7]}, {1: [5, 6, 7]}]
        r0_table = {1: [5, 6, 7]} | {r0_row: r0_cells + ([7] if r0_row == 1 else [])}
        return [
            snap(START, tables[0], [1, 2, 3, 4], [0, 1], waiting),
            snap(stage("extend", "r9", 1), tables[1], [1, 2, 3, 4], [0], {**waiting, "r9": req("r9", 1, 3)}),
            snap(stage("decode_finish", "r9", None), tables[2], [1, 2, 3, 4], [0, 1], {**waiting, "r9": r9_done}),
            snap(stage("extend", "r0", r0_row), r0_table, [3, 4], [other], {"r9": r9_done, "r0": req("r0", r0_row, 2)}),
            snap(stage("decode_finish", "r0", None), r0_table, [3, 4], [other, r0_row],
                 {"r9": r9_done, "r0": req("r0", r0_row, 2, "finished")}),
        ]

    verdict = renumbering_verdict(run(0, [1, 2]), run(1, [1, 2]), 1, exact=False)
    assert verdict.verdict == RENUMBERED, verdict.detail
    assert renumbering_verdict(run(0, [1, 2]), run(1, [1, 3]), 1, exact=False).verdict == DIVERGENT


def test_a_divergence_carries_the_kind_of_what_failed_as_data():
    """The release matrix counts ``what`` (a map, or a request's field), never reading the message."""
    assert renumbering_verdict(run((1, 2), 3), run((3, 1), 1), 1, exact=False).what == "page map"
    assert renumbering_verdict(run((1, 2), 3), run((3, 1), 4, fill=(5, 7)), 1, exact=False).what == "fill_ids"
    assert renumbering_verdict(run((1, 2), 3), run((3, 1), 4), 1, exact=False).what is None


# ---- snapshots once a scheduler iteration (``per_iteration``) ---------------------------------------
def _finish_and_reuse(slot):
    """r0 prefills into row 0 (slots 1, 2); in the next iteration it finishes (its slots freed)
    and r1's prefill, in row 1, is handed ``slot``: freed and handed out again between two
    snapshots when ``slot`` is 1."""
    waiting = {"r0": view(None, status="waiting", fill=()), "r1": view(None, status="waiting", fill=())}
    first = StageRecord(step=0, kind="extend", rids=("r0",), rows=(0,), seq_lens=(2,), extend_lens=(2,), out_cache_loc=(1, 2))
    second = StageRecord(step=1, kind="extend", rids=("r1",), rows=(1,), seq_lens=(1,), extend_lens=(1,), out_cache_loc=(slot,))
    done = view(None, status="finished", fill=())
    return [
        snap(START, {}, [1, 2, 3, 4], [0, 1], waiting),
        snap(first, {0: [1, 2]}, [3, 4], [1], {**waiting, "r0": view(0)}),
        snap(second, {0: [1, 2], 1: [slot]}, [s for s in (1, 2, 3, 4) if s != slot], [0],
             {"r0": done, "r1": view(1, fill=(7,))}),
    ]


def test_a_slot_freed_and_handed_out_again_within_an_iteration_may_pair_anew():
    """The reference hands r0's freed slot 1 straight to r1, the other run slot 3: never seen free
    on both sides, still a renumbering once the snapshots are an iteration apart."""
    ref, got = _finish_and_reuse(1), _finish_and_reuse(3)
    assert renumbering_verdict(ref, got, 1, exact=False).verdict == DIVERGENT  # stage by stage: a contradiction
    verdict = renumbering_verdict(ref, got, 1, exact=False, per_iteration=True)
    assert verdict.verdict == RENUMBERED, verdict.detail
    assert verdict.pages[1] == 3


def test_a_slot_handed_out_while_its_partner_is_still_held_is_divergent_per_iteration_too():
    """r0 runs on: the other run hands r1 slot 1, which r0 still holds (its partner, reference
    slot 1, is held too), where the reference hands slot 3."""
    ref, got = _finish_and_reuse(3), _finish_and_reuse(1)
    running = {"r0": view(0), "r1": view(1, fill=(7,))}
    ref[2] = snap(ref[2].record, {0: [1, 2], 1: [3]}, [4], [], running)
    got[2] = snap(got[2].record, {0: [1, 2], 1: [1]}, [4], [], running)
    verdict = renumbering_verdict(ref, got, 1, exact=False, per_iteration=True)
    assert verdict.verdict == DIVERGENT
    assert verdict.detail.endswith("1 stands for reference 3 here, but for 1 before"), verdict.detail
