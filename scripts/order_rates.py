"""How production-shaped kvparity's batches are (issue 25, "measure first"): over the scenarios the
default ``kvparity check`` plays (the same derandomized draws, ``ci`` profile), how many extend and
decode batches have request rows that are not ascending in batch order, a request whose KV pages
are not contiguous, or a free list that is not in ascending order when the batch allocates. A
long-running server's batches have all three most of the time.

    python scripts/order_rates.py [--examples 800] [--seed S]

Measured on the reference world (legacy on torch): every world plays the same scenarios.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvparity.kernels import runtime  # noqa: E402,F401  (fixes the Triton mode first)

# isort: split
from kvparity.engine.snapshot import Snapshot  # noqa: E402
from kvparity.model import profiles  # noqa: E402
from kvparity.model.scenario import Scenario  # noqa: E402
from kvparity.run import runner, sweep  # noqa: E402

REFERENCE = (("legacy", "torch"),)
BATCH_KINDS = ("extend", "decode")


def _pages_contiguous(slots: list[int], page_size: int) -> bool:
    pages = [s // page_size for s in slots]
    distinct = [p for i, p in enumerate(pages) if i == 0 or p != pages[i - 1]]
    return all(b == a + 1 for a, b in zip(distinct, distinct[1:]))


def _request_slots(after: Snapshot, rid: str) -> list[int]:
    view = after.requests.get(rid)
    if view is None or view.req_pool_idx is None:
        return []
    return after.req_to_token[view.req_pool_idx, : view.slotted].tolist()


def measure(scenario: Scenario, counts: Counter) -> None:
    """Play ``scenario`` in the reference world and count its batches by shape."""
    lockstep = runner.Lockstep(scenario, REFERENCE, oracles=False)
    for index, step in enumerate(scenario.steps):
        if lockstep.halted:
            break
        lockstep.play(index, step)
    stages = lockstep.reference_stages
    page_size = scenario.geometry.page_size
    for before, after in zip(stages, stages[1:]):
        record = after.record
        if record.kind not in BATCH_KINDS or record.outcome != "ok" or not record.rids:
            continue
        counts[f"{record.kind} batches"] += 1
        if len(record.rows) > 1 and list(record.rows) != sorted(record.rows):
            counts[f"{record.kind}: rows not ascending"] += 1
        if page_size > 1:  # at page size 1 a "page" is a slot: any reuse of a freed slot splits a request
            counts[f"{record.kind} batches, page size > 1"] += 1
            if any(not _pages_contiguous(_request_slots(after, rid), page_size) for rid in record.rids):
                counts[f"{record.kind}: a request's pages not contiguous (page size > 1)"] += 1
        elif any(not _pages_contiguous(_request_slots(after, rid), page_size) for rid in record.rids):
            counts[f"{record.kind}: a request's slots not contiguous (page size 1)"] += 1
        free = before.free_pages.tolist()
        if free != sorted(free):
            counts[f"{record.kind}: free list not ascending"] += 1
    counts["scenarios"] += 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=800)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)
    profiles.load("ci")
    counts: Counter = Counter()
    play = runner.run_scenario

    def measured(scenario: Scenario, *a, **k):  # the sweep's own draws, measured as they are played
        measure(scenario, counts)
        return play(scenario, *a, **k)

    sweep.run_scenario = measured  # type: ignore[assignment]
    sweep.check_repository(REFERENCE, args.examples, args.seed, finding_budget_s=0)
    print(f"{counts['scenarios']} scenarios (the default check's draws, ci profile)")
    for kind in BATCH_KINDS:
        total, paged = counts[f"{kind} batches"], counts[f"{kind} batches, page size > 1"]
        print(f"{kind} batches: {total} ({paged} with page size > 1)")
        for shape, of in (("rows not ascending", total), ("free list not ascending", total),
                          ("a request's pages not contiguous (page size > 1)", paged),
                          ("a request's slots not contiguous (page size 1)", total - paged)):
            n = counts[f"{kind}: {shape}"]
            print(f"  {shape}: {n} of {of} ({100 * n / max(of, 1):.1f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
