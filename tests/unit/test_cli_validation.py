"""Every option is checked before a run starts: a bad one costs exit 2 and one sentence naming
it, never a traceback after the run (issue 12, items 3 and 7)."""

from __future__ import annotations

import pytest

from parity import profiles
from parity.cli import main


@pytest.mark.parametrize(
    "argv, words",
    [
        (["mutants", "--timeout", "0"], "--timeout must be greater than 0"),
        (["mutants", "--jobs", "0"], "--jobs must be at least 1"),
        (["mutants", "--json", "/nonexistent-kvparity/x.json"], "the folder '/nonexistent-kvparity' does not exist"),
    ],
)
def test_mutants_options_are_checked_up_front(argv, words, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


def test_a_json_path_that_is_a_folder_is_refused(tmp_path, capsys):
    assert main(["mutants", "--json", str(tmp_path)]) == 2
    assert "is a folder, not a file" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["0", "abc", "-3", "2000000"])
def test_max_examples_variable_is_named_when_bad(value, monkeypatch):
    monkeypatch.setenv("KVPARITY_MAX_EXAMPLES", value)
    with pytest.raises(ValueError, match=rf"KVPARITY_MAX_EXAMPLES='{value}': expected a whole number"):
        profiles.max_examples_override()


def test_max_examples_variable_sets_the_count(monkeypatch):
    monkeypatch.setenv("KVPARITY_MAX_EXAMPLES", "7")
    assert profiles.max_examples_override() == 7
