"""Shrink a failing scenario: remove requests, steps, names and tokens while the failure is kept,
until nothing more can go or the time budget is spent. This is kvparity's only shrinker (the
sweep stops Hypothesis at its first failure and reports it before shrinking): it works on the
scenario itself, so every candidate is a valid scenario the report can print, and it cuts big
first (delta debugging's halves before single removals), so a scenario drawn with 100 requests
loses most of them in a few plays.

``fails(scenario) -> bool`` says whether a candidate still fails in the same way (the caller
decides what "the same" is: a disagreement stays a disagreement). ``minimize``'s loop is the same
for every scenario form; what is smaller comes from ``candidates`` (``kvparity.run.candidates``:
a step scenario's, a traffic scenario's).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from kvparity.judge.verdict import Shrunk

S = TypeVar("S")


def failure_kind(result) -> str | None:
    """"disagree" (some world differs), "oracle" (all agree, an oracle failed) or None (it passed)."""
    if result.divergences:
        return "disagree"
    return "oracle" if result.violations else None


# Set (to anything) in a property run whose failures need no minimal counterexample: the mutant zoo's
# tests only ask whether a mutant is killed, and shrinking each permanent example that fails cost
# most of their time (46 of 52 s for one mutant).
NO_MINIMIZE_ENV = "KVPARITY_NO_MINIMIZE"

# Seconds a counterexample's shrinking may take by default (``kvparity check --shrink-budget``). Measured
# on the real-SGLang mutants (scripts/bench_real_mutants.py, docs/perf/fast-answers.md, 2 cores):
# the slowest reached its minimum in 17 s, replaying the reference and one failed world.
DEFAULT_BUDGET_S = 45.0


Progress = Callable[[int, Any], None]  # (candidates tried so far, the smallest failing one)


def minimize(scenario: S, fails: Callable[[S], bool], *, candidates: Callable[[S], Iterator[S]],
             budget_s: float = DEFAULT_BUDGET_S, progress: Progress | None = None,
             max_tried: int | None = None) -> Shrunk:
    """The smallest scenario reachable from ``scenario`` by removals that still fails, within
    ``budget_s``. Candidates come biggest cut first (half the requests, half the steps, ... down
    to one; then single names and tokens), each candidate is played once (a repeat is answered
    from memory), and the first that fails is taken; then the search starts again from the
    biggest cuts (a bigger cut may work now). When none fails, the scenario is minimal. (Going on
    from the cut just made plays about half as many candidates, but on the real-SGLang mutants it
    settled in local minima up to twice as large: 7 requests and 7 steps where this finds 5 and 3.)
    ``max_tried`` bounds it by candidates played as well: what the machine's speed cannot change."""
    start = time.monotonic()
    known: dict[S, bool] = {}
    tried = 0
    while True:
        for candidate in candidates(scenario):
            if time.monotonic() - start >= budget_s or (max_tried is not None and tried >= max_tried):
                return Shrunk(scenario, tried, False, time.monotonic() - start)
            if candidate not in known:
                known[candidate] = fails(candidate)
                tried += 1
                if progress is not None:
                    progress(tried, candidate if known[candidate] else scenario)
            if known[candidate]:
                scenario = candidate
                break
        else:
            return Shrunk(scenario, tried, True, time.monotonic() - start)


def halvings(n: int) -> list[int]:
    """The sizes of the cuts to try, biggest first: n itself, then n//2, n//4, ..., 1."""
    sizes: list[int] = []
    size = n // 2 if n > 1 else n
    while size >= 1:
        sizes.append(size)
        size //= 2
    return ([n] if n >= 1 and n not in sizes else []) + sizes


