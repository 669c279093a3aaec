"""Hypothesis strategies for traffic scenarios (``kvparity.model.traffic``): a few requests arrive
one at a time and finish, filling the radix tree; then a burst arrives together, cuts of those
prompts (often ending at, or one short of, a cached end) with tokens of their own, under a prefill
budget small enough that admission stops on it. Everything shrinks towards one short burst.

About one scenario in three is under memory pressure: few KV slots, admission reserving less of
the outputs to come (``--schedule-conservativeness 0.3``) and a burst with long outputs, so that
decoding runs out of memory and SGLang retracts (at the default conservativeness 1.0 its admission
keeps enough back that it never does)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Protocol

from hypothesis import strategies as st

from kvparity.mem_cache.schedule_policy import POLICIES
from kvparity.model.cache_configs import PREFETCH_POLICIES
from kvparity.model.traffic import (
    ANY_REQUEST,
    EVERY_HOST_TIER,
    Arrival,
    HostOffer,
    ServerConfig,
    TrafficScenario,
)

_STEM = 60


@st.composite
def server_configs(draw: Any, policies: tuple[str, ...] = POLICIES, pressure: bool = False,
                   chunks_first: bool = False, long_chunks: bool = False) -> ServerConfig:
    """``chunks_first``: chunked prefill is the simplest draw (the nemesis's: an abort between
    chunks). Chunks of 2 to 8 pages; ``long_chunks``: of 16 to 48 tokens (a host tier's storage:
    SGLang 0.5.23 fetches nothing of a prefix its tree took in chunks of 8 tokens, and does of 16)."""
    page_size = 1 if pressure else draw(st.sampled_from((1, 4)))  # long decodes: cheap at page size 1
    rows = 8 if pressure else draw(st.integers(4, 8))
    chunk = st.integers(4, 12).map(lambda n: n * 4) if long_chunks else st.integers(2, 8).map(lambda n: n * page_size)
    chunked = draw(st.one_of(chunk, st.none()) if chunks_first else st.one_of(st.none(), chunk))
    return ServerConfig(
        schedule_policy=draw(st.sampled_from(policies)),
        page_size=page_size,
        pool_rows=rows,
        kv_slots=draw(st.sampled_from((128, 160) if pressure else (256, 512, 1024))),
        max_prefill_tokens=draw(st.sampled_from((256, 4096)) if pressure else st.integers(4, 32)),
        chunked_prefill_size=chunked,
        max_running_requests=rows,
        schedule_conservativeness=0.3 if pressure else draw(st.sampled_from((1.0, 0.3))),
    )


@dataclass(frozen=True)
class ServeOptions:
    """What a drive lets a cache kind's server take: a sliding-window model's page sizes
    ``window_pages``, the host tiers ``host_offer`` allows, and whether the nemesis plays (a host
    tier then always has its storage tier, where the nemesis's faults are)."""

    window_pages: tuple[int, ...] = (1, 4)
    host_offer: HostOffer = EVERY_HOST_TIER
    nemesis: bool = False


class ServedKind(Protocol):
    """The part of a cache kind (``kvparity.caches``) a traffic scenario is drawn with."""

    @property
    def host_tier(self) -> bool: ...

    def serve(self, draw: Any, config: ServerConfig, options: ServeOptions) -> ServerConfig: ...


def _fillers(draw: Any, config: ServerConfig, fetching: bool = False) -> list[tuple[Arrival, ...]]:
    """A host tier's run: prompts of their own between the warm-up and the burst, one at a time,
    whose KV (from half the device pool to half as much again) pushes the warm-up's out of the
    device, onto the host, where the burst's hits find it (or, the host full, evicted from there);
    with a storage tier, twice as many, so that the host, too, lets the warm-up's KV go (to
    storage, where the burst's hits find it) and holds KV of their own it can evict for a fetch.
    ``fetching``: ``_fetching_fillers``."""
    if fetching:
        return _fetching_fillers(draw, config)
    kv_slots = config.kv_slots
    count = draw(st.integers(4, 6) if config.hicache_storage else st.integers(2, 3))
    lengths = [draw(st.integers(kv_slots // 4, kv_slots // 2)) for _ in range(count)]
    return _filler_arrivals(lengths)


def _filler_arrivals(lengths: list[int]) -> list[tuple[Arrival, ...]]:
    return [(Arrival(f"f{k}", tuple(range(200_000 + 1000 * k, 200_000 + 1000 * k + n)), 1),)
            for k, n in enumerate(lengths)]


def _fetching_fillers(draw: Any, config: ServerConfig) -> list[tuple[Arrival, ...]]:
    """The nemesis's storage tier (whose reads it fails or cuts short): fillers of a quarter to half
    a device pool each (half the simplest draw), as many as hold the device's and the host's slots
    and half a device pool more, whatever lengths were drawn, so that the warm-up's KV is in
    storage alone; then idle passes until every filler has finished (one per chunk of each), so
    that the burst finds no filler waiting: under lpm it would be admitted before them, while its
    prefix is still on the device or the host (traced on 0.5.23: lpm fetched from storage in 6 of
    40 scenarios, fcfs in 14, and where nothing is fetched, no read fails and no prefetch is cut)."""
    kv_slots = config.kv_slots
    room = kv_slots + int(kv_slots * (config.hicache_ratio or 0)) + kv_slots // 2
    lengths: list[int] = []
    while sum(lengths) < room:
        lengths.append(draw(st.integers(kv_slots // 4, kv_slots // 2).map(lambda n: kv_slots // 2 + kv_slots // 4 - n)))
    if sum(lengths) % 2:  # a stable half of the scenarios, as ``_core_of``'s
        return _filler_arrivals(lengths)
    chunk = config.chunked_prefill_size
    passes = sum(-(-n // chunk) if chunk else 1 for n in lengths)
    return _filler_arrivals(lengths) + [()] * (passes - len(lengths) + FILLERS_DRAINED)


def _last_filler_holding(arrivals: list[tuple[Arrival, ...]], config: ServerConfig) -> list[tuple[Arrival, ...]]:
    """The nemesis's host tier, half the time: the last filler decodes for half a device pool, so
    that it holds the device while the burst's hits wait on the host, whatever the policy ranks
    first (``_host_hits``)."""
    last = max(i for i, group in enumerate(arrivals) if group)
    (filler,) = arrivals[last]
    holding = dataclasses.replace(filler, max_new_tokens=config.kv_slots // 2)
    return [*arrivals[:last], (holding,), *arrivals[last + 1:]]


# Tokens of its own past a warm-up prompt, for a host hit of the burst's (``_host_hits``).
HIT_OWN = 4


def _host_hits(draw: Any, cached: list[tuple[int, ...]], stems: list[tuple[int, ...]]) -> list[Arrival]:
    """The nemesis's host tier: the burst opens with a hit on each stem's longest warm-up prompt
    and tokens of its own (where a Mamba model's tree keeps a state: a hit on the prompt alone
    ends a token short, on no state). The two share nothing, so that under lpm, which admits the
    longer hit first, the other finds the device taken by it (or by the holding filler): its
    load-back refused. Traced on 0.5.23, a Mamba model's host tier under lpm: a refused load-back
    in 0 of 40 scenarios without these three (2 with the kind checked alone), 5 with them (10
    alone); each other host-tier class stays at 5 of 40 or more."""
    hits = []
    for k, stem in enumerate(stems):
        longest = max((p for p in cached if p[0] == stem[0]), key=len)
        own = tuple(range(60_000 + 100 * k, 60_000 + 100 * k + HIT_OWN))
        hits.append(Arrival(f"w{k}", longest + own, draw(_OUTPUTS_DECODING_FIRST)))
    return hits


# The nemesis's fetching request (``traffic_scenarios``), the pass after the burst: it fetches the
# first warm-up prompt from storage, and its load-back may then find the device taken by the burst
# (refused load-backs in a host tier's tasks: 5 to 9 of 40 with it first in the burst, 9 to 18
# after). Its tokens of its own, past a whole warm-up prompt, whose end is where a Mamba model's
# tree keeps a state (a hit on a Mamba model's prefix ends on a kept state: traced on 0.5.23, a
# Mamba model's host tier fetched in 2 to 6 scenarios of 40 without it). No abort names it (an abort
# at arrival, the simplest delay, would end every fetch); an abort on a state takes it as any.
FETCHER_OWN = tuple(range(80_000, 80_004))
FETCHER = "s"
FETCHER_OUTPUTS = 2
# Idle passes past a filler's last chunk before the burst: its backup to the host acknowledged
# (up to ``LATE_ACKNOWLEDGEMENTS`` late) and its finish seen.
FILLERS_DRAINED = 3


@st.composite
def traffic_scenarios(draw: Any, policies: tuple[str, ...] = POLICIES, kind: ServedKind | None = None,
                      options: ServeOptions = ServeOptions(), two_cores: bool = False,
                      forced_retraction: bool = False) -> TrafficScenario:
    """``kind``: the cache kind served (``kvparity.caches``; None: full attention), its server
    drawn under ``options`` (with ``options.nemesis``, clients abort requests too: both players
    take aborts); ``two_cores``: both releases ship the Rust and the Python radix-tree core
    (0.5.21+), the Python one played in about half the scenarios (a host tier runs on it always)."""
    nemesis = options.nemesis
    pressure = draw(st.sampled_from((False, True, False)))
    # Chunks first for the nemesis's aborts between them (long enough for a host tier's storage).
    long_chunks = nemesis and kind is not None and kind.host_tier
    config = draw(server_configs(policies, pressure, chunks_first=nemesis, long_chunks=long_chunks))
    if kind is not None:
        config = kind.serve(draw, config, options)
    stems = [tuple(range(100_000 * (k + 1), 100_000 * (k + 1) + _STEM)) for k in range(2)]
    # The nemesis's storage tier: the warm-up's prompts whole first (long enough to fetch back).
    fetching = nemesis and config.hicache_storage
    length = st.integers(4, _STEM).map(lambda n: _STEM + 4 - n) if fetching else st.integers(4, _STEM)
    cached = [draw(st.sampled_from(stems))[: draw(length)] for _ in range(draw(st.integers(1, 3)))]
    host = config.hicache_ratio is not None
    host_nemesis = nemesis and host
    if host_nemesis:  # a prompt of each stem: two host hits that share nothing (``_host_hits``)
        cached += [stem[: draw(length)] for stem in stems if all(p[0] != stem[0] for p in cached)]
    arrivals: list[tuple[Arrival, ...]] = [(Arrival(f"c{i}", p, 1),) for i, p in enumerate(cached)]
    arrivals.append(())  # an idle iteration: the warm-up has finished
    if host:
        arrivals += _fillers(draw, config, fetching)
    if host_nemesis and draw(st.booleans()):
        arrivals = _last_filler_holding(arrivals, config)
    burst = _host_hits(draw, cached, stems) if host_nemesis else []
    if not pressure and draw(st.booleans()):
        # The shape pull request #11200's ranking key tells apart: a cached prompt cut one short with
        # tokens of its own, then the cached prompt itself (the old key caps both matches at len-1).
        base = draw(st.sampled_from(cached))
        own = tuple(range(90_000, 90_000 + draw(st.integers(1, 12))))
        burst += [Arrival("t0", base[:-1] + own, draw(st.integers(1, 6))), Arrival("t1", base, draw(st.integers(1, 6)))]
    for i in range(draw(st.integers(6, 8) if pressure else st.integers(2, 6))):
        base = draw(st.sampled_from(cached))
        cut = draw(st.sampled_from((len(base), len(base) - 1, draw(st.integers(0, len(base))))))
        if pressure:  # little shared: every request needs its own slots
            cut = min(cut, 4)
            own_len = draw(st.integers(16, 32))
        else:  # half of them none: a prompt that is (a cut of) a cached one exactly
            own_len = draw(st.sampled_from((0, draw(st.integers(1, 12))))) if cut else draw(st.integers(1, 12))
        own = tuple(range(10_000 * (i + 1), 10_000 * (i + 1) + own_len))
        outputs = draw(st.integers(32, 48) if pressure else _OUTPUTS_DECODING_FIRST if nemesis else st.integers(1, 6))
        burst.append(Arrival(f"r{i}", base[:cut] + own, outputs))
    arrivals.append(tuple(burst))
    aborts, when = draw(_aborts(burst, len(arrivals) - 1, host, config.hicache_storage)) if nemesis else ((), ())
    if fetching:  # then a request that fetches: the first warm-up prompt (the first the host evicted), and more
        arrivals.append((Arrival(FETCHER, cached[0] + FETCHER_OWN, FETCHER_OUTPUTS),))
    if nemesis:
        config = draw(_server_faults(config, pressure, forced_retraction))
    if two_cores and config.hicache_ratio is None:
        config = dataclasses.replace(config, tree_core=_core_of(arrivals))
    return TrafficScenario(config, tuple(arrivals), aborts, when)


@st.composite
def _server_faults(draw: Any, config: ServerConfig, pressure: bool, forced_retraction: bool) -> ServerConfig:
    """The nemesis's faults of the server, drawn last (the traffic does not depend on them):
    Hypothesis plays variations of a task's first few scenarios, varying their last draws most, so
    that faults drawn with the server would fall alike in most of a task (a drawn choice came out 1
    in 40). Half the time three request rows (a burst left waiting with every row taken; two with a
    host tier, whose waiting requests fetch from storage; four under pressure, whose burst of six to
    eight still runs out of slots); half the time SGLang's forced retraction where the releases
    have it, every 2 or 3 forwards; with a host tier, half the time its transfers acknowledged late
    (``LATE_ACKNOWLEDGEMENTS``); a storage tier's faults (``_storage_faults``)."""
    if not draw(st.booleans()):
        rows = 4 if pressure else 2 if config.hicache_ratio is not None else 3
        config = dataclasses.replace(config, pool_rows=rows, max_running_requests=rows)
    if forced_retraction and not draw(st.booleans()):
        config = dataclasses.replace(config, forced_retraction=draw(st.sampled_from(FORCED_RETRACTION_INTERVALS)))
    if config.hicache_ratio is not None and not draw(st.booleans()):
        config = config.with_printed(hicache_ack_delay=draw(st.sampled_from(LATE_ACKNOWLEDGEMENTS)))
    return draw(_storage_faults(config)) if config.hicache_storage else config


# How many passes late a host tier's transfers are acknowledged under the nemesis (half the time):
# a load-back still listed when the next pass's aborts come, a backup still locking its node.
LATE_ACKNOWLEDGEMENTS = (2, 1)


# The storage calls the nemesis fails (by the start of their names): the reads of a prefetch first
# (a failed read), the backups (a failed backup: what the tree wrote is not there to fetch), any
# call (the hit query too: a prefix not found). Reads in two draws of four: a tier failing its
# backups or any call fails the backups and queries that come first, so its fetches find little to
# read (traced on 0.5.23: failing every call, no read was made), and in shards of 10 reads failed in
# 1 to 6 scenarios of 40 with reads one draw of three.
STORAGE_FAILING = ("batch_get", "batch_set", "batch_get", "")


@st.composite
def _storage_faults(draw: Any, config: ServerConfig) -> ServerConfig:
    """A storage tier under the nemesis (SGLang's failure injector from 0.5.23, kvparity's faulty
    backend before): the release's own early end of a prefetch first (best_effort); in three tiers
    in four some of the calls ``STORAGE_FAILING`` names fail, from a drawn seed: every one first
    (the simplest draw, which each shard of a task plays: reads named first, every read fails), then
    a half or a quarter of them (a fetch that brings some of its pages)."""
    config = config.with_printed(hicache_prefetch_policy=draw(st.sampled_from(PREFETCH_POLICIES[::-1])))
    failure = draw(st.sampled_from((1.0, 0.5, 0.25, 0.0)))
    if not failure:
        return config
    return config.with_printed(hicache_storage_failure=failure, hicache_storage_seed=draw(st.integers(0, 2**16 - 1)),
                              hicache_storage_failing=draw(st.sampled_from(STORAGE_FAILING)))


def _core_of(arrivals: list[tuple[Arrival, ...]]) -> str | None:
    """The Python core for a scenario whose prompts hold an odd number of tokens, else the server's
    default: a stable half of the scenarios whatever Hypothesis favours in a task's few draws (a
    drawn choice came out 1 in 40 in some derandomized tasks)."""
    return "python" if sum(len(a.tokens) for group in arrivals for a in group) % 2 else None


# A burst request's outputs under the nemesis: the simplest draw decodes (an abort while decoding, a
# retraction; at 1 a request finishes at its prefill).
_OUTPUTS_DECODING_FIRST = st.sampled_from((6, 1, 2, 3, 4, 5))
# The nemesis's forced retraction (SGLang's SGLANG_TEST_RETRACT_INTERVAL): a decode batch retracts a
# request every 2 or 3 forwards (half the time: ``_server_faults``).
FORCED_RETRACTION_INTERVALS = (2, 3)


# How many iterations after its arrival a client aborts a request: 0 while it waits (the abort comes
# in the pass it arrives in, after it is queued); a few, between chunks or right after its prefill;
# more, while it decodes or after it was retracted (the pressured scenarios' long outputs).
ABORT_DELAYS = (0, 1, 2, 3, 5, 8, 13, 21)


# The states an abort waits for (``TrafficScenario.abort_when``): those a drawn delay rarely meets.
ABORT_ON_STATES = ("between chunks", "retracted", "decoding", "prefilled")
# With a host tier, a held request whose prefix the tree is loading back from the host; with a
# storage tier too (the nemesis's host tiers always have one), a waiting request whose prefix the
# tree is fetching from storage.
HOST_ABORT_STATES = (*ABORT_ON_STATES, "loading back")
STORAGE_ABORT_STATES = (*HOST_ABORT_STATES, "prefetching")
# The states an abort armed for any request always waits for (the others half the time): the
# rarest to meet, a chunked request, a retracted one and a load-back still listed (late
# acknowledgements), each reached in 0 to 3 of 40 scenarios of some tasks when armed half the time.
ALWAYS_ARMED = ("between chunks", "retracted", "loading back")


@st.composite
def _aborts(draw: Any, burst: list[Arrival], arrival: int, host: bool = False, storage: bool = False
            ) -> tuple[tuple[tuple[str, ...], ...], tuple[tuple[str, str], ...]]:
    """The nemesis's client aborts (none in a quarter of scenarios): some of the burst's requests,
    each at a drawn delay after the burst's iteration ``arrival`` or, as often, on a drawn state
    of its life (the first pass that finds it there); and, for each state of ``ABORT_ON_STATES``
    (``HOST_ABORT_STATES`` with a ``host`` tier, ``STORAGE_ABORT_STATES`` with its ``storage``
    tier) half the time (``prefetching`` a quarter, ``ALWAYS_ARMED`` always), the first request of any found in it
    (``ANY_REQUEST``: a retraction or a chunk, wherever it falls). Returns (``aborts``,
    ``abort_when``)."""
    # Each choice's simplest draw (the first, the smallest, False) is the fault: Hypothesis draws
    # simplest first, and a derandomized task of 40 draws many such.
    if not burst or draw(st.integers(0, 3)) == 3:
        return (), ()
    chosen = draw(st.lists(st.sampled_from([a.rid for a in burst]), min_size=1, max_size=3, unique=True))
    states = STORAGE_ABORT_STATES if storage else HOST_ABORT_STATES if host else ABORT_ON_STATES
    on_state = {rid: draw(st.sampled_from(states)) for rid in chosen if draw(st.booleans())}
    at = {rid: arrival + draw(st.sampled_from(ABORT_DELAYS)) for rid in chosen if rid not in on_state}
    groups: list[tuple[str, ...]] = [() for _ in range(max(at.values(), default=-1) + 1)]
    for rid, i in sorted(at.items(), key=lambda item: item[1]):
        groups[i] += (rid,)
    # An abort while prefetching, armed for any request, half as often again and not in the
    # simplest draw: it takes the first fetch from storage, and with it the scenario's fetch (the
    # reads the nemesis fails or cuts short).
    anyone = tuple((ANY_REQUEST, state) for state in states if state in ALWAYS_ARMED
                   or not draw(st.booleans()) and (state != "prefetching" or draw(st.booleans())))
    return tuple(groups), tuple(on_state.items()) + anyone
