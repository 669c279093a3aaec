"""The host tier (issue 35): HiCache keeps evicted KV in host memory and loads it back on a prefix
hit. kvparity keeps a HiCache world's canary in the real pool's KV itself, so the release's own
copies between device and host carry it, and a load-back is read as it restored it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kvparity.caches.host_pool import STATE_POOL as STATE_HOST_POOL
from kvparity.caches.host_pool import HostNode, HostState, host_nodes_consistent, host_slots_conserved
from kvparity.caches.host_tier import host_classes as host_tier_classes
from kvparity.caches.mamba_host_tier import state_load_backs
from kvparity.engine.canary import KVCanary, LaneStore, SlotStore
from kvparity.engine.real.defects import RAISED, known_defect
from kvparity.judge.memory import run_problems
from kvparity.judge.traffic_classes import abort_classes
from kvparity.model.canary import UNSTAMPED
from kvparity.model.classes import (
    TRAFFIC_ABORTS,
    TRAFFIC_HOST_DEMOTED,
    TRAFFIC_HOST_LOAD_BACK,
    TRAFFIC_STATE_LOAD_BACK,
    TRAFFIC_STORAGE_HIT,
)
from kvparity.model.scenario import Decode, Evict, Extend, RequestSpec, Scenario
from kvparity.model.traffic import Arrival, ServerConfig, TrafficScenario, traffic_geometry
from kvparity.model.worlds import Geometry


def host_classes(run) -> set[str]:
    """The host tier's shapes ``run`` met (``kvparity.caches.host_tier``)."""
    return host_tier_classes(run.decisions, run.memory)


def test_a_lane_store_keeps_the_canary_in_the_kv_exactly():
    kv = np.zeros((8, 8), dtype=np.float32)
    store = LaneStore(kv)
    values = np.array([[300_059, 61, (1 << 63) - 12345, 2], [7, 0, 1, 0]], dtype=np.int64)
    store.put(np.array([3, 5]), values)
    assert np.array_equal(store.get(np.array([5, 3, 4, -1])),
                          np.array([values[1], values[0], [UNSTAMPED] * 4, [UNSTAMPED] * 4]))
    kv[6] = kv[3]  # a copy of the KV (a load-back) is a copy of the canary
    assert np.array_equal(store.get(np.array([6])), values[:1])
    store.put(np.array([3]), np.full((1, 4), UNSTAMPED))  # an undone write: the slot never written
    assert not kv[3].any()


def test_a_lane_store_refuses_what_float32_cannot_hold_exactly():
    with pytest.raises(ValueError, match="cannot be kept exact in float32"):
        LaneStore(np.zeros((4, 8), dtype=np.float32)).put(np.array([1]), np.array([[1 << 24, 0, 5, 0]]))
    with pytest.raises(ValueError, match="past the pool's 4"):
        LaneStore(np.zeros((4, 8), dtype=np.float32)).put(np.array([4]), np.array([[1, 0, 5, 0]]))
    with pytest.raises(ValueError, match="float32"):
        LaneStore(np.zeros((4, 8), dtype=np.float16))


def test_a_canary_on_a_lane_store_reads_as_on_a_side_table():
    from kvparity.engine.canary import ForwardRequest
    reads = []
    for store in (SlotStore(), LaneStore(np.zeros((16, 8), dtype=np.float32))):
        canary = KVCanary(store)
        first = ForwardRequest("a", 1, 3, 0, (5, 6, 7), (1, 2, 3), (5, 6, 7))
        canary.land(canary.launch(0, [first], {1: np.array([1, 2, 3])}), [])
        second = ForwardRequest("b", 2, 4, 3, (9,), (4,), (5, 6, 7, 9))
        launch = canary.launch(1, [second], {2: np.array([1, 2, 3, 4])})
        reads.append((launch.last_hashes, launch.violations))
    assert reads[0] == reads[1] and reads[0][1] == []


def _host(nodes, free, available=None):
    return HostState(slots=8, free=tuple(free), nodes=tuple(HostNode(*node) for node in nodes),
                     available_size=len(free) if available is None else available)


def test_every_host_slot_is_free_or_backs_exactly_one_node():
    """Eight host slots: the node (1, 2) is backed by host slots 0-1 and still on the device in 5-6;
    (1, 2, 3) by host slot 2, evicted from the device; 3-7 are free."""
    nodes = [((1, 2), (0, 1), (5, 6), False, False), ((1, 2, 3), (2,), None, False, False)]
    assert host_slots_conserved(_host(nodes, range(3, 8))) == []
    assert host_slots_conserved(_host(nodes, range(2, 8))) == [
        "host slots in two places at once (free, backing a node, fetched from storage): [2]"]
    assert host_slots_conserved(_host(nodes, range(4, 8))) == [
        "host slots neither free, nor backing a node, nor fetched from storage (leaked): [3]"]
    assert host_slots_conserved(_host(nodes, [*range(3, 8), 8])) == ["host slots that are no slots of the pool: [8]"]
    assert host_slots_conserved(_host(nodes, range(3, 8), available=4)) == [
        "host available_size 4 is not the 5 free slots"]


def test_no_host_slot_is_freed_while_a_transfer_lists_it():
    """A load-back lists (1, 2, 3)'s host slot 2: freed meanwhile (a host eviction during the
    load-back), it is both free and listed."""
    loading = [((1, 2, 3), (2,), (7,), False, True)]
    assert host_slots_conserved(_host(loading, [2, 3, 4, 5, 6, 7, 0, 1])) == [
        "host slots in two places at once (free, backing a node, fetched from storage): [2]",
        "host slots freed while a transfer lists them: [2]"]


def test_a_node_s_device_and_host_states_agree():
    """(1, 2) holds two device slots but one host slot; (1, 2, 3, 4) is being loaded back without
    device slots; and the device tree still holds KV below (5, 6), which the device evicted. The
    same tokens under another extra key (a LoRA adapter's tree) are another tree: not below it."""
    nodes = [((1, 2), (0,), (5, 6), False, False), ((1, 2, 3, 4), (1, 2), None, False, True),
             ((5, 6), (3, 4), None, False, False)]
    device_tree = ((None, (1, 2), (5, 6), 0), (None, (5, 6, 7), (9,), 0), ("lora-a", (5, 6, 8), (10,), 0))
    assert host_nodes_consistent(_host(nodes, range(5, 8)), device_tree) == [
        "node [2 tokens ending [1, 2]]: 2 device slots but 1 host slots",
        "node [4 tokens ending [2, 3, 4]]: a load-back lists it, but it has no device slots",
        "device KV below a node the device evicted: [3 tokens ending [5, 6, 7]]"]
    lora_only = ((None, (1, 2), (5, 6), 0), ("lora-a", (5, 6, 8), (10,), 0))
    assert host_nodes_consistent(_host(nodes[2:], range(5, 8)), lora_only) == []


A = tuple(range(100, 140))


def load_back_scenario(policy: str = "write_through") -> TrafficScenario:
    """``a`` (40 tokens) finishes, the tree keeps it (backed up to the host); ``b`` and ``c`` (40
    of their own each) need the device's 64 slots, so a's KV is evicted from the device and kept
    on the host alone; ``d`` (a's prompt and two more) hits it there: loaded back, not recomputed."""
    config = ServerConfig(pool_rows=4, max_running_requests=4, kv_slots=64, hicache_ratio=2.0,
                          hicache_write_policy=policy)
    fresh = [tuple(range(1000 * k, 1000 * k + 40)) for k in (2, 3)]
    return TrafficScenario(config, ((Arrival("a", A, 1),), (), (Arrival("b", fresh[0], 1),), (),
                                    (Arrival("c", fresh[1], 1),), (), (Arrival("d", A + (5, 6), 2),)))


def _played(release_workers, release, scenario):
    from kvparity.engine.traffic_run import TrafficRun

    config, arrivals = scenario.to_plain()
    run = TrafficRun.from_plain(release_workers(release).call("run_traffic", config=config, arrivals=arrivals))
    assert run.error is None, run.error
    assert run_problems(traffic_geometry(scenario), run.memory) == []
    assert [read.line() for snap in run.memory for read in snap.record.canary] == []
    return run


@pytest.mark.parametrize("release", ["0.5.3", "0.5.6", "0.5.15", "0.5.23"])
def test_a_prefix_the_device_evicted_is_loaded_back_from_the_host(release_workers, release):
    """The same on HiRadixCache (0.5.3, 0.5.6, 0.5.15: a radix tree with a host tier of its own) and
    on UnifiedRadixCache's host tier (0.5.19+: 0.5.23)."""
    run = _played(release_workers, release, load_back_scenario())
    hits = {rid: hit for rec in run.decisions if rec.mode == "EXTEND" for rid, hit in zip(rec.rids, rec.prefix_lens)}
    assert hits["d"] == 40, hits
    assert {TRAFFIC_HOST_DEMOTED, TRAFFIC_HOST_LOAD_BACK} <= host_classes(run)


def storage_scenario() -> TrafficScenario:
    """``a`` and then three requests of their own (40 tokens each) pass one after another through a
    device of 64 slots and a host of 129: each pushes the one before it to the host, and the host,
    full, evicts a's KV, which storage still keeps; ``d`` (a's prompt and two more) finds it there:
    fetched to the host, then loaded back to the device, not recomputed."""
    config = ServerConfig(pool_rows=4, max_running_requests=4, kv_slots=64, hicache_ratio=2.0, hicache_storage=True)
    fresh = [(Arrival(f"f{k}", tuple(range(1000 * k, 1000 * k + 40)), 1),) for k in (2, 3, 4)]
    return TrafficScenario(config, ((Arrival("a", A, 1),), (), *[g for f in fresh for g in (f, ())],
                                    (Arrival("d", A + (5, 6), 2),)))


def write_back_load_back_scenario(d_outputs: int = 2) -> TrafficScenario:
    """Write-back, a device of 64 slots, a host of 49: ``a`` (40 tokens) reaches the host when
    ``g`` evicts it (beside ``f``, 20 each). ``d`` (a's prompt and two more) and ``h`` (20 of its
    own) arrive together: d's load-back of a makes room by dropping f (the host has none for it),
    then h's room is g's, whose write-back needs host room: a's host copy, which the load-back
    lists and locks until acknowledged, must not be the room taken."""
    config = ServerConfig(pool_rows=4, max_running_requests=4, kv_slots=64, hicache_ratio=0.75,
                          hicache_write_policy="write_back", hicache_ack_delay=2)
    own = [tuple(range(k, k + 20)) for k in (2000, 3000, 5000)]
    return TrafficScenario(config, ((Arrival("a", A, 1),), (), (Arrival("f", own[0], 1),), (), (Arrival("g", own[1], 1),),
                                    (), (Arrival("d", A + (5, 6), d_outputs), Arrival("h", own[2], 2))))


@pytest.mark.parametrize("release", ["0.5.19", "0.5.23"])
def test_a_prefix_the_host_evicted_is_fetched_from_storage_and_loaded_back(release_workers, release):
    """d waits one iteration while a's 40 tokens come from the file backend into 40 host slots (in
    flight, outside the tree), then extends on a 40-token hit: the canary's lanes went from the
    device to the host, to a file, and back, unchanged."""
    run = _played(release_workers, release, storage_scenario())
    waiting = [snap.host.in_flight for rec, snap in zip(run.decisions, run.memory) if "d" in rec.waiting]
    assert [len(slots) for slots in waiting] == [40]
    hits = {rid: hit for rec in run.decisions if rec.mode == "EXTEND" for rid, hit in zip(rec.rids, rec.prefix_lens)}
    assert hits["d"] == 40
    assert run.memory[-1].host.fetched == 40
    assert TRAFFIC_STORAGE_HIT in host_classes(run)


def test_a_request_aborted_while_its_prefix_is_fetched_from_storage_gives_its_host_slots_back(release_workers):
    """The nemesis's abort while prefetching: d's client disconnects in the pass d waits for a's 40
    tokens to come from storage. SGLang's abort ends the fetch; every host slot it took is free or
    backs a node again (``_played`` runs the host oracle after every pass), and d is never run."""
    scenario = dataclasses.replace(storage_scenario(), abort_when=(("d", "prefetching"),))
    run = _played(release_workers, "0.5.23", scenario)
    assert [(rid, state) for _, rid, state in run.aborts] == [("d", "prefetching")]
    assert all("d" not in rec.rids for rec in run.decisions)
    assert {TRAFFIC_ABORTS["prefetching"], TRAFFIC_ABORTS["waiting"]} <= abort_classes(run)  # waiting, too


@pytest.mark.parametrize("release", ["0.5.15", "0.5.23"])
def test_a_request_aborted_while_its_prefix_is_loaded_back_from_the_host_leaves_nothing_held(release_workers,
                                                                                          release):
    """The nemesis's abort while loading back: d's admission loads a's 40 tokens back from the host
    (HiRadixCache, UnifiedRadixCache), acknowledged two passes late, and d's client disconnects in
    the next pass, the load still listed. SGLang's abort finishes d after that pass's decode (of 8
    outputs, it would decode 7 times); every device, host and row slot is free, in the tree or held
    once after every pass (``_played``)."""
    scenario = dataclasses.replace(write_back_load_back_scenario(d_outputs=8), abort_when=(("d", "loading back"),))
    run = _played(release_workers, release, scenario)
    assert [(rid, state) for _, rid, state in run.aborts] == [("d", "loading back")]
    assert abort_classes(run) == {TRAFFIC_ABORTS["loading back"]}
    assert [str(rec.mode) for rec in run.decisions if "d" in rec.rids] == ["EXTEND", "DECODE"]


def test_a_copy_that_leaves_an_aborted_requests_fetch_running_is_caught_only_under_that_abort(mutant_judged):
    """``abort-prefetching-keeps-fetch``: d's fetch runs on after d's abort, and what the host keeps
    afterwards differs from the release's (its nodes and tokens); on the same traffic without the
    abort, the copy agrees with the release."""
    judgement, _ = mutant_judged("abort-prefetching-keeps-fetch", storage_scenario())
    assert judgement.agree, judgement.line()
    aborted = dataclasses.replace(storage_scenario(), abort_when=(("d", "prefetching"),))
    judgement, _ = mutant_judged("abort-prefetching-keeps-fetch", aborted)
    assert not judgement.agree and judgement.kind == "memory", judgement.line()


def test_a_late_acknowledgement_keeps_a_load_back_listed(release_workers):
    """The fault mode: every transfer acknowledged two passes late. d's load-back of a is listed
    (pinned against write-back's reclaim) in the iteration it is made and the next, not after."""
    run = _played(release_workers, "0.5.23", write_back_load_back_scenario())
    listed = [bool(snap.host.loading) for snap in run.memory]
    first = listed.index(True)
    assert listed[first:first + 3] == [True, True, False]


@pytest.mark.parametrize(("release", "mamba", "loads_refused"),
                         [("0.5.15", False, 1), ("0.5.23", False, 0), ("0.5.16", True, 0)])
def test_a_backup_the_host_has_no_room_for_is_counted(release_workers, release, mamba, loads_refused):
    """Write-back to a host of 49 slots: g's eviction needs a backup while a's load-back holds the
    host, so the backup is refused: counted on HiRadixCache's controller, and where
    UnifiedRadixCache checks for host room itself and gives up before asking its controller (a Mamba
    model's host tier in 0.5.16: its ``write_backup`` backs up no token; from 0.5.17
    ``_execute_kv_backup`` returns None). HiRadixCache also finds no device room for a load-back
    once (UnifiedRadixCache evicts the device first)."""
    from kvparity.model.classes import TRAFFIC_BACKUP_REFUSED, TRAFFIC_LOAD_BACK_REFUSED

    scenario = write_back_load_back_scenario()
    if mamba:  # a Mamba model's server: page size 1, the fewest state slots its four rows run with
        scenario = dataclasses.replace(scenario, config=dataclasses.replace(scenario.config, page_size=1, mamba_slots=12))
    run = _played(release_workers, release, scenario)
    host = run.memory[-1].host
    assert host.backups_refused > 0 and host.loads_refused == loads_refused
    assert TRAFFIC_BACKUP_REFUSED in host_classes(run)
    assert (TRAFFIC_LOAD_BACK_REFUSED in host_classes(run)) == bool(loads_refused)


@pytest.mark.parametrize("release", ["0.5.15", "0.5.23"])
def test_a_request_left_waiting_for_device_room_while_its_prefix_waits_on_the_host_is_a_refused_load_back(
        release_workers, release):
    """f (40 tokens, 16 outputs) pushes a's 40 tokens to the host and holds the device while it
    decodes; d (a's prompt and two more) arrives then: its load-back, extend and outputs do not fit
    beside f, so the PrefillAdder leaves it waiting (from 0.5.21 its budget counts the host hit
    before any load starts), and d runs on a 40-token hit once f is done."""
    from kvparity.model.classes import TRAFFIC_LOAD_BACK_REFUSED

    config = ServerConfig(pool_rows=4, max_running_requests=4, kv_slots=64, hicache_ratio=2.0)
    scenario = TrafficScenario(config, ((Arrival("a", A, 1),), (), (Arrival("f", tuple(range(2000, 2040)), 16),),
                                        (), (Arrival("d", A + (5, 6), 4),)))
    run = _played(release_workers, release, scenario)
    refused = [snap.host.loads_refused for snap in run.memory]
    assert refused[3:5] == [0, 1]  # the pass d arrives in
    assert TRAFFIC_LOAD_BACK_REFUSED in host_classes(run)
    admitted = [(rec.rids, rec.prefix_lens) for rec in run.decisions if str(rec.mode) == "EXTEND"]
    assert admitted[-1] == (("d",), (40,)) and [rec.rids for rec in run.decisions].index(("d",)) > 16


def host_eviction_scenario() -> TrafficScenario:
    """``a`` then ``b`` (40 tokens of their own each) through a device of 64 slots and a host of 49:
    b pushes a to the host, then the host, full, evicts a to back b up."""
    config = ServerConfig(pool_rows=4, max_running_requests=4, kv_slots=64, hicache_ratio=0.75)
    return TrafficScenario(config, ((Arrival("a", A, 1),), (), (Arrival("b", tuple(range(2000, 2040)), 1),), (),
                                    (Arrival("c", tuple(range(3000, 3040)), 1),)))


def reclaim_scenario() -> TrafficScenario:
    """Write-back, a device of 128 slots, a host of 96 and file storage (shrunk from a check's
    draw): c1 and two prompts of their own pass through; then four requests hitting c1's first 4
    tokens decode under memory pressure, the host reclaiming copies the device also holds."""
    config = ServerConfig(kv_slots=128, max_prefill_tokens=256, schedule_conservativeness=0.3, hicache_ratio=0.75,
                          hicache_write_policy="write_back", hicache_storage=True)
    stem = tuple(range(100000, 100047))
    burst = tuple(Arrival(f"r{i}", stem[:4] + tuple(range(10000 * (i + 1), 10000 * (i + 1) + n)), out)
                  for i, (n, out) in enumerate(((22, 42), (31, 47), (26, 35), (30, 37))))
    return TrafficScenario(config, ((Arrival("c1", stem, 1),), (Arrival("f1", tuple(range(201000, 201055)), 1),),
                                    (Arrival("f2", tuple(range(202000, 202059)), 1),), burst))


def mamba(scenario: TrafficScenario) -> TrafficScenario:
    """``scenario`` served by a Mamba model (12 state slots): its states backed up to the host too."""
    return TrafficScenario(dataclasses.replace(scenario.config, mamba_slots=12), scenario.arrivals)


@pytest.mark.parametrize("release", ["0.5.16", "0.5.23"])
def test_a_mamba_models_state_is_loaded_back_from_the_host_with_its_kv(release_workers, release):
    """A Mamba model's host tier (``hicache-mamba``): a's KV and its state after 40 tokens go to
    the host when b and c take the device; d hits a's prompt there and both come back. The state
    canary: d's state slot holds exactly the state after a's 40 tokens (``_played`` asserts no
    canary read is wrong), and the state host pool conserves its slots after every iteration."""
    run = _played(release_workers, release, mamba(load_back_scenario()))
    hits = {rid: hit for rec in run.decisions if rec.mode == "EXTEND" for rid, hit in zip(rec.rids, rec.prefix_lens)}
    assert hits["d"] == 40
    assert TRAFFIC_HOST_LOAD_BACK in host_classes(run)
    assert state_load_backs(run.decisions, run.memory) == {TRAFFIC_STATE_LOAD_BACK}
    assert all(STATE_HOST_POOL.record(snap.pools) is not None for snap in run.memory)


def test_a_mamba_models_prefetch_gives_state_host_slots_back_through_its_release_queue(release_workers):
    """With storage, a Mamba model's prefetch holds state host slots as it starts (0.5.18); a query
    that finds nothing gives them back through the controller's release queue of the state pool,
    where they are in flight until released, not leaked (``_played`` runs the host oracle). d still
    finds a's prefix in storage."""
    run = _played(release_workers, "0.5.18", mamba(storage_scenario()))
    assert TRAFFIC_STORAGE_HIT in host_classes(run)


def write_back_storage_scenario(host_ratio: float) -> TrafficScenario:
    """A Mamba model's host tier, write_back, with storage (shrunk from a nemesis task of 0.5.23):
    f (18 tokens) finishes; r0 (58) and r1 (49 of r0's prompt) arrive. r1's match stops at 0 (no
    state kept at 48 tokens), so its 49 tokens need f's and r0's device slots: each demoted leaf's
    host copy starts a storage backup that host-locks it, and r0's 48-token node then needs host
    room only those locked nodes hold."""
    config = ServerConfig(pool_rows=4, kv_slots=96, max_prefill_tokens=15, max_running_requests=4,
                          schedule_conservativeness=0.3, mamba_slots=12, hicache_ratio=host_ratio,
                          hicache_write_policy="write_back", hicache_storage=True)
    r0 = tuple(range(200000, 200053)) + tuple(range(10000, 10005))
    return TrafficScenario(config, ((Arrival("f", tuple(range(204000, 204018)), 1),),
                                    (Arrival("r0", r0, 1), Arrival("r1", r0[:49], 1))))


WRITE_BACK_BEHIND_STORAGE = "write-back eviction stopped by storage backups"


def _raises_a_known_defect(release_workers, release: str, scenario: TrafficScenario, seen: str, name: str) -> str:
    """``release``'s run of ``scenario`` stops on an error that says ``seen`` and is SGLang's known
    defect ``name``; the error's message."""
    from kvparity.engine.traffic_run import TrafficRun

    config, arrivals = scenario.to_plain()
    run = TrafficRun.from_plain(release_workers(release).call("run_traffic", config=config, arrivals=arrivals))
    assert run.error is not None and seen in run.error.message, run.error
    known = known_defect(release, scenario.config, RAISED, run.error.message)
    assert known is not None and known.name == name, known
    return run.error.message


def test_write_back_eviction_behind_storage_backups_raises_out_of_memory_a_known_defect(release_workers):
    scenario = write_back_storage_scenario(0.75)  # a host of 73 slots
    # 48 tokens counted evictable, never freed
    _raises_a_known_defect(release_workers, "0.5.23", scenario, "full_available_size=48 + full_evictable_size_=48",
                           WRITE_BACK_BEHIND_STORAGE)
    _played(release_workers, "0.5.23", write_back_storage_scenario(2.0))  # a host of 192: room enough, none


def full_attention_write_back_storage_scenario(**change: object) -> TrafficScenario:
    """A full-attention model's host tier, write_back, with storage, acknowledgements a pass late,
    the overlap loop (shrunk from a nemesis task of 0.5.23): three prompts of their own fill the
    device and the small host; r0 and r3 then hit f0's and c0's prefixes."""
    config = ServerConfig(schedule_policy="lpm", page_size=4, pool_rows=2, kv_slots=96, max_prefill_tokens=17,
                          chunked_prefill_size=28, max_running_requests=2, schedule_conservativeness=0.3, loop="overlap",
                          hicache_ratio=0.75, hicache_write_policy="write_back", hicache_storage=True, hicache_ack_delay=1)
    own = [(Arrival(f"f{k}", tuple(range(200000 + 1000 * k, 200000 + 1000 * k + n)), 1),) for k, n in ((0, 37), (1, 48))]
    return TrafficScenario(dataclasses.replace(config, **change), (
        (Arrival("c0", tuple(range(100000, 100030)), 1),), (), (), (), *own, (), (),
        (Arrival("f4", tuple(range(204000, 204046)), 1),),
        (Arrival("r0", tuple(range(200000, 200006)) + tuple(range(10000, 10009)), 1),
         Arrival("r3", tuple(range(100000, 100029)) + tuple(range(40000, 40009)), 4))))


def test_write_back_eviction_behind_storage_backups_raises_on_a_full_attention_host_tier_too(release_workers):
    """The same defect without a Mamba model (0.5.22, 0.5.23): Prefill out of memory with 52 tokens
    counted evictable; the same traffic with storage off or a host of 192 runs to its end."""
    scenario = full_attention_write_back_storage_scenario()
    message = _raises_a_known_defect(release_workers, "0.5.23", scenario, "full_available_size=12 + full_evictable_size_=52",
                                     WRITE_BACK_BEHIND_STORAGE)
    assert known_defect("0.5.18", scenario.config, RAISED, message) is None
    _played(release_workers, "0.5.23", full_attention_write_back_storage_scenario(hicache_storage=False))
    _played(release_workers, "0.5.23", full_attention_write_back_storage_scenario(hicache_ratio=2.0))


def unpaged_write_back_storage_scenario(**change: object) -> TrafficScenario:
    """The same shape in pages of 1 (shrunk from the nemesis's controls of 0.5.21): c0's 60 tokens and
    three prompts of their own fill a device of 128 slots and a host of 96; s then hits c0's prompt,
    fetched from storage best effort (waiting for the whole fetch, none raises)."""
    config = ServerConfig(schedule_policy="lpm", pool_rows=4, kv_slots=128, max_prefill_tokens=4096,
                          chunked_prefill_size=32, max_running_requests=4, schedule_conservativeness=0.3, loop="overlap",
                          hicache_ratio=0.75, hicache_write_policy="write_back", hicache_storage=True,
                          hicache_prefetch_policy="best_effort")
    own = [(Arrival(f"f{k}", tuple(range(200000 + 1000 * k, 200000 + 1000 * k + n)), 1),) for k, n in ((0, 46), (2, 46), (3, 63))]
    return TrafficScenario(dataclasses.replace(config, **change), (
        (Arrival("c0", tuple(range(100000, 100060)), 1),), *own, (), (), (),
        (Arrival("s", tuple(range(100000, 100060)) + tuple(range(80000, 80004)), 2),)))


def test_write_back_eviction_behind_storage_backups_raises_in_pages_of_one_too(release_workers):
    """The full-attention form on 0.5.20 and 0.5.21, pages of 1: alloc_token_slots raises Out of memory
    with 85 tokens counted evictable; the normal loop, or a larger host, runs to its end."""
    scenario = unpaged_write_back_storage_scenario()
    message = _raises_a_known_defect(release_workers, "0.5.21", scenario, "full_available_size=11 + full_evictable_size_=85",
                                     WRITE_BACK_BEHIND_STORAGE)
    assert known_defect("0.5.18", scenario.config, RAISED, message) is None
    _played(release_workers, "0.5.21", unpaged_write_back_storage_scenario(loop="normal"))
    _played(release_workers, "0.5.21", unpaged_write_back_storage_scenario(hicache_ratio=2.0))


def hiradix_write_back_storage_scenario(**change: object) -> TrafficScenario:
    """HiRadixCache's form (shrunk from the nemesis's controls of 0.5.18): c0's 48 tokens, then six
    prompts of their own through a device of 96 slots in pages of 4 and a host of 72; t0 and t1 hit c0."""
    config = ServerConfig(schedule_policy="lpm", page_size=4, pool_rows=2, kv_slots=96, max_prefill_tokens=16,
                          chunked_prefill_size=24, max_running_requests=2, hicache_ratio=0.75,
                          hicache_write_policy="write_back", hicache_storage=True)
    own = [(Arrival(f"f{k}", tuple(range(200000 + 1000 * k, 200000 + 1000 * k + n)), 1),)
           for k, n in enumerate((37, 30, 43, 46, 38, 42))]
    return TrafficScenario(dataclasses.replace(config, **change), (
        (Arrival("c0", tuple(range(100000, 100048)), 1),), (), *own, *[()] * 9,
        (Arrival("t0", tuple(range(100000, 100047)) + tuple(range(90000, 90006)), 4),
         Arrival("t1", tuple(range(100000, 100048)), 2))))


def test_a_hiradix_write_back_host_tier_behind_storage_raises_out_of_memory_a_known_defect(release_workers):
    """0.5.15 to 0.5.18: Prefill out of memory with 48 tokens counted evictable; with write_through, or
    a host of 192, the same traffic runs to its end."""
    scenario = hiradix_write_back_storage_scenario()
    _raises_a_known_defect(release_workers, "0.5.15", scenario, "(available_size=4 + evictable_size=48)",
                           "write-back host tier out of memory behind storage (HiRadixCache)")
    _played(release_workers, "0.5.15", hiradix_write_back_storage_scenario(hicache_write_policy="write_through"))
    _played(release_workers, "0.5.15", hiradix_write_back_storage_scenario(hicache_ratio=2.0))


def unpaged_hiradix_write_back_storage_scenario(**change: object) -> TrafficScenario:
    """The same in pages of 1 (shrunk from the nemesis's controls of 0.5.18): c0's 42 tokens, two
    prompts of their own through a device of 128 slots and a host of 96, half the storage backups
    failing; s hits c0."""
    config = ServerConfig(pool_rows=4, kv_slots=128, max_prefill_tokens=4096, chunked_prefill_size=36,
                          max_running_requests=4, schedule_conservativeness=0.3, hicache_ratio=0.75,
                          hicache_write_policy="write_back", hicache_storage=True, hicache_ack_delay=1,
                          hicache_storage_failure=0.5, hicache_storage_seed=325, hicache_storage_failing="batch_set",
                          hicache_prefetch_policy="best_effort")
    return TrafficScenario(dataclasses.replace(config, **change), (
        (Arrival("c0", tuple(range(100000, 100042)), 1),), (), (), (), (),
        (Arrival("f4", tuple(range(204000, 204063)), 1),), (Arrival("f5", tuple(range(205000, 205058)), 1),), (),
        (Arrival("s", tuple(range(100000, 100042)) + tuple(range(80000, 80004)), 2),)))


def test_in_pages_of_1_the_hiradix_defect_raises_from_alloc_token_slots_in_words_of_its_own(release_workers):
    """0.5.18, pages of 1: RuntimeError: Out of memory with 36 tokens counted evictable, the same
    known defect; with write_through, or a host of 256, the same traffic runs to its end."""
    scenario = unpaged_hiradix_write_back_storage_scenario()
    _raises_a_known_defect(release_workers, "0.5.18", scenario, "(available_size=5 + evictable_size=36)",
                           "write-back host tier out of memory behind storage (HiRadixCache)")
    _played(release_workers, "0.5.18", unpaged_hiradix_write_back_storage_scenario(hicache_write_policy="write_through"))
    _played(release_workers, "0.5.18", unpaged_hiradix_write_back_storage_scenario(hicache_ratio=2.0))


def test_a_host_tier_serves_full_attention_or_a_mamba_model_and_names_what_it_refuses(release_workers):
    """A sliding-window model's host tier is not driven (refused by the scenario); a Mamba model's
    is from 0.5.16 (UnifiedRadixCache's), and refused by name before (MambaRadixCache has none)."""
    from kvparity.engine.real.worker import RemoteError

    with pytest.raises(ValueError, match="full attention and Mamba models only"):
        ServerConfig(kv_slots=64, sliding_window=8, hicache_ratio=2.0)
    config, arrivals = mamba(load_back_scenario()).to_plain()
    with pytest.raises(RemoteError, match="a Mamba model's host tier is not driven for this release"):
        release_workers("0.5.15").call("run_traffic", config=config, arrivals=arrivals)


@pytest.mark.parametrize(("name", "scenario", "kind", "what"), [
    ("hicache-load-back-skips-copy", load_back_scenario, "canary", "which holds token 2016 at position 16 of b; its own token 100"),
    ("hicache-demotion-pruned", load_back_scenario, "memory", "host available_size: 89 != 49"),
    ("hicache-host-slots-freed-twice", host_eviction_scenario, "error", "AssertionError: Double-free detected"),
    ("hicache-host-evicted-during-load-back", reclaim_scenario, "memory", "host available_size: 38 != 34"),
    ("hicache-mamba-state-load-skips-copy", lambda: mamba(load_back_scenario()), "canary",
     "request d (row 4) read state slot 7, which holds the empty state"),
    ("hicache-mamba-host-state-leaked", lambda: mamba(host_eviction_scenario()), "oracle",
     "states: host slots neither free, nor backing a node, nor fetched from storage (leaked): [0]"),
    ("hiradix-load-back-skips-copy", load_back_scenario, "canary", "which holds token 2016 at position 16 of b"),
    ("hiradix-demotion-pruned", load_back_scenario, "oracle", "host slots neither free, nor backing a node"),
])
def test_a_host_tier_mutant_of_a_release_is_caught(mutant_judged, name, scenario, kind, what):
    """Copies of 0.5.23 (UnifiedRadixCache) and 0.5.15 (HiRadixCache) whose host tier goes wrong,
    each against the release: a load-back that
    copies nothing leaves d reading b's KV, which the device slots held before (the canary); a demotion
    turned into a prune frees a's host copy with its device slots (the host tier's memory, from
    the iteration b evicts a); host slots released twice stop the release on its own assertion
    (its run ends early); write-back's reclaim taking host copies that are locked frees host
    slots the release keeps (the host tier's memory). HiRadixCache's prune deletes the node and
    leaves its host copy allocated: slots no node backs (the host oracle). A Mamba model's
    load-back that copies no state leaves d's state slot empty (the state canary); a host eviction
    that drops a node's host state without freeing it leaks the state host slot (the oracle)."""
    judgement, ours = mutant_judged(name, scenario())
    assert judgement.kind == kind, judgement.line()
    seen = [judgement.line(), *(read.line() for read in judgement.canary), ours.error.message if ours.error else ""]
    assert any(what in line for line in seen), seen


def test_a_host_pool_importing_sgl_kernel_gets_a_stand_in_for_that_import_only(release_workers):
    """0.5.3 to 0.5.12's host pool module imports ``sgl_kernel.kvcacheio`` on every device: it is
    imported with a stand-in of kvparity's there, and ``sgl_kernel`` stays absent for the rest of
    SGLang, which chooses its CPU fallbacks by that absence."""
    assert "sgl_kernel" in release_workers("0.5.12").call("hello")["absent"]


@pytest.mark.parametrize("release", ["0.5.3", "0.5.18"])
def test_hiradix_cache_fetches_a_prefix_from_storage_within_the_iteration_d_arrives_in(release_workers, release):
    """HiRadixCache's storage tier (0.5.3 to 0.5.18): its prefetch loop makes its page-transfer
    queue itself each time it runs (from 0.5.16 the scheduler's thread feeds that queue after the
    hit query), and kvparity serves the queue it made. d's 40 tokens come from the file backend
    as d arrives, so d extends on a 40-token hit at once, never seen waiting; the canary's lanes
    went device, host, file and back, unchanged."""
    run = _played(release_workers, release, storage_scenario())
    assert not any("d" in rec.waiting for rec in run.decisions)
    hits = {rid: hit for rec in run.decisions if rec.mode == "EXTEND" for rid, hit in zip(rec.rids, rec.prefix_lens)}
    assert hits["d"] == 40
    assert [snap.host.fetched for snap in run.memory][-1] == 40
    assert TRAFFIC_STORAGE_HIT in host_classes(run)


@pytest.mark.parametrize("release", ["0.5.22", "0.5.23"])
def test_a_storage_tier_that_fails_every_call_is_recomputed_around(release_workers, release):
    """Every storage call failing (SGLang's own failure injector in 0.5.23, kvparity's faulty
    backend in 0.5.22): nothing reaches storage and nothing comes back from it, so d recomputes the
    prefix the host evicted (no fetch, no read of wrong KV, every slot accounted for)."""
    scenario = storage_scenario()
    failing = TrafficScenario(dataclasses.replace(scenario.config, hicache_storage_failure=1.0), scenario.arrivals)
    run = _played(release_workers, release, failing)
    assert TRAFFIC_STORAGE_HIT not in host_classes(run) and run.memory[-1].host.storage_faults
    hits = {rid: hit for rec in run.decisions if rec.mode == "EXTEND" for rid, hit in zip(rec.rids, rec.prefix_lens)}
    assert hits["d"] == 0


def harness_load_back() -> Scenario:
    """kvparity's own loop: ``r0`` (20 tokens) prefills and finishes (the tree keeps it, backed up
    to the host); the tree is evicted (its KV kept on the host alone); ``r1`` (r0's prompt and 3
    more) hits it there and loads it back before its prefill."""
    r0 = tuple(range(100000, 100020))
    return Scenario(Geometry(pool_rows=4, max_context_len=64, kv_slots=64, page_size=1, need_sort=False), "radix",
                    (RequestSpec("r0", r0, max_new_tokens=64), RequestSpec("r1", r0 + (7, 8, 9), arrival=3)),
                    (Extend(admit=("r0",)), Decode(finish=("r0",)), Evict(64), Extend(admit=("r1",))))


@pytest.mark.parametrize(("name", "model", "read"), [
    ("hiradix-load-back-skips-copy", "hicache", "KV canary"),
    ("hicache-load-back-skips-copy", "hicache", "KV canary"),
    ("hicache-mamba-state-load-skips-copy", "hicache-mamba", "read state slot"),
])
def test_the_harness_drive_loads_a_host_hit_back_and_reads_it(tmp_path, name, model, read):
    """With ``--caches hicache`` kvparity's loop makes a server's host-tier calls (its events as a
    pass starts, the load-back of a host hit before the cut, the load started as the batch
    forms), on HiRadixCache (0.5.15) and on UnifiedRadixCache's tier in the prefix-length state
    model (0.5.23): the release restores r0's KV for r1; the copy whose load-back copies nothing
    is caught by the canary reading what the device slots held before. A Mamba model's
    (``--caches hicache-mamba``) loads r0's state back too: the copy that copies no state is
    caught by the canary of its state slot."""
    from kvparity.engine.real.install import resolve
    from kvparity.engine.real.lane import RealLane
    from kvparity.run.runner import run_scenario
    from kvparity.teeth.real_zoo import REAL_MUTANTS_BY_NAME, make_mutated_copy

    mutant = REAL_MUTANTS_BY_NAME[name]
    copy = make_mutated_copy(resolve(mutant.version), mutant, tmp_path / mutant.name)
    with RealLane([mutant.against, str(copy)], ("torch",), model=model) as lane:
        result = run_scenario(harness_load_back(), (("legacy", "torch"),), lane=lane, real_reference=True)
    lines = [v.line() for v in result.violations]
    assert lines and all(v.world == f"{name}@{mutant.version}/torch" for v in result.violations), lines
    assert read in lines[0] and "r1" in lines[0], lines


def backed_off_load_back_scenario(**change: object) -> TrafficScenario:
    """A Mamba model's host tier, write_back, acknowledgements 2 passes late (shrunk from the
    nemesis's controls of 0.5.20 to 0.5.22): c0's 30 tokens and three prompts of their own (one
    aborted between chunks) push c0 to the host; s loads c0's prompt back, and its load pins the
    node at 24 tokens until acknowledged; the next pass r3 (c0's first 26 tokens) matches 20 on the
    device and the state at 24 on the host, in that pinned node."""
    def own(rid: str, start: int, n: int, out: int = 1) -> Arrival:
        return Arrival(rid, tuple(range(start, start + n)), out)

    config = ServerConfig(schedule_policy="lpm", pool_rows=4, kv_slots=128, max_prefill_tokens=15,
                          chunked_prefill_size=24, max_running_requests=4, mamba_slots=20, hicache_ratio=2.0,
                          hicache_write_policy="write_back", hicache_ack_delay=2)
    return TrafficScenario(dataclasses.replace(config, **change), (
        (own("c0", 200000, 30),), (own("f1", 201000, 63),), (), (), (own("f6", 206000, 57),), (),
        (own("f8", 208000, 50),), (own("r1", 200000, 29, 5), own("r3", 200000, 26)),
        (Arrival("s", tuple(range(200000, 200030)) + tuple(range(80000, 80004)), 2),),
    ), abort_when=(("*", "between chunks"),))


def test_a_mamba_load_back_backed_off_by_another_loads_pin_extends_from_the_empty_state(release_workers):
    """A known SGLang defect (0.5.20 to 0.5.23): r3's load-back is rejected (the node is pinned by
    s's load, not yet acknowledged), and SGLang admits r3 on its 20 device tokens without their
    state, so its extend reads the empty state. On time, or under write_through (no pins): none."""
    from kvparity.engine.real.defects import CANARY, known_defect
    from kvparity.engine.traffic_run import TrafficRun

    scenario = backed_off_load_back_scenario()
    config, arrivals = scenario.to_plain()
    run = TrafficRun.from_plain(release_workers("0.5.21").call("run_traffic", config=config, arrivals=arrivals))
    reads = [read for snap in run.memory for read in snap.record.canary]
    assert [(read.rid, read.position, read.found) for read in reads][:1] == [("r3", 19, None)]
    known = known_defect("0.5.21", scenario.config, CANARY, reads[0].line())
    assert known is not None and known.name == "Mamba load-back backed off onto a prefix without its state"
    _played(release_workers, "0.5.21", backed_off_load_back_scenario(hicache_ack_delay=0))
    _played(release_workers, "0.5.21", backed_off_load_back_scenario(hicache_write_policy="write_through"))


def test_a_refused_request_counts_as_a_refused_load_back_when_any_of_its_prefix_waits_on_the_host():
    """SGLang's own answer where a release has one (0.5.13+, ``VersionEntry.needs_host_load_back``):
    a Mamba model's request whose state alone waits on the host (its KV on the device) needs a
    load-back as much as one whose KV does. Before 0.5.13, only the KV's host hit says so."""
    from types import SimpleNamespace

    from kvparity.engine.real.scheduler_shell import _waits_on_host
    from kvparity.engine.real.versions import SUPPORTED

    answers, before = SUPPORTED["0.5.13"], SUPPORTED["0.5.12.post1"]
    state_only = SimpleNamespace(host_hit_length=0, needs_host_load_back=lambda: True)
    assert _waits_on_host(answers, state_only) and not _waits_on_host(before, state_only)
    assert not _waits_on_host(answers, SimpleNamespace(host_hit_length=3, needs_host_load_back=lambda: False))
    assert _waits_on_host(before, SimpleNamespace(host_hit_length=3))
    assert not _waits_on_host(before, SimpleNamespace(host_hit_length=0))


def called_off_state_load_back_scenario(**change: object) -> TrafficScenario:
    """A Mamba model's host tier, write_back, half the storage backups failing (a 0.5.16 control's
    scenario, the nemesis's host hits w0 and w1 after a filler holding the device; not shrinkable:
    the faults' sequence follows the storage calls)."""
    def own(rid: str, *runs: tuple[int, int], out: int = 1) -> Arrival:
        return Arrival(rid, tuple(t for start, stop in runs for t in range(start, stop)), out)

    config = ServerConfig(pool_rows=2, kv_slots=96, max_prefill_tokens=27, chunked_prefill_size=28,
                          max_running_requests=2, schedule_conservativeness=0.3, mamba_slots=23, hicache_ratio=0.75,
                          hicache_write_policy="write_back", hicache_storage=True, hicache_ack_delay=2,
                          hicache_storage_failure=0.5, hicache_storage_seed=511, hicache_storage_failing="batch_set")
    fillers = [(own(f"f{k}", (200000 + 1000 * k, 200000 + 1000 * k + n), out=48 if k == 6 else 1),)
               for k, n in enumerate((27, 31, 24, 37, 37, 25, 46))]
    return TrafficScenario(dataclasses.replace(config, **change), (
        (own("c0", (100000, 100053)),), (own("c1", (100000, 100058)),), (own("c2", (200000, 200045)),), (),
        *fillers,
        (own("w0", (100000, 100058), (60000, 60004), out=5), own("w1", (200000, 200045), (60100, 60104), out=4),
         own("r0", (100000, 100057), (10000, 10002), out=5), own("r1", (100000, 100052), out=5),
         own("r2", (100000, 100057), out=6)),
        (own("s", (100000, 100053), (80000, 80004), out=2),),
    ), aborts=((),) * 11 + (("r1",),))


def test_a_mamba_load_back_called_off_keeps_a_state_slot_nobody_cleared_before_0_5_17(release_workers):
    """A known SGLang defect of 0.5.16: a called-off load-back keeps the state slot it allocated,
    uncleared, and w0 extends from f1's state where the empty state belongs. 0.5.18 plays it clean."""
    from kvparity.engine.real.defects import CANARY, known_defect
    from kvparity.engine.traffic_run import TrafficRun

    scenario = called_off_state_load_back_scenario()
    config, arrivals = scenario.to_plain()
    run = TrafficRun.from_plain(release_workers("0.5.16").call("run_traffic", config=config, arrivals=arrivals))
    reads = [read for snap in run.memory for read in snap.record.canary]
    assert reads and reads[0].rid == "w0" and "the empty state belongs there" in reads[0].line(), reads[:1]
    known = known_defect("0.5.16", scenario.config, CANARY, reads[0].line())
    assert known is not None and known.name == "Mamba load-back called off on a state slot it took"
    _played(release_workers, "0.5.18", scenario)


def overwritten_state_load_back_scenario(**change: object) -> TrafficScenario:
    """A Mamba model's host tier, write_through, a quarter of the storage reads failing (a 0.5.23
    draw of the nemesis's host hits without the holding filler; not shrinkable: the faults' sequence
    follows the storage calls): s matches r3's 5 tokens on the device and c0's 13 more from storage."""
    def own(rid: str, *runs: tuple[int, int], out: int = 1) -> Arrival:
        return Arrival(rid, tuple(t for start, stop in runs for t in range(start, stop)), out)

    config = ServerConfig(pool_rows=2, kv_slots=128, max_prefill_tokens=29, chunked_prefill_size=20,
                          max_running_requests=2, mamba_slots=26, hicache_ratio=2.0, hicache_storage=True,
                          hicache_ack_delay=1, hicache_storage_failure=0.25, hicache_storage_seed=65535,
                          hicache_storage_failing="batch_get")
    fillers = [(own(f"f{k}", (200000 + 1000 * k, 200000 + 1000 * k + n)),)
               for k, n in enumerate((36, 45, 60, 59, 47, 55, 32, 56, 42, 51))]
    return TrafficScenario(dataclasses.replace(config, **change), (
        (own("c0", (100000, 100018)),), (own("c1", (200000, 200033)),), (own("c2", (200000, 200050)),), (),
        *fillers,
        (own("w0", (100000, 100018), (60000, 60004), out=3), own("w1", (200000, 200050), (60100, 60104), out=4),
         own("r0", (200000, 200033), (10000, 10007), out=2), own("r1", (200000, 200032), (20000, 20003), out=6),
         own("r2", (200000, 200033), (30000, 30010), out=2), own("r3", (100000, 100005)),
         own("r4", (100000, 100006), (50000, 50003), out=2)),
        (own("s", (100000, 100018), (80000, 80004), out=2),),
    ), aborts=((),) * 14 + (("w1",),))


def test_a_mamba_state_loaded_back_is_overwritten_by_the_matchs_copy_on_write(release_workers):
    """A known SGLang defect of 0.5.23: s's state, loaded back from the host, is overwritten by the
    copy its device match staged, and s reads the state after position 4 at position 17. With the
    storage faults off the same traffic runs clean."""
    from kvparity.engine.real.defects import CANARY, known_defect
    from kvparity.engine.traffic_run import TrafficRun

    scenario = overwritten_state_load_back_scenario()
    config, arrivals = scenario.to_plain()
    run = TrafficRun.from_plain(release_workers("0.5.23").call("run_traffic", config=config, arrivals=arrivals))
    reads = [read for snap in run.memory for read in snap.record.canary]
    assert reads and reads[0].rid == "s" and "holds the state after token 100004 at position 4" in reads[0].line()
    known = known_defect("0.5.23", scenario.config, CANARY, reads[0].line())
    assert known is not None and known.name == "Mamba state loaded back, then overwritten by the match's copy-on-write"
    _played(release_workers, "0.5.23", overwritten_state_load_back_scenario(hicache_storage_failure=0.0))
