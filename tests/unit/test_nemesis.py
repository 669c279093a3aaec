"""The nemesis's client aborts (issue 48): drawn into traffic scenarios after their requests arrive,
carried to the scheduler after that pass's arrivals, shrunk before the requests are, and played
through SGLang's own ``Scheduler.abort_request``."""

from __future__ import annotations

import pytest

from kvparity.engine.traffic_run import TrafficRun
from kvparity.judge.admission import traffic_problems
from kvparity.judge.traffic_classes import traffic_classes
from kvparity.model.classes import TRAFFIC_ABORTS, TRAFFIC_FORCED_RETRACTION
from kvparity.model.traffic import (
    ANY_REQUEST,
    Arrival,
    ServerConfig,
    TrafficScenario,
    traffic_from_dict,
    traffic_to_dict,
)
from kvparity.run.candidates import traffic_candidates

A = tuple(range(1000, 1010))
# w waits behind a long prompt that takes the whole prefill budget; d decodes 8 tokens.
SCENARIO = TrafficScenario(ServerConfig(max_prefill_tokens=12), (
    (Arrival("long", tuple(range(3000, 3012)), 2), Arrival("w", A, 2), Arrival("d", (7, 8), 8)),
), aborts=((("w",)), (), (), (), ("d",)))


def test_an_abort_comes_after_its_request_arrives():
    with pytest.raises(ValueError, match="request 'w' is aborted at iteration 0, before it arrives"):
        TrafficScenario(ServerConfig(), ((), (Arrival("w", A, 2),)), aborts=(("w",),))


def test_aborts_reach_the_scheduler_after_that_passs_arrivals():
    _, groups = SCENARIO.to_plain()
    assert [[spec.get("rid", spec.get("abort")) for spec in group] for group in groups] == [
        ["long", "w", "d", "w"], [], [], [], ["d"]]


def test_a_scenario_with_aborts_round_trips_through_json_and_python():
    from kvparity.model import traffic

    assert traffic_from_dict(traffic_to_dict(SCENARIO)) == SCENARIO
    assert eval(SCENARIO.to_python(), vars(traffic)) == SCENARIO
    plain = TrafficScenario(ServerConfig(), ((Arrival("r", A, 1),),))
    assert "aborts" not in traffic_to_dict(plain)["traffic"]  # a scenario without the nemesis is written as before


def test_shrinking_drops_an_abort_before_touching_the_requests():
    first = next(traffic_candidates(SCENARIO))
    assert first.arrivals == SCENARIO.arrivals and first.aborts == ((), (), (), (), ("d",))


def test_sglangs_own_abort_path_ends_a_waiting_and_a_decoding_request(scheduler_workers):
    config, groups = SCENARIO.to_plain()
    run = TrafficRun.from_plain(scheduler_workers["0.5.3"].call("run_traffic", config=config, arrivals=groups))
    assert run.error is None
    assert run.aborts == ((0, "w", "waiting"), (4, "d", "decoding"))
    assert run.outputs["w"] == () and 0 < len(run.outputs["d"]) < 8  # d stopped short of its 8 tokens
    assert {TRAFFIC_ABORTS["waiting"], TRAFFIC_ABORTS["decoding"]} <= traffic_classes(SCENARIO, run)
    assert not traffic_problems(SCENARIO, run)  # every slot and row came back


# A request aborted between the chunks of its prefill: c's 13 tokens go in chunks of 4; the abort
# reaches the scheduler at iteration 1, after c's first chunk; d (c's prompt and two more) arrives later.
C = tuple(range(2000, 2013))
BETWEEN_CHUNKS = ((Arrival("c", C, 2),), (), (), (Arrival("d", C + (7, 8), 2),))


@pytest.mark.parametrize(("name", "loop", "shown"), [
    # The slots conservation oracle sees the leak at the abort's pass (in the normal loop SGLang's
    # own leak check raises at the next idle pass, after it).
    ("abort-between-chunks-keeps-kv", "overlap", "oracle"),
    # The tree keeps what the release frees: the memory differs at once, under the same decisions.
    ("abort-between-chunks-inserted", "normal", "memory"),
])
def test_a_mutant_on_the_chunked_abort_path_is_caught_only_when_a_chunked_request_is_aborted(
        release_workers, tmp_path, name, loop, shown):
    """0.5.23 tears an aborted chunked request down at the next pass's start
    (``process_pending_chunked_abort``): its row and slots given back, nothing kept by the tree.
    A copy that leaks them, or inserts the chunks into the tree, agrees with the release on the
    same traffic without the abort."""
    from kvparity.engine.real.install import resolve
    from kvparity.engine.real.players import RealTrafficPlayer
    from kvparity.judge.admission import judge_traffic
    from kvparity.teeth.real_zoo import REAL_MUTANTS_BY_NAME, make_mutated_copy

    mutant = REAL_MUTANTS_BY_NAME[name]
    release = RealTrafficPlayer(resolve(mutant.version), release_workers(mutant.version))
    broken = RealTrafficPlayer(resolve(str(make_mutated_copy(resolve(mutant.version), mutant, tmp_path / "copy"))))
    config = ServerConfig(loop=loop, chunked_prefill_size=4, max_prefill_tokens=16)
    try:
        for aborts, agree in (((), True), (((), ("c",)), False)):
            scenario = TrafficScenario(config, BETWEEN_CHUNKS, aborts=aborts)
            ours = release.play(scenario)
            assert ours.aborts == (((1, "c", "between chunks"),) if aborts else ())
            judgement = judge_traffic(scenario, ours, broken.play(scenario), release.world_id, broken.world_id)
            assert judgement.agree == agree, judgement.line()
        assert judgement.kind == shown, judgement.line()
    finally:
        broken.close()


def failing_reads(failure: float, seed: int = 0) -> TrafficScenario:
    """A storage tier whose reads fail (SGLang's own injector, for ``batch_get`` only): ``a`` and
    then three requests of 40 tokens of their own pass through a device of 64 slots and a host of
    129, so the host evicts a's KV and storage keeps it; ``d`` (a's prompt and two more) asks
    storage for it."""
    config = ServerConfig(pool_rows=4, max_running_requests=4, kv_slots=64, hicache_ratio=2.0, hicache_storage=True,
                          hicache_storage_failure=failure, hicache_storage_seed=seed,
                          hicache_storage_failing="batch_get")
    fresh = [(Arrival(f"f{k}", tuple(range(1000 * k, 1000 * k + 40)), 1),) for k in (2, 3, 4)]
    return TrafficScenario(config, ((Arrival("a", A, 1),), (), *[g for f in fresh for g in (f, ())],
                                    (Arrival("d", A + (5, 6), 2),)))


@pytest.mark.parametrize("release", ["0.5.15", "0.5.23"])
def test_a_failed_storage_read_is_recomputed_around_and_counted_as_a_fault(release_workers, release):
    """Every read failing: the release finds a's prefix in storage (the hit query passes) but reads
    nothing back, so d recomputes it (no hit, no read of wrong KV, every slot accounted for); the
    host snapshot lists the failed read by name, and the run meets the read-fault class. 0.5.23
    through SGLang's own failure injector, 0.5.15 through kvparity's faulty backend."""
    from kvparity.caches.host_tier import host_classes
    from kvparity.model.classes import TRAFFIC_STORAGE_FAULT, TRAFFIC_STORAGE_READ_FAULT

    scenario = failing_reads(1.0)
    config, groups = scenario.to_plain()
    run = TrafficRun.from_plain(release_workers(release).call("run_traffic", config=config, arrivals=groups))
    assert run.error is None and not traffic_problems(scenario, run)
    assert run.memory[-1].host.storage_faults == ("batch_get",) and run.memory[-1].host.fetched == 0
    hits = {rid: hit for rec in run.decisions if rec.mode == "EXTEND" for rid, hit in zip(rec.rids, rec.prefix_lens)}
    assert hits["d"] == 0
    met = host_classes(run.decisions, run.memory)
    assert TRAFFIC_STORAGE_READ_FAULT in met and TRAFFIC_STORAGE_FAULT not in met


def test_a_failed_storage_read_counted_as_fetched_is_read_as_wrong_kv(release_workers, tmp_path):
    """The copy that counts a page storage failed to read as fetched loads the host slots the read
    was to fill into d's prefix: the canary reads another request's KV there. Without the fault
    the copy and the release agree."""
    from kvparity.engine.real.install import resolve
    from kvparity.engine.real.players import RealTrafficPlayer
    from kvparity.judge.admission import judge_traffic
    from kvparity.teeth.real_zoo import REAL_MUTANTS_BY_NAME, make_mutated_copy

    mutant = REAL_MUTANTS_BY_NAME["storage-failed-read-counted"]
    release = RealTrafficPlayer(resolve(mutant.version), release_workers(mutant.version))
    broken = RealTrafficPlayer(resolve(str(make_mutated_copy(resolve(mutant.version), mutant, tmp_path / "copy"))))
    try:
        judged = [judge_traffic(s, release.play(s), broken.play(s), release.world_id, broken.world_id)
                  for s in (failing_reads(0.0), failing_reads(1.0))]
    finally:
        broken.close()
    assert judged[0].agree
    assert judged[1].kind == "canary" and "request d read position 0" in judged[1].line(), judged[1].line()


def test_an_abort_on_a_state_waits_for_the_first_pass_that_finds_the_request_there(scheduler_workers):
    """``abort_when``: c is aborted at the first pass that finds it between two chunks of its
    prefill (iteration 1, after its first chunk of 4), d at the first that finds it decoding; the
    abort is armed in the arrival's pass and goes to SGLang's own abort path like any other."""
    scenario = TrafficScenario(ServerConfig(chunked_prefill_size=4, max_prefill_tokens=16), BETWEEN_CHUNKS,
                               abort_when=(("c", "between chunks"), ("d", "decoding")))
    assert traffic_from_dict(traffic_to_dict(scenario)) == scenario
    config, groups = scenario.to_plain()
    run = TrafficRun.from_plain(scheduler_workers["0.5.3"].call("run_traffic", config=config, arrivals=groups))
    assert run.error is None and not traffic_problems(scenario, run)
    assert [(rid, state) for _, rid, state in run.aborts] == [("c", "between chunks"), ("d", "decoding")]
    assert run.aborts[0][0] == 1 and len(run.outputs["c"]) < 2  # 0.5.3 ends it after one more forward
    with pytest.raises(ValueError, match="aborted when 'asleep'"):
        TrafficScenario(ServerConfig(), BETWEEN_CHUNKS, abort_when=(("c", "asleep"),))
    # For any request: the first found decoding (c, once its prefill is done) is the one aborted.
    anyone = TrafficScenario(scenario.config, BETWEEN_CHUNKS, abort_when=((ANY_REQUEST, "decoding"),))
    config, groups = anyone.to_plain()
    run = TrafficRun.from_plain(scheduler_workers["0.5.3"].call("run_traffic", config=config, arrivals=groups))
    assert [(rid, state) for _, rid, state in run.aborts] == [("c", "decoding")]


def test_a_prefetch_its_policy_ends_early_holds_its_tail_until_its_last_acknowledgement(release_workers):
    """``best_effort`` (the nemesis's prefetch policy): 0.5.23 ends d's prefetch at the scheduler's
    first check, before its pages came, so d recomputes the prefix; the host slots the fetch took
    past what came stay the fetch's until its last acknowledgement is read a pass later (counted
    in flight then, not leaked), and the run meets the class of a prefetch ended early."""
    import dataclasses

    from kvparity.caches.host_tier import host_classes
    from kvparity.model.classes import TRAFFIC_PREFETCH_CUT

    base = failing_reads(0.0)
    scenario = TrafficScenario(dataclasses.replace(base.config, hicache_prefetch_policy="best_effort"), base.arrivals)
    config, groups = scenario.to_plain()
    run = TrafficRun.from_plain(release_workers("0.5.23").call("run_traffic", config=config, arrivals=groups))
    assert run.error is None and not traffic_problems(scenario, run)
    assert run.memory[-1].host.prefetches_cut == 1 and TRAFFIC_PREFETCH_CUT in host_classes(run.decisions, run.memory)
    hits = {rid: hit for rec in run.decisions if rec.mode == "EXTEND" for rid, hit in zip(rec.rids, rec.prefix_lens)}
    assert hits["d"] == 0
    with pytest.raises(ValueError, match="hicache_prefetch_policy='best_effort'"):
        ServerConfig(hicache_prefetch_policy="best_effort")  # no storage tier to prefetch from


def test_a_row_freed_by_an_abort_is_reused_behind_the_write_after_read_barrier_not_under_the_forward(release_workers):
    """0.5.23's overlap loop: r1, aborted while decoding, is freed when the batch before lands,
    while the next batch, which still holds it, is in flight; the next pass gives its row to r2.
    Behind SGLang's write-after-read barrier (0.5.14 on, on CUDA) that rewrite waits for the
    in-flight forward's reads, so it is no race: the shell applies the barrier as a server does and
    finds nothing in flight (without it, it read wrong KV in r1's row)."""
    config = ServerConfig(schedule_policy="lpm", kv_slots=128, max_prefill_tokens=4096, schedule_conservativeness=0.3,
                          loop="overlap", hicache_ratio=2.0, hicache_ack_delay=1)
    burst = tuple(Arrival(f"r{i}", tuple(range(stem, stem + 4)) + tuple(range(own, own + n)), out)
                  for i, (stem, own, n, out) in enumerate(((100000, 10000, 31, 45), (200000, 20000, 25, 47),
                                                           (100000, 30000, 19, 32), (200000, 40000, 23, 41),
                                                           (100000, 50000, 21, 40), (100000, 60000, 18, 35))))
    scenario = TrafficScenario(config, (
        (Arrival("c0", tuple(range(200000, 200011)), 1),), (Arrival("c1", tuple(range(100000, 100039)), 1),),
        (Arrival("c2", tuple(range(100000, 100058)), 1),), (), (Arrival("f0", tuple(range(200000, 200063)), 1),),
        (Arrival("f1", tuple(range(201000, 201055)), 1),), burst), aborts=((),) * 16 + (("r1",),))
    config_plain, groups = scenario.to_plain()
    run = TrafficRun.from_plain(release_workers("0.5.23").call("run_traffic", config=config_plain, arrivals=groups))
    assert run.error is None and [state for _, _, state in run.aborts] == ["decoding"]
    assert run.inflight == () and not traffic_problems(scenario, run)


# Forced retraction: two requests decode 8 tokens each with memory to spare; SGLang's own test switch
# (SGLANG_TEST_RETRACT, every 2 forwards) retracts one of them anyway.
TWO_DECODING = (Arrival("a", tuple(range(4000, 4006)), 8), Arrival("b", tuple(range(5000, 5006)), 8))


def test_sglangs_retraction_test_switch_retracts_with_memory_to_spare(release_workers):
    def run(interval):
        config, groups = TrafficScenario(ServerConfig(forced_retraction=interval), (TWO_DECODING,)).to_plain()
        return TrafficRun.from_plain(release_workers("0.5.23").call("run_traffic", config=config, arrivals=groups))

    off, on = run(None), run(2)
    assert not any(d.retracted for d in off.decisions)
    assert any(d.retracted for d in on.decisions)
    assert on.error is None and on.outputs == off.outputs  # retracted, recomputed: the same tokens
    forced = TrafficScenario(ServerConfig(forced_retraction=2), (TWO_DECODING,))
    assert TRAFFIC_FORCED_RETRACTION in traffic_classes(forced, on)
    assert not traffic_problems(forced, on)


def test_a_release_without_the_switch_at_an_interval_refuses_forced_retraction(scheduler_workers):
    config, groups = TrafficScenario(ServerConfig(forced_retraction=2), (TWO_DECODING,)).to_plain()
    with pytest.raises(Exception, match=r"sglang 0\.5\.3 has no retraction test switch at an interval"):
        scheduler_workers["0.5.3"].call("run_traffic", config=config, arrivals=groups)


def test_shrinking_turns_forced_retraction_off_first():
    scenario = TrafficScenario(ServerConfig(forced_retraction=2), (TWO_DECODING,))
    assert next(traffic_candidates(scenario)).config.forced_retraction is None


def test_kvparitys_faulty_storage_answers_a_failed_call_as_sglangs_injector_does():
    """Before 0.5.23 (no injector of SGLang's own), kvparity's proxy fails the calls the world's
    generator says, answering as the injector would: a batch read of nothing, no page found; the
    calls it does not fail reach the backend."""
    from types import SimpleNamespace

    from kvparity.engine.real.faulty_storage import FaultyStorage

    backend = SimpleNamespace(batch_get=lambda keys, dst: [b"page"] * len(keys), batch_exists=lambda keys: len(keys),
                              clear=lambda: "cleared")
    failing = FaultyStorage(backend, lambda name: name == "batch_get")
    assert failing.batch_get(["k1", "k2"], [None, None]) == [None, None]
    assert failing.batch_exists(["k1", "k2"]) == 2 and failing.clear() == "cleared"
    assert FaultyStorage(backend, lambda name: True).batch_exists(["k1"]) == 0


def test_a_prefetch_whose_read_failed_is_released_twice_before_0_5_6_a_known_defect(release_workers):
    """0.5.4 releases the host slots of d's failed read twice (sgl-project/sglang#13483): the host
    oracle finds them free and backing a node at once, and the registry names it; 0.5.6 does not."""
    from kvparity.engine.real.defects import ORACLE, known_defect

    scenario = failing_reads(1.0)
    config, groups = scenario.to_plain()

    def problems(release):
        run = TrafficRun.from_plain(release_workers(release).call("run_traffic", config=config, arrivals=groups))
        return [p for p in traffic_problems(scenario, run)]

    assert problems("0.5.6") == []
    twice = problems("0.5.4")
    assert twice and "host slots in two places at once" in twice[0].line()
    known = known_defect("0.5.4", scenario.config, f"{ORACLE}: {twice[0].oracle}", twice[0].line())
    assert known is not None and known.name == "prefetch tail released twice"


def test_a_fetch_whose_read_failed_holds_only_what_came_while_hiradix_cache_still_lists_it(release_workers):
    """0.5.18 (HiRadixCache), shrunk from a nemesis task: f0's KV reaches storage and leaves the
    host; r3, r4 and r6 each ask storage for its first 4 tokens and every read fails. The transfer
    gives each fetch's slots back at once, while the tree lists the fetch until the scheduler next
    checks it: those slots are free, not in flight (before, the host oracle called them freed under
    a transfer, a false alarm)."""
    config = ServerConfig(kv_slots=128, hicache_ratio=1.5, hicache_storage=True, hicache_storage_failure=1.0,
                          hicache_storage_seed=116, hicache_storage_failing="batch_get")
    stem = tuple(range(200_000, 200_004))
    own = [(Arrival(f"f{k}", tuple(range(200_000 + 1000 * k, 200_000 + 1000 * k + n)), 1),)
           for k, n in ((2, 47), (3, 53), (4, 40), (5, 55), (6, 33))]
    burst = (Arrival("r3", stem + tuple(range(40_000, 40_025)), 38), Arrival("r4", stem + tuple(range(50_000, 50_018)), 47),
             Arrival("r5", tuple(range(100_000, 100_004)) + tuple(range(60_000, 60_016)), 32),
             Arrival("r6", stem + tuple(range(70_000, 70_027)), 43))
    scenario = TrafficScenario(config, ((), (), (), (Arrival("f0", tuple(range(200_000, 200_056)), 1),), (), *own, burst))
    config_plain, groups = scenario.to_plain()
    run = TrafficRun.from_plain(release_workers("0.5.18").call("run_traffic", config=config_plain, arrivals=groups))
    assert run.memory[-1].host.read_faults == 3
    assert [p.line() for p in traffic_problems(scenario, run)] == []


def test_a_fetch_whose_read_failed_holds_only_what_came_while_unified_radix_cache_still_lists_it(release_workers):
    """0.5.16, a Mamba model's host tier (UnifiedRadixCache), shrunk from the nemesis's control run:
    c0's KV reaches storage and leaves the host; r0 asks storage for it and the read fails. The IO
    thread gives the fetch's slots back, while the tree lists the fetch (``_OngoingPrefetch``) until
    the scheduler next checks it: those slots are free, not in flight (before, the host oracle found
    them in two places at once in 12 of 40 scenarios, a false alarm; 0.5.17 shows the same)."""
    config = ServerConfig(pool_rows=2, kv_slots=96, max_prefill_tokens=4, chunked_prefill_size=16, max_running_requests=2,
                          mamba_slots=12, hicache_ratio=0.75, hicache_storage=True, hicache_storage_failure=0.5,
                          hicache_storage_seed=1, hicache_storage_failing="batch_get", hicache_prefetch_policy="best_effort")
    scenario = TrafficScenario(config, (
        (Arrival("c0", tuple(range(100_000, 100_053)), 1),), (), (Arrival("f0", tuple(range(200_000, 200_048)), 1),),
        (), (), (), (Arrival("f4", tuple(range(204_000, 204_019)), 1),), (Arrival("r0", tuple(range(100_000, 100_060)), 6),)))
    config_plain, groups = scenario.to_plain()
    run = TrafficRun.from_plain(release_workers("0.5.16").call("run_traffic", config=config_plain, arrivals=groups))
    assert run.memory[-1].host.read_faults == 1
    assert [p.line() for p in traffic_problems(scenario, run)] == []


def test_the_nemesis_draws_a_servers_faults_after_its_traffic():
    """Hypothesis plays variations of a task's first few scenarios, varying their last draws most,
    so the nemesis draws the server's faults (its rows, forced retraction, late acknowledgements,
    which storage calls fail)
    after the traffic: one traffic is played under several of them (each of three, under two). A host tier under the nemesis
    always has its storage tier, where those faults are."""
    from hypothesis import HealthCheck, given, settings

    from kvparity import caches
    from kvparity.model.traffic_strategies import ServeOptions, traffic_scenarios

    faults: dict[tuple, set] = {}

    @settings(max_examples=100, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(traffic_scenarios(kind=caches.get("hicache"), options=ServeOptions(nemesis=True), forced_retraction=True))
    def collect(scenario: TrafficScenario) -> None:
        config = scenario.config
        assert config.hicache_storage
        faults.setdefault(scenario.arrivals, set()).add(
            (config.max_running_requests, config.forced_retraction, config.hicache_storage_failing,
             config.hicache_ack_delay))

    collect()
    assert sum(len(seen) >= 2 for seen in faults.values()) >= 3


def test_a_nemesis_task_is_played_in_shards_of_ten_each_from_its_own_seed():
    """A derandomized task spends its scenarios on variations of its first few, so a fault those
    few miss stays rare in the whole task: under the nemesis a task of 40 is four shards of 10,
    each from a seed of its own (fixed by the plan, never by the jobs), starting from four times as
    many scenarios; without it, one task of 40, derandomized."""
    from types import SimpleNamespace

    from kvparity.model.traffic import EVERY_HOST_TIER
    from kvparity.run.scheduler_drive import PlayerSpec, SchedulerDrive, SchedulerSpec

    player = SimpleNamespace(name="p", loops=("normal",), caches=("full",), paged_windows=True, tree_cores=("rust",),
                             host_offer=EVERY_HOST_TIER, aborts=True, forced_retraction=True, close=lambda: None)
    spec = PlayerSpec("real", "p")

    def tasks(nemesis: bool) -> list:
        drive = SchedulerDrive(SchedulerSpec(spec, spec, policies=("fcfs",), loops=("normal",), nemesis=nemesis),
                               players=(player, player))
        return drive.tasks(40, None)

    sharded = tasks(nemesis=True)
    assert [(t.examples, t.shard) for t in sharded] == [(10, 0), (10, 1), (10, 2), (10, 3)]
    assert len({t.seed for t in sharded}) == 4 and None not in {t.seed for t in sharded}
    assert [(t.examples, t.seed) for t in tasks(nemesis=False)] == [(40, None)]


def test_a_nemesis_storage_tier_pushes_the_warm_up_to_storage_and_sends_a_request_that_fetches_it():
    """Under the nemesis a host tier's fillers hold the device's slots, the host's and half a device
    more, whatever lengths were drawn (the warm-up's KV is in storage alone); in a stable half of
    the scenarios idle passes follow until every filler's chunks are done (lpm would admit the burst
    before them); the pass after the burst, a request of the first warm-up prompt and four tokens
    more (a Mamba model's tree keeps a state at that prompt's end), which no abort names."""
    from hypothesis import HealthCheck, given, settings

    from kvparity import caches
    from kvparity.model.traffic_strategies import FETCHER, FETCHER_OWN, FILLERS_DRAINED, ServeOptions, traffic_scenarios

    drained = []

    @settings(max_examples=60, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(traffic_scenarios(kind=caches.get("hicache"), options=ServeOptions(nemesis=True)))
    def check(scenario: TrafficScenario) -> None:
        config, groups = scenario.config, scenario.arrivals
        fillers = [a for group in groups for a in group if a.rid.startswith("f")]
        assert sum(len(a.tokens) for a in fillers) >= config.kv_slots * 3 // 2 + int(config.kv_slots * config.hicache_ratio)
        (fetcher,) = groups[-1]
        assert fetcher.rid == FETCHER and fetcher.tokens == groups[0][0].tokens + FETCHER_OWN
        assert FETCHER not in {rid for group in scenario.aborts for rid in group} | {rid for rid, _ in scenario.abort_when}
        last_filler = max(i for i, group in enumerate(groups) if any(a.rid.startswith("f") for a in group))
        idle = len(groups) - 2 - last_filler - 1  # before the burst and the fetcher
        chunk = config.chunked_prefill_size
        passes = sum(-(-len(a.tokens) // chunk) if chunk else 1 for a in fillers)
        assert idle in (0, passes - len(fillers) + FILLERS_DRAINED)
        drained.append(idle > 0)

    check()
    assert 0.25 < sum(drained) / len(drained) < 0.75
