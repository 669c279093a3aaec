"""``kvparity check --drive scheduler`` on kvparity's own model (legacy against refactored, in this
process): the verdict per policy, the shrunk counterexample as a replayable file, and the options
that do not fit."""

from __future__ import annotations

import json

import pytest

from kvparity.cli.main import main
from kvparity.mem_cache.schedule_policy import POLICIES
from kvparity.model.traffic import traffic_from_dict

pytestmark = pytest.mark.usefixtures("keep_hypothesis_profile")


def test_the_model_reports_pr_11200s_admission_change_per_policy(tmp_path, capsys):
    out = tmp_path / "verdict.json"
    assert main(["check", "--drive", "scheduler", "--traffic-examples", "10", "--json", str(out)]) == 1
    verdict = json.loads(out.read_text())
    assert verdict["drive"] == "scheduler"
    # PR #11200's ranking key changes which requests go first, and under the same decisions how
    # the tree splits (its memory): both under lpm and dfs-weight only.
    assert verdict["summary"] == ("DIVERGENCE: admission differs under lpm, dfs-weight; memory differs under the same "
                                  "decisions under lpm, dfs-weight; parity under fcfs, lof")
    rows = {row["task"].removesuffix(", normal loop"): row for row in verdict["rows"]}
    assert [row["task"] for row in verdict["rows"]] == [f"{policy}, normal loop" for policy in POLICIES]  # no overlap
    assert set(rows) == {"fcfs", "lpm", "dfs-weight", "lof"}  # loop in the model
    assert rows["fcfs"]["differing"] == 0 and rows["lof"]["differing"] == 0 and rows["lpm"]["kinds"]["admission"] >= 1
    first = rows["lpm"]["first"]
    assert "PR #11200" in first["cause"]
    saved = tmp_path / "shrunk.json"
    saved.write_text(json.dumps((first["shrunk"] or first)["scenario"]))
    assert traffic_from_dict(json.loads(saved.read_text())).config.schedule_policy == "lpm"
    capsys.readouterr()
    assert main(["check", "--drive", "scheduler", "--replay", str(saved)]) == 1
    assert "verdict: DIVERGENCE" in capsys.readouterr().out


@pytest.mark.parametrize("argv, problem", [
    (["--drive", "scheduler", "--target", "get_last_loc", "--candidate", "examples/last_loc_blocks.py:get_last_loc"],
     "--drive scheduler does not apply to --candidate"),
    (["--drive", "scheduler", "--traffic-examples", "0"], "--traffic-examples must be from 1"),
    (["--drive", "scheduler", "--caches", "swa"], "kvparity's model of a scheduler serves full attention only"),
    (["--drive", "scheduler", "--undo-changes"], "--undo-changes undoes a release's named changes: it needs"),
    (["--caches", "mamba"], "--caches mamba: the harness drive plays a hybrid model real release against real release"),
    (["--sglang", "0.5.22", "--against", "0.5.21", "--drive", "scheduler", "--undo-changes"],
     "kvparity names no change of 0.5.22 after 0.5.21 that it can undo"),
    (["--sglang", "0.5.3.post1", "--against", "0.5.3", "--drive", "scheduler", "--caches", "mamba"],
     "SGLang 0.5.3 and 0.5.3.post1 do not both serve any of them (they serve 0.5.3: full, swa, hicache; 0.5.3.post1: full, swa, hicache)"),
    (["--caches", "hicache"], "--caches hicache: the harness drive plays a hybrid model real release against real"),
    (["--sglang", "0.5.3.post1", "--against", "0.5.3", "--caches", "mamba"],
     "SGLang 0.5.3 and 0.5.3.post1 do not both serve any of them"),
])
def test_options_that_do_not_fit_are_refused(argv, problem, capsys):
    assert main(["check", *argv]) == 2
    assert problem in capsys.readouterr().err


def test_caches_are_named_from_those_kvparity_serves():
    from kvparity.cli.check_plan import caches_option, registered_caches

    assert registered_caches(caches_option("mamba,full")) == ("full", "mamba")  # in the registry's order
    with pytest.raises(ValueError, match="'gdn' is no cache kind; expected some of full, swa, mamba, hicache"):
        registered_caches(caches_option("mamba,gdn"))


def test_an_unknown_cache_kind_is_refused_with_exit_2_once_the_device_is_chosen(capsys):
    """``--caches`` is read before ``--device`` is applied, so the registry (which loads the kernels
    and with them the device) is asked only after: the name is refused by the run, exit 2."""
    assert main(["check", "--sglang", "0.5.23", "--against", "0.5.22", "--caches", "gdn", "--device", "cpu"]) == 2
    assert "--caches gdn: 'gdn' is no cache kind" in capsys.readouterr().err


def test_a_traffic_scenario_replays_only_scheduler_driven(tmp_path, capsys):
    saved = tmp_path / "traffic.json"
    saved.write_text(json.dumps({"traffic": {"config": {"schedule_policy": "fcfs"},
                                             "arrivals": [[{"rid": "a", "tokens": [1, 2], "max_new_tokens": 2}]]}}))
    assert main(["check", "--drive", "harness", "--replay", str(saved)]) == 2
    assert "it replays scheduler-driven" in capsys.readouterr().err
    assert main(["check", "--replay", str(saved)]) == 0  # legacy and refactored decide alike under fcfs


def test_the_caches_help_names_every_registered_kind(capsys):
    """``--caches``'s help is written before the registry may be asked (it loads the kernels): it
    must still name every kind the registry holds."""
    from kvparity import caches

    with pytest.raises(SystemExit):
        main(["check", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    help_text = text[text.index("--caches C[,C...]", text.index("options:")):]
    assert all(f"{name} (" in help_text for name in caches.names()), help_text[:400]
