"""A run-wide ledger of scenarios played: which worlds ran each one and which scenario classes it
reached. Property tests append to it (one file per process, so pytest-xdist workers never share
a file); the pytest controller reads it at the end to print how many scenarios each world ran and
which classes were reached, and to fail the run when a required class never was."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

ENV = "KVPARITY_LEDGER"


def record(test: str, worlds: tuple[str, ...], classes: set[str], ok: bool) -> None:
    directory = os.environ.get(ENV)
    if not directory:
        return
    line = json.dumps({"test": test, "worlds": list(worlds), "classes": sorted(classes), "ok": ok})
    with open(Path(directory) / f"{os.getpid()}.jsonl", "a") as handle:
        handle.write(line + "\n")


def read(directory: str) -> list[dict]:
    entries = []
    for path in sorted(Path(directory).glob("*.jsonl")):
        entries += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return entries


def tally(entries: list[dict]) -> tuple[Counter, Counter]:
    per_world: Counter = Counter()
    per_class: Counter = Counter()
    for entry in entries:
        per_world.update(entry["worlds"])
        per_class.update(entry["classes"])
    return per_world, per_class


def summary_lines(entries: list[dict], required: tuple[str, ...]) -> list[str]:
    per_world, per_class = tally(entries)
    lines = [f"kvparity scenarios: {len(entries)} played"]
    width = max((len(w) for w in per_world), default=0)
    lines += [f"  {world:<{width}} {count:>6} scenarios" for world, count in sorted(per_world.items())]
    missing = [c for c in required if not per_class[c]]
    lines.append(f"  scenario classes reached: {sum(1 for c in required if per_class[c])}/{len(required)}")
    lines += [f"  NOT REACHED: {c}" for c in missing]
    return lines
