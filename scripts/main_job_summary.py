"""The main job's last lines: the four verdicts on pull request #11200, read from the two checks'
``--json`` files (``scripts/main_job.sh``): kvparity's model and real SGLang, each on the memory
path (harness-driven) and on admission (scheduler-driven).

    python scripts/main_job_summary.py MODEL.json MODEL_STATUS REAL.json REAL_STATUS
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

CHECKS = ("kvparity's model, refactored vs legacy", "real SGLang, 0.5.3.post1 vs 0.5.3 (reference)")


def lines(title: str, path: str, status: int) -> list[str]:
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return [f"main job: {title}: ERROR (exit {status}, no verdict written)"]
    by_drive = {v["drive"]: v for v in doc.get("verdicts", [doc])}
    harness, scheduler = by_drive.get("harness", {}), by_drive.get("scheduler", {})
    return [f"main job: {title}:",
            f"  memory path (harness-driven, identical decisions):       {harness.get('verdict', 'not run').upper()}",
            f"  admission and memory (scheduler-driven, per policy):     {scheduler.get('summary', 'not run')}"]


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    for title, (path, status) in zip(CHECKS, ((argv[0], int(argv[1])), (argv[2], int(argv[3])))):
        print("\n".join(lines(title, path, status)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
