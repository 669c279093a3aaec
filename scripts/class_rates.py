"""How often each scenario template reaches each scenario class: draws N derandomized scenarios
per template (the ``ci`` shapes), plays them in the torch worlds only (the classes are decided by
the reference world, legacy on torch) and prints, per class, the share of scenarios that reached
it, template by template. Use it to check that a generator really makes a situation happen.

    python scripts/class_rates.py [N] [--template NAME] [--all-classes]
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvparity.kernels import runtime  # noqa: E402,F401  (fixes the Triton mode first)

# isort: split
from hypothesis import HealthCheck, given, settings  # noqa: E402

from kvparity.model.classes import REQUIRED  # noqa: E402
from kvparity.model.strategies import CI_SHAPE, TEMPLATES, scenarios  # noqa: E402
from kvparity.run.runner import run_scenario  # noqa: E402

TORCH_WORLDS = (("legacy", "torch"), ("refactored", "torch"))


def rates(template, count: int) -> tuple[Counter, int]:
    reached: Counter = Counter()
    played = [0]

    @settings(max_examples=count, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(scenarios(shape=CI_SHAPE, templates=(template,)))
    def play(scenario) -> None:
        result = run_scenario(scenario, TORCH_WORLDS)
        played[0] += 1
        reached.update(result.classes)
        reached.update(f"finding: {d.known_defect}" for d in {d.known_defect: d for d in result.findings}.values())

    play()
    return reached, played[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("count", nargs="?", type=int, default=100)
    parser.add_argument("--template", action="append", help="only these templates (repeatable)")
    parser.add_argument("--all-classes", action="store_true", help="also classes that are not required")
    args = parser.parse_args(argv)
    chosen = [t for t in TEMPLATES if not args.template or t.name in args.template]
    if not chosen:
        parser.error(f"--template: expected one of {[t.name for t in TEMPLATES]}")
    total: Counter = Counter()
    for template in chosen:
        reached, played = rates(template, args.count)
        total.update(reached)
        print(f"== {template.name}: {played} scenarios")
        for name, n in sorted(reached.items(), key=lambda kv: -kv[1]):
            if args.all_classes or name in REQUIRED or name.startswith("finding"):
                print(f"  {100 * n / played:5.1f}%  {name}")
    missing = [c for c in REQUIRED if c not in total]
    print("required classes not reached:", ", ".join(missing) if missing else "none")
    return 0


if __name__ == "__main__":
    sys.exit(main())
