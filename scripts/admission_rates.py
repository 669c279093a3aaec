"""How often pull request #11200 changes what SGLang's own scheduler admits (issue 26, measuring):
traffic scenarios (``kvparity.model.traffic_strategies``, derandomized) played through the real
``Scheduler.event_loop_normal`` of 0.5.3 and of 0.5.3.post1 (``kvparity.engine.real.scheduler_shell``),
each under every policy; a scenario "differs" when some iteration forms a different batch (request
ids in order) in the two releases.

    python scripts/admission_rates.py [--mixes 200]

A scenario: one to three prompts from two stems arrive first and finish (they fill the radix tree),
then a burst of two to six requests arrives together, cuts of those prompts with tokens of their
own, under a prefill budget small enough that admission stops on it.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hypothesis import HealthCheck, given, seed, settings  # noqa: E402

from kvparity.engine.real.install import resolve  # noqa: E402
from kvparity.engine.real.worker import RealWorker  # noqa: E402
from kvparity.engine.traffic_run import TrafficRun  # noqa: E402
from kvparity.mem_cache.schedule_policy import POLICIES  # noqa: E402
from kvparity.model.traffic import TrafficScenario  # noqa: E402
from kvparity.model.traffic_strategies import traffic_scenarios  # noqa: E402

RELEASES = ("0.5.3", "0.5.3.post1")


def drawn(count: int, policy: str, loop: str, seed_value: int | None = None) -> list[TrafficScenario]:
    """``count`` traffic scenarios under ``policy`` and ``loop`` (derandomized unless ``seed_value``).
    (The body, the ``keep`` function's source included, is what this script drew with before the
    scheduler-driven check moved into ``kvparity.run.scheduler_drive``: Hypothesis derives a
    derandomized run's draws from that source, so the figures it prints stay comparable.)"""
    found: list[TrafficScenario] = []

    @settings(max_examples=count, derandomize=seed_value is None, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(traffic_scenarios(policies=(policy,)))
    def keep(scenario: TrafficScenario) -> None:
        found.append(dataclasses.replace(scenario, config=dataclasses.replace(scenario.config, loop=loop)))

    if seed_value is not None:
        keep = seed(seed_value)(keep)
    keep()
    return found


def batches(result: TrafficRun) -> list[tuple[str, tuple[str, ...]]]:
    return [(rec.mode, rec.rids) for rec in result.decisions if rec.mode is not None]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mixes", type=int, default=200)
    args = parser.parse_args(argv)
    scenarios = drawn(args.mixes, "fcfs", "normal")  # each is then played under every policy
    differ: Counter = Counter()
    workers = {r: RealWorker(resolve(r), plugins=("kvparity.engine.real.scheduler_shell",)) for r in RELEASES}
    try:
        for policy in POLICIES:
            for scenario in scenarios:
                played = dataclasses.replace(scenario, config=dataclasses.replace(scenario.config, schedule_policy=policy))
                config, arrivals = played.to_plain()
                formed = {r: batches(TrafficRun.from_plain(w.call("run_traffic", config=config, arrivals=arrivals)))
                          for r, w in workers.items()}
                differ[policy] += formed[RELEASES[0]] != formed[RELEASES[1]]
    finally:
        for worker in workers.values():
            worker.close()
    print(f"{len(scenarios)} traffic scenarios, each under every policy: batches formed differ between "
          f"{RELEASES[0]} and {RELEASES[1]}")
    for policy in POLICIES:
        print(f"  {policy}: {differ[policy]} of {len(scenarios)} ({100 * differ[policy] / max(len(scenarios), 1):.0f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
