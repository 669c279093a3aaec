"""The one differ (``kvparity.judge.differ``), on hand-computed cells: equal data renders nothing, and
differing cells group into runs of consecutive columns, named the way each report reads them."""

from __future__ import annotations

import torch

from kvparity.judge import differ
from kvparity.model.poison import POISON


def test_equal_data_renders_nothing() -> None:
    row = [7, 8, POISON]
    assert differ.runs(row, list(row)) == []
    assert differ.list_diff("row 0", "column", row, list(row)) == []
    assert differ.row_runs([]) == []
    assert differ.tensor_cells(torch.tensor([[1, 2]]), torch.tensor([[1, 2]])) == []


def test_differing_cells_render_as_runs_of_columns() -> None:
    # Row 0 differs at columns 2, 3 and 5 (two runs), row 1 at column 0; given out of order.
    cells = [(1, 0, 9, 8), (0, 3, 4, 7), (0, 5, 6, POISON), (0, 2, 3, 6)]
    assert differ.row_runs(cells) == [(0, "2-3", [3, 4], [6, 7]), (0, "5", [6], [POISON]), (1, "0", [9], [8])]
    # expected [1 2 3 4 5 6], got [1 2 6 7 5]: columns 2-3 differ, 4 is equal, 5 is missing.
    assert differ.list_diff("row 0", "column", [1, 2, 3, 4, 5, 6], [1, 2, 6, 7, 5]) == [
        "row 0: columns 2-3 expected [3, 4] got [6, 7]",
        "row 0: column 5 expected [6] got []",
        "row 0: expected 6 values, got 5",
    ]
    notes = {POISON: "POISON: never written"}
    assert differ.cell_text((0, 5, 6, POISON), table=True, notes=notes) == (
        f"row 0, col 5: expected 6, got {POISON} (POISON: never written)"
    )
    assert differ.cell_text((0, 2, 3, 6), table=False, notes=notes) == "index 2: expected 3, got 6"
    assert differ.tensor_cells(torch.tensor([[1, 2], [3, 4]]), torch.tensor([[1, 0], [3, 0]])) == [(0, 1), (1, 1)]
    assert differ.index_text((0, 1), 2, 0) == "(0, 1): got 2 expected 0"
    assert differ.short(list(range(10)), limit=3) == "0 1 2 ... (10)"
