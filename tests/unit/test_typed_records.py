"""The typed records that replace string protocols: a world's identity, an oracle's violation, a
stage's observations and outcome, and out of memory as a type (``kvparity.model.records``,
``kvparity.engine.world``, ``kvparity.judge.oracles``, ``mem_cache.errors``). Each test shows one rule."""

from __future__ import annotations

import json

import pytest

from kvparity.engine.real.adapter import sglang_out_of_memory
from kvparity.engine.real.versions import entry
from kvparity.engine.world import World
from kvparity.judge.oracles import Violation
from kvparity.mem_cache.errors import Exhausted, KVOutOfMemory, RowsExhausted
from kvparity.model.classes import classify
from kvparity.model.records import LogprobAdmission, Note, StageRecord, error_text
from kvparity.model.scenario import Scenario
from kvparity.model.worlds import Geometry, WorldId


def test_a_world_id_is_named_as_before_and_holds_its_parts_as_data():
    linear = WorldId.modelled("refactored-linear", "triton")
    assert (str(linear), linear.family, linear.real) == ("refactored-linear/triton", "refactored", False)
    release = WorldId("checkout@0.5.4", "torch", "legacy", "0.5.4")  # a path source: no "sglang-" to strip
    assert (str(release), release.family, release.release, release.real) == ("checkout@0.5.4/torch", "legacy", "0.5.4", True)
    with pytest.raises(ValueError, match="family='sglang'"):
        WorldId("sglang-0.5.4", "torch", "sglang", "0.5.4")


def test_a_violation_names_its_world_as_data_and_prints_as_before():
    violation = Violation("sglang-0.5.3/torch", "step 2 extend: pages free twice: [3]")
    assert violation.world == "sglang-0.5.3/torch"
    assert str(violation) == violation.line() == "sglang-0.5.3/torch: step 2 extend: pages free twice: [3]"


def test_out_of_memory_is_a_type_and_prints_as_sglangs_runtime_error():
    """kvparity's model: the type says what ran out; text that merely reads like it is no OOM."""
    world = World.__new__(World)  # out_of_memory reads nothing of the world
    assert world.out_of_memory(KVOutOfMemory("alloc_token_slots: out of KV memory: 4 slots needed")) == Exhausted.KV
    assert world.out_of_memory(RowsExhausted("alloc_req_slots: out of request rows: 2 needed")) == Exhausted.ROWS
    assert world.out_of_memory(RuntimeError("alloc_token_slots: out of KV memory: 4 slots needed")) is None
    assert error_text(KVOutOfMemory("x: out of KV memory")) == "RuntimeError: x: out of KV memory"
    assert error_text(ValueError("bad")) == "ValueError: bad"


def test_real_sglangs_runtime_error_is_classified_once_at_the_boundary():
    """SGLang raises a plain RuntimeError in its own words, which differ between releases."""
    old, new = entry("0.5.3"), entry("0.5.3.post2")
    assert sglang_out_of_memory(old, RuntimeError("Prefill out of memory. Try to lower your batch size.")) == Exhausted.KV
    assert sglang_out_of_memory(new, RuntimeError("Out of memory. Try to lower your batch size.")) == Exhausted.KV
    assert sglang_out_of_memory(old, RuntimeError("Out of memory. Try to lower your batch size.")) is None
    assert sglang_out_of_memory(new, RuntimeError("alloc_req_slots runs out of memory. Please set ...")) == Exhausted.ROWS
    assert sglang_out_of_memory(new, ValueError("Out of memory.")) is None


def test_observations_are_typed_and_cross_a_process_as_plain_data():
    record = StageRecord(0, "extend", outcome="oom", exhausted=Exhausted.KV, error="RuntimeError: out",
                         notes=(Note.RADIX_HIT, LogprobAdmission("r1", -1, 0, 0)))
    back = StageRecord.from_plain(json.loads(json.dumps(record.to_plain())))
    assert back == record
    assert [type(n) for n in back.notes] == [Note, LogprobAdmission] and type(back.exhausted) is Exhausted


def test_the_classes_read_observations_and_the_kind_of_oom_not_text():
    scenario = Scenario(geometry=Geometry(pool_rows=2, max_context_len=8, kv_slots=8), cache_kind="radix",
                        requests=(), steps=())
    rows = StageRecord(0, "extend", outcome="oom", exhausted=Exhausted.ROWS, error="RuntimeError: out of KV memory")
    kv = StageRecord(0, "extend", outcome="oom", exhausted=Exhausted.KV, error="RuntimeError: Out of memory.")
    assert "off-path: prefill out of memory" not in classify(scenario, [rows])
    assert "off-path: prefill out of memory" in classify(scenario, [kv])
    admitted = StageRecord(1, "skip", notes=(Note.READMITTED, LogprobAdmission("r0", -1, -1, 0)))
    assert classify(scenario, [admitted]) >= {"retract then re-admit", "logprob: start -1 (server default)"}
