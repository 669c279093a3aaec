"""Replay one scenario (JSON, as printed in a failure report) in every world (kvparity.run.runner.ALL_WORLDS).

    python -m kvparity.run.replay '<scenario json>'      or      python -m kvparity.run.replay path/to/file.json

Exit status 0 when the worlds agree and every oracle holds, 1 otherwise, 2 for unreadable input.
"""

from __future__ import annotations

import json
import os
import sys

from kvparity.kernels import runtime  # noqa: F401  (fixes the Triton mode first)
from kvparity.model.scenario import scenario_from_dict
from kvparity.report.failure import format_failure, format_findings
from kvparity.run.runner import run_scenario


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    text = argv[0]
    try:
        if os.path.exists(text):
            with open(text) as handle:
                text = handle.read()
        scenario = scenario_from_dict(json.loads(text))
    except (OSError, ValueError) as exc:
        print(f"kvparity.run.replay: cannot read a scenario from {argv[0][:80]!r}: {exc}", file=sys.stderr)
        return 2
    result = run_scenario(scenario)
    print(f"{runtime.describe()}; {result.stages} stages in {len(result.worlds)} worlds")
    if result.findings:
        print("known legacy defects reached:\n" + format_findings(result))
    if result.ok:
        print("parity: all worlds agree and every oracle holds")
        return 0
    print(format_failure(result))
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
