"""``kvparity matrix --shard I/N`` and ``kvparity matrix merge`` (kvparity/run/matrix_shards.py).

Real SGLang is replaced by a fake lane and a fake ``run_matrix`` whose verdicts depend only on the
pair, so that the CLI's whole path (shares, documents, reports, merge) runs in a second."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvparity.cli.main import main
from kvparity.cli.matrix import _pairs
from kvparity.judge.renumber import DIVERGENT, EXACT, RENUMBERED
from kvparity.run import matrix_shards as shards
from kvparity.run.matrix import PairResult

RELEASES = ["0.5.3", "0.5.3.post1", "0.5.3.post2", "0.5.4", "0.5.4.post1"]


@pytest.mark.parametrize("base", [None, "0.5.3"])
def test_the_shares_are_a_partition_in_order_and_even_in_releases(base):
    for n_releases in range(2, len(RELEASES) + 1):
        pairs = _pairs(RELEASES[:n_releases], base)
        for count in range(1, 7):
            parts = [shards.share(pairs, shards.Shard(i, count)) for i in range(1, count + 1)]
            assert [p for part in parts for p in part] == pairs  # every pair once, in the matrix's order
            assert parts == [shards.share(pairs, shards.Shard(i, count)) for i in range(1, count + 1)]
            played = [len(shards.releases_of(part, RELEASES)) for part in parts if part]
            assert max(played) - min(played) <= 1, (pairs, count, parts)


@pytest.mark.parametrize("value", ["0/3", "4/3", "x", "1/0", "-1/3", "2"])
def test_a_bad_shard_is_refused_in_one_sentence_naming_the_option(value, capsys):
    assert main(["matrix", "0.5.3", "0.5.3.post1", f"--shard={value}"]) == 2
    err = capsys.readouterr().err
    assert "--shard" in err and err.count("\n") == 1, err


# --- the CLI on fake lanes --------------------------------------------------------------------------

VERDICTS = {"0.5.3.post1": EXACT, "0.5.3.post2": RENUMBERED, "0.5.4": DIVERGENT, "0.5.4.post1": DIVERGENT}


class FakeLane:
    started: list[str] = []

    def __init__(self, specs: list[str], backends: tuple[str, ...], **options: object) -> None:
        (self.release,), self.backends = specs, backends

    def start(self) -> None:
        FakeLane.started.append(self.release)

    def close(self) -> None:
        pass


def fake_run_matrix(scenarios, lanes, pairs, *, tick, pool):
    for lane in lanes.values():  # the real one starts each lane when its release's turn comes
        lane.start()
    results = []
    for a, b in pairs:
        for backend in lanes[a].backends:
            r = PairResult(f"sglang-{a}/{backend}", f"sglang-{b}/{backend}", a, b, backend)
            for i, scenario in enumerate(scenarios):
                verdict = VERDICTS[b] if i % 3 == 0 else EXACT
                r.add(verdict, f"{b} differs", scenario, {f"class-{i % 4}", "paged"}, f"field-{i % 2}")
                r.findings.update({"a known change"} if backend == "torch" else set())
            results.append(r)
    return results[::-1]  # any order: the document is in the plan's order


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.setattr("kvparity.engine.real.lane.RealLane", FakeLane)
    monkeypatch.setattr("kvparity.run.matrix.run_matrix", fake_run_matrix)
    FakeLane.started = []


def _run(argv: list[str], capsys) -> tuple[int, str]:
    status = main(argv)
    return status, capsys.readouterr().out


def test_the_merge_of_the_shards_is_the_unsharded_run(fake, tmp_path, capsys):
    run = ["matrix", *RELEASES, "--examples", "1"]
    whole_status, whole_out = _run([*run, "--json", f"{tmp_path}/whole.json", "--markdown", f"{tmp_path}/whole.md"],
                                   capsys)
    for i in (1, 2, 3):
        _run([*run, "--shard", f"{i}/3", "--json", f"{tmp_path}/s{i}.json"], capsys)
    merged = ["matrix", "merge", *(f"{tmp_path}/s{i}.json" for i in (3, 1, 2))]
    status, out = _run([*merged, "--json", f"{tmp_path}/m.json", "--markdown", f"{tmp_path}/m.md"], capsys)
    assert (status, out) == (whole_status, out) == (1, whole_out)
    assert json.loads(Path(f"{tmp_path}/m.json").read_text()) == json.loads(Path(f"{tmp_path}/whole.json").read_text())
    assert Path(f"{tmp_path}/m.md").read_text() == Path(f"{tmp_path}/whole.md").read_text()


def test_a_shard_plays_its_pairs_and_starts_only_their_releases(fake, tmp_path, capsys):
    assert main(["matrix", *RELEASES, "--examples", "1", "--shard", "2/3", "--json", f"{tmp_path}/s.json"]) == 1
    assert FakeLane.started == ["0.5.3.post2", "0.5.4"]
    doc = json.loads(Path(f"{tmp_path}/s.json").read_text())
    assert doc["shard"] == {"index": 2, "count": 3, "release_pairs": [["0.5.3.post2", "0.5.4"]]}
    assert len(doc["plan"]["release_pairs"]) == 4 and doc["plan"]["scenario_set"]["per_template"] == 1
    assert [(r["other_release"], r["backend"]) for r in doc["pairs"]] == [("0.5.4", "torch"), ("0.5.4", "triton")]


# --- merge refusals, on documents written by hand ---------------------------------------------------------

ROW = {"reference": "r", "other": "o", "verdict": EXACT, "scenarios": 1, "renumbered": 0, "divergent": 0,
       "fields": {}, "classes": {}, "known_changes": {}, "counterexample": None, "release_changes": [], "scenario": None}
PLAN = shards.plan(RELEASES[:3], _pairs(RELEASES[:3], None), ["torch"],
                   {"profile": "ci", "per_template": 1, "scenarios": 10, "sha256": "0" * 64})


def _shard(tmp_path: Path, name: str, index: int, count: int = 2, plan: dict = PLAN) -> str:
    rows = [{**ROW, "reference_release": a, "other_release": b, "backend": "torch"}
            for a, b in shards.share(plan["release_pairs"], shards.Shard(index, count))]
    (tmp_path / name).write_text(json.dumps(shards.document(rows, plan, shards.Shard(index, count))))
    return str(tmp_path / name)


def _other_scenarios(tmp_path, name):
    return _shard(tmp_path, name, 2, plan={**PLAN, "scenario_set": {**PLAN["scenario_set"], "per_template": 2}})


@pytest.mark.parametrize("second, words", [
    (lambda tmp, name: _shard(tmp, name, 1), "overlaps"),  # shard 1/2 twice
    (lambda tmp, name: _shard(tmp, name, 2, count=3), "one of 2 shards"),
    (_other_scenarios, "another run"),
    (lambda tmp, name: (tmp / name).write_text("{not json") and str(tmp / name), "not JSON"),
    (lambda tmp, name: str(tmp / name), "cannot be read"),  # no such file
    (lambda tmp, name: (tmp / name).write_text('{"pairs": []}') and str(tmp / name), "not the JSON of a kvparity"),
], ids=["given twice", "another shard count", "another scenario set", "not JSON", "no such file", "not a shard"])
def test_merge_refuses_what_is_not_the_shards_of_one_run_naming_the_file(second, words, tmp_path, capsys):
    files = [_shard(tmp_path, "a.json", 1), second(tmp_path, "b.json"), _shard(tmp_path, "c.json", 2)]
    assert main(["matrix", "merge", *files]) == 2
    err = capsys.readouterr().err
    assert words in err and "b.json" in err and err.count("\n") == 1, err


def test_merge_refuses_a_missing_shard(tmp_path, capsys):
    assert main(["matrix", "merge", _shard(tmp_path, "a.json", 1)]) == 2
    assert "shard 2/2 missing" in capsys.readouterr().err
    assert main(["matrix", "merge", _shard(tmp_path, "a.json", 1), _shard(tmp_path, "b.json", 2)]) == 0
