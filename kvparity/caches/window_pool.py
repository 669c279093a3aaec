"""A sliding-window model's window pool (issue 42): its record in a snapshot, its oracle and how
two runs' window pools differ."""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass
from typing import Any

from kvparity.caches.pool import Pool, size_difference


@dataclass
class WindowState:
    """A sliding-window model's window pool after an iteration: each full slot that holds a window
    slot (SGLang's ``full_to_swa_index_mapping``, 0: none; a tree node whose full slots hold none
    is tombstoned), the window allocator's free pages, and the tree's window sizes."""

    slots: int  # the window pool's size (page 0 is the padding sink, never handed out)
    page_size: int
    mapped: tuple[tuple[int, int], ...]  # (full slot, window slot), by full slot
    free: tuple[int, ...]  # free window pages: the free list, then those waiting to be sorted in
    available_size: int
    evictable_size: int = 0
    protected_size: int = 0

    def to_plain(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "mapped": [list(pair) for pair in self.mapped], "free": list(self.free)}

    @classmethod
    def from_plain(cls, data: dict[str, Any]) -> WindowState:
        return cls(**{**data, "mapped": tuple((int(f), int(w)) for f, w in data["mapped"]), "free": tuple(data["free"])})


def window_conserved(window: WindowState) -> list[str]:
    """A sliding-window model's window pool: every window slot is mapped from at most one full
    slot, no mapped slot lies on a free page, no page is free twice, the padding page 0 is never
    free, and every other page is free or holds a mapped slot (SGLang frees a window page when the
    last full slot mapping into it lets go)."""
    problems = []
    page = window.page_size
    owners = Counter(w for _, w in window.mapped)
    twice = sorted(w for w, n in owners.items() if n > 1)
    if twice:
        problems.append(f"window slots mapped from two full slots: {twice[:6]}")
    free = Counter(window.free)
    if [p for p, n in free.items() if n > 1]:
        problems.append(f"window pages free twice: {sorted(p for p, n in free.items() if n > 1)[:6]}")
    if 0 in free:
        problems.append("the window's padding page 0 is on its free list")
    on_free = sorted(w for w in owners if w // page in free)
    if on_free:
        problems.append(f"mapped window slots on a free page: {on_free[:6]}")
    held = {w // page for w in owners}
    lost = sorted(set(range(1, window.slots // page + 1)) - held - set(free))
    if lost:
        problems.append(f"window pages neither free nor mapped (leaked): {lost[:6]}")
    return problems


def window_difference(a: WindowState | None, b: WindowState | None, exact: bool) -> tuple[str, str] | None:
    """The first way two runs' window pools differ after an iteration: their sizes and how many
    full slots hold a window slot (numbers no renumbering changes), and, ``exact`` (the same
    release), which ones and what is free."""
    sizes = size_difference("window", a, b)
    if sizes is not None or a is None or b is None:
        return sizes
    if len(a.mapped) != len(b.mapped):
        return "window slots held", f"{len(b.mapped)} full slots hold one, against the reference's {len(a.mapped)}"
    if exact and a.mapped != b.mapped:
        return "window mapping", f"{list(b.mapped)[:8]} != {list(a.mapped)[:8]}"
    if exact and sorted(a.free) != sorted(b.free):
        return "window free pages", f"{sorted(b.free)[:8]} != {sorted(a.free)[:8]}"
    return None


POOL: Pool[WindowState] = Pool(name="window", oracle="window slots conserved", from_plain=WindowState.from_plain,
                               problems=lambda window, tree: window_conserved(window), difference=window_difference)
