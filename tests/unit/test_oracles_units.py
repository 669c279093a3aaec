"""The oracles (``kvparity.judge.oracles``) on hand-built snapshots: each passes on a stage that keeps its
rule and fails, with its exact message, on one that breaks it. The worlds never break these rules
in a passing run, so without these an oracle that stopped checking would go unnoticed."""

from __future__ import annotations

import torch

from kvparity.engine.scheduler import StageRecord
from kvparity.engine.snapshot import RequestView, Snapshot
from kvparity.judge.oracles import (
    cached_row_names_prefix,
    conservation,
    new_slots_fresh,
    stale_row_defects,
    untouched_cells,
)
from kvparity.model.poison import POISON
from kvparity.model.scenario import Scenario
from kvparity.model.worlds import Geometry


def scenario(page_size: int = 1, kv_slots: int = 8) -> Scenario:
    geometry = Geometry(pool_rows=2, max_context_len=6, kv_slots=kv_slots, page_size=page_size)
    return Scenario(geometry=geometry, cache_kind="radix", requests=(), steps=())


def view(row: int | None, held: tuple[int, ...] = (), prefix: tuple[int, ...] = (), status: str = "running") -> RequestView:
    return RequestView(status=status, fill_ids=(5, 6, 7), extend_input_len=1, req_pool_idx=row, cached_tokens=0,
                       already_computed=0, extend_logprob_start_len=0, last_matched_prefix_len=0, output_len=0,
                       prefix_values=prefix, prefix_kind="torch.int64 cpu tensor", alias_row=None, held=held)


def snap(record: StageRecord, rows: dict[int, list[int]] | None = None, free: list[int] = (), release: list[int] = (),
         requests: dict[str, RequestView] | None = None, tree_slots: tuple[int, ...] = ()) -> Snapshot:
    table = torch.full((2, 6), POISON, dtype=torch.int32)
    for row, cells in (rows or {}).items():
        table[row, : len(cells)] = torch.tensor(cells, dtype=torch.int32)
    return Snapshot(record=record, req_to_token=table, free_pages=torch.tensor(list(free), dtype=torch.int64),
                    release_pages=torch.tensor(list(release), dtype=torch.int64), available_size=len(free),
                    free_rows=(), tree=(), tree_slots=tuple(tree_slots), requests=requests or {})


START = StageRecord(step=-1, kind="start")


def extend(out: tuple[int, ...] = (1, 2, 3), region=((0, 0, 3),)) -> StageRecord:
    return StageRecord(step=0, kind="extend", rids=("r0",), rows=(0,), prefix_values=((),), seq_lens=(3,),
                       extend_lens=(3,), out_cache_loc=out, write_region=region)


def test_untouched_cells_allows_the_stage_region_only():
    before = snap(START)
    assert untouched_cells(before, snap(extend(), rows={0: [1, 2, 3]})) == []
    # Column 3 of row 0 and column 0 of row 1 are outside the region (0, 0, 3).
    after = snap(extend(), rows={0: [1, 2, 3, 9], 1: [4]})
    assert untouched_cells(before, after) == [
        f"2 cells outside the stage's rows/columns changed: (0, 3) {POISON} -> 9, (1, 0) {POISON} -> 4"]
    # A region reaching past the table, or naming a row it lacks, allows no other cell.
    wide = extend(region=((0, -2, 99), (7, 0, 6), (-1, 0, 6)))
    assert untouched_cells(before, snap(wide, rows={0: [1, 2, 3, 4, 5, 6], 1: [4]})) == [
        f"1 cells outside the stage's rows/columns changed: (1, 0) {POISON} -> 4"]


def test_conservation_counts_every_page_once():
    # Slot 0 is reserved: pages 1..8 are free, or held by the tree or by a request.
    held = {"r0": view(0, held=(1, 2))}
    assert conservation(scenario(kv_slots=8).geometry, snap(extend(), free=[3, 4, 5], release=[6, 7],
                                                   requests=held, tree_slots=(8,))) == []
    broken = snap(extend(), free=[3, 4, 3, 5], release=[2, 4], requests=held)
    assert conservation(scenario(kv_slots=8).geometry, broken) == [
        "pages free twice: [3, 4]", "pages both free and held: [2]",
        "4 free + 2 held pages != 8 (leak or double count)"]
    poisoned = snap(extend(), free=[3], requests={"r0": view(0, held=(POISON, 0, 2))})
    assert conservation(scenario().geometry, poisoned) == [f"held slots that are not real slots: [{POISON}, 0]"]


def test_conservation_counts_pages_not_slots():
    held = {"r0": view(0, held=(4, 5, 6))}  # pages 2 and 3 of page size 2
    assert conservation(scenario(page_size=2, kv_slots=8).geometry, snap(extend(), free=[1], requests=held, tree_slots=(8, 9))) == []
    assert conservation(scenario(page_size=2, kv_slots=8).geometry, snap(extend(), free=[3], requests=held)) == [
        "pages both free and held: [3]", "1 free + 2 held pages != 4 (leak or double count)"]


def test_new_slots_fresh_refuses_reused_duplicate_reserved_and_free_slots():
    before = snap(START, requests={"r1": view(1, held=(5,))})
    assert new_slots_fresh(scenario().geometry, before, snap(extend((1, 2, 3)), free=[4, 6])) == []
    after = snap(extend((2, 2, 0, 5, 7, 4)), free=[4], tree_slots=(7,))
    assert new_slots_fresh(scenario().geometry, before, after) == [
        "new slots handed out twice: [2]", "new slots below 1 (slot 0 is reserved): [0]",
        "new slots held by a request or by the tree: [5, 7]", "pages of new slots still listed as free: [4]"]


def cache_unfinished(prefix: tuple[int, ...]) -> StageRecord:
    return StageRecord(step=1, kind="cache_unfinished", rids=("r0",), rows=(0,), prefix_values=(prefix,))


def test_cached_row_holds_the_new_prefix_else_a_violation_or_the_stale_row_defect():
    tree_prefix = {"r0": view(0, prefix=(1, 2, 3, 4), status="chunked")}
    ok = snap(cache_unfinished((1, 2)), rows={0: [1, 2, 3, 4]}, requests=tree_prefix)
    assert cached_row_names_prefix(scenario(), ok) == [] and stale_row_defects(scenario(), ok) == []
    # Column 1 names freed slot 6 (before the old prefix length 2): the known defect, not a violation.
    stale = snap(cache_unfinished((1, 6)), rows={0: [1, 6, 3, 4]}, free=[6], requests=tree_prefix)
    assert cached_row_names_prefix(scenario(), stale) == []
    assert stale_row_defects(scenario(), stale) == [
        "request r0 row 0 columns [1] name freed slots [6] (harmless: its row is freed next)"]
    # Column 3 (past the old prefix) is wrong: a violation.
    wrong = snap(cache_unfinished((1, 2)), rows={0: [1, 2, 3, 9]}, free=[9], requests=tree_prefix)
    assert cached_row_names_prefix(scenario(), wrong) == ["cached r0: row 0 columns [3] hold [9], its prefix is [4]"]
    assert stale_row_defects(scenario(), wrong) == []
