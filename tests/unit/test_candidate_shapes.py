"""Candidate batches reach production shapes (issue 12, "What a newcomer hit").

Each wrong fixture under ``tests/unit/candidates/shp_*.py`` is right on the batches kvparity drew
before: at most 6 requests (300 for get_last_loc), slots below about 3,200, page sizes 2 to 16.
Each must now be caught in the ci profile, within a short check (``EXAMPLES`` batches: the ci
shape plays every wide range, 257-300 and 513-560 requests, at least once per check). These tests
call ``check_candidate`` as it was before the change (no new arguments; the profile comes from
``HYPOTHESIS_PROFILE``), so that run against the old code they fail with a PARITY verdict.
"""

from __future__ import annotations

import json
import os

import pytest

from kvparity.candidate.check import check_candidate, judge
from kvparity.candidate.sandbox import Sandbox
from kvparity.kernels import runtime
from kvparity.model import profiles

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
EXAMPLES = 25
SUITE_PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "dev")  # conftest has loaded it
SHRINK = 1.0  # these tests need the verdict, not a minimal batch


def fixture(name: str, function: str) -> str:
    return os.path.join(HERE, "candidates", f"{name}.py") + f":{function}"


@pytest.fixture(scope="module")
def sandbox():
    with Sandbox(call_timeout=8.0) as box:
        yield box


@pytest.fixture(autouse=True)
def ci_profile(monkeypatch):
    """The profile a candidate check sizes its batches by (``kvparity.model.profiles.load`` sets it)."""
    monkeypatch.setenv("HYPOTHESIS_PROFILE", "ci")


def caught(target: str, spec: str, sandbox: Sandbox, shrink: float = SHRINK):
    result = check_candidate(target, spec, examples=EXAMPLES, sandbox=sandbox, shrink_seconds=shrink)
    assert result.verdict == "divergence", result.report()
    return result


# ------------------------------------------------------------------ bugs that need production shapes


def test_write_skipping_requests_from_index_257_is_caught(sandbox):
    result = caught("write_cache_indices", fixture("shp_wci_skip_from_257", "write_cache_indices"), sandbox)
    assert result.fault_kind == "wrong_result" and result.counterexample.bs > 257, result.report()
    assert {cell[0] for cell in result.fault.cells} <= set(result.counterexample.rows[257:])


def test_write_with_per_block_offsets_from_request_513_is_caught(sandbox):
    result = caught("write_cache_indices", fixture("shp_wci_offset_from_513", "write_cache_indices"), sandbox)
    assert result.fault_kind == "wrong_result" and result.counterexample.bs > 512, result.report()


def test_write_staging_slots_through_int16_is_caught(sandbox):
    result = caught("write_cache_indices", fixture("shp_wci_int16", "write_cache_indices"), sandbox)
    assert result.fault_kind == "wrong_result" and result.counterexample.largest_slot > 32767, result.report()


def test_get_last_loc_with_two_blocks_at_most_is_caught(sandbox):
    """Wrong from request 513 on (index 512 on): never drawn before, when 300 was the most."""
    result = caught("get_last_loc", fixture("shp_gll_two_blocks", "get_last_loc"), sandbox)
    assert result.fault_kind == "wrong_result" and result.counterexample.bs > 512, result.report()


def test_get_last_loc_wrong_from_index_257_is_caught(sandbox):
    """Caught before the change too (get_last_loc then drew 257-300 requests now and then); kept so
    that the 257-300 range stays played for get_last_loc."""
    result = caught("get_last_loc", fixture("shp_gll_from_257", "get_last_loc"), sandbox)
    assert result.counterexample.bs > 257, result.report()


def test_alloc_extend_wrong_only_for_page_sizes_of_32_and_more_is_caught(sandbox):
    result = caught("alloc_extend", fixture("shp_ae_big_pages", "alloc_extend"), sandbox)
    assert result.fault_kind == "wrong_result" and result.counterexample.page_size >= 32, result.report()


def test_alloc_extend_computing_slots_in_float32_is_caught(sandbox):
    result = caught("alloc_extend", fixture("shp_ae_float_slots", "alloc_extend"), sandbox)
    assert result.fault_kind == "wrong_result" and result.counterexample.largest_slot > 2**24, result.report()


# ------------------------------------------------------------------ return value, sibling imports


def test_write_cache_indices_returning_something_is_a_wrong_return(sandbox):
    result = caught("write_cache_indices", fixture("shp_wci_returns_table", "write_cache_indices"), sandbox)
    assert result.fault_kind == "wrong_return", result.report()
    assert "returns None" in result.fault.summary, result.report()


def test_candidate_imports_a_module_from_its_own_folder(sandbox):
    spec = os.path.join(HERE, "candidates", "sibling_pkg", "sibling_candidate.py") + ":write_cache_indices"
    result = check_candidate("write_cache_indices", spec, examples=5, sandbox=sandbox)
    assert result.verdict == "parity", result.report()


# ------------------------------------------------------------------ counterexamples


@pytest.mark.parametrize("name, requests", [("wci_one_block", 1), ("shp_wci_clipped_offsets", 2)])
def test_shrunk_counterexample_keeps_no_request_that_plays_no_part(name, requests, sandbox):
    """One long request is all ``wci_one_block`` needs (the check used to report four, with
    prefixes); a long request and one after it all that ``shp_wci_clipped_offsets`` needs
    (Hypothesis alone leaves four). No request and no prefix element of the report can go."""
    spec = fixture(name, "write_cache_indices")
    result = caught("write_cache_indices", spec, sandbox, shrink=20.0)
    batch, kind = result.counterexample, result.fault_kind
    assert batch.bs == requests and max(batch.extend_lens) > 512 and not any(batch.prefix_lens), result.report()
    from kvparity.candidate.inputs import contract_violations, without_prefix_elements, without_requests

    smaller = [without_requests(batch, {i}) for i in range(batch.bs)]
    smaller += [without_prefix_elements(batch, i, {j}) for i in range(batch.bs) for j in range(batch.prefix_lens[i])]
    for candidate in smaller:
        if contract_violations(candidate):
            continue
        fault = judge(sandbox.call("write_cache_indices", spec, candidate.to_dict()), candidate, runtime.DEVICE)
        assert fault is None or fault.kind != kind, candidate.describe()


def test_requests_and_prefix_elements_that_play_no_part_are_removed(sandbox):
    """The same planted bug on a batch built by hand: five requests with prefixes, where the long
    request and the one after it are all the fault needs."""
    from kvparity.candidate.check import remove_what_plays_no_part
    from kvparity.candidate.inputs import KernelBatch

    prefixes = ((1, 2), (3,), (), (4, 5, 6), ())
    extend = (2, 513, 3, 1, 2)
    seq_lens = tuple(len(p) + e for p, e in zip(prefixes, extend))
    out_cache_loc = tuple(range(100, 100 + sum(extend)))
    bloated = KernelBatch("write_cache_indices", (4, 0, 3, 1, 2), prefixes, seq_lens, 6, max(seq_lens) + 2,
                          out_cache_loc=out_cache_loc)
    spec = fixture("shp_wci_clipped_offsets", "write_cache_indices")
    batch, fault = remove_what_plays_no_part("write_cache_indices", spec, bloated, sandbox=sandbox)
    assert fault is not None and fault.kind == "wrong_result", batch.describe()
    assert batch.extend_lens == [513, 3] and batch.prefix_lens == [0, 0], batch.describe()
    assert batch.rows == (0, 3) and batch.width == 513 and batch.pool_rows == 4, batch.describe()
    assert batch.out_cache_loc == out_cache_loc[2:518], batch.describe()  # each request keeps its slots


def test_a_batch_is_made_smaller_by_the_sweeps_shrinker_big_cuts_first():
    """The candidate check's batches are shrunk by kvparity's one shrinker (``run.minimize``), with
    the batch's own candidates: the last half of the requests first, never the last request, each
    request keeping its slots; then prefix elements; the smallest table last."""
    from kvparity.candidate.inputs import KernelBatch, smaller_batches

    batch = KernelBatch("write_cache_indices", (0, 1, 2, 3), ((7, 8), (), (), ()), (3, 1, 1, 1), 4, 4,
                        out_cache_loc=(10, 11, 12, 13))
    smaller = list(smaller_batches(batch))
    assert smaller[0].rows == (0, 1) and smaller[0].out_cache_loc == (10, 11)
    assert all(b.bs >= 1 for b in smaller)
    assert any(b.bs == 4 and b.prefix_lens == [0, 0, 0, 0] for b in smaller)  # the whole prefix at once
    assert smaller[-1].width == 3  # the table cut to the longest row


def test_get_last_loc_report_names_the_cell_a_filler_came_from(sandbox):
    result = caught("get_last_loc", fixture("shp_gll_next_column", "get_last_loc"), sandbox)
    report = result.report()
    assert "cells outside any request's prefix hold 1,000,000 + their flat index" in report, report
    batch, (_, index, _, got) = result.counterexample, result.fault.cells[0]
    row, col = divmod(got - 1_000_000, batch.width)
    assert (row, col) == (batch.rows[index], batch.prefix_lens[index]), report
    assert f"(filler of row {row}, col {col}: it read that cell)" in report, report


# ------------------------------------------------------------------ what a report says it covered


def test_report_says_what_was_played_and_covered(sandbox):
    """The default count in the ci profile: every page size, a batch past 512 requests, slots at
    int32's top, and the counts explained."""
    spec = os.path.join(REPO, "examples", "alloc_extend_flat.py") + ":alloc_extend"
    result = check_candidate("alloc_extend", spec, sandbox=sandbox)
    report = result.report()
    assert result.verdict == "parity", report
    cover = result.coverage
    assert cover.page_sizes == {1, 2, 4, 8, 16, 32, 64, 128, 256}, report
    assert cover.largest_batch > 512 and cover.past_request_block >= 1 and cover.past_column_block >= 1, report
    assert cover.largest_slot > 2**31 - 64, report
    assert result.drawn == 200 and f"played {result.batches_run} distinct batches of 200 drawn" in report, report
    assert "3 of 257-300 requests, 3 of 513-560 requests" in report and "a repeat is not played again" in report
    assert "largest batch" in report and "longest row" in report and "block boundaries crossed" in report
    data = json.loads(json.dumps(result.to_dict()))
    assert data["profile"] == "ci" and data["coverage"]["page_sizes"] == sorted(cover.page_sizes)


def test_nightly_profile_reaches_8192_requests_and_the_cli_passes_the_profile(monkeypatch, capsys):
    from hypothesis import Phase, find, settings

    from kvparity.candidate import check as checker
    from kvparity.candidate.inputs import contract_violations, kernel_batches, kernel_shape
    from kvparity.cli import check as cli_check

    nightly = kernel_shape("nightly")
    assert nightly.largest_batch == 8192 and kernel_shape("ci").largest_batch < 1024
    labels = [stage.label for stage, _ in checker.stages_for(2000, nightly)]
    assert "of 8192 requests" in labels and checker.default_examples("nightly") == 2000
    quick = settings(max_examples=1, database=None, derandomize=True, phases=[Phase.generate])
    batch = find(kernel_batches("get_last_loc", nightly, (8192, 8192)), lambda b: True, settings=quick)
    assert batch.bs == 8192 and not contract_violations(batch)

    seen = {}

    def fake_check(target, spec, examples, seed, **kwargs):
        seen.update(kwargs, examples=examples)
        raise ValueError("stop here")

    monkeypatch.setattr(checker, "check_candidate", fake_check)
    from kvparity.cli.main import main

    argv = ["check", "--target", "get_last_loc", "--candidate", "examples/last_loc_blocks.py:get_last_loc",
            "--profile", "nightly"]
    try:
        assert main(argv) == 2
        with pytest.raises(SystemExit):
            main(["check", "--help"])
    finally:
        profiles.load(SUITE_PROFILE)  # kvparity check loaded its own
    assert seen == {"profile": "nightly", "examples": None}, seen
    help_text = " ".join(capsys.readouterr().out.split())
    assert f"with --candidate, batches to draw (default {cli_check.DEFAULT_CANDIDATE_EXAMPLES}, 2000 in the nightly" \
        in help_text, help_text
    assert "distinct batches were played of how many drawn" in help_text, help_text
    assert cli_check.DEFAULT_CANDIDATE_EXAMPLES == checker.DEFAULT_EXAMPLES == checker.default_examples("ci")
