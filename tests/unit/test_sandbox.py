"""The sandbox that runs plug-in candidates (issue 12, items 4 and 5).

Each fault has one exact name (crash: the signal; hang: the timeout; exit: the code; exception:
the type and message) even when a grandchild keeps the worker's pipe open; nothing a candidate
starts (new sessions and double-fork daemons included) outlives the check or a timed-out call;
out-of-bounds stores land in guards (or fault) the same way on every run, empty tensors included;
and no piece of child output enters a report uncapped. The fixtures are ``candidates/sbx_*.py``.
Calls go through ``Sandbox`` directly on one small batch, except where the whole check is meant.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import pytest
import torch

from kvparity.candidate.check import check_candidate, judge
from kvparity.candidate.inputs import GUARD, KernelBatch, materialise
from kvparity.candidate.sandbox import Sandbox
from kvparity.kernels import runtime

HERE = os.path.dirname(os.path.abspath(__file__))
TARGET = "write_cache_indices"
CALL_TIMEOUT = 4.0
# Rows 2 and 0 of 3 (width 4); request 0 has prefix [5, 6], request 1 an EMPTY one; new slots 7, 8, 9.
BATCH = KernelBatch(TARGET, (2, 0), ((5, 6), ()), (3, 2), 3, 4, out_cache_loc=(7, 8, 9))
OTHER_BATCH = KernelBatch(TARGET, (1,), ((4,),), (3,), 2, 5, out_cache_loc=(8, 9))
PIDFILE = "KVPARITY_SBX_PIDFILE"
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process ownership needs Linux")


def spec(name: str, function: str = TARGET) -> str:
    return os.path.join(HERE, "candidates", f"{name}.py") + f":{function}"


@pytest.fixture(scope="module")
def sandbox():
    with Sandbox(call_timeout=CALL_TIMEOUT) as box:
        yield box


def name_of(outcome) -> str:
    """The exact name of an outcome (``status`` where an outcome has no ``kind``)."""
    return getattr(outcome, "kind", outcome.status)


def _pids(path) -> list[int]:
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def _alive(pid: int) -> bool:
    """Running (a zombie, dead but not yet reaped, does not count)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _still_alive(pids: list[int], grace: float = 2.0) -> list[int]:
    deadline = time.monotonic() + grace
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


def _end(pids: list[int]) -> None:
    """Kill, by pid, what a fixture started and a sandbox left alive (so a failing run leaks nothing)."""
    for pid in pids:
        if _alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


# ------------------------------------------------------------------ 1. the worker's own death


@linux_only
@pytest.mark.parametrize(
    "function, kind, words",
    [("write_cache_indices", "crashed", ["killed by SIGSEGV"]), ("exits_seven", "exited", ["exited with code 7"])],
    ids=["segfault", "os._exit(7)"],
)
def test_a_grandchild_holding_the_pipe_does_not_turn_a_death_into_a_timeout(function, kind, words, tmp_path,
                                                                             monkeypatch):
    monkeypatch.setenv(PIDFILE, str(tmp_path / "pids"))
    timeout = 8.0
    with Sandbox(call_timeout=timeout) as box:
        assert box.load(TARGET, spec("sbx_fork_grandchild_crash", function)).status == "loaded"
        start = time.monotonic()
        outcome = box.call(TARGET, spec("sbx_fork_grandchild_crash", function), BATCH.to_dict())
        elapsed = time.monotonic() - start
    grandchildren = _pids(tmp_path / "pids")
    try:
        assert name_of(outcome) == kind, outcome
        assert elapsed < timeout / 2, f"named after {elapsed:.1f} s: the parent waited for the pipe"
        for word in words:
            assert word in outcome.error, outcome.error
        fault = judge(outcome, BATCH, runtime.DEVICE)
        assert words[0] in fault.summary, fault.describe()
        assert grandchildren and not _still_alive(grandchildren), "the grandchild outlived the sandbox"
    finally:
        _end(grandchildren)


# ------------------------------------------------------------------ 2. everything the candidate starts


@linux_only
def test_new_sessions_and_daemons_die_when_a_call_times_out(tmp_path, monkeypatch):
    monkeypatch.setenv(PIDFILE, str(tmp_path / "pids"))
    started: list[int] = []
    try:
        with Sandbox(call_timeout=2.0) as box:
            first = box.call(TARGET, spec("sbx_setsid_daemon"), BATCH.to_dict())
            assert first.status == "returned", first
            started = _pids(tmp_path / "pids")
            assert len(started) == 3 and all(_alive(p) for p in started), started  # setsid'd, double-forked
            # A hang (its module, loaded again for this function, may start three more): the timeout
            # ends the worker and all of them, though none of them is in the worker's session.
            hung = box.call(TARGET, spec("sbx_setsid_daemon", "hangs_after_spawning"), BATCH.to_dict())
            assert name_of(hung) == "timed_out", hung
            started = _pids(tmp_path / "pids")
            assert not _still_alive(started, grace=0.5), "a timed-out call left processes alive"
            assert box.owns == "subreaper"
    finally:
        _end(started)


@linux_only
def test_after_the_check_no_process_the_candidate_started_is_alive(tmp_path, monkeypatch):
    monkeypatch.setenv(PIDFILE, str(tmp_path / "pids"))
    result = check_candidate(TARGET, spec("sbx_setsid_daemon"), examples=3, call_timeout=CALL_TIMEOUT)
    started = _pids(tmp_path / "pids")
    try:
        assert result.verdict == "parity", result.report()
        assert len(started) == 3, started
        assert not _still_alive(started, grace=0.5), "processes the candidate started outlived the check"
    finally:
        _end(started)


# ------------------------------------------------------------------ 3. exact names


@pytest.mark.parametrize(
    "name, function, kind, words",
    [
        ("sbx_keyboard_interrupt", TARGET, "raised", ["KeyboardInterrupt: the candidate pressed ctrl-c"]),
        ("sbx_sys_exit", TARGET, "exited", ["exited with code 3", "SystemExit(3)"]),
        ("sbx_sys_exit", "exits_with_message", "exited", ["exited with code 1", "SystemExit('bye')"]),
        ("sbx_sys_exit", "os_exit", "exited", ["exited with code 5"]),
        ("wci_raises", TARGET, "raised", ["Error"]),
    ],
    ids=["KeyboardInterrupt", "sys.exit(3)", "sys.exit('bye')", "os._exit(5)", "exception"],
)
def test_each_fault_is_named_exactly(name, function, kind, words, sandbox):
    outcome = sandbox.call(TARGET, spec(name, function), BATCH.to_dict())
    assert name_of(outcome) == kind, outcome
    for word in words:
        assert word in outcome.error, outcome.error
    assert "SIGINT" not in outcome.error
    fault = judge(outcome, BATCH, runtime.DEVICE)
    assert words[0] in fault.summary, fault.describe()  # the checker's report carries the exact name
    if kind == "raised":
        assert fault.kind == "raised" and words[0] in fault.describe()


# ------------------------------------------------------------------ 4. out-of-bounds stores, deterministically


@pytest.mark.parametrize(
    "function, hit",
    [
        (TARGET, "out_cache_loc: guard at index 303 (after the tensor of 3) holds 7"),
        ("table_row_past_margin", "req_to_token: guard at row 22, col 0 (after the table) holds 7"),
    ],
    ids=["300 past a 1-D tensor", "a row past the table's margin"],
)
def test_a_store_past_the_margin_lands_in_a_guard_every_time(function, hit, sandbox):
    outcomes = [sandbox.call(TARGET, spec("sbx_far_store", function), BATCH.to_dict()) for _ in range(3)]
    assert [name_of(o) for o in outcomes] == ["guard_damaged"] * 3, outcomes[0]
    assert len({o.error for o in outcomes}) == 1, [o.error for o in outcomes]
    assert hit in outcomes[0].error, outcomes[0].error
    fault = judge(outcomes[0], BATCH, runtime.DEVICE)
    assert "guard damaged" in fault.summary and hit in fault.describe(), fault.describe()


def test_a_store_past_every_guard_faults_every_time(sandbox):
    """On the CPU the regions are separated by inaccessible pages: the store faults. On a GPU it
    lands in the guard after the last region (the same cell every time)."""
    errors = []
    for batch in (BATCH, OTHER_BATCH, BATCH):
        outcome = sandbox.call(TARGET, spec("sbx_far_store", "past_every_guard"), batch.to_dict())
        if runtime.DEVICE.type == "cpu":
            assert name_of(outcome) == "crashed" and "killed by SIGSEGV" in outcome.error, outcome
        else:
            assert name_of(outcome) == "guard_damaged" and "holds 7" in outcome.error, outcome
        errors.append(outcome.error.splitlines()[0])
    assert errors[0] == errors[2], errors


def test_the_check_of_a_far_store_has_the_same_verdict_every_run(sandbox):
    results = [check_candidate(TARGET, spec("sbx_far_store"), examples=4, sandbox=sandbox, shrink_seconds=3.0)
               for _ in range(2)]
    first, again = results
    assert first.verdict == again.verdict == "divergence", first.report()
    assert first.counterexample == again.counterexample
    assert first.fault.summary == again.fault.summary and first.fault.details == again.fault.details
    assert "guard damaged" in first.fault.summary and "out_cache_loc: guard at index" in first.fault.summary


def test_a_store_through_an_empty_tensor_lands_in_its_guard(sandbox):
    outcome = sandbox.call(TARGET, spec("sbx_empty_tensor_write"), BATCH.to_dict())
    fault = judge(outcome, BATCH, runtime.DEVICE)
    assert fault is not None and fault.kind == "guard_damaged", (outcome, fault and fault.describe())
    assert "prefix_tensors[1]: guard at index 0 (after the tensor of 0) holds 7" in fault.describe()


def test_guarded_memory_keeps_the_layout_and_gives_empty_tensors_real_addresses():
    from kvparity.candidate.sandbox_guard import VECTOR_MOAT, AddressedView, GuardedMemory

    memory = GuardedMemory(BATCH, torch.device("cpu"))
    try:
        plain = materialise(BATCH, torch.device("cpu"))
        assert memory.snapshot() == plain.snapshot()  # the parent's layout, unchanged
        for g in memory.materialised.guarded:
            assert g.view.data_ptr() == g.buffer.data_ptr() + g.lo * g.buffer.element_size(), g.name
            assert g.view.data_ptr() != 0
        empty = memory.materialised.view("prefix_tensors[1]")
        assert empty.numel() == 0 and isinstance(empty, AddressedView)
        region = memory.regions[[g.name for g in memory.materialised.guarded].index("out_cache_loc")]
        assert region.before.numel() >= VECTOR_MOAT and region.after.numel() >= VECTOR_MOAT
        assert not memory.moat_damaged() and memory.guard_hits() == []
        region.after[300] = 7
        assert memory.moat_damaged()
        assert memory.guard_hits() == [
            f"out_cache_loc: guard at index {3 + 64 + 300} (after the tensor of 3) holds 7 (guard value {GUARD})"]
    finally:
        memory.release()


@linux_only
def test_a_broken_reply_stream_is_the_workers_fault_not_a_crash_of_kvparity(sandbox):
    outcome = sandbox.call(TARGET, spec("sbx_protocol_garbage"), BATCH.to_dict())
    assert name_of(outcome) == "crashed" and "malformed reply" in outcome.error, outcome
    assert sandbox.call(TARGET, spec("wci_torch_faithful"), BATCH.to_dict()).status == "returned"


# ------------------------------------------------------------------ 5. capped output


def test_cap_text_keeps_head_and_tail_and_marks_the_cut():
    from kvparity.candidate.sandbox import cap_text

    assert cap_text("short") == "short"
    text = "HEAD" + "x" * (4 << 20) + "TAIL"
    capped = cap_text(text, 4096)
    assert len(capped.encode()) < 4096 + 64
    assert capped.startswith("HEAD") and capped.endswith("TAIL")
    assert f"... [{len(text) - 4096} bytes cut] ..." in capped


def test_a_huge_line_before_a_crash_is_cut_in_the_report_and_the_json(sandbox):
    result = check_candidate(TARGET, spec("sbx_huge_line_crash"), examples=1, sandbox=sandbox, shrink_seconds=0.0)
    assert result.fault_kind == "crashed" and "SIGKILL" in result.fault.summary, result.report()[:2000]
    output = "\n".join(result.fault.details)
    assert len(output.encode()) < 6000, len(output)
    assert "HUGE-LINE-START" in output and "HUGE-LINE-END" in output and "bytes cut" in output, output[:300]
    assert len(result.report().encode()) < 16384, len(result.report())
    assert len(json.dumps(result.to_dict()).encode()) < 16384


def test_a_huge_exception_message_and_load_error_are_cut(sandbox):
    outcome = sandbox.call(TARGET, spec("sbx_huge_line_crash", "raises_huge"), BATCH.to_dict())
    assert name_of(outcome) == "raised", outcome.error[:300]
    for text in (outcome.error, outcome.reply["traceback"]):
        assert len(text.encode()) < 6000 and "bytes cut" in text, len(text)
    assert len(judge(outcome, BATCH, runtime.DEVICE).describe().encode()) < 12000  # message + traceback
    assert outcome.error.startswith("ValueError: HUGE-MESSAGE-START") and outcome.error.endswith("HUGE-MESSAGE-END")
    loaded = sandbox.load(TARGET, spec("sbx_huge_load_error"))
    assert loaded.status == "load_error", loaded
    assert len(loaded.error.encode()) < 6000 and "bytes cut" in loaded.error
    assert "HUGE-LOAD-START" in loaded.error and loaded.error.endswith("HUGE-LOAD-END")


def test_a_starved_call_is_waited_for_and_a_sleeping_one_is_not():
    """The limit is on the CPU a call gets: past the wall limit, a worker still running on less
    than the limit's worth of CPU is waited for; one that uses none (asleep) is not."""
    from kvparity.candidate.sandbox import STARVED_CAP, keep_waiting

    assert keep_waiting(cpu_used=0.6, cpu_step=0.5, wall_step=2.0, limit=1.0, waited=2.0)  # a share of a CPU
    assert not keep_waiting(cpu_used=1.0, cpu_step=0.5, wall_step=2.0, limit=1.0, waited=2.0)  # its limit used
    assert not keep_waiting(cpu_used=0.0, cpu_step=0.0, wall_step=2.0, limit=1.0, waited=2.0)  # asleep
    assert not keep_waiting(cpu_used=0.6, cpu_step=0.5, wall_step=2.0, limit=1.0, waited=STARVED_CAP)


@linux_only
def test_a_call_crowded_off_its_cpu_still_returns(monkeypatch):
    """A correct call that needs 1.6 s of CPU under a 2 s limit, on a CPU shared with a busy process
    (half of it: 3.2 s of wall time), returns: load is not the candidate's fault."""
    import multiprocessing

    cpu = sorted(os.sched_getaffinity(0))[0]
    monkeypatch.setenv("KVPARITY_SBX_CPU", str(cpu))
    monkeypatch.setenv("KVPARITY_SBX_CPU_SECONDS", "1.6")
    context = multiprocessing.get_context("fork")  # busy at once (a spawned one imports first)
    crowd = [context.Process(target=_busy, args=(cpu,), daemon=True)]  # one: the rest of the suite runs beside
    for p in crowd:
        p.start()
    try:
        with Sandbox(call_timeout=10.0) as box:  # started (torch imported) before the clock runs
            box.load(TARGET, spec("sbx_starved_cpu"))
            box.call_timeout = 2.0
            started = time.monotonic()
            outcome = box.call(TARGET, spec("sbx_starved_cpu"), BATCH.to_dict())
            waited = time.monotonic() - started
    finally:
        for p in crowd:
            p.kill()
    assert outcome.status == "returned", outcome.error
    assert waited > 2.0  # it was past the wall limit, and waited for


def _busy(cpu: int) -> None:
    os.sched_setaffinity(0, {cpu})
    while True:
        pass
