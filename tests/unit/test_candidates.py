"""Plug-in candidates (issue 4): loading, the sandbox, guarded inputs, and the verdicts.

Every wrong candidate under ``tests/unit/candidates/`` is wrong in one named way, and must get
exactly that fault kind; kvparity itself must survive each of them (a crash or a hang kills only
the sandbox worker, which the next check restarts). One worker is shared by the module, so the
few seconds of importing torch and Triton are paid once (plus once per crash or hang).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from hypothesis import Phase, find, given, settings
from hypothesis import strategies as st

from kvparity.candidate.check import check_candidate
from kvparity.candidate.inputs import (
    GUARD,
    TARGETS,
    Effect,
    KernelBatch,
    compare_effect,
    contract_violations,
    kernel_batches,
    materialise,
    reference_effect,
)
from kvparity.candidate.loader import CandidateLoadError, load_candidate, signature_problem
from kvparity.candidate.sandbox import Sandbox
from kvparity.model.poison import POISON

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
EXAMPLE = os.path.join(REPO, "examples", "offset_write.py") + ":write_cache_indices"
LAST_LOC_EXAMPLE = os.path.join(REPO, "examples", "last_loc_blocks.py") + ":get_last_loc"
ALLOC_EXAMPLE = os.path.join(REPO, "examples", "alloc_extend_flat.py") + ":alloc_extend"
CALL_TIMEOUT = 4.0
EXAMPLES = 25


def fixture(name: str, function: str = "write_cache_indices") -> str:
    return os.path.join(HERE, "candidates", f"{name}.py") + f":{function}"


@pytest.fixture(scope="module")
def sandbox():
    with Sandbox(call_timeout=CALL_TIMEOUT) as box:
        yield box


def check(target: str, spec: str, sandbox: Sandbox, examples: int = EXAMPLES, shrink: float = 6.0):
    return check_candidate(target, spec, examples=examples, sandbox=sandbox, shrink_seconds=shrink)


# ------------------------------------------------------------------ parity


@pytest.mark.parametrize(
    "target, spec",
    [
        ("write_cache_indices", EXAMPLE),
        ("write_cache_indices", "kvparity.kernels.linear_write:write_cache_indices"),
        ("write_cache_indices", fixture("wci_torch_faithful")),
        ("get_last_loc", fixture("gll_faithful", "get_last_loc")),
        ("alloc_extend", fixture("ae_faithful", "alloc_extend_kernel")),
        ("get_last_loc", LAST_LOC_EXAMPLE),
        ("alloc_extend", ALLOC_EXAMPLE),
    ],
    ids=["offset_write example", "linear-time kernel", "torch write (prints)", "get_last_loc kernel", "alloc_extend kernel",
         "last_loc_blocks example", "alloc_extend_flat example"],
)
def test_faithful_candidates_get_parity(target, spec, sandbox):
    result = check(target, spec, sandbox)
    assert result.verdict == "parity", result.report()
    assert result.fault is None and result.counterexample is None
    assert result.batches_run >= EXAMPLES // 2, result.batches_run  # Hypothesis dedups a few


# ------------------------------------------------------------------ divergences, each of its kind


@pytest.mark.parametrize(
    "target, name, function, kind",
    [
        ("write_cache_indices", "wci_own_offset", "write_cache_indices", "wrong_result"),
        ("write_cache_indices", "wci_no_prefix_shift", "write_cache_indices", "wrong_result"),
        ("write_cache_indices", "wci_one_block", "write_cache_indices", "wrong_result"),
        ("write_cache_indices", "wci_row_by_position", "write_cache_indices", "wrong_result"),
        ("write_cache_indices", "wci_row_past", "write_cache_indices", "guard_damaged"),
        ("write_cache_indices", "wci_raises", "write_cache_indices", "raised"),
        ("write_cache_indices", "wci_modifies_prefix", "write_cache_indices", "input_modified"),
        ("get_last_loc", "gll_wrong_dtype", "get_last_loc", "wrong_return"),
        ("get_last_loc", "gll_one_block", "get_last_loc", "wrong_result"),
        ("get_last_loc", "gll_writes_table", "get_last_loc", "input_modified"),
        ("write_cache_indices", "wci_exits", "write_cache_indices", "exited"),
        ("alloc_extend", "ae_off_by_one", "alloc_extend", "wrong_result"),
    ],
)
def test_wrong_candidate_gets_its_fault_kind(target, name, function, kind, sandbox):
    result = check(target, fixture(name, function), sandbox)
    assert result.verdict == "divergence", result.report()
    assert result.fault_kind == kind, result.report()
    assert result.counterexample is not None and not contract_violations(result.counterexample)
    assert "counterexample (shrunk)" in result.report() and f"fault: {kind}" in result.report()


def test_one_block_needs_a_long_request_and_reports_its_cells(sandbox):
    result = check("write_cache_indices", fixture("wci_one_block"), sandbox)
    batch, fault = result.counterexample, result.fault
    assert max(batch.extend_lens) > 512, batch.describe()
    row = batch.rows[batch.extend_lens.index(max(batch.extend_lens))]
    assert fault.cells and all(cell[3] == POISON for cell in fault.cells), fault.describe()
    assert {cell[0] for cell in fault.cells} == {row}


def test_row_by_position_needs_scrambled_rows(sandbox):
    batch = check("write_cache_indices", fixture("wci_row_by_position"), sandbox).counterexample
    assert list(batch.rows) != list(range(batch.bs)), batch.describe()


def test_prefix_taken_for_one_run_is_caught_by_scattered_pages(sandbox):
    """Issue 25: a prefix whose first two slots are consecutive is not one run when its pages are
    scattered. Slots scattered one by one (or all contiguous) never show it, and the old draws
    hardly ever had anything else (not in 25 batches); prefixes in page runs from scattered pages,
    as a paged allocator hands them out, do."""
    result = check("write_cache_indices", fixture("wci_prefix_one_run"), sandbox)
    assert result.fault_kind == "wrong_result", result.report()
    prefix = max(result.counterexample.prefixes, key=len)
    assert prefix[1] == prefix[0] + 1 and list(prefix) != list(range(prefix[0], prefix[0] + len(prefix))), prefix


# Each shrink call on a hang or a crash costs a timeout or a worker restart: a short budget. The
# check after it plays wide batches too, so it uses a quick (torch) candidate.
def test_hang_is_a_timeout_and_kvparity_goes_on(sandbox):
    # Its own sandbox with a short limit: the candidate spins from its first call, so no honest call
    # can be cut short, and the test spins a core for 1 + 3 s instead of 4 + 12 s.
    with Sandbox(call_timeout=1.0) as quick:
        result = check("write_cache_indices", fixture("wci_hang"), quick, examples=3, shrink=0.0)
    assert result.fault_kind == "timed_out", result.report()
    assert "nor within" in result.fault.summary and result.retried == 1 and result.returned_on_retry == 0  # tried twice
    assert check("write_cache_indices", fixture("wci_torch_faithful"), sandbox, examples=3).verdict == "parity"


SLOW_FIRST_CALL = '''"""wci_torch_faithful, but its first call ever sleeps past any limit: a busy machine, not a hang."""
import pathlib
import sys
import time

sys.path.insert(0, {candidates!r})
from wci_torch_faithful import write_cache_indices as faithful  # noqa: E402

MARK = pathlib.Path(__file__).with_suffix(".called")


def write_cache_indices(out_cache_loc, req_pool_indices_tensor, req_pool_indices_cpu, prefix_lens_tensor,
                        prefix_lens_cpu, seq_lens_tensor, seq_lens_cpu, extend_lens_tensor, extend_lens_cpu,
                        prefix_tensors, req_to_token_pool):
    if not MARK.exists():
        MARK.write_text("called")
        time.sleep(3600)  # killed at the limit; the retry finds the mark and writes at once
    faithful(out_cache_loc, req_pool_indices_tensor, req_pool_indices_cpu, prefix_lens_tensor, prefix_lens_cpu,
             seq_lens_tensor, seq_lens_cpu, extend_lens_tensor, extend_lens_cpu, prefix_tensors, req_to_token_pool)
'''


def test_a_call_that_times_out_once_is_tried_again_and_a_slow_machine_is_no_fault(sandbox, tmp_path):
    candidate = tmp_path / "wci_slow_first_call.py"
    candidate.write_text(SLOW_FIRST_CALL.format(candidates=os.path.join(HERE, "candidates")))
    result = check("write_cache_indices", f"{candidate}:write_cache_indices", sandbox, examples=3)
    assert result.verdict == "parity", result.report()
    assert (result.retried, result.returned_on_retry) == (1, 1)
    assert "tried again after a timeout, with 3 times the limit: 1 call, of which 1 then returned" in result.report()


def test_segfault_is_a_crash_with_its_signal_and_kvparity_goes_on(sandbox):
    result = check("write_cache_indices", fixture("wci_segfault"), sandbox, examples=3, shrink=1.0)
    assert result.fault_kind == "crashed", result.report()
    assert "SIGSEGV" in result.fault.summary, result.report()
    assert check("write_cache_indices", fixture("wci_torch_faithful"), sandbox, examples=3).verdict == "parity"


def test_same_seed_same_batches_and_shrink_budget_is_reported(sandbox):
    spec = fixture("wci_one_block")
    first = check_candidate("write_cache_indices", spec, examples=25, seed=7, sandbox=sandbox, shrink_seconds=0.0)
    again = check_candidate("write_cache_indices", spec, examples=25, seed=7, sandbox=sandbox, shrink_seconds=0.0)
    assert first.verdict == again.verdict == "divergence"
    assert first.counterexample == again.counterexample and first.batches_run == again.batches_run
    assert first.shrink_calls == 0 and "shrinking stopped after its budget" in first.report(), first.report()


def test_json_and_repro_script_replay_the_counterexample(sandbox, tmp_path):
    result = check("write_cache_indices", fixture("wci_no_prefix_shift"), sandbox, examples=5)
    data = json.loads(json.dumps(result.to_dict()))
    assert data["verdict"] == "divergence" and data["fault"]["kind"] == "wrong_result"
    assert KernelBatch.from_dict(data["counterexample"]) == result.counterexample
    script = tmp_path / "repro.py"
    script.write_text(result.repro_script())
    env = {**os.environ, "PYTHONPATH": REPO}
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "fault: wrong_result" in run.stdout and result.fault.details[0] in run.stdout, run.stdout


# ------------------------------------------------------------------ loading errors (exit code 2)


@pytest.mark.parametrize(
    "spec, words",
    [
        ("no_colon_here", ["expected 'package.module:name'"]),
        ("tests/unit/candidates/absent.py:f", ["absent.py", "does not exist"]),
        ("kvparity_no_such_module:f", ["kvparity_no_such_module", "not found"]),
        (fixture("wci_raises", "write_cache_indice"),
         ["has no attribute 'write_cache_indice'", "did you mean write_cache_indices"]),
        (fixture("wci_bad_signature"), ["it takes 10 positional arguments, SGLang passes 11"]),
        (fixture("crash_on_import"), ["crash_on_import.py", "loading it crashed", "SIGABRT"]),
    ],
    ids=["malformed", "missing file", "missing module", "missing name", "wrong parameter names", "crash on import"],
)
def test_unloadable_candidate_raises_a_load_error_naming_the_problem(spec, words, sandbox):
    with pytest.raises(CandidateLoadError) as error:
        check("write_cache_indices", spec, sandbox, examples=2)
    for word in words:
        assert word in str(error.value), str(error.value)


def test_signature_check_counts_positional_parameters_not_names():
    """SGLang calls every target positionally (SPEC 9): a candidate's own parameter names are its
    business; the number of positional parameters, and no required keyword-only one, are not."""
    assert signature_problem(load_candidate(EXAMPLE), "write_cache_indices") is None
    def renamed(table, rows, lens):
        return None
    assert signature_problem(renamed, "get_last_loc") is None
    assert "takes 2 positional arguments, SGLang passes 3" in signature_problem(lambda b, a: 0, "get_last_loc")
    def too_many(a, b, c, d):
        return None
    assert "requires 4 positional arguments, SGLang passes 3" in signature_problem(too_many, "get_last_loc")
    def keyword_only(a, b, *, c):
        return None
    assert "keyword-only parameters (c)" in signature_problem(keyword_only, "get_last_loc")
    def with_extra(req_to_token, req_pool_indices_tensor, prefix_lens_tensor, *, backend="triton"):
        return None
    assert signature_problem(with_extra, "get_last_loc") is None


# ------------------------------------------------------------------ inputs and judgement, in-process


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(TARGETS).flatmap(kernel_batches))
def test_generated_batches_meet_spec_8(batch):
    assert contract_violations(batch) == []
    m = materialise(batch, torch.device("cpu"))
    for g in m.guarded:
        if g.view.numel():  # an empty view's address is not meaningful (it may be 0)
            assert g.view.data_ptr() == g.buffer.data_ptr() + g.lo * g.buffer.element_size()
        assert g.view.is_contiguous() and g.view.numel() == g.hi - g.lo
        assert torch.all(g.buffer[: g.lo] == GUARD) and torch.all(g.buffer[g.hi :] == GUARD)
        expected_dtype = torch.int32 if g.name == "req_to_token" else torch.int64
        assert g.view.dtype == expected_dtype, g.name


def _batch() -> KernelBatch:
    # Rows 2 and 0 of 3; request 0 has prefix [5, 6], request 1 none; new slots 7, 8, 9.
    return KernelBatch("write_cache_indices", (2, 0), ((5, 6), ()), (3, 2), 3, 4, out_cache_loc=(7, 8, 9))


def test_reference_effect_by_hand():
    table = reference_effect(_batch(), torch.device("cpu")).buffers["req_to_token"]
    lo = 2 * 4 + 64
    p = POISON
    assert table[lo : lo + 12] == [8, 9, p, p, p, p, p, p, 5, 6, 7, p]
    assert set(table[:lo]) == {GUARD} and set(table[lo + 12 :]) == {GUARD}


def test_compare_effect_names_cell_guard_and_input():
    batch, cpu = _batch(), torch.device("cpu")
    good = reference_effect(batch, cpu)
    assert compare_effect(batch, good, cpu) is None
    lo = 2 * 4 + 64

    wrong = Effect({k: list(v) for k, v in good.buffers.items()})
    wrong.buffers["req_to_token"][lo + 4 * 2 + 3] = 42
    fault = compare_effect(batch, wrong, cpu)
    assert fault.kind == "wrong_result" and fault.cells == [(2, 3, POISON, 42)], fault.describe()

    wrong.buffers["req_to_token"][lo - 1] = 1
    fault = compare_effect(batch, wrong, cpu)
    assert fault.kind == "guard_damaged" and "row -1, col 3 (before the table)" in fault.describe(), fault.describe()

    moved = Effect({k: list(v) for k, v in good.buffers.items()})
    moved.buffers["out_cache_loc"][64] = 70
    fault = compare_effect(batch, moved, cpu)
    assert fault.kind == "input_modified" and "out_cache_loc" in fault.summary, fault.describe()


def _reachable(target: str, condition) -> KernelBatch:
    quick = settings(max_examples=300, database=None, derandomize=True, phases=[Phase.generate])  # no shrinking
    return find(kernel_batches(target), condition, settings=quick)


@pytest.mark.parametrize("target", TARGETS)
def test_strategy_reaches_the_situations_of_spec_8(target):
    assert _reachable(target, lambda b: 0 in b.prefix_lens and max(b.prefix_lens) > 0)  # empty and non-empty mixed
    assert _reachable(target, lambda b: list(b.rows) != sorted(b.rows))  # rows in non-identity order
    assert _reachable(target, lambda b: max(b.extend_lens) > 512 or max(b.prefix_lens) > 512)  # crossing 512


def test_strategy_reaches_unaligned_prefixes_and_several_page_sizes():
    assert _reachable("alloc_extend", lambda b: any(p % b.page_size for p in b.prefix_lens))
    assert _reachable("get_last_loc", lambda b: b.bs > 256)  # its Triton kernel works in blocks of 256
    assert _reachable(
        "alloc_extend", lambda b: b.page_size > 2 and any(p % b.page_size and p > b.page_size for p in b.prefix_lens))


def test_wild_store_is_caught_and_the_next_check_gets_a_healthy_worker(sandbox):
    result = check("write_cache_indices", fixture("wci_wild_store"), sandbox, examples=2, shrink=1.0)
    # The interpreter segfaults (crashed); a GPU reports an illegal address (raised, worker restarted).
    assert result.fault_kind in ("crashed", "raised"), result.report()
    assert check("write_cache_indices", EXAMPLE, sandbox, examples=3).verdict == "parity"
