"""Scenarios per second per world, the harness's overhead beside them, and what ``--jobs`` buys.

    python scripts/bench_scenarios.py [--examples N] [--seed S] [--shape ci|nightly]
                                      [--jobs N] [--check-examples M] [--no-jobs]

Draws N scenarios (all templates, the chosen shape) with a fixed seed and prints, on this machine:

1. each world's own play: the world built and every step applied, nothing else (no snapshot, no
   oracle, no comparison), as CPU seconds of this process and scenarios/s;
2. the harness's overhead: the same scenarios played by ``run_scenario`` in all worlds with
   snapshots, oracles and comparisons on, minus the worlds' own play; as seconds and as a share of
   the worlds' own play, split into snapshots, oracles and comparisons, plus the time it took
   Hypothesis to draw the scenarios;
3. ``kvparity check --jobs 1`` against ``--jobs N`` (N: the usable cores unless given), on M
   scenarios from the same seed: scenarios/s of each (the check's own clock, and wall time with
   the process start) and their ratio.

Figures and ratios only: nothing here asserts on a time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kvparity.kernels import runtime  # noqa: E402  (fixes the Triton mode first)

# isort: split
from hypothesis import HealthCheck, given, seed, settings  # noqa: E402

from kvparity.engine.scheduler import Scheduler  # noqa: E402
from kvparity.engine.world import build_world  # noqa: E402
from kvparity.model.scenario import Scenario  # noqa: E402
from kvparity.model.strategies import CI_SHAPE, NIGHTLY_SHAPE, scenarios  # noqa: E402
from kvparity.run import runner  # noqa: E402
from kvparity.run.runner import ALL_WORLDS, run_scenario  # noqa: E402

SHAPES = {"ci": CI_SHAPE, "nightly": NIGHTLY_SHAPE}
# In-process figures are this process's CPU seconds: they hold on a loaded machine, where wall
# time also counts the waits for a core. The --jobs comparison is wall time (that is its point).
CLOCK = time.process_time


def draw_scenarios(count: int, random_seed: int, shape=CI_SHAPE) -> list[Scenario]:
    drawn = []

    @seed(random_seed)
    @settings(max_examples=count, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(scenarios(shape=shape))
    def collect(scenario):
        drawn.append(scenario)

    collect()
    return drawn


def own_play(scenario: Scenario, version: str, backend: str) -> None:
    """One world's own work on ``scenario``: what ``run_scenario`` does for it, less the harness
    (it stops where the lockstep would: at a halt, which every agreeing world reaches together)."""
    world = build_world(version, backend, scenario.geometry, scenario.cache_kind, device=runtime.DEVICE)
    scheduler = Scheduler(world, scenario)
    for index, step in enumerate(scenario.steps):
        if scheduler.halted:
            break
        for _ in scheduler.apply(index, step):
            pass


class HarnessClock:
    """Seconds spent in the runner's snapshots, oracles and comparisons (wrapped in place)."""

    PARTS = {"snapshots": "take_snapshot", "oracles": "check_stage", "comparisons": "compare",
             "oracles (reference's findings)": "stale_row_defects"}

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.saved = {name: getattr(runner, name) for name in self.PARTS.values()}

    def __enter__(self) -> HarnessClock:
        for part, name in self.PARTS.items():
            setattr(runner, name, self._timed(part, self.saved[name]))
        return self

    def __exit__(self, *exc) -> None:
        for name, original in self.saved.items():
            setattr(runner, name, original)

    def _timed(self, part: str, function):
        def timed(*args, **kwargs):
            start = CLOCK()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds[part] += CLOCK() - start
        return timed


def bench_worlds(drawn: list[Scenario], draw_seconds: float) -> None:
    # Scenario by scenario, each world's own play then the full run: a machine whose speed drifts
    # (other load, clock changes) slows both alike. The first scenario warms both up, uncounted.
    for version, backend in ALL_WORLDS:
        own_play(drawn[0], version, backend)
    run_scenario(drawn[0])
    play_of: dict[str, float] = defaultdict(float)
    full, results = 0.0, []
    with HarnessClock() as clock:
        for scenario in drawn:
            for version, backend in ALL_WORLDS:
                start = CLOCK()
                own_play(scenario, version, backend)
                play_of[f"{version}/{backend}"] += CLOCK() - start
            start = CLOCK()
            results.append(run_scenario(scenario))
            full += CLOCK() - start
    print(f"{'world (own play only)':<28} {'seconds':>8} {'scenarios/s':>12}")
    for name, elapsed in play_of.items():
        print(f"{name:<28} {elapsed:8.2f} {len(drawn) / elapsed:12.1f}")
    play = sum(play_of.values())
    print(f"{'all worlds, own play':<28} {play:8.2f} {len(drawn) / play:12.1f}")
    failed = sum(not r.ok for r in results)
    print(f"{'all worlds + harness':<28} {full:8.2f} {len(drawn) / full:12.1f}"
          + (f"   ({failed} scenarios failed: not a clean measurement)" if failed else ""))
    overhead = full - play
    print("\nharness overhead (run_scenario with everything on, minus the worlds' own play):")
    print(f"  {'in run_scenario':<34} {overhead:8.2f} s  {100 * overhead / play:6.1f}% of the worlds' play")
    for part, seconds in clock.seconds.items():
        print(f"    {part:<32} {seconds:8.2f} s  {100 * seconds / play:6.1f}%")
    rest = overhead - sum(clock.seconds.values())
    print(f"    {'the rest (lockstep, classes, noise)':<32} {rest:8.2f} s  {100 * rest / play:6.1f}%")
    print(f"  {'drawing the scenarios':<34} {draw_seconds:8.2f} s  {100 * draw_seconds / play:6.1f}%")
    total = overhead + draw_seconds
    print(f"  {'total':<34} {total:8.2f} s  {100 * total / play:6.1f}%")


def timed_check(jobs: int, examples: int, random_seed: int, profile: str) -> tuple[int, float, float]:
    """(scenarios, the check's own seconds, wall seconds) of one ``kvparity check`` process."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "verdict.json"
        command = [sys.executable, "-m", "kvparity", "check", "--examples", str(examples), "--seed", str(random_seed),
                   "--profile", profile, "--jobs", str(jobs), "--json", str(out)]
        start = time.perf_counter()
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - start
        if done.returncode not in (0, 1) or not out.exists():
            raise SystemExit(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-2000:]}")
        verdict = json.loads(out.read_text())
    return verdict["scenarios"], verdict["seconds"], wall


def bench_jobs(jobs: int, examples: int, random_seed: int, profile: str) -> None:
    print(f"\nkvparity check --examples {examples} --seed {random_seed} --profile {profile}:")
    print(f"{'':<12} {'scenarios':>9} {'check s':>8} {'scen/s':>8} {'wall s':>8} {'scen/s':>8}")
    rates = {}
    for n in dict.fromkeys((1, jobs)):
        count, seconds, wall = timed_check(n, examples, random_seed, profile)
        rates[n] = (count / seconds if seconds else float("inf"), count / wall)
        print(f"{'--jobs ' + str(n):<12} {count:9d} {seconds:8.1f} {rates[n][0]:8.2f} {wall:8.1f} {rates[n][1]:8.2f}")
    if jobs != 1:
        print(f"speed-up of --jobs {jobs} over --jobs 1: {rates[jobs][0] / rates[1][0]:.2f}x "
              f"(check's clock), {rates[jobs][1] / rates[1][1]:.2f}x (wall)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=200, help="scenarios for the per-world table")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="ci", help="scenario sizes (a profile's)")
    parser.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)),
                        help="the parallel run to compare with --jobs 1 (default: the usable cores)")
    parser.add_argument("--check-examples", type=int, default=100, help="scenarios for the --jobs comparison")
    parser.add_argument("--no-jobs", action="store_true", help="skip the --jobs comparison")
    args = parser.parse_args()
    start = CLOCK()
    drawn = draw_scenarios(args.examples, args.seed, SHAPES[args.shape])
    draw_seconds = CLOCK() - start
    stages = sum(len(s.steps) for s in drawn)
    print(f"{runtime.describe()}; {len(drawn)} scenarios ({args.shape} shape, seed {args.seed}), {stages} steps")
    bench_worlds(drawn, draw_seconds)
    if not args.no_jobs:
        bench_jobs(args.jobs, args.check_examples, args.seed, args.shape)


if __name__ == "__main__":
    main()
