"""A traffic scenario (issue 26): a server configuration and the requests arriving at each iteration
of SGLang's own scheduler loop, which then decides everything else (admission, chunking, decoding,
retraction). The second scenario form beside ``kvparity.model.scenario``'s steps, where kvparity's
own loop decides. Plain, frozen data, printable as Python (``to_python``) and as the arguments of
``kvparity.engine.real.scheduler_shell.run_traffic`` (``to_plain``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from kvparity.mem_cache.schedule_policy import POLICIES
from kvparity.model.classes import TRAFFIC_ABORTS
from kvparity.model.scenario import tokens_python
from kvparity.model.worlds import Geometry

LOOPS = ("normal", "overlap")
# The cache kinds a server may serve are registered in ``kvparity.caches``.
# The write policies of a host tier (SGLang's --hicache-write-policy).
HICACHE_WRITE_POLICIES = ("write_through", "write_back", "write_through_selective")


@dataclass(frozen=True)
class HostOffer:
    """The host tiers a release's server is driven with: whether its host pool may be smaller than
    the device's (``both``: what two releases compared both take). Every release from 0.5.3 is
    driven with every write policy and with the file storage tier, whose calls the nemesis can fail
    (SGLang's own failure injector from 0.5.23, kvparity's faulty backend before)."""

    smaller: bool = True

    def both(self, other: HostOffer) -> HostOffer:
        return HostOffer(self.smaller and other.smaller)


EVERY_HOST_TIER = HostOffer()  # what a release from 0.5.15 serves
# A sliding-window server's window pool, as a share of its full pool (SGLang's default
# ``--swa-full-tokens-ratio``).
SWA_FULL_TOKENS_RATIO = 0.8
# The context length of a traffic server (the width of its request rows; the shell's default
# ``max_context_len``): it caps every request's outputs as SGLang's ``max_req_len`` does.
MAX_CONTEXT_LEN = 4096
# A Mamba model's server caps its running requests at a third of its state slots with a prefix
# cache (SGLang's MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO, every release with a Mamba tree): a
# request's own state, the one its match copies from, and one the tree keeps.
MAMBA_SLOTS_PER_REQUEST = 3


def window_slots(kv_slots: int, page_size: int, swa_kv_slots: int | None) -> int:
    """A sliding-window server's window pool: ``swa_kv_slots``, or the server's default share of
    its full pool in whole pages."""
    if swa_kv_slots is not None:
        return swa_kv_slots
    return int(kv_slots * SWA_FULL_TOKENS_RATIO) // page_size * page_size


def table_width(requests: list[tuple[int, int]], page_size: int, max_context_len: int) -> int:
    """The ``req_to_token`` columns a traffic run's snapshots keep: every sequence of the run fits
    (``requests``: (prompt length, outputs wanted) per request), with a page to spare."""
    longest = max((prompt + outputs for prompt, outputs in requests), default=0)
    return min(max_context_len, longest + page_size)


@dataclass(frozen=True)
class ServerConfig:
    """What a server is started with, as far as the KV path and admission go (SGLang's names)."""

    schedule_policy: str = "fcfs"
    page_size: int = 1
    pool_rows: int = 8
    kv_slots: int = 1024
    max_prefill_tokens: int = 16384
    chunked_prefill_size: int | None = None  # None: chunked prefill off
    max_running_requests: int = 8
    radix_cache: bool = True
    schedule_conservativeness: float = 1.0
    loop: str = "normal"
    # The radix tree's core where a release ships two (0.5.21+, issue 48): "python" (the fallback
    # SGLang tests its Rust core against) or None (the server's default: Rust). A host tier's tree
    # runs on the Python core whatever this says.
    tree_core: str | None = None
    # A hybrid sliding-window model (issue 34): its window (tokens a window layer attends to) and its
    # window pool's slots (None: SGLang's default share of the full pool, ``SWA_FULL_TOKENS_RATIO``).
    # None: full attention only.
    sliding_window: int | None = None
    swa_kv_slots: int | None = None
    # How many tokens must slide out of a request's window before its window slots are freed
    # (SGLang's SGLANG_SWA_EVICTION_INTERVAL, 0.5.16+; None: its default, 128).
    swa_eviction_interval: int | None = None
    # A hybrid linear (Mamba) model (issue 34): its recurrent-state pool's slots (SGLang's
    # --max-mamba-cache-size; a request holds one while it runs, the tree keeps others; at least
    # MAMBA_SLOTS_PER_REQUEST per running request, as a server caps them). Its tree
    # caches states without a buffer (SGLang's "no_buffer": page size 1, the normal loop).
    # None: no Mamba layer.
    mamba_slots: int | None = None
    # A host tier (issue 35: --enable-hierarchical-cache): the host pool's size as a ratio to the
    # KV pool's (SGLang's --hicache-ratio; None: no host tier) and how it backs the device up
    # (--hicache-write-policy). Full attention, or a Mamba model (its states backed up too).
    hicache_ratio: float | None = None
    hicache_write_policy: str = "write_through"
    hicache_storage: bool = False  # SGLang's file backend as a third tier (--hicache-storage-backend file)
    # The fault mode: every device-host transfer is acknowledged this many iterations late (a slow copy).
    hicache_ack_delay: int = 0
    # The storage fault mode (the nemesis): SGLang's own failure injector (0.5.23+) fails each
    # storage call with this probability, its generator seeded with ``hicache_storage_seed`` (so a
    # run replays its faults), for the calls whose names start with ``hicache_storage_failing``
    # ("": every call; "batch_get": the reads of a prefetch). A release without the injector gets
    # kvparity's faulty backend, which fails the same calls alike (``engine.real.faulty_storage``).
    hicache_storage_failure: float = 0.0
    hicache_storage_seed: int = 0
    hicache_storage_failing: str = ""
    # When a prefetch from storage may end (SGLang's --hicache-storage-prefetch-policy): "wait_complete"
    # (when every page came) or "best_effort" (at the scheduler's first check, with what came:
    # the release's own early termination, drawn by the nemesis).
    hicache_prefetch_policy: str = "wait_complete"
    # Forced retraction (the nemesis): SGLang's own test switch (SGLANG_TEST_RETRACT, 0.5.4+) with this
    # interval: every that many forwards a decode batch retracts a request (the last of its
    # retraction order), whatever the memory, and keeps one. None: off. A release without it refuses it.
    forced_retraction: int | None = None

    @property
    def window_at_odds(self) -> str | None:
        """How the window sits against the page where window bugs live: ``BELOW_A_PAGE`` (smaller
        than one) or ``BETWEEN_PAGES`` (past one, not a whole number of them); None without a
        window, at page size 1, or on a whole number of pages."""
        window, page = self.sliding_window, self.page_size
        if window is None or page == 1:
            return None
        if window < page:
            return BELOW_A_PAGE
        return BETWEEN_PAGES if window % page else None

    @property
    def window_slots(self) -> int | None:
        """The window pool's slots (None without a window)."""
        return None if self.sliding_window is None else window_slots(self.kv_slots, self.page_size, self.swa_kv_slots)

    def to_plain(self) -> dict[str, Any]:
        """As plain data, every field named (what crosses to a worker and into a verdict's JSON)."""
        return asdict(self)

    @classmethod
    def from_plain(cls, data: Mapping[str, Any]) -> ServerConfig:
        """``to_plain``'s inverse: a field left out takes this record's default (the one set of
        defaults, on either side of a worker); a name that is no field is refused by name."""
        unknown = sorted(set(data) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"ServerConfig has no field {', '.join(map(repr, unknown))}")
        return cls(**data)

    def __post_init__(self) -> None:
        if self.schedule_policy not in POLICIES:
            raise ValueError(f"ServerConfig.schedule_policy={self.schedule_policy!r}: expected one of {POLICIES}")
        if self.loop not in LOOPS:
            raise ValueError(f"ServerConfig.loop={self.loop!r}: expected one of {LOOPS}")
        if self.tree_core not in (None, "python"):
            raise ValueError(f"ServerConfig.tree_core={self.tree_core!r}: \"python\", or None for the server's default")
        for name in ("page_size", "pool_rows", "kv_slots", "max_prefill_tokens", "max_running_requests"):
            if getattr(self, name) < 1:
                raise ValueError(f"ServerConfig.{name}={getattr(self, name)}: must be >= 1")
        if self.max_running_requests > self.pool_rows:
            # SGLang sizes its request pool from --max-running-requests: it never admits past the rows.
            raise ValueError(f"ServerConfig.max_running_requests={self.max_running_requests} is more than "
                             f"pool_rows={self.pool_rows}")
        if self.chunked_prefill_size is not None and self.chunked_prefill_size < 1:
            raise ValueError(f"ServerConfig.chunked_prefill_size={self.chunked_prefill_size}: >= 1, or None for off")
        if self.forced_retraction is not None and self.forced_retraction < 1:
            raise ValueError(f"ServerConfig.forced_retraction={self.forced_retraction}: an interval >= 1, or None for off")
        self._check_window()
        self._check_mamba()
        self._check_host_tier()

    def _check_host_tier(self) -> None:
        if self.hicache_write_policy not in HICACHE_WRITE_POLICIES:
            raise ValueError(f"ServerConfig.hicache_write_policy={self.hicache_write_policy!r}: expected one of "
                             f"{HICACHE_WRITE_POLICIES}")
        if not 0 <= self.hicache_storage_failure <= 1 or (self.hicache_storage_failure and not self.hicache_storage):
            raise ValueError(f"ServerConfig.hicache_storage_failure={self.hicache_storage_failure}: a probability, "
                             f"with a storage tier (hicache_storage)")
        if self.hicache_ack_delay < 0:
            raise ValueError(f"ServerConfig.hicache_ack_delay={self.hicache_ack_delay}: must be >= 0")
        if self.hicache_prefetch_policy not in PREFETCH_POLICIES or (
                self.hicache_prefetch_policy != "wait_complete" and not self.hicache_storage):
            raise ValueError(f"ServerConfig.hicache_prefetch_policy={self.hicache_prefetch_policy!r}: one of "
                             f"{PREFETCH_POLICIES}, other than wait_complete with a storage tier (hicache_storage)")
        if self.hicache_ratio is None:
            if self.hicache_storage or self.hicache_ack_delay:
                raise ValueError("ServerConfig: a storage tier or a transfer delay needs a host tier (hicache_ratio)")
            return
        if not self.hicache_ratio > 0:
            raise ValueError(f"ServerConfig.hicache_ratio={self.hicache_ratio}: must be > 0, or None for no host tier")
        if self.sliding_window is not None:
            raise ValueError("ServerConfig: a host tier (hicache_ratio) is driven for full attention and Mamba models only")
        if not self.radix_cache:
            raise ValueError("ServerConfig: a host tier (hicache_ratio) needs the radix cache")

    def _check_mamba(self) -> None:
        if self.mamba_slots is None:
            return
        if self.sliding_window is not None:
            raise ValueError("ServerConfig: a model with both a sliding window and Mamba layers is not driven yet")
        if self.mamba_slots < MAMBA_SLOTS_PER_REQUEST * self.max_running_requests:
            raise ValueError(f"ServerConfig.mamba_slots={self.mamba_slots}: a server with a prefix cache runs at most "
                             f"one request per {MAMBA_SLOTS_PER_REQUEST} state slots "
                             f"(max_running_requests={self.max_running_requests})")
        if self.page_size != 1 or self.loop != "normal":
            raise ValueError(f"ServerConfig: a Mamba model's tree without a state buffer (no_buffer) serves page "
                             f"size 1 in the normal loop only (page_size={self.page_size}, loop={self.loop!r})")

    def _check_window(self) -> None:
        if self.sliding_window is None:
            for name in ("swa_kv_slots", "swa_eviction_interval"):
                if getattr(self, name) is not None:
                    raise ValueError(f"ServerConfig.{name}={getattr(self, name)}: needs sliding_window")
            return
        if self.swa_eviction_interval is not None and self.swa_eviction_interval < 1:
            raise ValueError(f"ServerConfig.swa_eviction_interval={self.swa_eviction_interval}: must be >= 1")
        if self.sliding_window < 1:
            raise ValueError(f"ServerConfig.sliding_window={self.sliding_window}: must be >= 1, or None for none")
        slots = self.window_slots
        if slots is None or slots < self.page_size or slots % self.page_size:
            raise ValueError(f"ServerConfig: the window pool's {slots} slots must be whole pages of "
                             f"page_size={self.page_size} (at least one)")


@dataclass(frozen=True)
class Arrival:
    rid: str
    tokens: tuple[int, ...]
    max_new_tokens: int = 4

    def __post_init__(self) -> None:
        if not self.tokens:
            raise ValueError(f"request {self.rid!r}: a prompt needs at least one token")
        if self.max_new_tokens < 1:
            raise ValueError(f"request {self.rid!r}: max_new_tokens={self.max_new_tokens} must be >= 1")

    def to_plain(self) -> dict[str, Any]:
        return {"rid": self.rid, "tokens": list(self.tokens), "max_new_tokens": self.max_new_tokens}


# The prefetch policies kvparity drives (SGLang's "timeout" reads the wall clock: no run would replay).
PREFETCH_POLICIES = ("wait_complete", "best_effort")
# ``ServerConfig.window_at_odds``'s answers.
BELOW_A_PAGE, BETWEEN_PAGES = "below a page", "between pages"
# ``TrafficScenario.abort_when``'s request that stands for any: the first found in the state.
ANY_REQUEST = "*"


@dataclass(frozen=True)
class TrafficScenario:
    config: ServerConfig
    arrivals: tuple[tuple[Arrival, ...], ...] = field(default=())  # per iteration, in arrival order
    # The nemesis: per iteration, the requests whose client disconnects at that pass's start (after
    # its arrivals), sent through SGLang's own abort path as its tokenizer manager sends it
    # (``Scheduler.abort_request(AbortReq(rid=...))``). A request is aborted at most once.
    aborts: tuple[tuple[str, ...], ...] = field(default=())
    # The nemesis's aborts on a state: (rid, state) - the request's client disconnects at the start
    # of the first pass that finds it in that state of its life (a key of ``TRAFFIC_ABORTS``: between
    # chunks, decoding, retracted, ...), if one does. Armed from the request's arrival; one for
    # ``ANY_REQUEST`` is armed with the last arrivals (the burst, after the warm-up that fills the
    # tree and the storage) and takes the first request (in arrival order) found so.
    abort_when: tuple[tuple[str, str], ...] = field(default=())

    def __post_init__(self) -> None:
        rids = [a.rid for group in self.arrivals for a in group]
        if len(set(rids)) != len(rids):
            raise ValueError(f"TrafficScenario: duplicate request ids in {rids}")
        for rid, state in self.abort_when:
            if rid not in rids and rid != ANY_REQUEST:
                raise ValueError(f"TrafficScenario: request {rid!r} is aborted when {state!r}, but never arrives")
            if state not in TRAFFIC_ABORTS:
                raise ValueError(f"TrafficScenario: request {rid!r} is aborted when {state!r}: expected one of "
                                 f"{tuple(TRAFFIC_ABORTS)}")
        aborted = [rid for group in self.aborts for rid in group] + \
            [rid for rid, _ in self.abort_when if rid != ANY_REQUEST]
        arrived_at = {a.rid: i for i, group in enumerate(self.arrivals) for a in group}
        for i, group in enumerate(self.aborts):
            for rid in group:
                if arrived_at.get(rid, i + 1) > i:
                    raise ValueError(f"TrafficScenario: request {rid!r} is aborted at iteration {i}, before it arrives")
        if len(set(aborted)) != len(aborted):
            raise ValueError(f"TrafficScenario: a request is aborted twice in {aborted}")

    @property
    def iterations(self) -> int:
        """The iterations that receive something (an arrival or an abort)."""
        return max(len(self.arrivals), len(self.aborts))

    def to_plain(self) -> tuple[dict[str, Any], list[list[dict[str, Any]]]]:
        """``run_traffic``'s ``config`` and ``arrivals``: per iteration, the arrivals, then the
        aborts on a state armed there (``{"abort": rid, "when": state}``, at the request's
        arrival; for any request, at the last arrivals), then the aborts (``{"abort": rid}``)."""
        groups: list[list[dict[str, Any]]] = [[] for _ in range(self.iterations)]
        when = dict(self.abort_when)
        last = max((i for i, group in enumerate(self.arrivals) if group), default=0)
        for i, group in enumerate(self.arrivals):
            groups[i] += [a.to_plain() for a in group]
            groups[i] += [{"abort": a.rid, "when": when[a.rid]} for a in group if a.rid in when]
        groups[last] += [{"abort": rid, "when": state} for rid, state in self.abort_when if rid == ANY_REQUEST]
        for i, rids in enumerate(self.aborts):
            groups[i] += [{"abort": rid} for rid in rids]
        return self.config.to_plain(), groups

    def table_width(self, max_context_len: int) -> int:
        return table_width([(len(a.tokens), a.max_new_tokens) for group in self.arrivals for a in group],
                           self.config.page_size, max_context_len)

    def to_python(self) -> str:
        """Python source that rebuilds this scenario (``from kvparity.model.traffic import *``)."""
        defaults = ServerConfig()
        knobs = [f"{k}={v!r}" for k, v in asdict(self.config).items() if v != getattr(defaults, k)]
        lines = [f"TrafficScenario(ServerConfig({', '.join(knobs)}), ("]
        for group in self.arrivals:
            shown = ", ".join(f"Arrival({a.rid!r}, {tokens_python(a.tokens)}, {a.max_new_tokens})" for a in group)
            lines.append(f"    ({shown}{',' if len(group) == 1 else ''}),")
        nemesis = "".join(f", {name}={getattr(self, name)!r}" for name in ("aborts", "abort_when") if getattr(self, name))
        return "\n".join(lines + [f"){nemesis})"])



def traffic_geometry(scenario: TrafficScenario) -> Geometry:
    """The pools a traffic world is built with (rows of ``MAX_CONTEXT_LEN``)."""
    c = scenario.config
    return Geometry(pool_rows=c.pool_rows, max_context_len=MAX_CONTEXT_LEN, kv_slots=c.kv_slots, page_size=c.page_size)


def traffic_to_dict(scenario: TrafficScenario) -> dict[str, Any]:
    """A traffic scenario as JSON-ready data, marked as one (``--replay`` tells the two forms apart)."""
    config = scenario.config.to_plain()
    arrivals = [[a.to_plain() for a in group] for group in scenario.arrivals]
    body: dict[str, Any] = {"config": config, "arrivals": arrivals}
    if scenario.aborts:
        body["aborts"] = [list(group) for group in scenario.aborts]
    if scenario.abort_when:
        body["abort_when"] = [list(pair) for pair in scenario.abort_when]
    return {"traffic": body}


def is_traffic_dict(data: Any) -> bool:
    return isinstance(data, dict) and set(data) == {"traffic"}


def traffic_from_dict(data: dict[str, Any]) -> TrafficScenario:
    """``traffic_to_dict``'s inverse; a ValueError or TypeError names what is wrong."""
    body = data["traffic"]
    config = ServerConfig.from_plain(body["config"])
    arrivals = tuple(tuple(Arrival(str(a["rid"]), tuple(int(t) for t in a["tokens"]), int(a["max_new_tokens"]))
                           for a in group) for group in body["arrivals"])
    aborts = tuple(tuple(str(rid) for rid in group) for group in body.get("aborts", ()))
    when = tuple((str(rid), str(state)) for rid, state in body.get("abort_when", ()))
    return TrafficScenario(config, arrivals, aborts, when)
