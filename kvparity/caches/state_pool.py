"""A hybrid linear (Mamba) model's state pool (issue 34): its record in a snapshot, its oracle and
how two runs' state pools differ."""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass
from typing import Any

from kvparity.caches.pool import Pool, size_difference


@dataclass
class MambaState:
    """A hybrid linear (Mamba) model's state pool after an iteration: which slot each request row in
    use names (SGLang's ``req_index_to_mamba_index_mapping``), the slots the tree keeps, the free
    slots, and the tree's state sizes. Every slot of the pool (``slots``) is exactly one of free,
    kept by the tree, or named by a row in use."""

    slots: tuple[int, ...]  # the pool's slots (1..size from 0.5.4; 0..size-1 in 0.5.3.post2)
    rows: tuple[tuple[int, int], ...]  # (row in use, its state slot), by row
    tree: tuple[int, ...]  # the slots the tree keeps, sorted
    free: tuple[int, ...]  # the free list, in order
    available_size: int
    evictable_size: int = 0
    protected_size: int = 0
    # Slots requests without a row hold, sorted: a waiting request's match took one (before 0.5.10
    # a refused request keeps it for its admission; from 0.5.10 the scheduler frees it).
    waiting: tuple[int, ...] = ()

    def to_plain(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "slots": list(self.slots), "rows": [list(pair) for pair in self.rows],
                "tree": list(self.tree), "free": list(self.free), "waiting": list(self.waiting)}

    @classmethod
    def from_plain(cls, data: dict[str, Any]) -> MambaState:
        return cls(**{**data, "slots": tuple(data["slots"]), "rows": tuple((int(r), int(s)) for r, s in data["rows"]),
                      "tree": tuple(data["tree"]), "free": tuple(data["free"]),
                      "waiting": tuple(data.get("waiting", ()))})


def states_conserved(states: MambaState) -> list[str]:
    """A Mamba model's state pool: every slot is exactly one of free, kept by the tree, named by a
    request row in use (a request restoring a state from the tree gets a copy in a slot of its own)
    or held by a waiting request (before 0.5.10, one its match took), and nothing else is handed out."""
    places = (Counter(states.free) + Counter(states.tree) + Counter(slot for _, slot in states.rows)
              + Counter(states.waiting))
    problems = []
    twice = sorted(s for s, n in places.items() if n > 1)
    if twice:
        problems.append(f"state slots in two places at once (free, the tree, a row, a waiting request): {twice[:6]}")
    stray = sorted(set(places) - set(states.slots))
    if stray:
        problems.append(f"state slots that are no slots of the pool: {stray[:6]}")
    lost = sorted(set(states.slots) - set(places))
    if lost:
        problems.append(f"state slots neither free, nor kept by the tree, nor a request's (leaked): {lost[:6]}")
    if states.available_size != len(states.free):
        problems.append(f"state available_size {states.available_size} is not the {len(states.free)} free slots")
    return problems


def states_difference(a: MambaState | None, b: MambaState | None, exact: bool) -> tuple[str, str] | None:
    """The first way two runs' state pools differ after an iteration: their sizes and how many slots
    rows and the tree hold (numbers no renumbering changes), and, ``exact`` (the same release),
    which ones and what is free."""
    sizes = size_difference("state", a, b)
    if sizes is not None or a is None or b is None:
        return sizes
    if (len(a.rows), len(a.tree)) != (len(b.rows), len(b.tree)):
        return "state slots held", (f"{len(b.rows)} rows and the tree's {len(b.tree)}, against the reference's "
                                    f"{len(a.rows)} and {len(a.tree)}")
    if exact and (a.rows, a.tree, sorted(a.free)) != (b.rows, b.tree, sorted(b.free)):
        return "state slots", f"rows {list(b.rows)[:6]}, tree {list(b.tree)[:6]} != {list(a.rows)[:6]}, {list(a.tree)[:6]}"
    return None


POOL: Pool[MambaState] = Pool(name="states", oracle="state slots conserved", from_plain=MambaState.from_plain,
                              problems=lambda states, tree: states_conserved(states), difference=states_difference)
