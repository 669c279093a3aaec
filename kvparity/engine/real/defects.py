"""SGLang's own defects that kvparity's runs of a release meet, each named with its evidence: which
releases have it, what it is, the upstream issue or fix, and how it shows in a run (the finding's
kind and what its line says). A release's own run that meets one still fails the check (a defect
is a failure, whether or not the reference shares it); the report names it as known instead of
leaving it to be traced again.

Beside ``kvparity.engine.releases`` (what changed between releases, on purpose or not): a
defect here is one a release's own run shows by itself, against itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvparity.caches import kind_of
from kvparity.caches.sliding_window import window_at_odds
from kvparity.engine.release_order import version_key
from kvparity.model.cache_configs import BETWEEN_PAGES, HostTier
from kvparity.model.traffic import ServerConfig

# The finding kinds a defect shows as (the tail of a scheduler-driven finding's label).
RAISED, ORACLE, CANARY, INFLIGHT = "the scheduler raised", "memory oracle", "KV canary", "in flight"


@dataclass(frozen=True)
class KnownDefect:
    name: str  # short, as a report names it
    first: str  # the first release that has it
    last: str  # the last release that has it (the next one fixes it, or changed the path)
    what: str  # what goes wrong, and why
    evidence: str  # the upstream issue or pull request, the release that fixes it, how it was traced
    shows: str  # the finding kind it shows as (RAISED, ORACLE, CANARY, INFLIGHT)
    says: tuple[str, ...]  # every one of these occurs in the finding's line
    cache: str | None = None  # the model served ("mamba", ...), where only one shows it
    # The servers it shows on, where only some do (None: any serving ``cache``).
    applies: Callable[[ServerConfig], bool] | None = None

    def covers(self, release: str) -> bool:
        return version_key(self.first) <= version_key(release) <= version_key(self.last)

    def matches(self, release: str, config: ServerConfig, kind: str, line: str) -> bool:
        """Whether a finding of ``kind`` saying ``line``, in ``release``'s run of a server ``config``, is this one."""
        return (self.covers(release) and kind.startswith(self.shows)
                and (self.cache is None or self.cache == kind_of(config).name)
                and (self.applies is None or self.applies(config)) and all(part in line for part in self.says))

    @property
    def line(self) -> str:
        return f"{self.name} ({self.first} to {self.last}): {self.what}; {self.evidence}"


def _window_off_page(config: ServerConfig) -> bool:
    """A sliding window past a page and not a whole number of them."""
    return window_at_odds(config) == BETWEEN_PAGES


def _storage(config: ServerConfig) -> bool:
    """A host tier with a storage tier behind it."""
    tier = config.part(HostTier)
    return tier is not None and tier.storage


def _write_back(config: ServerConfig) -> bool:
    """A host tier that backs the device up only on eviction (the only policy that pins load-backs)."""
    tier = config.part(HostTier)
    return tier is not None and tier.write_policy == "write_back"


def _write_back_to_storage(config: ServerConfig) -> bool:
    """A host tier that backs the device up only on eviction, with a storage tier behind it."""
    return _write_back(config) and _storage(config)


# Traced by playing every release with a Mamba model against itself (scheduler-driven, fcfs and lpm,
# 40 scenarios each, derandomized): each defect is met in every release of its range and in none
# after it.
KNOWN_DEFECTS: tuple[KnownDefect, ...] = (
    KnownDefect(
        "Mamba chunked prefill without its state", "0.5.3.post2", "0.5.8.post1",
        "a Mamba model's request prefilled in chunks: the chunk stash frees and retakes the request's row, "
        "so its state slot is held twice (the row and the free list) and its next chunk reads the empty state",
        "gone from 0.5.9, where the chunked request keeps its row between chunks (sgl-project/sglang#17850); "
        "shrunk: one request of 3 tokens, chunks of 2", ORACLE, ("two places at once",), "mamba"),
    KnownDefect(
        "Mamba chunked prefill reads the empty state", "0.5.3.post2", "0.5.8.post1",
        "the same defect as read by the state canary: the request's next chunk starts from the empty state",
        "gone from 0.5.9 (sgl-project/sglang#17850)", CANARY, ("holds the empty state",), "mamba"),
    KnownDefect(
        "Mamba retraction raises", "0.5.3.post2", "0.5.4.post2",
        "a Mamba model's request retracted under memory pressure: ScheduleBatch.release_req calls "
        "MambaRadixCache.cache_finished_req(req, is_insert=False), which takes no is_insert (TypeError)",
        "MambaRadixCache.cache_finished_req takes is_insert from 0.5.4.post3", RAISED,
        ("cache_finished_req() got an unexpected keyword argument 'is_insert'",), "mamba"),
    KnownDefect(
        "Mamba state leaked by a refused request", "0.5.4.post3", "0.5.9",
        "a Mamba model's match copies a state into a slot for a request the PrefillAdder then refuses, and nobody "
        "frees that slot: SGLang's own idle leak check raises (leaked_mamba_pages)",
        "fixed in 0.5.10 (sgl-project/sglang#21404, which frees the slot of a refused request)", RAISED,
        ("memory leak detected!", "mamba_available_size"), "mamba"),
    # Traced by playing the shrunk scenarios of the window geometry issue 48 added (0.5.18 against
    # itself, pages of 4, windows of 6 and 10) on every release with paged windows.
    *(KnownDefect(
        "window margin not whole pages", "0.5.18", "0.5.22",
        "a sliding-window model whose window is not a whole number of pages: free_swa_out_of_window_slots frees "
        "up to max(window, page) before the sequence's end, then floors that to a page, so it frees pages the "
        "request still reads and the tree still keys (pages both free and held, handed out again, read as "
        "another request's KV; SGLang's own leak check raises)",
        "0.5.23 rounds the margin up to whole pages (ceil_align(max(window, page), page)); 0.5.17 does not meet it; "
        "shrunk: one request of 55 tokens, pages of 4, a window of 10 (a window of 8 or 12: none)",
        shows, says, "swa", _window_off_page)
      for shows, says in ((ORACLE, ("slots conserved",)), (ORACLE, ("new slots distinct",)),
                          (RAISED, ("pool memory leak detected!",)), (CANARY, ("read position",)))),
    # Found by the nemesis's host-tier tasks (0.5.23 against itself, a Mamba model's host tier).
    KnownDefect(
        "Mamba slot asserted while host backups lock every state", "0.5.23", "0.5.23",
        "a Mamba model's host tier with transfers acknowledged late: every state the tree keeps is locked by a "
        "write-through not yet acknowledged, so a checkpoint's _alloc_mamba_slot evicts nothing and asserts "
        "instead of skipping the optional cache (the server dies)",
        "sgl-project/sglang#40128 (open: skip the donation on exhaustion); shrunk: 4 requests in one pass, "
        "lpm, state slots the fewest a server runs 4 requests with, acknowledgements 2 passes late; 0.5.16 to "
        "0.5.22 do not raise on it", RAISED, ("Can not alloc mamba cache",), "hicache-mamba"),
    # Found by the nemesis's controls of 0.5.15 and 0.5.16 (a sliding-window model's task), shrunk,
    # traced on 0.5.16 with a log in PrefillAdder._swa_budget_for_req.
    KnownDefect(
        "retracted window request never readmitted", "0.5.15", "0.5.16",
        "a sliding-window model whose window and a page nearly fill the window pool: a request retracted under "
        "memory pressure is refused on every pass after the others finish, with nothing running, because its window "
        "budget (the window and a page, whatever it reuses) is counted against the window pool less the tokens its "
        "own match locks (the server serves nothing more: a livelock, which kvparity's stall check stops)",
        "traced on 0.5.16: a window of 80 and a window pool of 102 slots; r7, retracted, needs 81 while 12 slots are "
        "free and 61 evictable (its own match locks the other 29); 0.5.17 readmits it and ends in 55 passes (0.5.10 "
        "and earlier, 0.5.18, 0.5.20 and 0.5.23 too; 0.5.11 to 0.5.14 not played); shrunk: 2 requests, one pass",
        RAISED, ("the scheduler admits nothing",), "swa"),

    # Found by the nemesis's storage faults (kvparity's faulty backend), played on every release.
    KnownDefect(
        "prefetch tail released twice", "0.5.3", "0.5.5.post3",
        "a prefetch from storage that ends short of its pages (a read that failed, a policy's early end): the "
        "controller's _page_transfer releases the host slots past what came, and prefetch_io_aux_func releases "
        "them again, so they are in the host's free list twice and one is handed out while still listed free",
        "sgl-project/sglang#13483 (double free in HiCache prefetch); gone from 0.5.6, whose _page_transfer no "
        "longer releases them; shrunk: every read of d's prefix failing", ORACLE,
        ("host slots in two places at once",), "hicache", _storage),
    # Found by the nemesis's host-tier tasks (0.5.23 against itself), shrunk, then played on every
    # release with a Mamba model's host tier.
    KnownDefect(
        "write-back eviction stopped by storage backups", "0.5.16", "0.5.23",
        "a Mamba model's host tier, write_back, with storage: an eviction demotes leaves to the host, and each "
        "host copy it acknowledges starts a storage backup that host-locks the node until the scheduler's next "
        "drain of the storage queues; the next leaf's backup then finds no host room it may evict "
        "(\"subtree drop declined (node locked)\"), so the tokens the admission counted evictable stay on the "
        "device and alloc_token_slots raises Out of memory (the server dies)",
        "not fixed as of 0.5.23 (the latest driven); HiRadixCache's write-back eviction skips subtrees an L3 "
        "operation locks since sgl-project/sglang#28614, UnifiedRadixCache's does not; shrunk: a device of 96 "
        "slots, a host of 73, 3 requests over 2 passes (with a host of 192: none); the host lock is released "
        "on the scheduler's thread only, so no storage speed avoids it", RAISED,
        ("Out of memory", "full_evictable_size_="), "hicache-mamba", _write_back_to_storage),
    # Found by the nemesis's host-tier tasks played in shards (0.5.23 against itself, lpm, the
    # overlap loop), then played on the releases installed beside it.
    # Found again by the controls of 0.5.20 and 0.5.21 (a group's label then came from its first
    # instance, and hid these under the Mamba model's defect), shrunk, played on the releases beside.
    *(KnownDefect(
        "write-back eviction stopped by storage backups", "0.5.19", "0.5.23",
        "the same on a full-attention model's host tier (UnifiedRadixCache): write_back with storage and a small "
        "host, the admission counts evictable tokens the eviction then cannot free, and the allocation raises out of "
        "memory (alloc_paged_token_slots_extend in pages, alloc_token_slots without; the server dies)",
        "shrunk: a device of 96 slots in pages of 4, a host of 72, 6 requests over 10 passes, the overlap loop "
        "(0.5.22, 0.5.23; not 0.5.21 or 0.5.15); a device of 128 slots, a host of 96, 5 requests over 8 passes, "
        "the overlap loop, a best_effort prefetch (0.5.20, 0.5.21; not 0.5.19, 0.5.22 or 0.5.23, nor wait_complete); "
        "9 requests over 18 passes in pages of 4 (0.5.19 in the overlap loop); each raises nothing with storage off, "
        "write_through, a larger host or the normal loop; not traced further than these conditions, which are the "
        "Mamba model's", RAISED, (form, "full_evictable_size_="), "hicache", _write_back_to_storage)
      for form in ("Prefill out of memory", "RuntimeError: Out of memory")),
    # Found by the controls of 0.5.18 once a group's label was per instance, shrunk, played on the
    # releases beside it; in pages of 1, alloc_token_slots raises it in words of its own (the
    # controls of 0.5.17 and 0.5.18 after the nemesis's host hits).
    *(KnownDefect(
        "write-back host tier out of memory behind storage (HiRadixCache)", "0.5.15", "0.5.18",
        "a full-attention model's host tier on HiRadixCache, write_back with storage and a host smaller than the "
        "device: the admission counts evictable tokens the allocation then cannot have, and "
        "alloc_paged_token_slots_extend raises Prefill out of memory (the server dies)",
        "not traced past its conditions, which are UnifiedRadixCache's defect above (the cause may differ: "
        "HiRadixCache's write-back eviction skips subtrees a storage operation locks); shrunk: a device of 96 slots in "
        "pages of 4, a host of 72, 9 requests over 18 passes: 0.5.15 to 0.5.18 raise (0.5.19 only in the overlap "
        "loop, as UnifiedRadixCache's), none with storage off, write_through or a host of 192; before 0.5.15 a host "
        "smaller than the device is refused; in pages of 1 (RuntimeError: Out of memory, from alloc_token_slots): "
        "c0's 42 tokens, two prompts of their own and s on c0 through a device of 128 slots and a host of 96, "
        "storage backups failing, raise on 0.5.15 to 0.5.18 (0.5.19: UnifiedRadixCache's defect above)", RAISED,
        (form, "(available_size="), "hicache",
        _write_back_to_storage)
      for form in ("Prefill out of memory", "RuntimeError: Out of memory")),
    # Found by a variant of the nemesis's host hits on 0.5.23 (its draw without the holding filler),
    # traced with a log on the storage, load-back and state-copy paths.
    KnownDefect(
        "Mamba state loaded back, then overwritten by the match's copy-on-write", "0.5.23", "0.5.23",
        "a Mamba model's host tier: a request whose device match ends on a state (its match stages a "
        "copy-on-write from it, mamba_cow_src_index) and whose host hit beyond holds the state it needs: the "
        "load-back writes that state into the request's slot (prepare_load_back allocates none, the request "
        "holds one), nothing clears the staged copy on that path (_adopt_loaded_state runs for the external "
        "linker and the buffer pipeline only), and prepare_for_extend's deferred copy then overwrites the loaded "
        "state with the device match's: the extend reads the state of the shorter prefix (wrong output, no error)",
        "traced on 0.5.23: s matches 5 device tokens (r3's prompt, its state in slot 3) and 13 more fetched from "
        "storage with their state (host slot 50); the load copies host 50 into s's slot 16, the deferred copy "
        "3 -> 16 runs in run_batch before the forward, and s reads the state after position 4 at position 17; "
        "none with the storage faults off (the fault on w0's fetch shapes the tree); 0.5.19 to 0.5.22 stage the "
        "copy the same way, but this traffic meets it on 0.5.23 only; no upstream issue found", CANARY,
        ("read state slot", "which holds the state after"), "hicache-mamba"),
    # Found by the nemesis's host hits (the controls of 0.5.16 against itself), traced by reading
    # 0.5.16's load_back beside 0.5.17's.
    KnownDefect(
        "Mamba load-back called off on a state slot it took", "0.5.16", "0.5.16",
        "a Mamba model's host tier: UnifiedRadixCache.load_back builds the state's transfer first, and that "
        "allocates the request's own state slot (req.mamba_pool_idx) for the host state's copy; a load-back then "
        "called off (under the threshold or over the quota, eviction short of room, or the controller's load "
        "finding none) returns False keeping the slot, neither copied into nor marked to be cleared, so "
        "alloc_req_slots passes it by and the request extends from whatever state the slot held last (wrong "
        "output, no error)",
        "fixed in 0.5.17, whose finalize_load_back returns the slot a called-off load-back allocated and clears "
        "the request (\"the H->D copy never ran\"); seen on a 0.5.16 control (16 requests over 13 passes, "
        "write_back, storage backups failing: w0 reads f1's state where the empty state belongs; the faults' "
        "sequence follows the storage calls, so no request can be cut); 0.5.18 to 0.5.20 play the same traffic "
        "clean", CANARY, ("the empty state belongs there",), "hicache-mamba"),
    # Found by the nemesis's host-tier tasks (the controls of 0.5.20 to 0.5.22 against themselves),
    # shrunk, then traced on 0.5.21 with a log on the load-back path.
    KnownDefect(
        "Mamba load-back backed off onto a prefix without its state", "0.5.20", "0.5.23",
        "a Mamba model's host tier, write_back: a load-back not yet acknowledged pins the nodes whose KV it loads "
        "(load_back_pending_id); a second request whose device match ends short of them, with the state it needs "
        "on the host in a pinned node, gets an empty load-back spec (build_load_back_spec rejects a transfer that "
        "names a node another load-back pins), and add_one_req recomputes its admission without the host hit but "
        "keeps its device prefix, whose end holds no state: its fresh state slot is cleared and its extend reads "
        "the empty state (wrong output, no error)",
        "the back-off is sgl-project/sglang#35931 (\"the request recomputes\"); #36317 stopped Mamba transfers "
        "pinning nodes, but the rejection still reads their nodes; no upstream issue found; not fixed as of 0.5.23 "
        "(the latest driven); 0.5.19 has no back-off; shrunk: s loads a 30-token prefix back, and the next pass r3 "
        "matches 20 device tokens and the state at 24 on the host, acknowledgements 2 passes late; 0.5.20 to 0.5.23 "
        "read the empty state, 0.5.19 none; none with write_through or acknowledgements 0 or 1 pass late", CANARY,
        ("holds the empty state",), "hicache-mamba", _write_back),
)


def known_defect(release: str, config: ServerConfig, kind: str, line: str) -> KnownDefect | None:
    """The known defect a finding of a release's own run of a server ``config`` is, or None."""
    return next((d for d in KNOWN_DEFECTS if d.matches(release, config, kind, line)), None)
