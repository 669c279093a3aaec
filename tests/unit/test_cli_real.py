"""``kvparity check --sglang A [--against B]`` and the real lane (kvparity/engine/real/lane.py): exit codes,
one-sentence refusals, a mutated copy of real SGLang caught end to end, and a real world that
crashes or hangs reported with its version, step and operation while the run goes on."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kvparity.cli.main import main
from kvparity.engine.real.install import resolve
from kvparity.engine.real.lane import RealLane
from kvparity.golden.scenarios import GOLDENS
from kvparity.run.runner import run_scenario
from kvparity.teeth.real_zoo import REAL_MUTANTS_BY_NAME, make_mutated_copy


def _check(*args: str) -> int:
    return main(["check", *args])


@pytest.mark.parametrize(
    "args, words",
    [
        (["--against", "0.5.3"], "--against needs --sglang"),
        (["--sglang", "0.5.3", "--candidate", "x.py:f"], "takes no --candidate"),
        (["--sglang", "0.5.3", "--target", "get_last_loc"], "--target get_last_loc does not apply"),
        (["--sglang", "0.9.9"], "the nearest supported version is 0.5.23"),
        (["--sglang", "not a version"], "is not an SGLang version"),
        (["--sglang", "/nonexistent/kvparity-sglang"], "/nonexistent/kvparity-sglang"),
        (["--sglang", "0.5.4"], "give the reference with --against"),
    ],
    ids=["against alone", "candidate", "target", "unsupported", "not a version", "missing folder", "not modelled"],
)
def test_bad_real_sglang_options_exit_2_with_one_sentence(args, words, capsys):
    assert _check(*args) == 2
    err = capsys.readouterr().err
    assert words in err, err
    assert "Traceback" not in err


def test_a_folder_without_sglang_exits_2(tmp_path, capsys):
    assert _check("--sglang", str(tmp_path)) == 2
    assert str(tmp_path) in capsys.readouterr().err


def test_no_network_for_an_install_exits_2(tmp_path, monkeypatch, capsys):
    """An empty cache and an empty wheel folder: pip cannot install, kvparity says so."""
    monkeypatch.setenv("KVPARITY_SGLANG_CACHE", str(tmp_path / "cache"))
    (tmp_path / "wheels").mkdir()
    monkeypatch.setenv("KVPARITY_SGLANG_WHEELS", str(tmp_path / "wheels"))
    assert _check("--sglang", "0.5.3") == 2
    assert "could not install sglang==0.5.3" in capsys.readouterr().err


def test_real_release_against_kvparity_model_gives_parity(tmp_path, capsys):
    out = tmp_path / "v.json"
    assert _check("--sglang", "0.5.3", "--examples", "20", "--backend", "torch", "--json", str(out)) == 0
    printed = capsys.readouterr().out
    assert "legacy/torch vs sglang-0.5.3/torch" in printed and "verdict (harness-driven): PARITY" in printed
    verdict = json.loads(out.read_text())
    assert (verdict["reference"], verdict["checked"]) == ("legacy/torch", ["sglang-0.5.3/torch"])


def test_mutated_copy_against_a_release_exits_1_with_the_shrunk_scenario_and_cells(tmp_path, capsys):
    copy = make_mutated_copy(resolve("0.5.3.post1"), REAL_MUTANTS_BY_NAME["chunk-cache-int32-view"], tmp_path / "mut")
    assert _check("--sglang", str(copy), "--against", "0.5.3", "--backend", "triton", "--examples", "40") == 1
    printed = capsys.readouterr().out
    assert "sglang-0.5.3/triton vs mut@0.5.3.post1/triton" in printed and "DIVERGENCE" in printed
    assert "kvparity: the worlds disagree" in printed and "expected" in printed  # the cells table
    assert "Scenario(" in printed and "cache_kind='chunk'" in printed


def _patched(tmp_path: Path, old: str, new: str) -> Path:
    """A copy of real 0.5.3.post1 whose paged alloc_extend starts with ``new``."""
    source = resolve("0.5.3.post1")
    dest = tmp_path / "patched"
    shutil.copytree(Path(source.path) / "sglang", dest / "sglang")
    target = dest / "sglang/srt/mem_cache/allocator.py"
    text = target.read_text()
    assert text.count(old) == 1
    target.write_text(text.replace(old, old + new))
    return dest


_ALLOC_EXTEND = "        extend_num_tokens: int,\n    ):\n"


def test_a_real_world_that_crashes_is_a_finding_and_the_run_goes_on(tmp_path):
    crash = "        import os, signal; os.kill(os.getpid(), signal.SIGSEGV)\n"
    copy = _patched(tmp_path, _ALLOC_EXTEND, crash)
    with RealLane([str(copy)], ("torch",)) as lane:
        paged = run_scenario(GOLDENS["paged-unaligned-chunk-tail"], (("refactored", "torch"),), lane=lane)
        page_1 = run_scenario(GOLDENS["mixed-prefixes"], (("refactored", "torch"),), lane=lane)
    lines = [d.detail for d in paged.divergences]
    assert any("died at step 0, in alloc_extend" in line and "SIGSEGV" in line for line in lines), lines
    assert page_1.ok  # a fresh worker played the next scenario


def test_a_real_world_that_hangs_is_named_and_stopped(tmp_path):
    copy = _patched(tmp_path, _ALLOC_EXTEND, "        import time; time.sleep(600)\n")
    with RealLane([str(copy)], ("torch",), timeout=8) as lane:
        result = run_scenario(GOLDENS["paged-unaligned-chunk-tail"], (("refactored", "torch"),), lane=lane)
    lines = [d.detail for d in result.divergences]
    assert any("hung at step 0" in line for line in lines), lines
