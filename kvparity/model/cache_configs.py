"""What a server holds beside full attention, one record per cache kind (issue 50): a sliding
window, Mamba states, a host tier. ``ServerConfig.caches`` holds them; the server is written,
printed and carried with their fields flat among its own, under SGLang's names (``sliding_window=8``),
as a server's arguments are. Each kind's module in ``kvparity.caches`` names its records
(``CacheKind.caches``); they live here, beside the server, because a scenario is plain data drawn
and checked below the kinds (and imported before the device is chosen, which the kinds' modules
are not). A new kind adds its record here, last (the printed order)."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

if TYPE_CHECKING:
    from kvparity.model.traffic import ServerConfig

# The write policies of a host tier (SGLang's --hicache-write-policy).
HICACHE_WRITE_POLICIES = ("write_through", "write_back", "write_through_selective")
# The prefetch policies kvparity drives (SGLang's "timeout" reads the wall clock: no run would replay).
PREFETCH_POLICIES = ("wait_complete", "best_effort")


class CacheConfig(Protocol):
    """What a server's cache of a kind beside full attention is configured with (a sliding
    window, Mamba states, a host tier: the records below, each named by its kind in
    ``kvparity.caches``). Its fields are printed flat among the server's, under SGLang's names
    (``FLAT``: printed name -> field; the first names the record: None there is no such cache), in
    ``CACHE_CONFIGS``' order."""

    FLAT: ClassVar[dict[str, str]]

    def check(self, server: ServerConfig) -> None:
        """A ValueError naming the field where this cache does not fit ``server``."""
        ...


Part = TypeVar("Part", bound=CacheConfig)


def part_of(caches: tuple[CacheConfig, ...], record: type[Part]) -> Part | None:
    """The cache of ``record``'s kind among ``caches`` (None: none)."""
    return next((p for p in caches if isinstance(p, record)), None)


@functools.cache
def flat_owner() -> dict[str, type[CacheConfig]]:
    """Each printed name's cache record (read, never changed: built once)."""
    return {name: record for record in CACHE_CONFIGS for name in record.FLAT}


@functools.cache
def absent_fields(record: type[CacheConfig]) -> dict[str, Any]:
    """A record's printed fields where a server has none of it: its first None, the rest their defaults."""
    defaults = {f.name: f.default for f in fields(record)}  # type: ignore[arg-type]
    first, *rest = record.FLAT
    return {first: None} | {name: defaults[record.FLAT[name]] for name in rest}


def printed_fields(part: CacheConfig) -> dict[str, Any]:
    """A cache's fields as a server prints them (by SGLang's names)."""
    return {name: getattr(part, f) for name, f in part.FLAT.items()}


def _cache_part(record: type[CacheConfig], given: dict[str, Any], held: CacheConfig | None) -> CacheConfig | None:
    """A server's cache of ``record``'s kind: ``held`` with the printed fields ``given`` (None as
    the first: none), or built from them; a field given without the record is refused by name."""
    first = next(iter(record.FLAT))
    known = absent_fields(record) if held is None else printed_fields(held)
    merged = known | given
    if merged[first] is None:
        stray = {name: v for name, v in merged.items() if v != absent_fields(record)[name]}
        if stray:
            name, value = next(iter(stray.items()))
            raise ValueError(f"ServerConfig.{name}={value!r}: needs {first}")
        return None
    return record(**{record.FLAT[name]: value for name, value in merged.items()})


def cache_parts(flat: Mapping[str, Any], held: tuple[CacheConfig, ...] = ()) -> tuple[CacheConfig, ...]:
    """The caches ``held`` with the printed fields ``flat`` (``sliding_window=8``, ...), one record
    per kind in ``CACHE_CONFIGS``' order: what a server, or a world, is built with."""
    owner = flat_owner()
    unknown = sorted(set(flat) - set(owner))
    if unknown:
        raise TypeError(f"ServerConfig has no field {', '.join(map(repr, unknown))}")
    by_type = {type(part): part for part in held}
    parts = []
    for record in CACHE_CONFIGS:
        part = _cache_part(record, {k: v for k, v in flat.items() if owner[k] is record}, by_type.pop(record, None))
        parts += [] if part is None else [part]
    if by_type:
        raise TypeError(f"ServerConfig: no cache record is {', '.join(t.__name__ for t in by_type)}")
    return tuple(parts)


# A window pool, as a share of the server's full pool (SGLang's default ``--swa-full-tokens-ratio``).
SWA_FULL_TOKENS_RATIO = 0.8
# ``SlidingWindow.at_odds``'s answers.
BELOW_A_PAGE, BETWEEN_PAGES = "below a page", "between pages"


def window_slots(kv_slots: int, page_size: int, swa_kv_slots: int | None) -> int:
    """A sliding-window server's window pool: ``swa_kv_slots``, or the server's default share of
    its full pool in whole pages."""
    if swa_kv_slots is not None:
        return swa_kv_slots
    return int(kv_slots * SWA_FULL_TOKENS_RATIO) // page_size * page_size


@dataclass(frozen=True)
class SlidingWindow:
    """A hybrid sliding-window model's server (issue 34): its window (tokens a window layer attends
    to), its window pool's slots (None: SGLang's default share of the full pool) and how many
    tokens must slide out of a request's window before its window slots are freed (SGLang's
    SGLANG_SWA_EVICTION_INTERVAL, 0.5.16+; None: its default, 128)."""

    FLAT: ClassVar[dict[str, str]] = {"sliding_window": "size", "swa_kv_slots": "kv_slots",
                                      "swa_eviction_interval": "eviction_interval"}

    size: int
    kv_slots: int | None = None
    eviction_interval: int | None = None

    def slots(self, server: ServerConfig) -> int:
        """Its window pool's slots on ``server``."""
        return window_slots(server.kv_slots, server.page_size, self.kv_slots)

    def at_odds(self, page_size: int) -> str | None:
        """How the window sits against the page where window bugs live: ``BELOW_A_PAGE`` (smaller
        than one) or ``BETWEEN_PAGES`` (past one, not a whole number of them); None at page size
        1 or on a whole number of pages."""
        if page_size == 1:
            return None
        if self.size < page_size:
            return BELOW_A_PAGE
        return BETWEEN_PAGES if self.size % page_size else None

    def check(self, server: ServerConfig) -> None:
        if self.eviction_interval is not None and self.eviction_interval < 1:
            raise ValueError(f"ServerConfig.swa_eviction_interval={self.eviction_interval}: must be >= 1")
        if self.size < 1:
            raise ValueError(f"ServerConfig.sliding_window={self.size}: must be >= 1, or None for none")
        slots = self.slots(server)
        if slots < server.page_size or slots % server.page_size:
            raise ValueError(f"ServerConfig: the window pool's {slots} slots must be whole pages of "
                             f"page_size={server.page_size} (at least one)")


# A Mamba model's server caps its running requests at a third of its state slots with a prefix
# cache (SGLang's MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO, every release with a Mamba tree): a
# request's own state, the one its match copies from, and one the tree keeps.
MAMBA_SLOTS_PER_REQUEST = 3


@dataclass(frozen=True)
class MambaStates:
    """A hybrid linear (Mamba) model's server (issue 34): its recurrent-state pool's slots (SGLang's
    --max-mamba-cache-size; a request holds one while it runs, the tree keeps others; at least
    MAMBA_SLOTS_PER_REQUEST per running request, as a server caps them). Its tree caches states
    without a buffer (SGLang's "no_buffer": page size 1, the normal loop)."""

    FLAT: ClassVar[dict[str, str]] = {"mamba_slots": "slots"}

    slots: int

    def check(self, server: ServerConfig) -> None:
        if server.part(SlidingWindow) is not None:
            raise ValueError("ServerConfig: a model with both a sliding window and Mamba layers is not driven yet")
        if self.slots < MAMBA_SLOTS_PER_REQUEST * server.max_running_requests:
            raise ValueError(f"ServerConfig.mamba_slots={self.slots}: a server with a prefix cache runs at most "
                             f"one request per {MAMBA_SLOTS_PER_REQUEST} state slots "
                             f"(max_running_requests={server.max_running_requests})")
        if server.page_size != 1 or server.loop != "normal":
            raise ValueError(f"ServerConfig: a Mamba model's tree without a state buffer (no_buffer) serves page "
                             f"size 1 in the normal loop only (page_size={server.page_size}, loop={server.loop!r})")


@dataclass(frozen=True)
class HostTier:
    """A server's host tier (issue 35: --enable-hierarchical-cache): its host pool's size as a
    ratio to the device pool's (SGLang's ``--hicache-ratio``: the host pool is that many times the
    device's slots, in whole pages, and a page more), its write policy (--hicache-write-policy),
    and SGLang's file backend as a third tier (--hicache-storage-backend file). For a full-attention
    model or a Mamba model (its states backed up too)."""

    FLAT: ClassVar[dict[str, str]] = {
        "hicache_ratio": "ratio", "hicache_write_policy": "write_policy", "hicache_storage": "storage",
        "hicache_ack_delay": "ack_delay", "hicache_storage_failure": "storage_failure",
        "hicache_storage_seed": "storage_seed", "hicache_storage_failing": "storage_failing",
        "hicache_prefetch_policy": "prefetch_policy"}

    ratio: float
    write_policy: str = "write_through"
    storage: bool = False
    # The fault mode: every device-host transfer is acknowledged this many iterations late (a slow copy).
    ack_delay: int = 0
    # The storage fault mode (the nemesis): SGLang's own failure injector (0.5.23+) fails each
    # storage call with this probability, its generator seeded with ``storage_seed`` (so a run
    # replays its faults; SGLang's is unseeded), for the calls whose names start with
    # ``storage_failing`` ("": every call; "batch_get": the reads of a prefetch). A release without
    # the injector gets kvparity's faulty backend, which fails the same calls alike
    # (``engine.real.faulty_storage``).
    storage_failure: float = 0.0
    storage_seed: int = 0
    storage_failing: str = ""
    # When a prefetch from storage may end (SGLang's --hicache-storage-prefetch-policy): "wait_complete"
    # (when every page came) or "best_effort" (at the scheduler's first check, with what came: the
    # release's own early termination, drawn by the nemesis).
    prefetch_policy: str = "wait_complete"

    def check(self, server: ServerConfig) -> None:
        if self.write_policy not in HICACHE_WRITE_POLICIES:
            raise ValueError(f"ServerConfig.hicache_write_policy={self.write_policy!r}: expected one of "
                             f"{HICACHE_WRITE_POLICIES}")
        if not 0 <= self.storage_failure <= 1 or (self.storage_failure and not self.storage):
            raise ValueError(f"ServerConfig.hicache_storage_failure={self.storage_failure}: a probability, "
                             f"with a storage tier (hicache_storage)")
        if self.ack_delay < 0:
            raise ValueError(f"ServerConfig.hicache_ack_delay={self.ack_delay}: must be >= 0")
        if self.prefetch_policy not in PREFETCH_POLICIES or (self.prefetch_policy != "wait_complete" and not self.storage):
            raise ValueError(f"ServerConfig.hicache_prefetch_policy={self.prefetch_policy!r}: one of "
                             f"{PREFETCH_POLICIES}, other than wait_complete with a storage tier (hicache_storage)")
        if not self.ratio > 0:
            raise ValueError(f"ServerConfig.hicache_ratio={self.ratio}: must be > 0, or None for no host tier")
        if server.part(SlidingWindow) is not None:
            raise ValueError("ServerConfig: a host tier (hicache_ratio) is driven for full attention and Mamba models only")
        if not server.radix_cache:
            raise ValueError("ServerConfig: a host tier (hicache_ratio) needs the radix cache")


# The records a server may hold, in the order they print.
CACHE_CONFIGS: tuple[type[CacheConfig], ...] = (SlidingWindow, MambaStates, HostTier)
