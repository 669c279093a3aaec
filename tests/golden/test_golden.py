"""Golden files: every golden replays in every world with exact equality, dtypes included, and
a missing, corrupt, outdated or edited file fails with a message naming the file, the first
difference and the command that regenerates it. Regeneration is deterministic and refuses to
record a golden the worlds disagree on; ``check`` writes nothing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kvparity.cli import main as cli
from kvparity.golden import store as golden
from kvparity.mem_cache.memory_pool import ReqToTokenPool
from kvparity.refactored import chunk_cache
from kvparity.run.runner import ALL_WORLDS, run_scenario

NAMES = list(golden.GOLDENS)
SMALL = "row-reuse-alias"  # small, and it has 'refactored' overrides


@pytest.mark.parametrize("version, backend", ALL_WORLDS, ids=[f"{v}-{b}" for v, b in ALL_WORLDS])
@pytest.mark.parametrize("name", NAMES)
def test_golden_replays_exactly(name: str, version: str, backend: str) -> None:
    problems = golden.replay_in_world(name, version, backend)
    assert not problems, golden.explain(name, problems, f"{version}/{backend}")


def test_the_issue_list_is_covered() -> None:
    """At least 12 goldens, and no file in tests/golden without a golden of that name."""
    assert len(NAMES) >= 12
    assert golden.stale_files() == []
    assert all(name == name.lower() and " " not in name and "_" not in name for name in NAMES), "kebab-case names"


# ---- failure messages ----------------------------------------------------------------------------
def _copy(tmp_path: Path, name: str = SMALL) -> Path:
    path = golden.path_of(name, tmp_path)
    shutil.copyfile(golden.path_of(name), path)
    return path


def _failure(name: str, directory: Path, world: tuple[str, str] = ("legacy", "torch")) -> str:
    problems = golden.replay_in_world(name, *world, directory=directory)
    assert problems, f"golden {name} in {directory} replayed without a difference"
    return golden.explain(name, problems, "/".join(world), directory)


def _assert_names_file_and_command(message: str, name: str, directory: Path) -> None:
    assert str(golden.path_of(name, directory)) in message
    assert f"python scripts/regen_golden.py {name}" in message
    assert golden.regen_command(name, directory) in message


def test_missing_file(tmp_path: Path) -> None:
    message = _failure(SMALL, tmp_path)
    _assert_names_file_and_command(message, SMALL, tmp_path)
    assert "is missing" in message


def test_corrupt_file(tmp_path: Path) -> None:
    path = _copy(tmp_path)
    path.write_text(path.read_text()[:200])
    message = _failure(SMALL, tmp_path)
    _assert_names_file_and_command(message, SMALL, tmp_path)
    assert "is not valid JSON" in message


def test_outdated_format(tmp_path: Path) -> None:
    path = _copy(tmp_path)
    path.write_text(path.read_text().replace('"format_version": 1,', '"format_version": 0,', 1))
    message = _failure(SMALL, tmp_path)
    _assert_names_file_and_command(message, SMALL, tmp_path)
    assert "format_version 0" in message


def test_outdated_scenario(tmp_path: Path) -> None:
    """The file was recorded from another scenario than kvparity/golden/scenarios.py defines now."""
    path = _copy(tmp_path)
    data = json.loads(path.read_text())
    data["scenario"]["requests"][1]["tokens"] = [7, 9]
    path.write_text(golden.to_text(data))
    message = _failure(SMALL, tmp_path)
    _assert_names_file_and_command(message, SMALL, tmp_path)
    assert "outdated" in message


@pytest.mark.parametrize("version, backend", ALL_WORLDS, ids=[f"{v}-{b}" for v, b in ALL_WORLDS])
def test_one_edited_number_names_step_row_and_cells(tmp_path: Path, version: str, backend: str) -> None:
    """A reviewer reads which golden, which stage, which row and columns, and both values."""
    path = _copy(tmp_path)
    text = path.read_text()
    edited = text.replace('"rows": {"0": [1, 2, 3, 4]}', '"rows": {"0": [1, 2, 33, 4]}', 1)
    assert edited != text, "the edit did not apply: the golden's first row changed"
    path.write_text(edited)
    message = _failure(SMALL, tmp_path, (version, backend))
    _assert_names_file_and_command(message, SMALL, tmp_path)
    assert f"first difference: golden {SMALL}, step 0 extend ['r0'], row 0: column 2 expected [33] got [3]" in message


def test_an_edited_dtype_is_a_difference(tmp_path: Path) -> None:
    path = _copy(tmp_path)
    path.write_text(path.read_text().replace('"out_cache_loc": {"dtype": "int64"', '"out_cache_loc": {"dtype": "int32"', 1))
    message = _failure(SMALL, tmp_path)
    assert "out_cache_loc dtype: expected 'int32' got 'int64'" in message


def test_an_edited_override_fails_the_refactored_worlds_only(tmp_path: Path) -> None:
    path = _copy(tmp_path)
    text = path.read_text()
    edited = text.replace('"prefix": {"values": [1, 2, 3, 4]}', '"prefix": {"values": [1, 2, 3, 5]}', 1)
    assert edited != text
    path.write_text(edited)
    assert golden.replay_in_world(SMALL, "legacy", "torch", tmp_path) == []
    message = _failure(SMALL, tmp_path, ("refactored", "triton"))
    assert "request r0 prefix values: position 3 expected [5] got [4]" in message


def test_a_change_that_moves_both_versions_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """What goldens are for: request rows handed out last-first changes legacy and refactored alike,
    so the worlds still agree, and only the golden sees it."""

    def last_first(self: ReqToTokenPool, need_size: int) -> list[int] | None:
        if need_size > len(self.free_slots):
            return None
        taken = self.free_slots[len(self.free_slots) - need_size :]
        self.free_slots = self.free_slots[: len(self.free_slots) - need_size]
        return taken

    monkeypatch.setattr(ReqToTokenPool, "alloc", last_first)
    scenario = golden.GOLDENS["empty-prefixes"]
    assert run_scenario(scenario).ok, "the worlds should agree on the changed behaviour"
    problems = golden.replay_in_world("empty-prefixes", "legacy", "torch")
    assert problems and "batch_rows" in problems[0], problems[:3]


# ---- regeneration and check ----------------------------------------------------------------------
@pytest.mark.parametrize("name", [SMALL, "allocation-failure"])
def test_regeneration_is_byte_identical(tmp_path: Path, name: str) -> None:
    first, _ = golden.regen(name, tmp_path / "a")
    second, _ = golden.regen(name, tmp_path / "b")
    assert first.read_bytes() == second.read_bytes()
    assert first.read_bytes() == golden.path_of(name).read_bytes(), (
        f"the committed {golden.display_path(golden.path_of(name))} is not what regeneration writes: "
        f"run {golden.regen_command(name)}"
    )


def test_check_writes_nothing(tmp_path: Path) -> None:
    path = _copy(tmp_path)
    text = path.read_text().replace('"available_size": 28', '"available_size": 27', 1)
    path.write_text(text)
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in tmp_path.iterdir()}
    problems = golden.check(SMALL, tmp_path)
    assert problems and "allocator available_size: expected 27 got 28" in problems[0]
    assert cli.main(["golden", "check", SMALL, "--directory", str(tmp_path)]) == 1
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in tmp_path.iterdir()} == before


def test_check_passes_on_a_clean_copy(tmp_path: Path) -> None:
    _copy(tmp_path)
    assert golden.check(SMALL, tmp_path) == []
    assert cli.main(["golden", "check", SMALL, "--directory", str(tmp_path)]) == 0


def test_regen_refuses_when_the_worlds_disagree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A golden recorded from a broken state would bless the bug: the refactored chunk cache
    handing out legacy's int32 view is misread by the refactored Triton kernel."""
    monkeypatch.setattr(chunk_cache.ChunkCache, "_prefix_from_row", lambda self, row_slots: row_slots)
    with pytest.raises(golden.GoldenError) as refused:
        golden.regen("chunked-chunk-cache", tmp_path)
    assert "golden chunked-chunk-cache: refusing to record" in str(refused.value)
    assert "first difference:" in str(refused.value)
    assert not any(tmp_path.iterdir()), "a refused golden was written"
    assert cli.main(["golden", "regen", "chunked-chunk-cache", "--directory", str(tmp_path)]) == 1


def test_cli_usage_errors() -> None:
    assert cli.main(["golden", "check", "no-such-golden"]) == 2
    assert cli.main(["golden", "regen", "no-such-golden"]) == 2
    with pytest.raises(SystemExit) as usage:
        cli.main(["golden"])
    assert usage.value.code == 2
