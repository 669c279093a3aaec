"""The pools a cache kind adds beside the device's KV (issue 50): a sliding-window model's window
pool, a Mamba model's state pool, a host tier's pool and a Mamba model's host state pool. Each is one
module of ``kvparity.caches`` exporting one ``Pool``: its name (a snapshot's key, and the JSON's),
the record a snapshot holds of it after an iteration, the oracle it answers to and its problems,
and how two runs' records of it differ. ``kvparity.caches`` registers them; a snapshot holds the
records of the pools its world has, by name (``Snapshot.pools``), and the judges ask the registry
(``pool_problems``, ``pools_difference``), never a pool's name, so a new kind's pool is judged
where it is registered."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, cast


class PoolRecord(Protocol):
    """A pool's record in a snapshot: plain data across the worker boundary."""

    def to_plain(self) -> Any: ...


R = TypeVar("R", bound=PoolRecord)


@dataclass(frozen=True)
class Pool(Generic[R]):
    name: str  # its key in a snapshot and the JSON
    oracle: str  # the oracle its problems are reported under
    from_plain: Callable[[Any], R]  # its record from ``to_plain``'s data
    problems: Callable[[R, tuple], list[str]]  # (its record, the device tree's contents) -> what is wrong
    # How two runs' records differ after an iteration: (reference's, other's, exact) -> (what,
    # detail), or None. Either may be missing: present in one run only is a difference.
    difference: Callable[[R | None, R | None, bool], tuple[str, str] | None]

    def record(self, pools: Mapping[str, PoolRecord]) -> R | None:
        """This pool's record among a snapshot's (None: the world has no such pool)."""
        return cast("R | None", pools.get(self.name))


POOLS: dict[str, Pool[Any]] = {}  # by name, in registration order: the order problems and differences are reported in


def register_pool(pool: Pool[R]) -> Pool[R]:
    if pool.name in POOLS:
        raise ValueError(f"pool {pool.name!r} is registered twice")
    POOLS[pool.name] = pool
    return pool


def _registered(pools: Mapping[str, PoolRecord]) -> list[tuple[Pool[Any], PoolRecord]]:
    unknown = sorted(set(pools) - set(POOLS))
    if unknown:
        raise ValueError(f"a snapshot holds pools no cache kind registers: {unknown}; expected some of {list(POOLS)}")
    return [(pool, pools[name]) for name, pool in POOLS.items() if name in pools]


def pool_problems(pools: Mapping[str, PoolRecord], tree: tuple) -> list[tuple[str, str]]:
    """Every registered pool's oracle on the records ``pools`` holds: (oracle, problem) pairs."""
    return [(pool.oracle, problem) for pool, record in _registered(pools) for problem in pool.problems(record, tree)]


def pools_difference(ref: Mapping[str, PoolRecord], got: Mapping[str, PoolRecord],
                     exact: bool) -> tuple[str, str] | None:
    """The first way two runs' pools differ after an iteration, in the registry's order."""
    for name, pool in POOLS.items():
        found = pool.difference(ref.get(name), got.get(name), exact)
        if found is not None:
            return found
    return None


def pools_to_plain(pools: Mapping[str, PoolRecord]) -> dict[str, Any]:
    """Every registered pool's plain record, None where the world has no such pool."""
    return {name: None if pools.get(name) is None else pools[name].to_plain() for name in POOLS}


def pools_from_plain(data: Mapping[str, Any]) -> dict[str, PoolRecord]:
    """The inverse of ``pools_to_plain``: the records of the pools present."""
    return {name: pool.from_plain(data[name]) for name, pool in POOLS.items() if data.get(name) is not None}


def size_difference(pool: str, a: Any, b: Any, sizes: tuple[str, ...] = ("available_size", "evictable_size",
                                                                          "protected_size")) -> tuple[str, str] | None:
    """A pool present in one run only, or its ``sizes`` apart (numbers no renumbering changes)."""
    if a is None or b is None:
        return None if a is b else (f"{pool} pool", f"{'none' if b is None else 'one'} against the reference's "
                                                   f"{'none' if a is None else 'one'}")
    for attr in sizes:
        if getattr(a, attr) != getattr(b, attr):
            return f"{pool} {attr}", f"{getattr(b, attr)} != {getattr(a, attr)}"
    return None
