"""What a parity verdict rules out (``kvparity.judge.power``): n draws that all agree would have shown,
with 95% probability, any difference reached by more than 1 - 0.05 ** (1 / n) of the draws."""

from __future__ import annotations

import pytest

from kvparity.judge.power import percent, rules_out, scenarios_for


def test_ten_scenarios_rule_out_only_differences_reached_by_more_than_a_quarter():
    # 0.05 ** (1 / 10) = 0.741: a difference reached by 5% is missed by ten draws 60% of the time.
    assert percent(rules_out(10)) == "25.9%"
    assert (1 - 0.05) ** 10 > 0.5
    assert percent(rules_out(40)) == "7.2%"
    assert rules_out(0) == 1.0  # no scenario rules nothing out


def test_the_count_for_a_target_reach_is_the_inverse():
    assert scenarios_for(0.02) == 149  # 0.98 ** 149 = 0.0494 <= 0.05 < 0.98 ** 148 = 0.0504
    assert rules_out(149) <= 0.02 < rules_out(148)


def test_a_reach_that_is_no_fraction_is_refused():
    with pytest.raises(ValueError, match="reach 2 is not a fraction"):
        scenarios_for(2)


def test_a_verdict_states_the_power_of_its_weakest_parity_task():
    from kvparity.judge.verdict import Row, Verdict
    from kvparity.report.console import power_lines

    rows = [Row("fcfs, normal loop", scenarios=40), Row("lpm, normal loop", scenarios=10), Row("lof", scenarios=5, differing=1)]
    verdict = Verdict("scheduler", "ref", ("checked",), rows, required=(), counts_all=True)
    assert verdict.rules_out == rules_out(10)  # the divergent row claims nothing; the weakest parity row speaks
    assert power_lines(verdict) == ["power: each task at parity would have shown, with 95% probability, a difference "
                                    "reached by more than 25.9% of its drawn scenarios (the fewest a task played: 10)"]
    assert Verdict("scheduler", "ref", ("checked",), rows[2:], required=(), counts_all=True).rules_out is None


def test_a_reach_is_read_as_a_percentage_or_a_fraction():
    from kvparity.judge.power import parse_reach

    assert parse_reach("2%") == parse_reach("0.02") == 0.02
    with pytest.raises(ValueError, match=r"--power '2x' is not a reach such as 2% or 0.02"):
        parse_reach("2x")
    with pytest.raises(ValueError, match="must be from 0.1% to below 100%"):
        parse_reach("100%")


def test_check_plays_as_many_scenarios_as_the_power_asks(tmp_path, keep_hypothesis_profile):
    import json

    from kvparity.cli.main import main

    out = tmp_path / "verdict.json"
    # 60%: ceil(ln 0.05 / ln 0.4) = 4 scenarios per policy (kvparity's model: the normal loop only).
    argv = ["check", "--drive", "scheduler", "--power", "60%", "--no-shrink", "--jobs", "1", "--json", str(out)]
    assert main(argv) in (0, 1)
    verdict = json.loads(out.read_text())
    assert [row["scenarios"] for row in verdict["rows"]] == [4, 4, 4, 4]
    assert verdict["power"] == {"confidence": 0.95, "rules_out_above": round(rules_out(4), 4)}
    assert verdict["power"]["rules_out_above"] <= 0.6


@pytest.mark.parametrize("argv, problem", [
    (["check", "--drive", "scheduler", "--power", "2%", "--traffic-examples", "5"], "give --power or --examples / --traffic-examples, not both"),
    (["check", "--power", "2x"], "--power '2x' is not a reach such as 2% or 0.02"),
    (["matrix", "--power", "2%", "--examples", "3"], "give --power or --examples / --traffic-examples, not both"),
    (["matrix", "--power", "0"], "must be from 0.1% to below 100%"),
    (["matrix", "merge", "shard.json", "--power", "2%"], "--power is an option of a run, not of merge"),
])
def test_a_power_that_cannot_be_met_as_given_is_refused(argv, problem, capsys):
    from kvparity.cli.main import main

    assert main(argv) == 2
    assert problem in capsys.readouterr().err
