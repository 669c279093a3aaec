"""A hybrid linear (Mamba) model (issue 34): each request runs with a recurrent-state slot beside
its KV row, and the tree keeps states at the nodes it can restore from (``MambaRadixCache`` up to
0.5.15, ``UnifiedRadixCache`` with the FULL and MAMBA components from 0.5.16). kvparity's forward
keeps a state slot holding the KV canary of the last token it has seen, so a restored state is
checked against the prefix it claims; the state oracle checks every slot is in exactly one place."""

from __future__ import annotations

import numpy as np
import pytest

from kvparity.caches.state_pool import MambaState, states_conserved
from kvparity.engine.canary import EMPTY_STATE, ForwardRequest, KVCanary, StateView
from kvparity.judge.memory import run_problems
from kvparity.judge.traffic_classes import traffic_classes
from kvparity.model.classes import TRAFFIC_STATE_RESTORED
from kvparity.model.traffic import Arrival, ServerConfig, TrafficScenario, traffic_geometry


@pytest.mark.parametrize(("fields", "message"), [
    (dict(mamba_slots=23, max_running_requests=8), "mamba_slots=23: a server with a prefix cache runs at most one "
                                                   "request per 3 state slots"),
    (dict(mamba_slots=24, page_size=4), "page size 1 in the normal loop only"),
    (dict(mamba_slots=24, loop="overlap"), "page size 1 in the normal loop only"),
    (dict(mamba_slots=24, sliding_window=4), "both a sliding window and Mamba layers"),
])
def test_a_mamba_setting_that_cannot_be_served_is_refused_by_name(fields, message):
    with pytest.raises(ValueError, match=message):
        ServerConfig(**fields)


def _states(rows, tree, free, available=None):
    return MambaState(slots=tuple(range(1, 7)), rows=tuple(rows), tree=tuple(tree), free=tuple(free),
                      available_size=len(free) if available is None else available)


def test_every_state_slot_is_free_kept_by_the_tree_or_a_row_s():
    """Six slots: rows 1 and 2 run in slots 1 and 2, the tree keeps 3 and 4, 5 and 6 are free."""
    assert states_conserved(_states([(1, 1), (2, 2)], [3, 4], [5, 6])) == []
    assert states_conserved(_states([(1, 1), (2, 3)], [3, 4], [5, 6])) == [
        "state slots in two places at once (free, the tree, a row, a waiting request): [3]", "state slots neither free, nor kept "
        "by the tree, nor a request's (leaked): [2]"]
    assert states_conserved(_states([(1, 1)], [3, 4], [5, 6])) == [
        "state slots neither free, nor kept by the tree, nor a request's (leaked): [2]"]
    assert states_conserved(_states([(1, 1), (2, 2)], [3, 4], [5, 6, 0])) == [
        "state slots that are no slots of the pool: [0]"]
    assert states_conserved(_states([(1, 1), (2, 2)], [3, 4], [5, 6], available=3)) == [
        "state available_size 3 is not the 2 free slots"]


class _Pool:
    """A state pool of canaries, by slot (what ``hybrid_pools.state_view`` reads from a MambaPool)."""

    def __init__(self) -> None:
        self.held: dict[int, np.ndarray] = {}

    def view(self, slots: dict[str, int]) -> StateView:
        def read(s: np.ndarray) -> np.ndarray:
            return np.stack([self.held.get(int(k), np.array(EMPTY_STATE)) for k in s])

        def write(s: np.ndarray, canaries: np.ndarray) -> None:
            self.held.update({int(k): c for k, c in zip(s, canaries)})

        return StateView(slots, read, write)


def test_a_state_must_be_the_state_after_the_prefix_it_claims():
    """``a`` prefills 4 tokens in slot 1 (which then holds the state after position 3). ``b`` hits
    a's first 4 tokens: its slot 2 must hold that state (the tree's copy on write). Not copied, it
    holds the empty state: a read of wrong state at position 3."""
    prompt = (7, 8, 9, 10)
    pool, canary = _Pool(), KVCanary()
    row = np.arange(1, 7, dtype=np.int64)
    canary.launch(0, [ForwardRequest("a", 0, 4, 0, prompt, (1, 2, 3, 4), prompt)], {0: row}, states=pool.view({"a": 1}))

    def b_extends() -> list:
        b = ForwardRequest("b", 1, 6, 4, (11, 12), (5, 6), (*prompt, 11, 12))
        return canary.launch(1, [b], {1: row}, states=pool.view({"b": 2})).violations

    assert [(r.position, r.slot, r.when, r.found) for r in b_extends()] == [(3, 2, "state", None)]
    pool.held[2] = pool.held[1]  # copied on write
    assert b_extends() == []


A = tuple(range(100, 140))


def mamba_scenario() -> TrafficScenario:
    """``a`` (40 tokens) finishes and leaves its state in the tree; ``c`` (a's prompt and two more)
    restores it, ``d`` (a's first 30) finds no state at 30 and prefills from nothing."""
    config = ServerConfig(pool_rows=4, max_running_requests=4, kv_slots=256, mamba_slots=12)
    return TrafficScenario(config, ((Arrival("a", A, 2),), (), (), (),
                                    (Arrival("c", A + (5, 6), 4), Arrival("d", A[:30], 3))))


@pytest.mark.parametrize(("release", "tree"), [
    ("0.5.3.post2", "MambaRadixCache"), ("0.5.15", "MambaRadixCache"), ("0.5.23", "unified/rust, FULL+MAMBA")])
def test_a_mamba_model_is_served_and_its_restored_states_are_right(release_workers, release, tree):
    """Each release's own tree and scheduler serve it: every request gets its tokens, the state
    oracle holds after every iteration, and ``c``'s state, restored from the tree, is the state after
    a's 40 tokens (0.5.15 on: the copy the model runner defers, done by kvparity's forward)."""
    from kvparity.engine.traffic_run import TrafficRun

    scenario = mamba_scenario()
    config, arrivals = scenario.to_plain()
    run = TrafficRun.from_plain(release_workers(release).call("run_traffic", config=config, arrivals=arrivals))
    assert run.error is None and run.player["tree"] == tree, (run.error, run.player)
    assert {rid: len(out) for rid, out in run.outputs.items()} == {"a": 2, "c": 4, "d": 3}
    assert run_problems(traffic_geometry(scenario), run.memory) == []
    assert [read.line() for snap in run.memory for read in snap.record.canary] == []
    hits = {rid: hit for rec in run.decisions if rec.mode == "EXTEND" for rid, hit in zip(rec.rids, rec.prefix_lens)}
    assert (hits["c"], hits["d"]) == (40, 0)
    assert TRAFFIC_STATE_RESTORED in traffic_classes(scenario, run)


def chain_scenario() -> TrafficScenario:
    """``a`` (16 tokens) prefills in two chunks of 8 and the tree keeps a state after each; ``b``
    (a's prompt and 3 more) restores the one after 16, whose node's parent keeps the one after 8."""
    config = ServerConfig(pool_rows=4, max_running_requests=4, kv_slots=256, chunked_prefill_size=8, mamba_slots=12)
    return TrafficScenario(config, ((Arrival("a", A[:16], 1),), (), (), (Arrival("b", A[:16] + (1, 2, 3), 2),)))


def eviction_scenario() -> TrafficScenario:
    """Sixteen requests of their own, one after another: each leaves its state in the tree, which
    holds twelve slots, so the last ones evict states and run in slots others used."""
    config = ServerConfig(pool_rows=4, max_running_requests=4, kv_slots=256, mamba_slots=12)
    return TrafficScenario(config, tuple((Arrival(f"r{i}", (1000 + 10 * i, 1001 + 10 * i, 1002 + 10 * i), 1),)
                                         for i in range(16)))


def refusal_scenario() -> TrafficScenario:
    """``c0`` (30 tokens) is cached; then ``a`` (28 tokens of its own) takes all but 4 of the pass's
    32 prefill tokens, and ``b`` (c0's prompt and 10 more) matches c0's state, which the tree copies
    into a slot for it, before the adder refuses it: the slot must go back."""
    config = ServerConfig(pool_rows=4, max_running_requests=4, kv_slots=256, max_prefill_tokens=32, mamba_slots=12)
    stem = tuple(range(300, 330))
    return TrafficScenario(config, ((Arrival("c0", stem, 1),), (), (),
                                    (Arrival("a", tuple(range(500, 528)), 2), Arrival("b", stem + tuple(range(9)), 2))))


@pytest.mark.parametrize(("name", "scenario", "kind", "what"), [
    ("mamba-fresh-slot-not-cleared", eviction_scenario, "canary", "which holds the state after"),
    ("mamba-restore-wrong-node", chain_scenario, "canary", "which holds the state after token 107 at position 7"),
    ("mamba-cow-kept-on-refusal", refusal_scenario, "oracle", "state slots conserved"),
])
def test_a_state_mutant_of_a_release_is_caught_where_its_state_goes_wrong(mutant_judged, name, scenario, kind, what):
    """Copies of 0.5.23 (and 0.5.15) whose Mamba path goes wrong, each against the release on a
    scenario that meets it: a fresh slot not cleared or a state restored from the wrong node is read
    by the forward (the state canary), a copy-on-write slot kept by a refused request leaks (the
    state oracle). The release against itself agrees."""
    judgement, _ = mutant_judged(name, scenario())
    assert judgement.kind == kind, judgement.line()
    assert what in judgement.line() + " ".join(read.line() for read in judgement.canary), judgement.line()


def test_the_harness_drive_plays_a_mamba_model_and_reads_its_restored_states(tmp_path):
    """The harness drive's worlds serve a Mamba model with ``--caches mamba`` (real against real):
    kvparity's loop decides, the release's tree restores states, the forward reads them. ``r9``
    hits r3's 7 tokens, whose state the tree keeps at a node under one holding the state after 6:
    0.5.15 restores the right one; the copy whose match takes the parent's is caught reading it."""
    from kvparity.engine.real.install import resolve
    from kvparity.engine.real.lane import RealLane
    from kvparity.model.scenario import Extend, RequestSpec, Scenario
    from kvparity.model.worlds import Geometry
    from kvparity.run.runner import run_scenario
    from kvparity.teeth.real_zoo import REAL_MUTANTS_BY_NAME, make_mutated_copy

    scenario = Scenario(Geometry(pool_rows=12, max_context_len=33, kv_slots=444, page_size=1, need_sort=True),
                        "radix", (RequestSpec("r2", (100000, *range(30000, 30012)), max_new_tokens=64),
                                  RequestSpec("r3", tuple(range(10000, 10007)), max_new_tokens=64),
                                  RequestSpec("r9", tuple(range(10000, 10008)), arrival=2, max_new_tokens=64)),
                        (Extend(admit=("r2", "r3")), Extend(admit=(), chunked_last=True), Extend(admit=("r9",))), 19)
    mutant = REAL_MUTANTS_BY_NAME["mamba-restore-wrong-node"]
    copy = make_mutated_copy(resolve(mutant.version), mutant, tmp_path / mutant.name)
    with RealLane(["0.5.15", str(copy)], ("torch",), tree_core_variants=False, model="mamba") as lane:
        result = run_scenario(scenario, (("legacy", "torch"),), lane=lane, real_reference=True)
    assert [v.world for v in result.violations] == [f"{mutant.name}@0.5.15/torch"] * len(result.violations)
    assert result.violations and "(state)" in result.violations[0].line(), [v.line() for v in result.violations]


def test_the_harness_drive_frees_a_refused_requests_state_on_every_release_that_frees_it():
    """r5's match copies r4's state into a slot of its own; the harness's adder then refuses r5 (a
    chunk of 3 tokens past its budget), and, as the scheduler of 0.5.10 on does, frees that slot.
    0.5.16 to 0.5.18 keep the request's state fields on the request itself (its ``req.kv`` is
    another record, None while it holds no KV): read from there, r5 is refused cleanly (before, the
    harness read ``None.mamba_cow_src_index``, a false alarm)."""
    from kvparity.engine.real.lane import RealLane
    from kvparity.model.scenario import Extend, RequestSpec, Scenario
    from kvparity.model.worlds import Geometry

    scenario = Scenario(Geometry(pool_rows=11, max_context_len=35, kv_slots=512, page_size=1, need_sort=True), "radix", (
        RequestSpec("r4", tuple(range(200000, 200004)), max_new_tokens=2, extra_key="lora-a"),
        RequestSpec("r5", (200000, 200001, 200002), arrival=1, max_new_tokens=64)),
        (Extend(admit=("r4",)), Extend(admit=("r5",), chunked_last=True)), chunk_size=3)
    with RealLane(["0.5.16"], ("torch",), tree_core_variants=False, model="mamba") as lane:
        played = lane.play(scenario)
    assert [isinstance(snapshots, list) for snapshots in played.values()] == [True], played  # no RealFailure


def test_the_harness_drive_names_the_change_a_refused_requests_freed_state_comes_from():
    """``check --sglang 0.5.10 --against 0.5.9 --caches mamba``'s harness drive, shrunk: r7's match
    copies r0's state into a slot of its own, kvparity's adder refuses r7 (its chunk past the
    budget), and 0.5.10 frees that slot as its scheduler does (#21404) where 0.5.9 keeps it: a
    state slot more free. The cause is shown, not assumed: 0.5.10 replayed with that rule of its
    adapter undone agrees with 0.5.9."""
    from kvparity.model.scenario import Extend, RequestSpec, Scenario
    from kvparity.model.worlds import Geometry
    from kvparity.run.harness_drive import HarnessSpec

    scenario = Scenario(Geometry(pool_rows=15, max_context_len=26, kv_slots=446, page_size=1, need_sort=True), "radix", (
        RequestSpec("r0", tuple(range(100000, 100005)), max_new_tokens=64, extra_key="lora-a"),
        RequestSpec("r7", (*range(100000, 100006), 80000, 80001), arrival=1, max_new_tokens=64, extra_key="lora-a")),
        (Extend(admit=("r0",)), Extend(admit=("r7",), chunked_last=True)), chunk_size=4)
    drive = HarnessSpec((("legacy", "torch"),), ("0.5.9", "0.5.10"), ("torch",), real_reference=True,
                        model="mamba").build()
    try:
        played = drive.play(scenario)
        assert played.kind == "disagree", played.line
        assert "state available_size: 43 != 42" in played.result.divergences[0].line()
        assert (drive.explain(played) or "").startswith("cause: a Mamba model's request the PrefillAdder refuses")
    finally:
        drive.close()


@pytest.mark.parametrize("version", ["0.5.15", "0.5.17", "0.5.19"])
def test_a_waiting_requests_state_slot_is_read_where_its_release_keeps_it(version):
    """A waiting request that holds a state slot and no row: on the request up to 0.5.18 (0.5.16 to
    0.5.18 also have a ``req.kv``, None while the request holds no KV), on ``req.kv`` from 0.5.19."""
    from types import SimpleNamespace

    from kvparity.engine.real.pool_readers import _waiting_slots
    from kvparity.engine.real.versions import entry

    fields = SimpleNamespace(mamba_pool_idx=5, req_pool_idx=None)
    req = {"0.5.15": fields, "0.5.17": SimpleNamespace(kv=None, **vars(fields)), "0.5.19": SimpleNamespace(kv=fields)}[version]
    assert _waiting_slots([req], entry(version)) == (5,)
