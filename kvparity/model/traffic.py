"""A traffic scenario (issue 26): a server configuration and the requests arriving at each iteration
of SGLang's own scheduler loop, which then decides everything else (admission, chunking, decoding,
retraction). The second scenario form beside ``kvparity.model.scenario``'s steps, where kvparity's
own loop decides. Plain, frozen data, printable as Python (``to_python``) and as the arguments of
``kvparity.engine.real.scheduler_shell.run_traffic`` (``to_plain``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from kvparity.mem_cache.schedule_policy import POLICIES
from kvparity.model.cache_configs import (
    CACHE_CONFIGS,
    CacheConfig,
    Part,
    absent_fields,
    cache_parts,
    flat_owner,
    part_of,
    printed_fields,
)
from kvparity.model.classes import TRAFFIC_ABORTS
from kvparity.model.scenario import tokens_python
from kvparity.model.worlds import Geometry

LOOPS = ("normal", "overlap")


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
# The context length of a traffic server (the width of its request rows; the shell's default
# ``max_context_len``): it caps every request's outputs as SGLang's ``max_req_len`` does.
MAX_CONTEXT_LEN = 4096


def table_width(requests: list[tuple[int, int]], page_size: int, max_context_len: int) -> int:
    """The ``req_to_token`` columns a traffic run's snapshots keep: every sequence of the run fits
    (``requests``: (prompt length, outputs wanted) per request), with a page to spare."""
    longest = max((prompt + outputs for prompt, outputs in requests), default=0)
    return min(max_context_len, longest + page_size)


@dataclass(frozen=True, init=False, repr=False)
class ServerConfig:
    """What a server is started with, as far as the KV path and admission go (SGLang's names):
    full attention's pool and scheduler, and ``caches``, what it has beside them (one record per
    kind, in ``CACHE_CONFIGS``'s order). Built, printed (``to_python``) and carried as plain data
    (``to_plain``) with the caches' fields flat among its own, under SGLang's names, as a server's
    arguments are; ``part`` reads one cache's record."""

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
    # Its caches beside full attention's (``kvparity.caches``' records), printed flat here.
    caches: tuple[CacheConfig, ...] = ()
    # Forced retraction (the nemesis): SGLang's own test switch (SGLANG_TEST_RETRACT, 0.5.4+) with this
    # interval: every that many forwards a decode batch retracts a request (the last of its
    # retraction order), whatever the memory, and keeps one. None: off. A release without it refuses it.
    forced_retraction: int | None = None

    def __init__(self, *, caches: tuple[CacheConfig, ...] = (), **knobs: Any) -> None:
        own = {f.name: f.default for f in fields(self) if f.name != "caches"}
        for name, default in own.items():
            object.__setattr__(self, name, knobs.get(name, default))
        # The rest are the caches' printed fields (``cache_parts`` refuses a name that is none).
        object.__setattr__(self, "caches", cache_parts({k: v for k, v in knobs.items() if k not in own}, caches))
        self.__post_init__()

    def with_part(self, part: CacheConfig, **changes: Any) -> ServerConfig:
        """This server holding ``part`` (in place of its cache of that kind), with its own fields
        ``changes``."""
        return replace(self, caches=(*(p for p in self.caches if type(p) is not type(part)), part), **changes)

    def with_printed(self, **knobs: Any) -> ServerConfig:
        """This server with fields changed by their printed names, its caches' among them
        (``hicache_ack_delay=1``): for what draws a cache's fields without naming its kind."""
        return ServerConfig(**(self.to_plain() | knobs))

    def part(self, record: type[Part]) -> Part | None:
        """This server's cache of ``record``'s kind (None: it has none)."""
        return part_of(self.caches, record)

    def __getattr__(self, name: str) -> Any:
        """A cache's field by its printed name (None as the first where the server has none of it):
        the flat form this server is written in."""
        record = flat_owner().get(name)
        if record is None:
            raise AttributeError(f"ServerConfig has no field {name!r}")
        part = self.part(record)
        return absent_fields(record)[name] if part is None else getattr(part, record.FLAT[name])

    def __repr__(self) -> str:
        return f"ServerConfig({', '.join(f'{k}={v!r}' for k, v in self.to_plain().items())})"

    def to_plain(self) -> dict[str, Any]:
        """As plain data, every field named, the caches' flat in their place (what crosses to a
        worker and into a verdict's JSON)."""
        plain: dict[str, Any] = {}
        for f in fields(self):
            if f.name != "caches":
                plain[f.name] = getattr(self, f.name)
                continue
            for record in CACHE_CONFIGS:
                part = self.part(record)
                plain |= absent_fields(record) if part is None else printed_fields(part)
        return plain

    @classmethod
    def from_plain(cls, data: Mapping[str, Any]) -> ServerConfig:
        """``to_plain``'s inverse: a field left out takes this record's default (the one set of
        defaults, on either side of a worker); a name that is no field is refused by name."""
        try:
            return cls(**data)
        except TypeError as exc:
            raise ValueError(str(exc)) from None

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
        for part in self.caches:
            part.check(self)


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
        default = ServerConfig().to_plain()
        knobs = [f"{k}={v!r}" for k, v in self.config.to_plain().items() if v != default[k]]
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
