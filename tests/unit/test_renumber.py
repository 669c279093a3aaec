"""Comparison up to renumbering (``parity.renumber``), on hand-built snapshots: a permutation of
free pages is "renumbered", a map that contradicts itself later is "divergent" (saying which map
and where), and a difference in anything that is no number is "divergent" too."""

from __future__ import annotations

import torch

from parity.poison import POISON
from parity.renumber import DIVERGENT, EXACT, RENUMBERED, renumbering_verdict
from parity.scheduler import StageRecord
from parity.snapshot import RequestView, Snapshot


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
