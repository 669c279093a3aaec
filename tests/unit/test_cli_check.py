"""``kvparity check`` without a candidate: verdicts, exit statuses, --json and --repro."""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys

import pytest
import torch

from kvparity.cli.main import main
from kvparity.model import profiles
from kvparity.model.strategies import TEMPLATES
from kvparity.refactored import schedule_batch


@pytest.fixture(autouse=True)
def keep_the_suites_profile():
    """``kvparity check`` loads its own Hypothesis profile; give the suite's back afterwards."""
    suite_profile = os.environ["HYPOTHESIS_PROFILE"]
    yield
    profiles.load(suite_profile)


def test_parity_exits_0_and_writes_the_verdict(tmp_path, capsys):
    out = tmp_path / "verdict.json"
    examples = 2 * len(TEMPLATES)  # two per template
    assert main(["check", "--examples", str(examples), "--backend", "torch", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "legacy/torch vs refactored/torch" in printed and "verdict (harness-driven): PARITY" in printed
    verdict = json.loads(out.read_text())
    assert verdict["verdict"] == "parity" and verdict["scenarios"] == examples and verdict["first_difference"] is None
    assert (verdict["drive"], verdict["reference"], verdict["checked"]) == ("harness", "legacy/torch", ["refactored/torch"])


def test_divergence_exits_1_with_a_shrunk_counterexample_and_a_repro(tmp_path, capsys, monkeypatch):
    """A refactored last_loc taken from the second-to-last prefix element (a real bug class)."""

    def second_to_last(prefix_tensors, device):
        minus_one = torch.tensor([-1], dtype=torch.int64, device=device)
        return torch.cat([p[-2:-1].to(device) if len(p) > 1 else minus_one for p in prefix_tensors])

    monkeypatch.setattr(schedule_batch, "last_loc_from_prefixes", second_to_last)
    out, repro = tmp_path / "verdict.json", tmp_path / "repro.py"
    # One job: the planted bug lives in this process only (spawned jobs would import the real code).
    status = main(["check", "--examples", "80", "--backend", "torch", "--jobs", "1", "--json", str(out), "--repro", str(repro)])
    printed = capsys.readouterr().out
    assert status == 1
    assert "legacy/torch vs refactored/torch" in printed and "DIVERGENCE" in printed
    assert "last_loc" in printed and "verdict (harness-driven): DIVERGENCE" in printed
    verdict = json.loads(out.read_text())
    assert verdict["verdict"] == "divergence"
    assert verdict["first_difference"]["shrunk"]["scenario"]["geometry"]["page_size"] > 1  # last_loc only matters paged
    script = repro.read_text()
    compile(script, str(repro), "exec")
    assert '"--replay"' in script and "first_found = {" in script and "CHECK = ['--backend', 'torch']" in script
    monkeypatch.setattr(sys, "argv", [str(repro)])
    with pytest.raises(SystemExit) as replayed:  # the repro replays the shrunk counterexample: still a divergence
        runpy.run_path(str(repro), run_name="__main__")
    assert replayed.value.code == 1


@pytest.mark.parametrize(
    "argv,message",
    [
        (["check", "--examples", "0"], "--examples must be from 1 to 1,000,000"),
        (["check", "--target", "get_last_loc"], "needs --candidate"),
        (["check", "--profile", "weekly"], "Hypothesis profile 'weekly'"),
    ],
)
def test_usage_errors_exit_2_and_say_why(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_console_entry_rejects_unknown_options():
    done = subprocess.run([sys.executable, "-m", "kvparity", "check", "--colour"], capture_output=True, text=True)
    assert done.returncode == 2 and "unrecognized arguments: --colour" in done.stderr


# ---- with a candidate -----------------------------------------------------------------------------
CANDIDATES = "tests/unit/candidates"


def test_example_candidate_gets_parity(capsys):
    argv = ["check", "--target", "write_cache_indices", "--candidate", "examples/offset_write.py:write_cache_indices",
            "--examples", "20"]
    assert main(argv) == 0
    assert "verdict: PARITY" in capsys.readouterr().out


def test_wrong_candidate_exits_1_with_cells_json_and_repro(tmp_path, capsys):
    out, repro = tmp_path / "verdict.json", tmp_path / "repro.py"
    argv = ["check", "--target", "write_cache_indices", "--candidate", f"{CANDIDATES}/wci_own_offset.py:write_cache_indices",
            "--examples", "20", "--json", str(out), "--repro", str(repro)]
    assert main(argv) == 1
    printed = capsys.readouterr().out
    assert "counterexample (shrunk)" in printed and "expected" in printed and "verdict: DIVERGENCE" in printed
    verdict = json.loads(out.read_text())
    assert verdict["verdict"] == "divergence" and verdict["fault"]["cells"]
    assert "replay_batch" in repro.read_text()


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--target", "prepare_for_extend", "--candidate", "examples/offset_write.py:write_cache_indices"],
         "takes no candidate"),
        (["--target", "write_cache_indices", "--candidate", "examples/no_such_file.py:write_cache_indices"],
         "no_such_file.py"),
        (["--target", "get_last_loc", "--candidate", "examples/offset_write.py:write_cache_indices"], "get_last_loc"),
    ],
)
def test_candidate_usage_errors_exit_2(argv, message, capsys):
    assert main(["check", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_device_cuda_without_cuda_is_a_usage_error():
    """The device is chosen before the kernels are imported; asking for one that is not there
    is refused with the reason, not a traceback."""
    done = subprocess.run([sys.executable, "-m", "kvparity", "check", "--device", "cuda"], capture_output=True, text=True)
    assert done.returncode == 2 and "torch sees no CUDA device" in done.stderr
