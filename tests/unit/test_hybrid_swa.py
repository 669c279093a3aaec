"""A hybrid sliding-window model (issue 34): the server's window pool beside its full pool, joined
by SGLang's slot mapping, and the tree each release builds for it (``SWARadixCache`` up to 0.5.15,
``UnifiedRadixCache`` with the FULL and SWA components from 0.5.16), driven by SGLang's own
scheduler and judged by the window oracle."""

from __future__ import annotations

import dataclasses

import pytest

from kvparity.caches.window_pool import WindowState, window_conserved
from kvparity.engine.traffic_run import TrafficRun
from kvparity.judge.memory import run_problems
from kvparity.judge.traffic_classes import traffic_classes
from kvparity.model.cache_configs import SlidingWindow
from kvparity.model.classes import (
    TRAFFIC_TOMBSTONE,
    TRAFFIC_WINDOW_BELOW_PAGE,
    TRAFFIC_WINDOW_EVICTED,
    TRAFFIC_WINDOW_OFF_PAGE,
)
from kvparity.model.traffic import Arrival, ServerConfig, TrafficScenario, traffic_geometry


def _window_pool(**fields) -> int | None:
    config = ServerConfig(**fields)
    window = config.part(SlidingWindow)
    return None if window is None else window.slots(config)


def test_a_sliding_window_server_sizes_its_window_pool_as_sglang_does():
    """SGLang's default window pool is 0.8 of the full pool, in whole pages; a scenario may set it."""
    assert _window_pool(kv_slots=256, sliding_window=8) == 204
    assert _window_pool(kv_slots=256, page_size=16, sliding_window=8) == 192
    assert _window_pool(kv_slots=256, sliding_window=8, swa_kv_slots=64) == 64
    assert _window_pool(kv_slots=256) is None  # full attention: no window pool


def test_a_server_holds_its_window_as_a_record_and_prints_it_flat():
    """A server's caches beside full attention are records, one per kind; it is written, printed
    and carried with their fields flat among its own, under SGLang's names."""
    config = ServerConfig(kv_slots=256, sliding_window=8, swa_eviction_interval=1)
    assert config.caches == (SlidingWindow(8, eviction_interval=1),)
    assert config.to_plain()["sliding_window"] == 8 and config.to_plain()["mamba_slots"] is None
    assert ServerConfig.from_plain(config.to_plain()) == config
    assert "sliding_window=8, swa_eviction_interval=1" in TrafficScenario(config, ((Arrival("a", (1,)),),)).to_python()
    assert dataclasses.replace(config, sliding_window=None, swa_eviction_interval=None).caches == ()


@pytest.mark.parametrize(("fields", "message"), [
    (dict(swa_kv_slots=64), "swa_kv_slots=64: needs sliding_window"),
    (dict(swa_eviction_interval=4), "swa_eviction_interval=4: needs sliding_window"),
    (dict(sliding_window=0), "sliding_window=0: must be >= 1"),
    (dict(sliding_window=8, page_size=4, swa_kv_slots=30), "30 slots must be whole pages of page_size=4"),
])
def test_a_window_setting_that_cannot_be_served_is_refused_by_name(fields, message):
    with pytest.raises(ValueError, match=message):
        ServerConfig(**fields)


def _window(mapped, free, slots=8, page_size=1):
    return WindowState(slots=slots, page_size=page_size, mapped=tuple(mapped), free=tuple(free), available_size=len(free))


def test_every_window_slot_is_free_or_mapped_from_one_full_slot():
    """Eight window slots (0 is the padding sink): full slots 17 and 18 hold window slots 1 and 2."""
    assert window_conserved(_window([(17, 1), (18, 2)], range(3, 9))) == []
    assert window_conserved(_window([(17, 1), (18, 1)], range(2, 9))) == ["window slots mapped from two full slots: [1]"]
    assert window_conserved(_window([(17, 1), (18, 2)], [2, *range(3, 9)])) == [
        "mapped window slots on a free page: [2]"]
    assert window_conserved(_window([(17, 1), (18, 2)], range(4, 9))) == [
        "window pages neither free nor mapped (leaked): [3]"]
    assert window_conserved(_window([(17, 1)], [0, *range(2, 9)])) == ["the window's padding page 0 is on its free list"]
    # Page size 4: window slots 4..7 are page 1; one mapped slot keeps its page.
    assert window_conserved(_window([(33, 5)], [2], slots=8, page_size=4)) == []


A = tuple(range(100, 140))


def window_scenario(loop: str) -> TrafficScenario:
    """A window of 8 tokens, freed every 2 that slide out: ``a`` (40 tokens) and ``b`` (20 of them
    and 3 of its own) decode while ``c`` (36 of them) hits the tree a's prefill left."""
    config = ServerConfig(pool_rows=4, max_running_requests=4, kv_slots=256, sliding_window=8,
                          swa_eviction_interval=2, loop=loop)
    return TrafficScenario(config, ((Arrival("a", A, 24), Arrival("b", A[:20] + (7, 8, 9), 30)), (),
                                    (Arrival("c", A[:36], 12),)))


SLID = {TRAFFIC_WINDOW_EVICTED, TRAFFIC_TOMBSTONE}


@pytest.mark.parametrize("loop", ["normal", "overlap"])
@pytest.mark.parametrize(("release", "tree", "slid"), [
    ("0.5.3", "SWARadixCache", set()), ("0.5.21", "unified/rust, FULL+SWA", SLID),
    ("0.5.23", "unified/rust, FULL+SWA", SLID)])
def test_a_sliding_window_model_is_served_to_the_end_under_each_release_s_own_checks(release_workers, release,
                                                                                    tree, slid, loop):
    """Each release's own tree and scheduler serve it: SGLang's own leak checks stay quiet, every
    request gets its tokens, the window oracle holds after every iteration. Where the release
    slides the window (0.5.21, 0.5.23: every ``swa_eviction_interval`` tokens), slots are freed
    under running requests and tree nodes are left without window slots; 0.5.3 frees window slots
    only when its tree evicts (none here: no memory pressure)."""
    from kvparity.engine.traffic_run import TrafficRun

    scenario = window_scenario(loop)
    config, arrivals = scenario.to_plain()
    run = TrafficRun.from_plain(release_workers(release).call("run_traffic", config=config, arrivals=arrivals))
    assert run.error is None and run.player["tree"] == tree, (run.error, run.player)
    assert {rid: len(out) for rid, out in run.outputs.items()} == {"a": 24, "b": 30, "c": 12}
    assert run_problems(traffic_geometry(scenario), run.memory) == []
    assert all(snap.window is not None for snap in run.memory)
    assert [read.line() for snap in run.memory for read in snap.record.canary] == []  # the window reads too
    assert traffic_classes(scenario, run) & SLID == slid


@pytest.mark.parametrize(("name", "kind", "what", "wrong_reads"), [
    ("swa-frontier-one-past", "memory", "window available_size", True),
    ("swa-free-keeps-mapping", "oracle", "window slots conserved", False),
])
def test_a_window_mutant_of_a_release_is_caught_where_its_window_goes_wrong(mutant_judged, name, kind, what,
                                                                           wrong_reads):
    """A copy of 0.5.23 that frees one window slot too many differs from the release in its window
    pool under the same decisions, and its forwards read a freed window slot (the canary's window
    layer); one that frees window pages but leaves them mapped breaks the window oracle. The release
    against itself agrees."""
    judgement, ours = mutant_judged(name, window_scenario("normal"))
    assert judgement.kind == kind and judgement.decision is None, judgement.line()
    assert what in judgement.line(), judgement.line()
    reads = [read for snap in ours.memory for read in snap.record.canary]
    assert bool(reads) == wrong_reads and all(read.when == "window" and read.slot == 0 for read in reads), reads


@pytest.mark.parametrize(("window", "shape"), [
    (3, TRAFFIC_WINDOW_BELOW_PAGE), (6, TRAFFIC_WINDOW_OFF_PAGE), (8, None)])
def test_a_window_at_odds_with_its_pages_is_counted_where_the_window_frees(release_workers, window, shape):
    """Pages of 4: a window of 3 is smaller than a page, one of 6 is not a whole number of pages,
    one of 8 is two pages; each counted only in a run whose window freed slots (the frontier was
    computed under it)."""
    scenario = window_scenario("normal")
    paged = dataclasses.replace(scenario.config, page_size=4, sliding_window=window)
    scenario = TrafficScenario(paged, scenario.arrivals)
    config, arrivals = scenario.to_plain()
    run = TrafficRun.from_plain(release_workers("0.5.23").call("run_traffic", config=config, arrivals=arrivals))
    classes = traffic_classes(scenario, run)
    assert SLID <= classes
    assert classes & {TRAFFIC_WINDOW_BELOW_PAGE, TRAFFIC_WINDOW_OFF_PAGE} == ({shape} if shape else set())


def test_a_window_layer_reads_only_its_window_and_a_freed_slot_inside_it_is_wrong_kv():
    """Window 2: a decode at position 4 reads the window layer at positions 2, 3 and 4 (a query at
    p sees ``[p - 2, p]``). Position 1's window slot may be freed; position 3's may not."""
    import numpy as np

    from kvparity.engine.canary import ForwardRequest, KVCanary, WindowView

    canary = KVCanary()
    mapping = np.array([0, 11, 12, 13, 14, 15, 0], dtype=np.int64)  # full slot -> window slot
    row = np.array([1, 2, 3, 4, 5], dtype=np.int64)
    prompt = (7, 8, 9, 10)
    canary.launch(0, [ForwardRequest("a", 0, 4, 0, prompt, (1, 2, 3, 4), prompt)], {0: row}, WindowView(2, mapping))

    def decode(freed: list[int]) -> list:
        window = mapping.copy()
        window[freed] = 0
        request = ForwardRequest("a", 0, 5, 4, (99,), (5,), (*prompt, 99))
        return canary.launch(1, [request], {0: row}, WindowView(2, window)).violations

    assert decode([1]) == []  # position 0 slid out of the window
    found = decode([1, 4])
    assert [(read.position, read.slot, read.when) for read in found] == [(3, 0, "window")]


def test_a_scheduler_that_admits_nothing_is_stopped_not_spun(release_workers):
    """0.5.3 admits a sliding-window model's request only if the window pool holds all of it: a
    20-token prompt and a 16-slot window pool wait forever. The shell stops the run after a few
    hundred empty passes, as an error the judge compares, not after ten thousand."""
    from kvparity.engine.real.scheduler_shell import STALL_PASSES
    from kvparity.engine.traffic_run import TrafficRun

    scenario = TrafficScenario(ServerConfig(kv_slots=256, sliding_window=4, swa_kv_slots=16),
                               ((Arrival("a", tuple(range(100, 120)), 1),),))
    config, arrivals = scenario.to_plain()
    run = TrafficRun.from_plain(release_workers("0.5.3").call("run_traffic", config=config, arrivals=arrivals))
    assert run.error is not None and "admits nothing" in run.error.message, run.error
    assert len(run.decisions) <= STALL_PASSES + 2


def test_a_retracted_window_request_never_readmitted_is_a_known_defect_of_0_5_15(release_workers):
    """A window of 80 on a window pool of 102 slots: r7 is retracted, r6 finishes, and 0.5.15 never
    admits r7 again (its window budget against the pool less what its own match locks); kvparity's
    stall check stops the run, a known SGLang defect. 0.5.17 is not installed by CI; 0.5.21 ends it."""
    from kvparity.engine.real.defects import RAISED, known_defect

    config = ServerConfig(schedule_policy="lpm", pool_rows=4, kv_slots=128, max_prefill_tokens=4096,
                          max_running_requests=4, schedule_conservativeness=0.3, sliding_window=80, swa_eviction_interval=1)
    scenario = TrafficScenario(config, ((Arrival("r6", (*range(100000, 100004), *range(70000, 70016)), 46),
                                         Arrival("r7", (*range(100000, 100004), *range(80000, 80025)), 36)),))
    plain, arrivals = scenario.to_plain()
    run = TrafficRun.from_plain(release_workers("0.5.15").call("run_traffic", config=plain, arrivals=arrivals))
    assert run.error is not None and "admits nothing: 200 passes with 1 requests waiting and none running" in run.error.message
    assert known_defect("0.5.15", config, RAISED, run.error.message).name == "retracted window request never readmitted"
    fixed = TrafficRun.from_plain(release_workers("0.5.21").call("run_traffic", config=plain, arrivals=arrivals))
    assert fixed.error is None and set(fixed.outputs) == {"r6", "r7"}


def test_a_worker_s_errors_cross_a_process_whole():
    """A job process's exception reaches the parent pickled: it must come back as it was raised."""
    import pickle

    from kvparity.engine.real.worker import RemoteError, WorkerDied, WorkerHung

    for error in (WorkerHung("run_traffic", 120.0), WorkerDied("run_traffic", -11, "tail"),
                  RemoteError("run_traffic", {"type": "ValueError", "message": "m"})):
        back = pickle.loads(pickle.dumps(error))
        assert (type(back), str(back)) == (type(error), str(error))


def test_the_harness_drive_plays_a_sliding_window_model_under_its_window_oracle(tmp_path):
    """With ``--caches swa`` the harness drive's real worlds serve a sliding-window model: one
    request of one token that finishes at its prefill frees its window page; the copy of 0.5.23
    that leaves the page mapped breaks the window oracle, and its window differs from the release's."""
    from kvparity.engine.real.install import resolve
    from kvparity.engine.real.lane import RealLane
    from kvparity.model.scenario import Extend, RequestSpec, Scenario
    from kvparity.model.worlds import Geometry
    from kvparity.run.runner import run_scenario
    from kvparity.teeth.real_zoo import REAL_MUTANTS_BY_NAME, make_mutated_copy

    scenario = Scenario(Geometry(pool_rows=8, max_context_len=63, kv_slots=468, page_size=4), "radix",
                        (RequestSpec("r4", (100000,), max_new_tokens=1),), (Extend(admit=("r4",)),), 8)
    mutant = REAL_MUTANTS_BY_NAME["swa-free-keeps-mapping"]
    copy = make_mutated_copy(resolve(mutant.version), mutant, tmp_path / mutant.name)
    with RealLane(["0.5.23", str(copy)], ("torch",), tree_core_variants=False, model="swa") as lane:
        result = run_scenario(scenario, (("legacy", "torch"),), lane=lane, real_reference=True)
    assert {v.world for v in result.violations} == {f"{mutant.name}@0.5.23/torch"}
    assert "window slots conserved: mapped window slots on a free page" in result.violations[0].line()


def test_the_harness_drive_keeps_where_a_requests_window_lock_stops():
    """SGLang's PrefillAdder keeps where a request's lock stopped locking the window (the node whose
    tokens reach it: ``swa_uuid_for_lock``), and the release unlocks the window down to there. r13
    matches r12's 10 tokens (a node of 8 under r11's node of 2, a window of 8): its window lock stops
    at the node of 8. Kept by the harness's admission too, r13's release leaves r11's window lock
    alone, and r11 finishes (without it, 0.5.15's SWARadixCache asserted at r11's release:
    ``dec_lock_ref on node with node.swa_lock_ref=0``, a false alarm of the harness drive)."""
    from kvparity.engine.real.lane import RealLane
    from kvparity.model.scenario import Decode, Extend, RequestSpec, Scenario
    from kvparity.model.worlds import Geometry

    prompt = tuple(range(200000, 200011))
    scenario = Scenario(Geometry(pool_rows=17, max_context_len=41, kv_slots=800, page_size=2), "radix", (
        RequestSpec("r11", prompt[:2], max_new_tokens=2), RequestSpec("r12", prompt[:10], max_new_tokens=64),
        RequestSpec("r13", prompt, arrival=1, max_new_tokens=1)),
        (Extend(admit=("r11", "r12")), Extend(admit=("r13",)), Decode()))
    with RealLane(["0.5.15"], ("torch",), tree_core_variants=False, model="swa") as lane:
        played = lane.play(scenario)
    assert [isinstance(snapshots, list) for snapshots in played.values()] == [True], played  # no RealFailure


def test_the_harness_drive_names_the_full_page_a_window_models_failed_decode_keeps():
    """One request of two tokens fills the one window page of a server of 4 slots in pages of 2; its
    decode finds no window page, raises, and 0.5.23's window allocator keeps the full page it took
    first. The harness drive scripts that decode (SGLang's own scheduler checks both pools first and
    never makes it): the page is a named finding of SGLang's, not a leak in every world."""
    from kvparity.engine.real.lane import RealLane
    from kvparity.judge.oracles import FAILED_DECODE_KEEPS_PAGE
    from kvparity.model.scenario import Decode, Extend, RequestSpec, Scenario
    from kvparity.model.worlds import Geometry
    from kvparity.run.runner import run_scenario

    scenario = Scenario(Geometry(pool_rows=4, max_context_len=16, kv_slots=4, page_size=2), "radix",
                        (RequestSpec("r0", (100, 101), max_new_tokens=8),), (Extend(admit=("r0",)), Decode()))
    with RealLane(["0.5.23"], ("torch",), tree_core_variants=False, model="swa") as lane:
        result = run_scenario(scenario, (("legacy", "torch"),), lane=lane, real_reference=True)
    assert (result.violations, result.divergences) == ([], [])
    assert [(f.what, f.detail, f.known_defect) for f in result.findings] == [(
        "step 1 decode", "pages [2] taken by the decode that ran out of window pages (the server stops here)",
        FAILED_DECODE_KEEPS_PAGE)]
