"""``kvparity matrix``: releases pairwise on one scenario set (kvparity/run/matrix.py), harness-driven."""

from __future__ import annotations

import json

import pytest

from kvparity.cli.main import main
from kvparity.cli.matrix import _pairs
from kvparity.model.strategies import TEMPLATES


def test_pairs_are_each_release_against_the_one_before_or_against_the_base():
    assert _pairs(["a", "b", "c"], None) == [("a", "b"), ("b", "c")]
    assert _pairs(["a", "b", "c"], "b") == [("b", "a"), ("b", "c")]


@pytest.mark.parametrize("argv, words", [
    (["matrix", "0.5.3"], "at least two releases"),
    (["matrix", "0.5.3", "0.5.3.post1", "--examples", "0"], "--examples must be from 1 to 10000"),
    (["matrix", "0.5.3", "0.9.9"], "the nearest supported version is"),
    (["matrix", "0.5.3", "0.5.3.post1", "--json", "/nonexistent-kvparity/m.json"], "does not exist"),
])
def test_bad_matrix_options_exit_2(argv, words, capsys):
    assert main(argv) == 2
    assert words in capsys.readouterr().err


def test_the_refactor_release_pair_is_exact(tmp_path, capsys):
    out = tmp_path / "m.json"
    assert main(["matrix", "0.5.3", "0.5.3.post1", "--examples", "2", "--backend", "torch", "--json", str(out)]) == 0
    assert "exact" in capsys.readouterr().out
    (pair,) = json.loads(out.read_text())["pairs"]
    assert (pair["reference_release"], pair["other_release"], pair["label"]) == ("0.5.3", "0.5.3.post1", "exact")
    assert (pair["reference"], pair["checked"], pair["verdict"]) == \
        ("sglang-0.5.3/torch", ["sglang-0.5.3.post1/torch"], "parity")
    assert pair["scenarios"] == 2 * len(TEMPLATES)  # --examples is per template
