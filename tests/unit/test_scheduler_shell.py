"""SGLang's own Scheduler event loop (``event_loop_normal``) of real 0.5.3 and 0.5.3.post1, only the
model forward replaced (``kvparity.engine.real.scheduler_shell``; issue 26, a first step): the
issue's minimal case of pull request #11200's ranking-key change, played as traffic."""

from __future__ import annotations

import pytest

from kvparity.engine.real.install import resolve
from kvparity.engine.real.worker import RealWorker

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


def config(policy: str) -> dict:
    return {"schedule_policy": policy, "page_size": 1, "pool_rows": 8, "kv_slots": 512, "max_prefill_tokens": 11,
            "chunked_prefill_size": None, "max_running_requests": 8, "radix_cache": True}


@pytest.fixture(scope="module")
def workers():
    started = {v: RealWorker(resolve(v), plugins=("kvparity.engine.real.scheduler_shell",)) for v in RELEASES}
    yield started
    for worker in started.values():
        worker.close()


def play(workers: dict, release: str, policy: str) -> dict:
    return workers[release].call("run_traffic", config=config(policy), arrivals=ARRIVALS)


def batches(result: dict) -> list[dict]:
    return [rec for rec in result["iterations"] if rec["mode"] is not None]


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
        assert [(b["mode"], b["rids"]) for b in formed[:1]] == [("EXTEND", ["a"])], (release, formed)
        admitted = next(b for b in result["iterations"] if b["iteration"] == 3)
        second = "r0" if first == "r1" else "r1"
        assert admitted["mode"] == "EXTEND" and admitted["rids"] == [first], (release, policy, admitted)
        assert admitted["waiting"] == [second], (release, policy, admitted)
        # Both match A's first 39 tokens in the tree (r0's own match is capped at len - 1).
        assert admitted["prefix_lens"] == [39] and admitted["extend_lens"] == [11 if first == "r1" else 1]
        nxt = next(b for b in result["iterations"] if b["iteration"] == 4)
        assert nxt["mode"] == "EXTEND" and nxt["rids"] == [second] and nxt["waiting"] == []
        decodes = [b for b in formed if b["mode"] == "DECODE"]
        assert decodes and all(b["rids"] == [first, second] for b in decodes), (release, decodes)
        assert sorted(result["outputs"]) == ["a", "r0", "r1"]
        assert [len(result["outputs"][r]) for r in ("a", "r0", "r1")] == [1, 3, 3]


def test_the_forward_is_deterministic_across_releases(workers):
    """The same request gets the same tokens in both releases, whatever the admission order."""
    one = play(workers, "0.5.3", "lpm")["outputs"]
    two = play(workers, "0.5.3.post1", "lpm")["outputs"]
    assert one == two


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
            result = workers[release].call("run_traffic", config=cfg, arrivals=arrivals)
            retracted[conservativeness] = sum(rec["retracted"] for rec in result["iterations"])
            assert sorted(len(out) for out in result["outputs"].values()) == [40] * 8, release
        assert retracted[1.0] == 0 and retracted[0.3] > 0, (release, retracted)
