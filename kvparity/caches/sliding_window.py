"""A hybrid sliding-window model (issue 34): a window pool beside the full one, a window from below a
page to beyond any prompt."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hypothesis import strategies as st

from kvparity.caches.kind import CacheKind, Memory
from kvparity.caches.window_pool import POOL
from kvparity.model.cache_configs import BELOW_A_PAGE, SlidingWindow, window_slots
from kvparity.model.classes import (
    TRAFFIC_TOMBSTONE,
    TRAFFIC_TOMBSTONE_HIT,
    TRAFFIC_WINDOW,
    TRAFFIC_WINDOW_BELOW_PAGE,
    TRAFFIC_WINDOW_EVICTED,
    TRAFFIC_WINDOW_OFF_PAGE,
    TRAFFIC_WINDOW_RETRACTION,
)
from kvparity.model.traffic import LOOPS, ServerConfig, TrafficScenario
from kvparity.model.traffic_records import Decision


def window_at_odds(config: ServerConfig) -> str | None:
    """A server's window against its page (``SlidingWindow.at_odds``; None without a window)."""
    window = config.part(SlidingWindow)
    return None if window is None else window.at_odds(config.page_size)


# Its window in the harness drive's worlds: below most drawn prompts (the window slides), above a
# page; its slots are freed every 2 tokens that slide out (SGLang's default, 128, is past every
# drawn sequence).
HARNESS_WINDOW = 8
HARNESS_EVICTION_INTERVAL = 2


@st.composite
def windows(draw: Any, config: ServerConfig, window_pages: tuple[int, ...]) -> ServerConfig:
    """``config`` as a hybrid sliding-window model's server: a window from below a page to beyond
    any prompt (pages of 4 two times in three where the releases page their windows; with them, two
    windows in seven below a page, two past one and not a whole number of them), window slots freed
    after a few tokens slid out (three times in four; else SGLang's default interval, which these
    short requests never reach), the window pool SGLang's default share."""
    page_size = draw(st.sampled_from(window_pages + window_pages[1:]))  # a page past one token two times in three
    chunked = config.chunked_prefill_size
    if chunked is not None:
        chunked = -(-chunked // page_size) * page_size
    # 80: beyond every drawn prompt, within every drawn window pool (a window wider than its pool
    # is no server's: SGLang then admits nothing and the run stalls).
    size = draw(st.sampled_from((8, 1, 3, 6, 16, 10, 80)))
    window = SlidingWindow(size, eviction_interval=draw(st.sampled_from((1, 4, 1, None))))
    return config.with_part(window, page_size=page_size, chunked_prefill_size=chunked)


def harness_options(geometry: Any, offer: Any) -> dict[str, Any]:
    """The harness drive's window and its default window pool, sized for ``geometry``."""
    return {"sliding_window": HARNESS_WINDOW, "swa_eviction_interval": HARNESS_EVICTION_INTERVAL,
            "swa_kv_slots": max(geometry.page_size, window_slots(geometry.kv_slots, geometry.page_size, None))}


def window_classes(decisions: Sequence[Decision], memory: Sequence[Memory]) -> set[str]:
    """A sliding-window model's shapes a run met: window slots freed under a running request (a
    slot it holds maps to no window slot), a tombstone (a tree slot that maps to none), a radix hit
    while the tree held one, a retraction."""
    found: set[str] = set()
    tombstoned = False
    for rec, snap in zip(decisions, memory):
        window = POOL.record(snap.pools)
        if window is None:
            return found
        if rec.mode == "EXTEND" and tombstoned and any(hit > 0 for hit in rec.prefix_lens):
            found.add(TRAFFIC_TOMBSTONE_HIT)
        mapped = {full for full, _ in window.mapped}
        tombstoned = any(slot not in mapped for slot in snap.tree_slots)
        if tombstoned:
            found.add(TRAFFIC_TOMBSTONE)
        if any(view.status in ("running", "chunked") and any(s not in mapped for s in view.held)
               for view in snap.requests.values()):
            found.add(TRAFFIC_WINDOW_EVICTED)
        if rec.retracted:
            found.add(TRAFFIC_WINDOW_RETRACTION)
    return found


def window_geometry_classes(scenario: TrafficScenario, window_met: set[str]) -> set[str]:
    """The window's geometry against the page, where the run's window freed slots (``window_met``,
    its ``window_classes``: its frontier was computed under it): smaller than a page, or past one
    and not a whole number of them."""
    odds = window_at_odds(scenario.config)
    if odds is None or not window_met & {TRAFFIC_WINDOW_EVICTED, TRAFFIC_TOMBSTONE}:
        return set()
    return {TRAFFIC_WINDOW_BELOW_PAGE if odds == BELOW_A_PAGE else TRAFFIC_WINDOW_OFF_PAGE}


def reached(scenario: TrafficScenario, decisions: Sequence[Decision], memory: Sequence[Memory]) -> set[str]:
    window = window_classes(decisions, memory)
    return window | window_geometry_classes(scenario, window)


KIND = CacheKind(
    name="swa", label="sliding window", loops=LOOPS, host_tier=False, default=True,
    served_by=lambda release: True,
    caches=(SlidingWindow,),
    serve=lambda draw, config, options: draw(windows(config, options.window_pages)),
    harness_options=harness_options,
    # Pages above 1 where every release of the lane pages its window pool.
    harness_paged=lambda paged_windows: paged_windows,
    classes=TRAFFIC_WINDOW,
    reached=reached,
)
