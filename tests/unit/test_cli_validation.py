"""Every option is checked before a run starts: a bad one costs exit 2 and one sentence naming
it, never a traceback after the run (issue 12, items 3 and 7)."""

from __future__ import annotations

import pytest

from kvparity.cli.main import main
from kvparity.model import profiles
from kvparity.model.strategies import TEMPLATES


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


@pytest.mark.parametrize(
    "argv, words",
    [
        (["check", "--examples", "0"], "--examples must be from 1 to 1,000,000"),
        (["check", "--examples", "1000001"], "--examples must be from 1 to 1,000,000"),
        (["check", "--jobs", "0"], "--jobs must be at least 1"),
        (["check", "--json", "/nonexistent-kvparity/v.json"], "--json /nonexistent-kvparity/v.json: the folder"),
        (["check", "--repro", "/nonexistent-kvparity/r.py"], "--repro /nonexistent-kvparity/r.py: the folder"),
        (["check", "--target", "write_cache_indices", "--candidate", "examples/offset_write.py:write_cache_indices",
          "--backend", "torch"], "--backend does not apply to --candidate"),
        (["check", "--target", "write_cache_indices", "--candidate", "examples/offset_write.py:write_cache_indices",
          "--jobs", "2"], "--jobs does not apply to --candidate"),
    ],
)
def test_check_options_are_checked_before_the_run(argv, words, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


def test_a_bad_max_examples_variable_is_not_blamed_on_profile(monkeypatch, capsys):
    monkeypatch.setenv("KVPARITY_MAX_EXAMPLES", "abc")
    assert main(["check", "--examples", "1"]) == 2
    err = capsys.readouterr().err
    assert "KVPARITY_MAX_EXAMPLES='abc'" in err and "--profile" not in err


def test_jobs_2_gives_the_verdict_and_count_of_jobs_1(tmp_path):
    """The same derandomized scenarios, shared out over two processes: the same verdict, count and
    classes as one process (templates merged in their order)."""
    import json

    runs = {}
    for jobs in ("1", "2"):
        out = tmp_path / f"v{jobs}.json"
        assert main(["check", "--examples", "20", "--backend", "torch", "--jobs", jobs, "--json", str(out)]) == 0
        runs[jobs] = json.loads(out.read_text())
    keys = ("verdict", "scenarios", "classes_reached")
    assert {k: runs["1"][k] for k in keys} == {k: runs["2"][k] for k in keys}


def test_templates_split_into_shards_give_one_job_and_two_the_same_verdict_and_count(monkeypatch):
    """Four scenarios per template in shards of two, each shard from its own seed (fixed by the
    plan alone, never by the number of jobs): one process and two give the same verdict and count.
    (Hypothesis's draws within a shard can still depend on what the process imported before, so
    the classes may differ by an example; the derandomized default run is compared in full above.)"""
    from kvparity.run import plan
    from kvparity.run.harness_drive import HarnessDrive, HarnessSpec, check_harness

    monkeypatch.setattr(plan, "SHARD_SIZE", 2)  # the tasks are made in this process; the jobs play them
    worlds = (("legacy", "torch"), ("refactored", "torch"))
    examples = 4 * len(TEMPLATES)
    tasks = HarnessDrive(HarnessSpec(worlds)).tasks(examples, 7)
    assert [(t.key, t.shard) for t in tasks[:3]] == [((0,), 0), ((0,), 1), ((1,), 0)]
    assert tasks[0].seed != tasks[1].seed
    assert [t.examples for t in tasks[:2]] == [2, 2]
    one = check_harness(worlds, examples, 7, jobs=1)
    two = check_harness(worlds, examples, 7, jobs=2)
    assert (one.verdict, one.scenarios) == (two.verdict, two.scenarios) == ("parity", examples)


@pytest.mark.parametrize(("argv", "drive"), [
    ([], "harness"),
    (["--sglang", "0.5.9", "--against", "0.5.9"], "harness"),
    (["--sglang", "0.5.9", "--against", "0.5.9", "--caches", "mamba"], "both"),
    (["--sglang", "0.5.23", "--against", "0.5.23", "--nemesis"], "both"),
    (["--sglang", "0.5.9", "--caches", "full"], "harness"),
    (["--sglang", "0.5.9", "--against", "0.5.9", "--caches", "mamba", "--drive", "harness"], "harness"),
])
def test_the_default_drive_plays_sglangs_own_scheduler_where_a_hybrid_model_or_the_nemesis_is_asked_for(argv, drive):
    """Real release against real release, a hybrid model or the nemesis plays SGLang's own
    scheduler first (its defects and failure paths live there) and the harness drive beside it;
    otherwise the default stays the harness drive; --drive always wins."""
    from kvparity.cli.check_plan import chosen_drive
    from kvparity.cli.main import build_parser

    assert chosen_drive(build_parser().parse_args(["check", *argv])) == drive
