"""How production-shaped a world's batches were: the order classes (issue 25).

A server that has run for an hour hands out request rows and KV pages in no particular order, and
code that silently relies on order or contiguity (a sort of the rows, a "first slot plus offset",
a searchsorted over the free list) passes every check made on a fresh pool. These classes say
whether a run's batches looked like a server's. They are read from a world's snapshots, not its
records, because the free lists and the rows' contents are there: the reference world's in a
modelled run, the real reference's in a ``--sglang`` run (so they are reached by real SGLang too).
"""

from __future__ import annotations

from collections.abc import Sequence

from kvparity.engine.snapshot import Snapshot
from kvparity.model.classes import (
    ORDER_MIXED_FREE_TIMES,
    ORDER_PAGES_NOT_CONTIGUOUS,
    ORDER_ROWS_NOT_ASCENDING,
    ORDER_WRAPPED_FREE_LIST,
)

BATCH_KINDS = ("extend", "decode")


def pages_contiguous(slots: Sequence[int], page_size: int) -> bool:
    """Whether ``slots`` lie on consecutive ascending pages (at page size 1: consecutive slots)."""
    pages = [s // page_size for s in slots]
    distinct = [p for i, p in enumerate(pages) if i == 0 or p != pages[i - 1]]
    return all(b == a + 1 for a, b in zip(distinct, distinct[1:]))


def request_slots(after: Snapshot, rid: str) -> list[int]:
    """The KV slots of request ``rid``'s tokens, as its row holds them after the stage."""
    view = after.requests.get(rid)
    if view is None or view.req_pool_idx is None:
        return []
    return after.req_to_token[view.req_pool_idx, : view.slotted].tolist()


def pages_handed_out(before: Snapshot, out_cache_loc: Sequence[int], page_size: int) -> list[int]:
    """The new pages a batch was given, in the order it was given them: free before the stage, or
    evicted from the tree for it (a slot that continues a page a request already held is no new
    page)."""
    held = {slot // page_size for slot in before.request_held}
    taken: dict[int, None] = {}  # ordered, without repeats
    for slot in out_cache_loc:
        if slot // page_size not in held:
            taken.setdefault(slot // page_size)
    return list(taken)


def free_list_wrapped(before: Snapshot) -> bool:
    """Whether the free pages an allocation takes from are out of ascending order (pages freed
    behind, or in front of, others: SGLang's paged allocator puts freed pages first)."""
    free = before.free_pages.tolist()
    return any(b < a for a, b in zip(free, free[1:]))


def order_classes(stages: Sequence[Snapshot], page_size: int) -> set[str]:
    """The order classes ``stages`` (a world's start snapshot, then one per stage) reached."""
    found: set[str] = set()
    freed_at: dict[int, int] = {}  # row -> the stage that last gave it back
    for index, (before, after) in enumerate(zip(stages, stages[1:])):
        for row in set(after.free_rows) - set(before.free_rows):
            freed_at[row] = index
        record = after.record
        if record.kind not in BATCH_KINDS or record.outcome != "ok" or not record.rids:
            continue
        rows = list(record.rows)
        if rows != sorted(rows):
            found.add(ORDER_ROWS_NOT_ASCENDING)
        if len({freed_at[row] for row in rows if row in freed_at}) >= 2:
            found.add(ORDER_MIXED_FREE_TIMES)
        if any(not pages_contiguous(request_slots(after, rid), page_size) for rid in record.rids):
            found.add(ORDER_PAGES_NOT_CONTIGUOUS)
        if pages_handed_out(before, record.out_cache_loc or (), page_size) and free_list_wrapped(before):
            found.add(ORDER_WRAPPED_FREE_LIST)
    return found
