"""Scenario classes: named kinds of situation a run reached, counted with ``hypothesis.event``.

A class is decided from what actually happened in the reference world (legacy on torch), not
from what the generator intended: a chunked request "continuing over two rounds" only counts
if it really did. ``REQUIRED`` lists what the CI profile must reach; nightly adds more.
"""

from __future__ import annotations

from kvparity.mem_cache.errors import Exhausted
from kvparity.model.profiles import PAGE_SIZES_CI
from kvparity.model.records import LogprobAdmission, Note, Observation, StageRecord
from kvparity.model.scenario import Scenario

# Production order (issue 25): decided from a world's snapshots by ``kvparity.judge.order``.
ORDER_ROWS_NOT_ASCENDING = "order: a batch's rows not ascending"
ORDER_PAGES_NOT_CONTIGUOUS = "order: a request's pages not contiguous"
ORDER_WRAPPED_FREE_LIST = "order: allocation from a free list that has wrapped"
ORDER_MIXED_FREE_TIMES = "order: a batch mixing rows freed at different times"
ORDER_CLASSES = (ORDER_ROWS_NOT_ASCENDING, ORDER_PAGES_NOT_CONTIGUOUS, ORDER_WRAPPED_FREE_LIST, ORDER_MIXED_FREE_TIMES)

REQUIRED = (
    "prefix: all empty",
    "prefix: mixed empty and non-empty",
    "prefix: every request",
    "chunked: two or more rounds",
    "chunked: unaligned prefix tail (page > 1)",
    "radix: hit from a shared prompt prefix",
    "radix: node split",
    "radix: exact repeat of a finished prompt",
    *(f"page size {ps}" for ps in PAGE_SIZES_CI),
    "length: prefix crosses 512",
    "length: extend crosses 512",
    "paged: extend fits in the old partial page",
    "paged: extend of exactly one page",
    "paged: tail with no full page",
    "batch size 1",
    "batch size 2-4",
    "batch size 5-16",
    "off-path: prefill out of memory",
    "logprob: start -1 (server default)",
    "logprob: start 0",
    "logprob: start inside the cached prefix",
    "logprob: start beyond the cached prefix",
    "retract then re-admit",
    "row reuse: freed chunked row taken by another request in the same batch",
    "radix: hit on a running request's prompt",
    "decode: retract under memory pressure",
    "paged: merge before alloc_extend (need_sort)",
    "paged: merge before alloc_decode (need_sort)",
    "paged: several finishes in one decode free group",
    "extend: allocation evicts from the tree",
    *ORDER_CLASSES,
)
NIGHTLY_EXTRA = ("page size 64", "batch size over 64")

# Traffic scenarios (issue 26): what SGLang's own scheduler did, decided from a run's iteration
# records by ``kvparity.judge.traffic_classes``; a scheduler-driven check must reach each.
TRAFFIC_RETRACTION = "traffic: retraction under memory pressure"
TRAFFIC_CHUNKED = "traffic: chunked prefill"
TRAFFIC_RADIX_HIT_RUNNING = "traffic: radix hit on a running request"
TRAFFIC_REORDERED = "traffic: queue reordered by the policy"
TRAFFIC_BUDGET_STOP = "traffic: admission stopped on budget"
TRAFFIC_REQUIRED = (TRAFFIC_RETRACTION, TRAFFIC_CHUNKED, TRAFFIC_RADIX_HIT_RUNNING, TRAFFIC_REORDERED,
                    TRAFFIC_BUDGET_STOP)
# Rare shapes (issue 33) the scheduler-driven strategy steers toward with Hypothesis's ``target()``
# (``kvparity.run.scheduler_drive``): counted and reported, not required.
TRAFFIC_CHUNK_IN_FLIGHT_FREED = "traffic: rows freed while a chunked prefill is in flight (overlap loop)"
TRAFFIC_OVERLAP_RETRACTION = "traffic: retraction in the overlap loop"
TRAFFIC_RETRACTED_HIT = "traffic: a retracted request readmitted on a radix hit"
TRAFFIC_RARE = (TRAFFIC_CHUNK_IN_FLIGHT_FREED, TRAFFIC_OVERLAP_RETRACTION, TRAFFIC_RETRACTED_HIT)
# A run on the Python radix-tree core where the release's server defaults to its Rust one (0.5.21+,
# issue 48): the components SGLang ships as the fallback, under its own scheduler.
TRAFFIC_PYTHON_CORE = "traffic: the Python radix-tree core, beside the Rust default (0.5.21+)"
# A sliding-window model's shapes (issue 34), read from the window pool's snapshots.
TRAFFIC_WINDOW_EVICTED = "traffic: window slots freed under a running request (sliding window)"
TRAFFIC_TOMBSTONE = "traffic: a tree node whose window slots are freed (tombstone)"
TRAFFIC_TOMBSTONE_HIT = "traffic: a radix hit while the tree holds tombstones"
TRAFFIC_WINDOW_RETRACTION = "traffic: retraction of a sliding-window model's request"
# The window's geometry where its frontier code runs (issue 48: window bugs live at page edges): a
# window smaller than a page, or past a page and not a multiple of it, in a run whose window freed slots.
TRAFFIC_WINDOW_BELOW_PAGE = "traffic: window slots freed, the window smaller than a page (sliding window)"
TRAFFIC_WINDOW_OFF_PAGE = "traffic: window slots freed, the window not a whole number of pages (sliding window)"
TRAFFIC_WINDOW = (TRAFFIC_WINDOW_EVICTED, TRAFFIC_TOMBSTONE, TRAFFIC_TOMBSTONE_HIT, TRAFFIC_WINDOW_RETRACTION,
                  TRAFFIC_WINDOW_BELOW_PAGE, TRAFFIC_WINDOW_OFF_PAGE)
# A Mamba model's shapes (issue 34), read from the state pool's snapshots. A radix hit restores the
# state the tree keeps at the matched node by copying it into the request's own slot (copy on write).
TRAFFIC_STATE_RESTORED = "traffic: a state restored from the tree, copied on write into the request's slot (Mamba)"
TRAFFIC_STATE_EVICTED = "traffic: a state the tree kept evicted (Mamba)"
TRAFFIC_STATE_RETRACTION = "traffic: retraction of a Mamba model's request"
TRAFFIC_STATE_RETRACTED_RESTORED = "traffic: a retracted request readmitted with its state restored from the tree (Mamba)"
TRAFFIC_STATE = (TRAFFIC_STATE_RESTORED, TRAFFIC_STATE_EVICTED, TRAFFIC_STATE_RETRACTION,
                 TRAFFIC_STATE_RETRACTED_RESTORED)
# A host tier's shapes (issue 35), read from the host pool's snapshots.
TRAFFIC_HOST_DEMOTED = "traffic: device KV evicted and kept on the host (host tier)"
TRAFFIC_HOST_LOAD_BACK = "traffic: a prefix hit loaded back from the host (host tier)"
TRAFFIC_HOST_EVICTED = "traffic: host KV evicted (host tier)"
TRAFFIC_HOST_RETRACTION = "traffic: retraction with a host tier"
TRAFFIC_STORAGE_HIT = "traffic: a prefix fetched from storage to the host (host tier, file backend)"
TRAFFIC_STATE_LOAD_BACK = "traffic: a Mamba state the host kept alone loaded back (host tier)"
TRAFFIC_HOST = (TRAFFIC_HOST_DEMOTED, TRAFFIC_HOST_LOAD_BACK, TRAFFIC_HOST_EVICTED, TRAFFIC_HOST_RETRACTION,
                TRAFFIC_STORAGE_HIT, TRAFFIC_STATE_LOAD_BACK)
# The nemesis's fault classes (issue 48): a client aborts a request in each state of its life, as
# the scheduler shell names it (a finished request aside, state "finished": its abort finds nothing).
TRAFFIC_ABORTS = {state: f"nemesis: a request aborted {words}" for state, words in (
    ("waiting", "while waiting"), ("prefetching", "while its prefix is fetched from storage (host tier)"),
    ("between chunks", "between chunks of its prefill"),
    ("loading back", "while its prefix is loaded back from the host (host tier)"),
    ("prefilled", "right after its prefill"), ("decoding", "while decoding"), ("retracted", "after its retraction"))}
# Storage calls SGLang's own failure injector failed (the host tier's storage, 0.5.23+): a read of
# pages a prefetch asked for, or another call (the hit query, a backup).
TRAFFIC_STORAGE_READ_FAULT = "nemesis: a storage read failed (host tier, SGLang's failure injector)"
TRAFFIC_STORAGE_FAULT = "nemesis: a storage query or backup failed (host tier, SGLang's failure injector)"
# A prefetch from storage the release's own policy ended before every page came (best_effort).
TRAFFIC_PREFETCH_CUT = "nemesis: a prefetch from storage ended before all its pages came (host tier, best_effort)"
# Exhaustion of the request rows: a request left waiting while every row the server runs is taken.
TRAFFIC_ROWS_FULL = "nemesis: admission stopped with every request row taken"
# Exhaustion on the host tier: a backup the host had no room for, a load-back the device had none for.
TRAFFIC_BACKUP_REFUSED = "nemesis: a backup the host had no room for (host tier)"
TRAFFIC_LOAD_BACK_REFUSED = "nemesis: a load-back the device had no room for (host tier)"
# A retraction in a run with SGLang's retraction test switch on (the nemesis's forced retraction, 0.5.4+).
TRAFFIC_FORCED_RETRACTION = "nemesis: a retraction with SGLang's test switch on (SGLANG_TEST_RETRACT)"
TRAFFIC_NEMESIS = (*TRAFFIC_ABORTS.values(), TRAFFIC_STORAGE_READ_FAULT, TRAFFIC_STORAGE_FAULT, TRAFFIC_PREFETCH_CUT,
                   TRAFFIC_ROWS_FULL, TRAFFIC_BACKUP_REFUSED, TRAFFIC_LOAD_BACK_REFUSED, TRAFFIC_FORCED_RETRACTION)


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _extend_classes(record: StageRecord, ps: int) -> set[str]:
    found = set()
    pres = [len(p) for p in record.prefix_values]
    if all(p == 0 for p in pres):
        found.add("prefix: all empty")
    elif all(p > 0 for p in pres):
        found.add("prefix: every request")
    else:
        found.add("prefix: mixed empty and non-empty")
    bs = len(record.rids)
    found.add("batch size 1" if bs == 1 else "batch size 2-4" if bs <= 4 else "batch size 5-16" if bs <= 16 else "batch size 17-64" if bs <= 64 else "batch size over 64")
    for pre, seq in zip(pres, record.seq_lens):
        if pre > 512:
            found.add("length: prefix crosses 512")
        if seq - pre > 512:
            found.add("length: extend crosses 512")
        if ps > 1:
            old_end = _ceil(pre, ps) * ps
            full_end = seq // ps * ps
            if pre % ps and seq <= old_end:
                found.add("paged: extend fits in the old partial page")
            if pre % ps == 0 and seq - pre == ps:
                found.add("paged: extend of exactly one page")
            if full_end <= old_end and seq > old_end:
                found.add("paged: tail with no full page")
    return found


def classify(scenario: Scenario, records: list[StageRecord]) -> set[str]:
    ps = scenario.geometry.page_size
    found = {f"page size {ps}"}
    rounds: dict[str, int] = {}
    for record in records:
        if record.kind == "extend" and record.outcome == "oom" and record.exhausted == Exhausted.KV:
            # Off the server's path: SGLang's admission keeps a prefill from running out (SPEC 6).
            found.add("off-path: prefill out of memory")
        if record.kind == "extend" and record.outcome == "ok":
            found |= _extend_classes(record, ps)
            for rid, pre in zip(record.rids, record.prefix_values):
                rounds[rid] = rounds.get(rid, 0) + 1
                if rounds[rid] >= 2 and ps > 1 and len(pre) % ps:
                    found.add("chunked: unaligned prefix tail (page > 1)")
        for note in record.notes:
            found |= _note_classes(note)
    if any(n >= 3 for n in rounds.values()):
        found.add("chunked: two or more rounds")
    return found


# The class each simple observation reaches (observations not listed reach none).
_NOTE_CLASSES = {
    Note.RADIX_HIT: "radix: hit from a shared prompt prefix",
    Note.NODE_SPLIT: "radix: node split",
    Note.EXACT_REPEAT: "radix: exact repeat of a finished prompt",
    Note.READMITTED: "retract then re-admit",
    Note.ROW_REUSE_BY_ANOTHER: "row reuse: freed chunked row taken by another request in the same batch",
    Note.RADIX_HIT_ON_RUNNING: "radix: hit on a running request's prompt",
    Note.DECODE_RETRACT: "decode: retract under memory pressure",
    Note.MERGE_BEFORE_ALLOC_EXTEND: "paged: merge before alloc_extend (need_sort)",
    Note.MERGE_BEFORE_ALLOC_DECODE: "paged: merge before alloc_decode (need_sort)",
    Note.PAGED_FINISHES_IN_ONE_GROUP: "paged: several finishes in one decode free group",
    Note.EXTEND_EVICTED: "extend: allocation evicts from the tree",
    Note.DECODE_REPLACED_BY_CHUNK: "decode while chunked: the chunk runs instead",
}


def _note_classes(note: Observation) -> set[str]:
    if isinstance(note, LogprobAdmission):
        return _logprob_classes(note)
    return {_NOTE_CLASSES[note]} if note in _NOTE_CLASSES else set()


def _logprob_classes(admission: LogprobAdmission) -> set[str]:
    requested, start, matched = admission.requested, admission.start, admission.matched
    if requested == -1:
        return {"logprob: start -1 (server default)"}
    if start == 0:
        return {"logprob: start 0"}
    if matched == start:
        return {"logprob: start inside the cached prefix"}  # the start capped the match
    if 0 < matched < start:
        return {"logprob: start beyond the cached prefix"}
    return set()
