"""Teeth, shown and not assumed: each mutant breaks a copy of the code the way a real regression
would, and the ``ci``-profile properties must fail on it (and say so in a readable report)."""

from __future__ import annotations

import pytest

from parity.mutants import MUTANTS, run_properties


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_properties_kill_mutant(mutant):
    done = run_properties(mutant, profile="ci")
    output = done.stdout + done.stderr
    assert done.returncode == 1, f"{mutant.name} ({mutant.bug_class}) survived:\n{output[-3000:]}"
    assert "kvparity: the worlds disagree" in output or "kvparity: an oracle failed" in output, output[-3000:]
