"""The scenario classes of ``kvparity.model.classes``, one rule per test: a hand-built record (``judge_cases``)
that earns the class and a near miss that does not. Classes are read from what the reference world
did, so each case is a few stage records, and the expected classes are written out in full (or,
for a rule among a family of classes, the whole family: every class whose name starts alike)."""

from __future__ import annotations

import pytest

from kvparity.model.classes import classify

from judge_cases import batch, failed_otherwise, logprob, note, observed, out_of_memory, scenario, stage


def family(found: set[str], prefix: str) -> set[str]:
    """The classes of ``found`` whose names start with ``prefix``."""
    return {c for c in found if c.startswith(prefix)}


def test_every_run_has_its_page_size():
    """Even a run of no stages reaches "page size N"."""
    assert classify(scenario(page_size=4), []) == {"page size 4"}


@pytest.mark.parametrize(("prefix_lens", "expected"), [
    ([0, 0], "prefix: all empty"),
    ([2, 3], "prefix: every request"),
    ([0, 2], "prefix: mixed empty and non-empty"),
])
def test_an_extend_batch_is_classed_by_its_prefixes(prefix_lens, expected):
    """An ok extend batch: all prefixes empty, none empty, or some of each."""
    assert classify(scenario(), [batch(prefix_lens)]) == {"page size 1", "batch size 2-4", expected}


@pytest.mark.parametrize(("size", "expected"), [
    (1, "batch size 1"), (4, "batch size 2-4"), (5, "batch size 5-16"), (16, "batch size 5-16"),
    (17, "batch size 17-64"), (64, "batch size 17-64"), (65, "batch size over 64"),
])
def test_an_extend_batch_is_classed_by_its_size_at_the_bounds(size, expected):
    """Batch sizes 1, 2-4, 5-16, 17-64 and over 64, bounds included."""
    assert family(classify(scenario(), [batch([0] * size)]), "batch size") == {expected}


@pytest.mark.parametrize(("prefix_len", "seq_len", "expected"), [
    (513, 514, {"length: prefix crosses 512"}),
    (512, 513, set()),  # 512 does not cross
    (0, 513, {"length: extend crosses 512"}),
    (1, 513, set()),  # an extend of 512 tokens
])
def test_a_prefix_or_an_extend_of_more_than_512_tokens_crosses_512(prefix_len, seq_len, expected):
    """More than 512 prefix tokens, or more than 512 new ones, in one request of an extend."""
    assert family(classify(scenario(), [batch([prefix_len], [seq_len])]), "length:") == expected


# Page size 4: the prefix's last page ends at ceil(prefix / 4) * 4, the last full page at seq // 4 * 4.
@pytest.mark.parametrize(("prefix_len", "seq_len", "expected"), [
    (5, 8, {"paged: extend fits in the old partial page"}),  # page 1 holds tokens 4..7: 5, 6, 7 fill it
    (5, 9, {"paged: tail with no full page"}),  # it fills page 1 and spills into page 2, not filling it
    (4, 8, {"paged: extend of exactly one page"}),  # aligned, then one whole page
    (0, 4, {"paged: extend of exactly one page"}),
    (4, 6, {"paged: tail with no full page"}),  # aligned, then part of a page
    (4, 9, set()),  # a whole page and a tail: none of the three
    (5, 12, set()),  # fills page 1, then a whole page
])
def test_paged_extends_are_classed_by_where_they_end_against_page_bounds(prefix_len, seq_len, expected):
    """Page size > 1: an extend that stays in the prefix's partial page, is exactly one page from a
    page bound, or ends in a partial page without filling a new one."""
    assert family(classify(scenario(page_size=4), [batch([prefix_len], [seq_len])]), "paged:") == expected


def test_page_size_1_has_no_paged_classes():
    """With page size 1 every slot is a page: none of the paged classes (not even for one new slot, one "page")."""
    records = [batch([5], [8]), batch([4], [8]), batch([4], [6]), batch([4], [5])]
    assert family(classify(scenario(), records), "paged:") == set()


@pytest.mark.parametrize(("page_size", "rounds", "expected"), [
    (4, [(0, 5), (5, 9)], {"chunked: unaligned prefix tail (page > 1)"}),  # round 2 starts mid-page
    (4, [(5, 9)], set()),  # one round: its prefix is a radix hit, not a chunk
    (4, [(0, 4), (4, 8)], set()),  # round 2 starts on a page bound
    (1, [(0, 5), (5, 9)], set()),  # page size 1: no page to start in the middle of
])
def test_a_later_round_of_a_request_that_starts_mid_page_is_an_unaligned_chunk_tail(page_size, rounds, expected):
    """A request's second or later extend whose prefix length is no multiple of the page size."""
    records = [batch([pre], [seq], step=i) for i, (pre, seq) in enumerate(rounds)]
    assert family(classify(scenario(page_size=page_size), records), "chunked:") == expected


@pytest.mark.parametrize(("records", "expected"), [
    ([batch([0], [4], step=0), batch([4], [8], step=1), batch([8], [12], step=2)],
     {"chunked: two or more rounds"}),  # three extends: the prompt continued over two or more chunks
    ([batch([0], [4], step=0), batch([4], [8], step=1)], set()),  # two extends: one continuation only
    ([batch([0], [4], step=0), batch([4], [8], step=1), out_of_memory(), batch([0], [4], step=2, rids=("r1",))],
     set()),  # a failed extend is no round, nor another request's
])
def test_a_request_extended_three_times_ran_over_two_or_more_rounds(records, expected):
    """Three or more ok extends of one request."""
    assert family(classify(scenario(page_size=4), records), "chunked:") == expected


@pytest.mark.parametrize(("record", "expected"), [
    (out_of_memory("extend"), {"page size 1", "off-path: prefill out of memory"}),
    (out_of_memory("extend", of="rows"), {"page size 1"}),  # out of request rows, not of KV memory
    (out_of_memory("decode"), {"page size 1"}),  # a decode, not a prefill
    (failed_otherwise("extend"), {"page size 1"}),  # another error
])
def test_an_extend_out_of_kv_memory_is_off_the_servers_path(record, expected):
    """An extend that ran out of KV memory (SGLang's admission keeps a prefill from it: SPEC 6)."""
    assert classify(scenario(), [record]) == expected


@pytest.mark.parametrize(("name", "expected"), [
    ("radix hit", "radix: hit from a shared prompt prefix"),
    ("node split", "radix: node split"),
    ("exact repeat", "radix: exact repeat of a finished prompt"),
    ("re-admitted", "retract then re-admit"),
    ("row reuse by another request", "row reuse: freed chunked row taken by another request in the same batch"),
    ("radix hit on a running request", "radix: hit on a running request's prompt"),
    ("decode retract under memory pressure", "decode: retract under memory pressure"),
    ("merge before alloc_extend", "paged: merge before alloc_extend (need_sort)"),
    ("merge before alloc_decode", "paged: merge before alloc_decode (need_sort)"),
    ("paged finishes in one free group", "paged: several finishes in one decode free group"),
    ("extend evicted from the tree", "extend: allocation evicts from the tree"),
    ("decode replaced by the pending chunk", "decode while chunked: the chunk runs instead"),
])
def test_each_observation_reaches_its_class(name, expected):
    """A stage that observed it reaches the class, whatever the stage."""
    assert classify(scenario(), [observed(stage("skip"), note(name))]) == {"page size 1", expected}


@pytest.mark.parametrize("name", [
    "row reuse",  # a request taking back its own row: not "by another request"
    "merge before alloc",  # page size 1: not the paged allocator's need_sort merge
    "empty extend", "empty decode", "retract of a request not running", "evict without a radix cache",
])
def test_other_observations_reach_no_class(name):
    """Observations that are no situation worth reaching (or a near one) reach nothing."""
    assert classify(scenario(), [observed(stage("skip"), note(name))]) == {"page size 1"}


@pytest.mark.parametrize(("requested", "start", "matched", "expected"), [
    (-1, -1, 0, {"logprob: start -1 (server default)"}),
    (-1, 0, 0, {"logprob: start -1 (server default)"}),  # what was asked for decides, not what it became
    (0, 0, 0, {"logprob: start 0"}),
    (5, 3, 3, {"logprob: start inside the cached prefix"}),  # the start capped the match
    (5, 3, 2, {"logprob: start beyond the cached prefix"}),  # the cache ran out before the start
    (5, 3, 0, set()),  # nothing cached: neither
    (5, 3, 4, set()),  # matched past the start: a violation (the logprob oracle), no class
])
def test_a_logprob_admission_is_classed_by_its_start_against_the_match(requested, start, matched, expected):
    """Start -1 asked for, start 0, or a start the match reached exactly (inside) or fell short of (beyond)."""
    found = classify(scenario(), [observed(stage("skip"), logprob(requested, start, matched))])
    assert family(found, "logprob:") == expected
