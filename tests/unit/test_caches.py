"""The cache kinds (``kvparity.caches``, issue 50): one registered record per kind, looked up by
name, in the order reports list them; every server is of one kind, and a kind draws its own."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from kvparity import caches
from kvparity.caches.state_pool import MambaState
from kvparity.caches.window_pool import POOL as WINDOW
from kvparity.caches.window_pool import WindowState
from kvparity.engine.real.versions import entry
from kvparity.model.cache_configs import CACHE_CONFIGS
from kvparity.model.traffic import ServerConfig
from kvparity.model.traffic_strategies import ServeOptions, traffic_scenarios


def test_the_kinds_are_registered_in_the_order_reports_list_them():
    assert caches.names() == ("full", "swa", "mamba", "hicache", "hicache-mamba")
    assert caches.default_names() == ("full", "swa", "mamba")  # a host tier is asked for by name
    assert [k.name for k in caches.KINDS.values() if k.host_tier] == ["hicache", "hicache-mamba"]
    assert caches.get("mamba").loops == ("normal",)  # its tree without a state buffer refuses the overlap loop


def test_an_unknown_kind_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match="'paged': expected one of full, swa, mamba, hicache, hicache-mamba"):
        caches.get("paged")


def test_a_kind_registered_twice_is_refused():
    with pytest.raises(ValueError, match="'swa' is registered twice"):
        caches.register(caches.get("swa"))


@pytest.mark.parametrize("fields, name", [
    ({}, "full"),
    ({"sliding_window": 8}, "swa"),
    ({"mamba_slots": 24}, "mamba"),
    ({"hicache_ratio": 0.75}, "hicache"),
    ({"mamba_slots": 24, "hicache_ratio": 0.75}, "hicache-mamba"),
])
def test_a_server_is_of_the_kind_whose_caches_it_holds(fields, name):
    assert caches.kind_of(ServerConfig(**fields)).name == name


def test_every_cache_record_a_server_may_hold_is_a_kinds_and_each_kind_holds_a_distinct_set():
    held = [frozenset(kind.caches) for kind in caches.KINDS.values()]
    assert set().union(*held) == set(CACHE_CONFIGS)
    assert len(set(held)) == len(held)  # no server is of two kinds


@pytest.mark.parametrize("name", caches.names())
def test_a_kind_draws_servers_of_its_own_kind(name):
    kind = caches.get(name)

    @settings(max_examples=15, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(traffic_scenarios(kind=kind, options=ServeOptions(nemesis=True)))
    def check(scenario):
        assert caches.kind_of(scenario.config) is kind

    check()


@pytest.mark.parametrize("release, served", [
    ("0.5.3", ("full", "swa", "hicache")),
    ("0.5.3.post2", ("full", "swa", "mamba", "hicache")),
    ("0.5.16", ("full", "swa", "mamba", "hicache", "hicache-mamba")),
])
def test_which_releases_serve_a_kind_their_version_entries_say(release, served):
    facts = entry(release)
    assert tuple(k.name for k in caches.KINDS.values() if k.served_by(facts)) == served


def test_a_report_counts_each_kinds_shapes_once_in_the_registrys_order():
    from kvparity.model.classes import TRAFFIC_HOST, TRAFFIC_STATE, TRAFFIC_WINDOW

    assert caches.classes() == TRAFFIC_WINDOW + TRAFFIC_STATE + TRAFFIC_HOST  # a Mamba host tier's: no new ones


def test_the_pools_a_kind_adds_are_judged_in_the_registrys_order_each_by_its_own_oracle():
    # Window slot 4 (page 2) mapped from two full slots, and page 2 free besides.
    window = WindowState(slots=8, page_size=2, mapped=((5, 4), (6, 4)), free=(1, 2, 3, 4), available_size=4)
    states = MambaState(slots=(1, 2), rows=(), tree=(), free=(1,), available_size=1)
    # Listed states first: the registry, not the snapshot, decides the order.
    assert caches.pool_problems({"states": states, "window": window}, tree=()) == [
        ("window slots conserved", "window slots mapped from two full slots: [4]"),
        ("window slots conserved", "mapped window slots on a free page: [4]"),
        ("state slots conserved", "state slots neither free, nor kept by the tree, nor a request's (leaked): [2]"),
    ]
    assert caches.pools_difference({"states": states}, {}, exact=True) == ("state pool", "none against the reference's one")


def test_a_pool_no_kind_registers_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"pools no cache kind registers: \['draft'\]"):
        caches.pool_problems({"draft": object()}, tree=())


def test_a_kind_reads_the_shapes_of_its_own_from_its_pool_after_each_iteration():
    """The window kind counts a window slot freed under a running request: r0 holds full slots 4
    and 5, and after the second iteration slot 4 maps to no window slot (it slid out), while the
    tree's slot 5 still does. Full attention has no shapes of its own to read; a window pool it
    never built is no window shape of its."""
    from types import SimpleNamespace as Memory

    from kvparity.model.traffic import TrafficScenario
    from kvparity.model.traffic_records import Decision

    def memory(mapped):
        window = WindowState(slots=8, page_size=1, mapped=mapped, free=(), available_size=0)
        return Memory(pools={WINDOW.name: window}, tree_slots=(5,),
                      requests={"r0": Memory(status="running", held=(4, 5))})

    decisions = (Decision(0, "EXTEND", ("r0",), (0,), (2,), (2,), (1,)), Decision(1, "DECODE", ("r0",)))
    after = (memory(((4, 1), (5, 2))), memory(((5, 2),)))
    swa = TrafficScenario(ServerConfig(sliding_window=8), ((),))
    assert caches.get("swa").reached(swa, decisions[:1], after[:1]) == set()
    assert caches.get("swa").reached(swa, decisions, after) == {caches.get("swa").classes[0]}
    assert caches.get("full").reached(TrafficScenario(ServerConfig(), ((),)), decisions, after) == set()
