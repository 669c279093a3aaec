"""The faithfulness lane: kvparity's model held against real SGLang (SPEC section 10).

- kvparity's legacy equals real 0.5.3 and kvparity's refactored equals real 0.5.3.post1, on every
  golden and on drawn scenarios of every template, both backends, after every stage (the model is
  the reference; the real worlds also pass every oracle);
- real 0.5.3 against real 0.5.3.post1 (the refactor itself, on real code) gives parity;
- teeth: each mutated copy of real 0.5.3.post1 (``kvparity.teeth.real_zoo``) is caught.

Real SGLang is installed on first use into the per-user cache (``kvparity.engine.real.install``) and runs in
worker processes; ``KVPARITY_REAL_EXAMPLES`` sets the drawn scenarios per template (default 20).
"""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings

from kvparity.engine.real.install import resolve
from kvparity.engine.real.lane import RealLane
from kvparity.golden.scenarios import GOLDENS
from kvparity.model.strategies import TEMPLATES, scenarios
from kvparity.report.failure import format_failure
from kvparity.run.runner import run_scenario
from kvparity.teeth.real_zoo import REAL_MUTANTS, make_mutated_copy

MODELLED = {"0.5.3": "legacy", "0.5.3.post1": "refactored"}
REAL_EXAMPLES = int(os.environ.get("KVPARITY_REAL_EXAMPLES", "20"))
TEMPLATE_IDS = [t.name.replace(" ", "-") for t in TEMPLATES]


@pytest.fixture(scope="module")
def lanes():
    """One started lane per modelled release, and one holding both (0.5.3.post1 first)."""
    made = {v: RealLane([v]) for v in MODELLED}
    made["both"] = RealLane(["0.5.3", "0.5.3.post1"])
    for lane in made.values():
        lane.start()
    yield made
    for lane in made.values():
        lane.close()


def _against_model(scenario, version, lane):
    return run_scenario(scenario, ((MODELLED[version], "torch"),), lane=lane)


@pytest.mark.parametrize("version", MODELLED)
def test_every_golden_matches_real_sglang(version, lanes):
    for name, scenario in GOLDENS.items():
        result = _against_model(scenario, version, lanes[version])
        assert result.ok, f"golden {name}:\n{format_failure(result)}"
        assert len(result.worlds) == 3  # the model and real SGLang on both backends


@pytest.mark.parametrize("version", MODELLED)
@pytest.mark.parametrize("template", TEMPLATES, ids=TEMPLATE_IDS)
def test_model_matches_real_sglang(version, template, lanes):
    @settings(max_examples=REAL_EXAMPLES)
    @given(scenario=scenarios(templates=(template,)))
    def run(scenario):
        result = _against_model(scenario, version, lanes[version])
        assert result.ok, format_failure(result)

    run()


@pytest.mark.parametrize("template", TEMPLATES, ids=TEMPLATE_IDS)
def test_real_refactor_keeps_parity(template, lanes):
    """Real 0.5.3.post1 against real 0.5.3 (the reference), both backends."""

    @settings(max_examples=max(1, REAL_EXAMPLES // 2))
    @given(scenario=scenarios(templates=(template,)))
    def run(scenario):
        result = run_scenario(scenario, (("legacy", "torch"),), lane=lanes["both"], real_reference=True)
        assert result.ok, format_failure(result)

    run()


@pytest.mark.parametrize("mutant", REAL_MUTANTS, ids=[m.name for m in REAL_MUTANTS])
def test_a_mutated_real_sglang_is_caught(mutant, tmp_path):
    """The mutated copy, compared with kvparity's model of its release: some golden diverges (the
    goldens are played in order until one does)."""
    copy = make_mutated_copy(resolve(mutant.version), mutant, tmp_path / "sglang-copy")
    with RealLane([str(copy)]) as lane:
        caught = next((name for name, scenario in GOLDENS.items()
                       if not _against_model(scenario, mutant.version, lane).ok), None)
    assert caught is not None, f"{mutant.name} ({mutant.what}) passed every golden"
