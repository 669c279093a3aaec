"""The generators reach every named scenario class within the ``ci`` profile's budget.

A generator decides what the harness can see: one that never mixes empty and non-empty prefixes
cannot catch a kernel that forgets ``+ prefix_len``. This test draws exactly what the ``ci``
profile draws per template (derandomized, same number of examples) and plays each scenario in the
reference world only, which is enough to know which classes it reaches. (The full four-world run
also records its classes in the ledger; conftest fails a full ``ci`` run that misses one.)
"""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings

from kvparity.model.classes import REQUIRED
from kvparity.model.strategies import CI_SHAPE, TEMPLATES, scenarios
from kvparity.run.runner import run_scenario

REFERENCE = (("legacy", "torch"),)


def test_ci_profile_reaches_every_class():
    seen: Counter = Counter()
    for template in TEMPLATES:

        @settings(settings.get_profile("ci"))
        @given(scenarios(shape=CI_SHAPE, templates=(template,)))
        def play(scenario):
            seen.update(run_scenario(scenario, REFERENCE, oracles=False).classes)

        play()
    missing = [name for name in REQUIRED if not seen[name]]
    assert not missing, f"the ci profile never reached: {missing}; reached: {dict(seen)}"
