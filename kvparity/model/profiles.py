"""Hypothesis profiles, shared by the test suite (conftest.py) and ``kvparity check``.

``ci``: derandomized, no deadline, bounded. ``dev``: random, small. ``nightly``: random (its seed
printed by whoever runs it), thousands of examples, larger shapes. ``mutation``: derandomized, no
example database (a mutant must not replay another mutant's failures), no shrinking.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings

PROFILES = ("ci", "dev", "nightly", "mutation")
# The page sizes a scenario draws, defined once: ``ci`` (and ``dev``, ``mutation``) draws these, and
# the scenario classes name each one; ``nightly`` adds SGLang's common 64.
PAGE_SIZES_CI = (1, 2, 4, 16)
PAGE_SIZES_NIGHTLY = PAGE_SIZES_CI + (64,)
# Kernel-level inputs (``alloc_extend`` on its own, kvparity.candidate.inputs) go further: 1, 2, 4, ..., 256.
KERNEL_PAGE_SIZES = tuple(2**k for k in range(9))
_QUIET = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]

# ci's 70 examples a property (per template, for the four-world property): the fewest at which
# every required scenario class is still reached at least twice (at 50 one is never reached, at 60
# once); 100 cost CI about 2 minutes more on 2 cores (issue 33: `.ci/run` within 15 minutes).
settings.register_profile("ci", derandomize=True, deadline=None, max_examples=70, database=None,
                          suppress_health_check=_QUIET, print_blob=True)
settings.register_profile("dev", deadline=None, max_examples=20, suppress_health_check=_QUIET, print_blob=True)
settings.register_profile("nightly", deadline=None, max_examples=2000, suppress_health_check=_QUIET, print_blob=True)
# The mutant zoo's tests (tests/properties/test_teeth.py): the ci profile's draws, but no shrinking
# and no further examples once one fails: a killed mutant needs no minimal counterexample, and
# shrinking can cost a minute. (A mutant must be killed within 20 scenarios, well inside 60.)
settings.register_profile("mutation", derandomize=True, deadline=None, max_examples=60, database=None,
                          phases=(Phase.explicit, Phase.generate), report_multiple_bugs=False,
                          suppress_health_check=_QUIET)


def chosen_profile() -> str:
    """``HYPOTHESIS_PROFILE``, else ``ci`` when ``CI=true``, else ``dev``."""
    return os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") == "true" else "dev")


def load(profile: str) -> None:
    """Load ``profile`` (and tell the strategies, which size scenarios by it)."""
    if profile not in PROFILES:
        raise ValueError(f"Hypothesis profile {profile!r}: expected one of {', '.join(PROFILES)}")
    cap = max_examples_override()
    os.environ["HYPOTHESIS_PROFILE"] = profile
    if cap is not None:
        # One knob for a quick or a long run of any profile (e.g. a time-boxed nightly on a GPU).
        settings.register_profile(profile, parent=settings.get_profile(profile), max_examples=cap)
    settings.load_profile(profile)


MAX_EXAMPLES_ENV = "KVPARITY_MAX_EXAMPLES"
MAX_EXAMPLES_LIMIT = 1_000_000


class MaxExamplesError(ValueError):
    """``KVPARITY_MAX_EXAMPLES`` is set to something that is not a count (the variable is at fault,
    not the profile named on the command line)."""


def max_examples_override() -> int | None:
    """``KVPARITY_MAX_EXAMPLES`` as a count, None when unset; a ValueError naming the variable when
    it is not a whole number from 1 to 1,000,000."""
    raw = os.environ.get(MAX_EXAMPLES_ENV, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_EXAMPLES_LIMIT:
        raise MaxExamplesError(f"{MAX_EXAMPLES_ENV}={raw!r}: expected a whole number from 1 to {MAX_EXAMPLES_LIMIT:,}")
    return int(raw)
