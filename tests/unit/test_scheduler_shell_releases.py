"""SGLang's own scheduler loops on one release per scheduler generation
(``kvparity.engine.real.shell_adapters.SCHEDULER_GENERATIONS``), normal and overlap: a hand-made
scenario with a radix hit and chunked prefill is admitted the same way by every generation, every
request gets the deterministic forward's tokens, and the in-flight oracle reports a planted fault
(``rewrite_inflight_cell``) with its iterations, row and column, and nothing else.
``scripts/shell_releases.py`` plays every release."""

from __future__ import annotations

import pytest

from kvparity.engine.real import RealSGLangError
from kvparity.engine.real.adapter import VOCAB_SIZE
from kvparity.engine.real.shell_adapters import SCHEDULER_GENERATIONS, adapter_for
from kvparity.engine.real.versions import SUPPORTED
from kvparity.model.traffic import Arrival, ServerConfig, TrafficScenario, next_token

# One release per scheduler generation (0.5.3 and 0.5.3.post1: the shared workers of conftest).
REPRESENTATIVES = {
    "thread-overlap": "0.5.3",
    "monolithic": "0.5.3.post1",
    "split-init": "0.5.12.post1",
    "components": "0.5.15.post1",
    "batch-plan": "0.5.21",
    "prefix-len": "0.5.23",
}
SHARED = ("0.5.3", "0.5.3.post1")

A = tuple(range(1000, 1040))
B = A[:32] + tuple(range(5000, 5024))
FAULT_ITERATION, FAULT_COLUMN = 8, 5


def scenario(loop: str) -> TrafficScenario:
    """``a`` (40 tokens) is prefilled in chunks of 16 and finishes, leaving A in the radix tree;
    ``b`` (A's first 32 tokens and 24 of its own) arrives at iteration 5: a radix hit of 32, then
    two chunks (16 and 8), then decodes."""
    return TrafficScenario(
        ServerConfig(schedule_policy="fcfs", pool_rows=4, max_running_requests=4, kv_slots=256, max_prefill_tokens=64,
                     chunked_prefill_size=16, loop=loop),
        ((Arrival("a", A, 1),), (), (), (), (), (Arrival("b", B, 6),)))


@pytest.fixture(scope="module")
def release_workers(scheduler_workers):
    """One worker per representative release, started when first asked for."""
    from kvparity.engine.real.install import resolve
    from kvparity.engine.real.worker import RealWorker

    started: dict = {}

    def get(release: str):
        if release in SHARED:
            return scheduler_workers[release]
        if release not in started:
            try:
                source = resolve(release)
            except RealSGLangError as exc:
                pytest.skip(f"cannot get a real sglang {release}: {exc}")
            started[release] = RealWorker(source, plugins=("kvparity.engine.real.scheduler_shell",))
        return started[release]

    yield get
    for worker in started.values():
        worker.close()


@pytest.mark.parametrize("loop", ["normal", "overlap"])
@pytest.mark.parametrize("generation", list(REPRESENTATIVES))
def test_each_scheduler_generation_admits_forwards_and_reports_a_planted_fault(release_workers, generation, loop):
    assert list(REPRESENTATIVES) == list(SCHEDULER_GENERATIONS)
    release = REPRESENTATIVES[generation]
    assert adapter_for(SUPPORTED[release]).generation == generation
    config, arrivals = scenario(loop).to_plain()
    fault = {"name": "rewrite_inflight_cell", "iteration": FAULT_ITERATION, "request": 0, "column": FAULT_COLUMN,
             "value": 999}
    result = release_workers(release).call("run_traffic", config=dict(config, fault=fault), arrivals=arrivals)
    assert (result["release"], result["scheduler_generation"], result["loop"]) == (release, generation, loop)

    # The same admissions in every generation: a's three chunks, then b's radix hit and its two chunks.
    by_iteration = {rec["iteration"]: rec for rec in result["iterations"]}
    seen = [(i, by_iteration[i]["mode"], by_iteration[i]["rids"], by_iteration[i]["prefix_lens"],
             by_iteration[i]["extend_lens"], by_iteration[i]["chunked"]) for i in (0, 1, 2, 5, 6)]
    assert seen == [(0, "EXTEND", ["a"], [0], [16], "a"), (1, "EXTEND", ["a"], [16], [16], "a"),
                    (2, "EXTEND", ["a"], [32], [8], None), (5, "EXTEND", ["b"], [32], [16], "b"),
                    (6, "EXTEND", ["b"], [48], [8], None)], (release, loop)
    assert (by_iteration[FAULT_ITERATION]["mode"], by_iteration[FAULT_ITERATION]["rids"]) == ("DECODE", ["b"])

    # Every request gets all its tokens, each the shared forward's from its arrival index and length.
    assert result["outputs"] == {"a": [next_token(0, 40, VOCAB_SIZE)],
                                 "b": [next_token(1, n, VOCAB_SIZE) for n in range(56, 62)]}, (release, loop)

    # The planted rewrite, and nothing else: under the batch it was planted in; in the overlap loop
    # also under the batch still in flight, and its restore under the batch launched next.
    row = by_iteration[FAULT_ITERATION]["rows"][0]
    found = result["inflight_violations"]
    assert all((v["kind"], v["rid"], v["row"], v["columns"], v["class"]) == ("cell", "b", row, [FAULT_COLUMN], "live")
               for v in found), (release, loop, found)
    old = found[0]["old"][0]
    assert old != 999
    planted = [(FAULT_ITERATION, [old], [999], FAULT_ITERATION, "run_batch")]
    if loop == "overlap":
        planted = [(FAULT_ITERATION - 1, [old], [999], FAULT_ITERATION, "run_batch"), *planted,
                   (FAULT_ITERATION + 1, [999], [old], FAULT_ITERATION + 1, "process_batch_result")]
    assert [(v["batch_iteration"], v["old"], v["new"], v["detected"]["iteration"], v["detected"]["step"])
            for v in found] == planted, (release, loop)
