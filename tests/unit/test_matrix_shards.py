"""``kvparity matrix --shard I/N`` and ``kvparity matrix merge`` (kvparity/run/matrix_shards.py).

Real SGLang is replaced by a fake lane, a fake ``resolve`` and a fake ``run_matrix`` whose pair
verdicts depend only on the pair (its rows made by the matrix's own ``pair_row`` and
``release_row``), so that the CLI's whole path (shares, documents, reports, merge) runs in a second."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvparity.cli.main import main
from kvparity.cli.matrix import _pairs
from kvparity.golden.scenarios import GOLDENS
from kvparity.judge.compare import RENUMBERED_BETWEEN_RELEASES
from kvparity.judge.verdict import Finding, Played, Row, Verdict
from kvparity.model.classes import REQUIRED
from kvparity.model.strategies import TEMPLATES
from kvparity.run import matrix_shards as shards
from kvparity.run.harness_drive import HarnessDrive, HarnessSpec
from kvparity.run.matrix import DIVERGENT, EXACT, RENUMBERED, Releases, pair_row, release_row

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

LABELS = {"0.5.3.post1": EXACT, "0.5.3.post2": RENUMBERED, "0.5.4": DIVERGENT, "0.5.4.post1": DIVERGENT}
SCENARIO = GOLDENS["chunked-radix-cache"]


class FakeLane:
    started: list[str] = []

    def __init__(self, specs: list[str], backends: tuple[str, ...], **options: object) -> None:
        (self.release,), self.backends = specs, backends
        FakeLane.started.append(self.release)  # the real one starts its worker on first use: here, once made

    def close(self) -> None:
        pass


def fake_verdict(ref: str, other: str, examples: int) -> tuple[Verdict, HarnessDrive]:
    """The verdict of the pair: every third scenario differs (or is renumbered) as ``LABELS`` says."""
    names = (f"sglang-{ref}/torch", f"sglang-{other}/torch")
    drive = HarnessDrive(HarnessSpec((("legacy", "torch"),), real_reference=True, counts_all=True),
                         lane=SimpleNamespace(names=names))
    row = Row(TEMPLATES[0].name, (0,))
    for i in range(examples):
        differs = LABELS[other] == DIVERGENT and i % 3 == 0
        findings = (Finding("a known change", names[1], "seen"),)
        if LABELS[other] == RENUMBERED and i % 3 == 0:
            findings += (Finding(RENUMBERED_BETWEEN_RELEASES, names[1], "renumbered"),)
        row.count(Played(SCENARIO, not differs, "disagree" if differs else None, f"{other} differs" if differs else "",
                         frozenset({REQUIRED[i % 4], REQUIRED[4]}), findings), row.task)
    verdict = Verdict("harness", drive.reference, drive.checked, [row], REQUIRED, counts_all=True)
    verdict.summary_line = "PARITY" if verdict.verdict == "parity" else f"DIVERGENCE: {other} differs"
    return verdict, drive


def fake_run_matrix(drive, sources, pairs, *, examples, seed, backends, shrink_budget_s, say=print, caches=("full",)):
    releases = Releases(drive, sources, backends)
    for release in dict.fromkeys(r for pair in pairs for r in pair):  # the real one starts each on first use
        releases.get(release)
    rows, found = [], {}
    for ref, other in pairs:
        verdict, judge = fake_verdict(ref, other, examples)
        rows.append(pair_row(ref, other, verdict, judge))
        for release, name in ((ref, judge.reference), (other, judge.checked[0])):
            found.setdefault(release, release_row(release, name, verdict, releases.open.get(release)))
    releases.close()
    return {"pairs": rows[::-1], "releases": list(found.values())[::-1]}  # any order: the document is the plan's


@pytest.fixture
def fake(monkeypatch):
    from kvparity.engine.real import versions

    monkeypatch.setattr("kvparity.engine.real.lane.RealLane", FakeLane)
    monkeypatch.setattr("kvparity.engine.real.install.resolve", lambda release: (versions.entry(release), release)[1])
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
    whole = json.loads(Path(f"{tmp_path}/whole.json").read_text())
    assert json.loads(Path(f"{tmp_path}/m.json").read_text()) == whole
    assert Path(f"{tmp_path}/m.md").read_text() == Path(f"{tmp_path}/whole.md").read_text()
    assert [row["label"] for row in whole["pairs"]] == [LABELS[b] for _, b in _pairs(RELEASES, None)]
    assert [r["release"] for r in whole["releases"]] == RELEASES
    assert f"Harness-driven matrix: {len(TEMPLATES)} scenarios, shared out over the templates" in whole_out


def test_a_shard_plays_its_pairs_and_starts_only_their_releases(fake, tmp_path, capsys):
    assert main(["matrix", *RELEASES, "--examples", "1", "--shard", "2/3", "--json", f"{tmp_path}/s.json"]) == 1
    assert FakeLane.started == ["0.5.3.post2", "0.5.4"]
    doc = json.loads(Path(f"{tmp_path}/s.json").read_text())
    assert doc["shard"] == {"index": 2, "count": 3, "release_pairs": [["0.5.3.post2", "0.5.4"]]}
    assert len(doc["plan"]["release_pairs"]) == 4 and doc["plan"]["drive"] == "harness"
    assert doc["plan"]["examples"] == len(TEMPLATES)  # --examples is per template; the plan holds them in all
    assert doc["plan"]["backends"] == ["torch", "triton"]
    assert [(r["reference_release"], r["other_release"], r["label"]) for r in doc["pairs"]] == \
        [("0.5.3.post2", "0.5.4", DIVERGENT)]


# --- merge refusals, on documents written by hand ---------------------------------------------------------

ROW = {"drive": "harness", "verdict": "parity", "summary": "PARITY", "reference": "r", "checked": ["o"], "scenarios": 1,
       "differing": 0, "rows": [], "findings": {}, "first_difference": None, "label": EXACT, "release_changes": []}
PLAN = shards.plan("harness", RELEASES[:3], _pairs(RELEASES[:3], None), ["torch"], 10, None)


def _shard(tmp_path: Path, name: str, index: int, count: int = 2, plan: dict = PLAN) -> str:
    mine = shards.share(plan["release_pairs"], shards.Shard(index, count))
    rows = [{**ROW, "reference_release": a, "other_release": b} for a, b in mine]
    releases = [{"release": r, "scenarios": 1, "findings": {}, "findings_first": {}, "costs": {}}
                for r in shards.releases_of(mine, plan["releases"])]
    (tmp_path / name).write_text(json.dumps(shards.document(rows, releases, plan, shards.Shard(index, count))))
    return str(tmp_path / name)


def _other_scenarios(tmp_path, name):
    return _shard(tmp_path, name, 2, plan={**PLAN, "examples": 20})


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
