"""Scenarios per second per world, on this machine.

    python scripts/bench_scenarios.py [--examples N] [--seed S]

Draws N scenarios (all templates, the ci shape) with a fixed seed, then plays all of them in each
world on its own (oracles off, so only the world's own work is timed) and prints a table.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kernels import runtime  # noqa: E402  (fixes the Triton mode first)
from hypothesis import HealthCheck, given, seed, settings  # noqa: E402

from parity.runner import ALL_WORLDS, run_scenario  # noqa: E402
from parity.strategies import CI_SHAPE, scenarios  # noqa: E402


def draw_scenarios(count: int, random_seed: int) -> list:
    drawn = []

    @seed(random_seed)
    @settings(max_examples=count, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(scenarios(shape=CI_SHAPE))
    def collect(scenario):
        drawn.append(scenario)

    collect()
    return drawn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    drawn = draw_scenarios(args.examples, args.seed)
    stages = sum(len(s.steps) for s in drawn)
    print(f"{runtime.describe()}; {len(drawn)} scenarios, {stages} steps")
    print(f"{'world':<20} {'seconds':>8} {'scenarios/s':>12}")
    for version, backend in ALL_WORLDS:
        start = time.perf_counter()
        for scenario in drawn:
            run_scenario(scenario, ((version, backend),), oracles=False)
        elapsed = time.perf_counter() - start
        print(f"{version + '/' + backend:<20} {elapsed:8.2f} {len(drawn) / elapsed:12.1f}")
    start = time.perf_counter()
    for scenario in drawn:
        run_scenario(scenario)
    elapsed = time.perf_counter() - start
    print(f"{'all four + oracles':<20} {elapsed:8.2f} {len(drawn) / elapsed:12.1f}")


if __name__ == "__main__":
    main()
