"""SGLang's own scheduler loops on one release per scheduler generation
(``kvparity.engine.releases.SCHEDULER_GENERATIONS``), normal and overlap: a hand-made
scenario with a radix hit and chunked prefill is admitted the same way by every generation, every
request gets the KV canary forward's tokens, and the in-flight oracle reports a planted fault
(``rewrite_inflight_cell``) with its iterations, row and column, and nothing else.
``scripts/shell_releases.py`` plays every release."""

from __future__ import annotations

import pytest

from kvparity.engine.real.adapter import VOCAB_SIZE
from kvparity.engine.real.shell_adapters import adapter_for
from kvparity.engine.real.versions import SUPPORTED
from kvparity.engine.releases import SCHEDULER_GENERATIONS
from kvparity.engine.traffic_run import TrafficRun
from kvparity.model.canary import chain, token_from
from kvparity.model.traffic import Arrival, ServerConfig, TrafficScenario
from kvparity.model.traffic_records import TABLE_ONLY, WRONG_KV

# One release per scheduler generation (0.5.3 and 0.5.3.post1: the shared workers of conftest).
REPRESENTATIVES = {
    "thread-overlap": "0.5.3",
    "monolithic": "0.5.3.post1",
    "split-init": "0.5.12.post1",
    "components": "0.5.15.post1",
    "batch-plan": "0.5.21",
    "prefix-len": "0.5.23",
}

# Where a release's overlap loop applies its write-after-read barrier (0.5.14+, on CUDA: every later
# write of the scheduler waits for the batches in flight to finish reading the table): at a pass's
# start (0.5.14, 0.5.15) or right after the launch (0.5.16 on). None: no barrier.
WAR_BARRIER = {"0.5.15.post1": "pass start", "0.5.21": "after launch", "0.5.23": "after launch"}
A = tuple(range(1000, 1040))
B = A[:32] + tuple(range(5000, 5024))
FAULT_ITERATION, FAULT_COLUMN = 8, 5


def canary_outputs(prompt: tuple[int, ...], n: int) -> tuple[int, ...]:
    """The KV canary forward's ``n`` outputs for ``prompt``: each from the chained hash of every
    token before it."""
    tokens = list(prompt)
    for _ in range(n):
        tokens.append(token_from(chain(tokens)[-1], VOCAB_SIZE))
    return tuple(tokens[len(prompt):])


def scenario(loop: str) -> TrafficScenario:
    """``a`` (40 tokens) is prefilled in chunks of 16 and finishes, leaving A in the radix tree;
    ``b`` (A's first 32 tokens and 24 of its own) arrives at iteration 5: a radix hit of 32, then
    two chunks (16 and 8), then decodes."""
    return TrafficScenario(
        ServerConfig(schedule_policy="fcfs", pool_rows=4, max_running_requests=4, kv_slots=256, max_prefill_tokens=64,
                     chunked_prefill_size=16, loop=loop),
        ((Arrival("a", A, 1),), (), (), (), (), (Arrival("b", B, 6),)))


@pytest.mark.parametrize("loop", ["normal", "overlap"])
@pytest.mark.parametrize("generation", list(REPRESENTATIVES))
def test_each_scheduler_generation_admits_forwards_and_reports_a_planted_fault(release_workers, generation, loop):
    assert list(REPRESENTATIVES) == list(SCHEDULER_GENERATIONS)
    release = REPRESENTATIVES[generation]
    assert adapter_for(SUPPORTED[release]).generation == generation
    config, arrivals = scenario(loop).to_plain()
    fault = {"name": "rewrite_inflight_cell", "iteration": FAULT_ITERATION, "request": 0, "column": FAULT_COLUMN,
             "value": 999}
    result = TrafficRun.from_plain(
        release_workers(release).call("run_traffic", config=dict(config, fault=fault), arrivals=arrivals))
    assert (result.player["release"], result.player["scheduler_generation"], result.loop) == (release, generation, loop)

    # The same admissions in every generation: a's three chunks, then b's radix hit and its two chunks.
    by_iteration = {rec.iteration: rec for rec in result.decisions}
    seen = [(i, by_iteration[i].mode, by_iteration[i].rids, by_iteration[i].prefix_lens,
             by_iteration[i].extend_lens, by_iteration[i].chunked) for i in (0, 1, 2, 5, 6)]
    assert seen == [(0, "EXTEND", ("a",), (0,), (16,), "a"), (1, "EXTEND", ("a",), (16,), (16,), "a"),
                    (2, "EXTEND", ("a",), (32,), (8,), None), (5, "EXTEND", ("b",), (32,), (16,), "b"),
                    (6, "EXTEND", ("b",), (48,), (8,), None)], (release, loop)
    assert (by_iteration[FAULT_ITERATION].mode, by_iteration[FAULT_ITERATION].rids) == ("DECODE", ("b",))

    # Every request gets all its tokens, each the canary forward's from the whole sequence before it;
    # in the overlap loop the batch launched after the rewrite (iteration 9, b's fourth output) reads
    # the rewritten cell, so from that token on b generates from what it read.
    clean = {"a": canary_outputs(A, 1), "b": canary_outputs(B, 6)}
    if loop == "normal":
        assert result.outputs == clean, (release, loop)
    else:
        got = result.outputs["b"]
        assert result.outputs["a"] == clean["a"] and len(got) == 6, (release, loop)
        assert got[:3] == clean["b"][:3] and got[3] != clean["b"][3], (release, loop, got, clean["b"])

    # The planted rewrite, and nothing else: under the batch it was planted in; in the overlap loop
    # also under the batch still in flight, and its restore under the batch launched next (which a
    # read of the table at that batch's launch, before the restore, sees as wrong KV). The rewrite
    # names a slot past the pool (wrong KV); the restore puts back b's own slot (the table only).
    row = by_iteration[FAULT_ITERATION].rows[0]
    found = result.inflight
    assert all((v.kind, v.rid, v.row, v.columns, v.cls) == ("cell", "b", row, (FAULT_COLUMN,), "live")
               for v in found), (release, loop, found)
    old = found[0].old[0]
    assert old != 999
    # Behind a barrier a write is no race with the batches in flight: the rewrite, made after the
    # barrier that fenced the batch before it, is not one with that batch; the restore, after the
    # launch of the next batch, is none with it where the barrier follows that launch.
    rewrite = (FAULT_ITERATION, (old,), (999,), FAULT_ITERATION, "run_batch", WRONG_KV)
    planted, launch_reads = [rewrite], []
    barrier = WAR_BARRIER.get(release)
    if loop == "overlap":
        before = [] if barrier else [(FAULT_ITERATION - 1, (old,), (999,), FAULT_ITERATION, "run_batch", WRONG_KV)]
        restore = (FAULT_ITERATION + 1, (999,), (old,), FAULT_ITERATION + 1, "process_batch_result", TABLE_ONLY)
        planted = [*before, rewrite, *([] if barrier == "after launch" else [restore])]
        launch_reads = [(FAULT_ITERATION + 1, "b", row, FAULT_COLUMN, 999)]
    assert [(v.batch_iteration, v.old, v.new, v.detected_iteration, v.detected_step, v.harm)
            for v in found] == planted, (release, loop)
    assert [(r.iteration, r.rid, r.row, r.position, r.slot) for r in result.canary] == launch_reads, (release, loop)
