"""The known differences 0.5.21 -> 0.5.22 (and 0.5.20's split at the prompt boundary), one rule per
test, on hand-built snapshots (``judge_cases``): each is a named finding between worlds on either side
of its release, and a divergence between any others (here 0.5.22 against 0.5.23)."""

from __future__ import annotations

import torch

from kvparity.judge.compare import (
    CHECKPOINT_SPLITS_AT_PROMPT,
    FINISH_REPOINTS_ROW,
    FINISH_SPLITS_AT_PROMPT,
    INT64_STAGED_FREES,
    RELEASED_HAS_NO_PREFIX,
    compare,
    per_token,
)
from kvparity.judge.renumber import RENUMBERED, renumbering_verdict

from judge_cases import changed, extend, release_world, snap, view

V21, V22, V23 = (release_world(r, "refactored") for r in ("0.5.21", "0.5.22", "0.5.23"))

# One prompt of 4 tokens, cached whole (0.5.21), or split at the prompt boundary after 2 (0.5.22).
WHOLE = ((None, (5, 6, 7, 8), (1, 2, 3, 4), 1),)
SPLIT = ((None, (5, 6), (1, 2), 1), (None, (5, 6, 7, 8), (3, 4), 1))


def _known(ref, a, world, b) -> list[str | None]:
    return [d.known_defect for d in compare(ref, a, world, b)]


def test_a_tree_compared_token_by_token_ignores_where_nodes_split():
    assert per_token(WHOLE) == per_token(SPLIT)
    assert per_token(WHOLE) != per_token(((None, (5, 6, 7, 8), (1, 2, 3, 9), 1),))  # a slot is no split


def test_a_split_at_the_prompt_boundary_is_0_5_22s_checkpoint_and_0_5_20s_finish():
    a, b = snap(extend(), tree=WHOLE), snap(extend(), tree=SPLIT)
    assert _known(V21, a, V22, b) == [CHECKPOINT_SPLITS_AT_PROMPT]
    assert _known(release_world("0.5.19", "refactored"), a, release_world("0.5.20", "refactored"), b) == [
        FINISH_SPLITS_AT_PROMPT]
    assert _known(V22, a, V23, b) == [None]  # no release between them splits otherwise


def test_other_tokens_in_the_tree_are_no_split():
    a, b = snap(extend(), tree=WHOLE), snap(extend(), tree=((None, (5, 6, 7, 8), (1, 2, 3, 9), 1),))
    assert _known(V21, a, V22, b) == [None]


def test_a_free_rows_stale_cell_repointed_onto_a_tree_slot_is_0_5_22s_finish():
    # Row 1 is free on both sides; 0.5.21 left the duplicate slot 7 there, 0.5.22 the tree's slot 3.
    a = snap(extend(), rows={1: [7]}, free_rows=(1,), tree_slots=(3,))
    b = snap(extend(), rows={1: [3]}, free_rows=(1,), tree_slots=(3,))
    assert _known(V21, a, V22, b) == [FINISH_REPOINTS_ROW]
    assert _known(V22, a, V23, b) == [None]


def test_a_live_cell_that_differs_is_no_repoint():
    live = {"r0": view(1, status="running", slotted=1)}
    a = snap(extend(), rows={1: [7]}, tree_slots=(3,), requests=live)
    b = snap(extend(), rows={1: [3]}, tree_slots=(3,), requests=live)
    assert _known(V21, a, V22, b) == [None]


def test_a_released_request_without_a_prefix_is_0_5_22s_model():
    had = {"r0": view(None, prefix=(1, 2), status="finished")}
    has_none = {"r0": view(None, prefix=(), status="finished", prefix_kind="ReleasedPrefix")}
    a, b = snap(extend(), requests=had), snap(extend(), requests=has_none)
    assert set(_known(V21, a, V22, b)) == {RELEASED_HAS_NO_PREFIX}
    assert set(_known(V22, a, V23, b)) == {None}


def test_the_same_staged_frees_as_int64_are_0_5_22s_tree_copy():
    a = snap(extend(), release=(4, 5))
    b = changed(a, release_pages=torch.tensor([4, 5], dtype=torch.int32))
    assert _known(V22, a, V21, b) == [INT64_STAGED_FREES]
    assert _known(V22, a, V23, b) == [None]


def test_the_renumbering_comparison_excuses_a_split_only_where_it_is_known():
    a, b = [snap(extend(), tree=WHOLE)], [snap(extend(), tree=SPLIT)]
    verdict = renumbering_verdict(a, b, 1, exact=False, known=frozenset({CHECKPOINT_SPLITS_AT_PROMPT}))
    assert (verdict.verdict, verdict.findings) == (RENUMBERED, {CHECKPOINT_SPLITS_AT_PROMPT})
    assert renumbering_verdict(a, b, 1, exact=False).verdict == "divergent"
