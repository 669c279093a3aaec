"""SGLang's own Scheduler event loops (``event_loop_normal`` and ``event_loop_overlap``) of real 0.5.3
and 0.5.3.post1, only the model forward replaced (``kvparity.engine.real.scheduler_shell``; issue 26):
the issue's minimal case of pull request #11200's ranking-key change, played as traffic, in both
loops; and the in-flight oracle of the overlap loop: quiet on ordinary traffic, what it finds in the
real releases, and a deliberately broken run it must catch."""

from __future__ import annotations

import pytest

from kvparity.engine.real.adapter import VOCAB_SIZE
from kvparity.engine.traffic_run import TrafficRun
from kvparity.model.canary import chain, token_from
from kvparity.model.traffic import ServerConfig
from kvparity.model.traffic_records import TABLE_ONLY, WRONG_KV, Decision

RELEASES = ("0.5.3", "0.5.3.post1")
A = list(range(1000, 1040))
R1 = A[:39] + list(range(5000, 5011))
# Iteration 0: A arrives and finishes at once (max_new_tokens 1), leaving A in the radix tree.
# Iteration 3: r1 (A's first 39 tokens and 11 new ones), then r0 (A itself), arrive together.
ARRIVALS = [
    [{"rid": "a", "tokens": A, "max_new_tokens": 1}],
    [],
    [],
    [{"rid": "r1", "tokens": R1, "max_new_tokens": 3}, {"rid": "r0", "tokens": A, "max_new_tokens": 3}],
]


def config(policy: str, loop: str = "normal") -> dict:
    return {"loop": loop, "schedule_policy": policy, "page_size": 1, "pool_rows": 8, "kv_slots": 512, "max_prefill_tokens": 11,
            "chunked_prefill_size": None, "max_running_requests": 8, "radix_cache": True}


def test_a_server_crosses_to_a_worker_as_plain_data_with_one_set_of_defaults():
    """The worker reads ``run_traffic``'s config back into the record the scenario held: a field left
    out takes the record's default, a name that is no field is refused by name."""
    server = ServerConfig(schedule_policy="lpm", pool_rows=4, max_running_requests=4, mamba_slots=12, hicache_ratio=2.0,
                          hicache_ack_delay=2)
    assert ServerConfig.from_plain(server.to_plain()) == server
    assert ServerConfig.from_plain({"kv_slots": 64}) == ServerConfig(kv_slots=64)
    with pytest.raises(ValueError, match="no field 'pool_row'"):
        ServerConfig.from_plain({"pool_row": 2})


@pytest.fixture
def workers(scheduler_workers):
    return scheduler_workers


def call(worker, config: dict, arrivals: list[list[dict]]) -> TrafficRun:
    return TrafficRun.from_plain(worker.call("run_traffic", config=config, arrivals=arrivals))


def play(workers: dict, release: str, policy: str, loop: str = "normal") -> TrafficRun:
    return call(workers[release], config(policy, loop), ARRIVALS)


def batches(result: TrafficRun) -> list[Decision]:
    return [rec for rec in result.decisions if rec.mode is not None]


def canary_outputs(prompt: list[int], n: int) -> tuple[int, ...]:
    """The KV canary forward's outputs for a prompt: each token from the chained hash of the whole
    sequence before it (a function of the tokens only, not of the release or the admission order)."""
    tokens = list(prompt)
    for _ in range(n):
        tokens.append(token_from(chain(tokens)[-1], VOCAB_SIZE))
    return tuple(tokens[len(prompt):])


@pytest.mark.parametrize("policy, first_53, first_post1", [
    ("fcfs", "r1", "r1"),
    ("lpm", "r1", "r0"),  # the ranking key of #11200: post1 matches r0's whole input (40) above r1's 39
    ("dfs-weight", "r1", "r0"),
])
def test_the_minimal_case_through_sglangs_own_loop(workers, policy, first_53, first_post1):
    for release, first in (("0.5.3", first_53), ("0.5.3.post1", first_post1)):
        result = play(workers, release, policy)
        formed = batches(result)
        # A's own prefill, then the two arrivals one at a time (max_prefill_tokens 11), then decodes.
        assert [(b.mode, b.rids) for b in formed[:1]] == [("EXTEND", ("a",))], (release, formed)
        admitted = next(b for b in result.decisions if b.iteration == 3)
        second = "r0" if first == "r1" else "r1"
        assert admitted.mode == "EXTEND" and admitted.rids == (first,), (release, policy, admitted)
        assert admitted.waiting == (second,), (release, policy, admitted)
        # Both match A's first 39 tokens in the tree (r0's own match is capped at len - 1).
        assert admitted.prefix_lens == (39,) and admitted.extend_lens == (11 if first == "r1" else 1,)
        nxt = next(b for b in result.decisions if b.iteration == 4)
        assert nxt.mode == "EXTEND" and nxt.rids == (second,) and nxt.waiting == ()
        decodes = [b for b in formed if b.mode == "DECODE"]
        assert decodes and all(b.rids == (first, second) for b in decodes), (release, decodes)
        assert sorted(result.outputs) == ["a", "r0", "r1"]
        assert [len(result.outputs[r]) for r in ("a", "r0", "r1")] == [1, 3, 3]


def test_the_forward_is_deterministic_across_releases(workers):
    """The same request gets the same tokens in both releases, whatever the admission order: the
    KV canary's, a function of the request's tokens alone (a and r0 share the prompt A, and so
    their first output)."""
    one = play(workers, "0.5.3", "lpm").outputs
    two = play(workers, "0.5.3.post1", "lpm").outputs
    assert one == two
    assert one == {"a": canary_outputs(A, 1), "r0": canary_outputs(A, 3), "r1": canary_outputs(R1, 3)}


def test_retraction_is_reached_when_admission_reserves_little_for_outputs(workers):
    """Eight requests of 20 tokens and 40 outputs, 200 KV slots: with SGLang's default
    ``--schedule-conservativeness`` (1.0) admission reserves room for outputs and never retracts;
    at 0.3 it admits more than the decodes have room for, and ``retract_decode`` runs. Every
    request still finishes with all its outputs."""
    arrivals = [[{"rid": f"q{i}", "tokens": list(range(2000 + 100 * i, 2020 + 100 * i)), "max_new_tokens": 40}
                 for i in range(8)]]
    for release in RELEASES:
        retracted = {}
        for conservativeness in (1.0, 0.3):
            cfg = dict(config("fcfs"), max_prefill_tokens=4096, kv_slots=200,
                       schedule_conservativeness=conservativeness)
            result = call(workers[release], cfg, arrivals)
            retracted[conservativeness] = sum(rec.retracted for rec in result.decisions)
            assert sorted(len(out) for out in result.outputs.values()) == [40] * 8, release
        assert retracted[1.0] == 0 and retracted[0.3] > 0, (release, retracted)


# --------------------------------------------------------------------------- the overlap loop


@pytest.mark.parametrize("policy, first_53, first_post1", [
    ("fcfs", "r1", "r1"),
    ("lpm", "r1", "r0"),
    ("dfs-weight", "r1", "r0"),
])
def test_the_minimal_case_through_sglangs_own_overlap_loop(workers, policy, first_53, first_post1):
    """The same admissions at the same iterations as the normal loop, and the same outputs. What
    differs, rightly: a request's finish is known only when its batch's result is processed, which
    the overlap loop does after forming and launching the next batch; so each request runs one more
    decode whose token SGLang discards (``a`` at iteration 1, r0 and r1 at iteration 7).

    The in-flight oracle finds one cell in both releases whenever r1 is admitted first: r0 (A itself,
    its prefix match capped at 39) is prefilled at iteration 4 and decoded at 5, formed before the
    prefill's result is processed; that processing (``cache_unfinished_req``) finds all 40 tokens of
    A in the tree and rewrites r0's cell 39 to the tree's slot while batch 5 reads the row. When r0 goes
    first (0.5.3.post1 under lpm and dfs-weight), its prefill result lands while batch 4 (r1 only) is
    in flight, and nothing is found."""
    for release, first in (("0.5.3", first_53), ("0.5.3.post1", first_post1)):
        normal = play(workers, release, policy)
        result = play(workers, release, policy, "overlap")
        assert result.loop == "overlap"
        second = "r0" if first == "r1" else "r1"
        by_iteration = {rec.iteration: rec for rec in result.decisions}
        assert (by_iteration[0].mode, by_iteration[0].rids) == ("EXTEND", ("a",))
        assert (by_iteration[1].mode, by_iteration[1].rids) == ("DECODE", ("a",))  # a's discarded token
        assert by_iteration[1].finished == ("a",)
        fields = ("mode", "rids", "prefix_lens", "extend_lens", "waiting")
        for i in (3, 4):  # the admissions, as in the normal loop
            theirs = next(r for r in normal.decisions if r.iteration == i)
            assert [getattr(by_iteration[i], k) for k in fields] == [getattr(theirs, k) for k in fields], (
                release, policy, i)
        assert by_iteration[3].rids == (first,)
        decodes = [b for b in batches(result) if b.mode == "DECODE" and b.iteration > 4]
        assert [b.iteration for b in decodes] == [5, 6, 7] and all(b.rids == (first, second) for b in decodes)
        assert by_iteration[7].finished == ("r0", "r1")
        assert result.outputs == normal.outputs, release
        assert normal.inflight == ()
        found = result.inflight
        if first == "r1":
            row = by_iteration[5].rows[1]
            assert len(found) == 1, (release, policy, found)
            v = found[0]
            assert (v.kind, v.batch_iteration, v.rid, v.row, v.columns, v.cls, v.detected_iteration,
                    v.detected_step) == ("cell", 5, "r0", row, (39,), "live", 5, "process_batch_result"), (
                release, policy, v)
            assert v.old != v.new
            # The tree's slot holds A's token 39 at position 39 too: the table changed, not the KV read.
            assert v.harm == TABLE_ONLY, (release, policy, v)
        else:
            assert found == (), (release, policy, found)
        assert result.canary == [] and normal.canary == [], release


def traffic() -> list[list[dict]]:
    """Six requests with distinct prompts of 29 to 64 tokens, arriving over eight iterations."""
    arrivals: list[list[dict]] = [[] for _ in range(8)]
    for i in range(6):
        tokens = list(range(3000 + 100 * i, 3024 + 100 * i)) + list(range(7000 + 50 * i, 7005 + 57 * i))
        arrivals[2 * i if i < 3 else i + 2].append({"rid": f"q{i}", "tokens": tokens, "max_new_tokens": 3 + 2 * i})
    return arrivals


def traffic_config(release_rows: int = 8, **kw) -> dict:
    return dict(config("fcfs", "overlap"), max_prefill_tokens=64, chunked_prefill_size=16, pool_rows=release_rows,
                max_running_requests=release_rows, **kw)


def test_the_in_flight_oracle_finds_nothing_on_ordinary_traffic(workers):
    """Six requests, chunked prefill (16 tokens), page size 1, rows to spare: nothing changes under an
    in-flight batch in either release, and the overlap loop gives the normal loop's outputs."""
    for release in RELEASES:
        result = call(workers[release], traffic_config(), traffic())
        assert sum(1 for rec in result.decisions if rec.chunked) >= 10, release  # chunked prefill ran
        assert result.inflight == (), (release, result.inflight)
        normal = call(workers[release], dict(traffic_config(), loop="normal"), traffic())
        assert result.outputs == normal.outputs
        assert {rid: len(out) for rid, out in result.outputs.items()} == {f"q{i}": 3 + 2 * i for i in range(6)}


def test_the_in_flight_oracle_on_a_chunked_request_with_few_rows(workers):
    """A finding in both real releases: the same traffic with 3 rows. Between chunks, SGLang frees the
    chunked request's row (it "will get a new req_pool_idx") while its previous chunk is in flight;
    the next formation gives that row to a newly admitted request, whose prefill writes its own slots
    into it. Here: q1's second chunk (iteration 3, row 0) is in flight when iteration 4 admits q2
    into row 0 (q1 moves to another row) and rewrites columns 0 to 11. q2's slots are not q1's KV:
    a read through the changed row sees wrong KV (the canary's harm, on both findings)."""
    for release in RELEASES:
        result = call(workers[release], traffic_config(3), traffic())
        by_iteration = {rec.iteration: rec for rec in result.decisions}
        assert (by_iteration[3].rids, by_iteration[3].chunked) == (("q1",), "q1")
        assert by_iteration[4].rids == ("q1", "q2")
        row = by_iteration[3].rows[0]
        assert by_iteration[4].rows[1] == row and by_iteration[4].rows[0] != row
        found = sorted(result.inflight, key=lambda v: v.kind)
        assert [(v.kind, v.batch_iteration, v.rid, v.row, v.cls, v.harm) for v in found] == [
            ("cell", 3, "q1", row, "live", WRONG_KV), ("row", 3, "q1", row, "live", WRONG_KV)], (release, found)
        assert found[0].columns == tuple(range(12)) and found[1].taken_by == "q2"
        assert all((v.detected_iteration, v.detected_step) == (4, "get_next_batch_to_run") for v in found)
        normal = call(workers[release], dict(traffic_config(3), loop="normal"), traffic())
        assert normal.inflight == () and normal.outputs == result.outputs


@pytest.mark.parametrize("loop", ["overlap", "normal"])
def test_the_in_flight_oracle_catches_a_rewritten_cell(workers, loop):
    """A deliberately broken scheduler (the shell's ``rewrite_inflight_cell`` fault, named in the
    config): right after ``run_batch`` of the decode batch at iteration 3, cell 5 of its request's
    row is rewritten, and restored when batch 3's window ends (so the run stays sound). The oracle
    reports the iteration, the row, the column and both values. In the overlap loop the rewrite is
    also under batch 2 (still in flight at iteration 3), and the restore is itself a change under
    batch 4 (launched at iteration 4, before batch 3's result is processed); in the normal loop the
    windows do not overlap and only batch 3 sees it.

    The canary grades them: the rewrite to slot 999 is wrong KV under every batch that reads it,
    the restore only a change of the table. And in the overlap loop batch 4 is launched while the
    cell still names slot 999: the canary reads wrong KV at its launch, position 5."""
    arrivals = [[{"rid": "x", "tokens": list(range(100, 120)), "max_new_tokens": 6}]]
    fault = {"name": "rewrite_inflight_cell", "iteration": 3, "request": 0, "column": 5, "value": 999}
    for release in RELEASES:
        cfg = dict(config("fcfs", loop), fault=fault)
        result = call(workers[release], cfg, arrivals)
        rec = next(r for r in result.decisions if r.iteration == 3)
        assert rec.mode == "DECODE" and rec.rids == ("x",)
        row = rec.rows[0]
        found = result.inflight
        assert all((v.kind, v.rid, v.row, v.columns, v.cls) == ("cell", "x", row, (5,), "live")
                   for v in found), (release, found)
        old = found[0].old[0]
        assert old != 999
        seen = [(v.batch_iteration, v.old, v.new, v.detected_iteration, v.detected_step, v.harm) for v in found]
        rewrite = [(3, (old,), (999,), 3, "run_batch", WRONG_KV)]
        if loop == "overlap":
            assert seen == [(2, (old,), (999,), 3, "run_batch", WRONG_KV), *rewrite,
                            (4, (999,), (old,), 4, "process_batch_result", TABLE_ONLY)], (release, seen)
            assert [(r.iteration, r.rid, r.row, r.position, r.slot, r.when) for r in result.canary] == [
                (4, "x", row, 5, 999, "launch")], (release, result.canary)
        else:
            assert seen == rewrite, (release, seen)
            assert result.canary == [], (release, result.canary)
        assert len(result.outputs["x"]) == 6
