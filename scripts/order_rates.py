"""How production-shaped kvparity's batches are (issue 25, "measure first"): over the scenarios the
default ``kvparity check`` plays (the same derandomized draws, ``ci`` profile), how many extend and
decode batches have request rows that are not ascending in batch order, a request whose KV pages
are not contiguous, or a free list that is not in ascending order when the batch allocates; and
how many scenarios reach each order class (``kvparity.judge.order``). A long-running server's
batches have all of these most of the time. Every figure is printed twice: over every scenario,
and over those of the templates other than "warm start" (which draw what the check drew before).

    python scripts/order_rates.py [--examples N] [--seed S] [--sglang 0.5.3.post1 --against 0.5.3]

Measured on the reference world (legacy on torch): every world plays the same scenarios. With
``--sglang``, the order classes are also counted as real SGLang reached them (a real-reference run
reads them from the real reference's snapshots), on the torch backend.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvparity.kernels import runtime  # noqa: E402,F401  (fixes the Triton mode first)

# isort: split
from kvparity.judge import order  # noqa: E402
from kvparity.model import profiles  # noqa: E402
from kvparity.model.classes import ORDER_CLASSES  # noqa: E402
from kvparity.model.scenario import Scenario  # noqa: E402
from kvparity.model.strategies import WARMUP_PREFIX  # noqa: E402
from kvparity.run import harness_drive, runner  # noqa: E402

REFERENCE = (("legacy", "torch"),)


def warmed(scenario: Scenario) -> bool:
    """A scenario of the "warm start" template: it begins with a warm-up (requests w0, w1, ...)."""
    return any(r.rid.startswith(WARMUP_PREFIX) for r in scenario.requests)


def measure(scenario: Scenario, counts: Counter) -> None:
    """Play ``scenario`` in the reference world and count its batches by shape (the order classes'
    own tests, ``kvparity.judge.order``, batch by batch), and the scenario's order classes."""
    lockstep = runner.Lockstep(scenario, REFERENCE, oracles=False)
    for index, step in enumerate(scenario.steps):
        if lockstep.halted:
            break
        lockstep.play(index, step)
    stages = lockstep.reference_stages
    page_size = scenario.geometry.page_size
    for before, after in zip(stages, stages[1:]):
        record = after.record
        if record.kind not in order.BATCH_KINDS or record.outcome != "ok" or not record.rids:
            continue
        counts[f"{record.kind} batches"] += 1
        if len(record.rows) > 1 and list(record.rows) != sorted(record.rows):
            counts[f"{record.kind}: rows not ascending"] += 1
        split = any(not order.pages_contiguous(order.request_slots(after, rid), page_size) for rid in record.rids)
        if page_size > 1:  # at page size 1 a "page" is a slot: any reuse of a freed slot splits a request
            counts[f"{record.kind} batches, page size > 1"] += 1
            counts[f"{record.kind}: a request's pages not contiguous (page size > 1)"] += split
        else:
            counts[f"{record.kind}: a request's slots not contiguous (page size 1)"] += split
        taken = order.pages_handed_out(before, record.out_cache_loc or (), page_size)
        if taken and order.free_list_wrapped(before):
            counts[f"{record.kind}: allocates from a wrapped free list"] += 1
        if taken != sorted(taken):
            counts[f"{record.kind}: new pages handed out not ascending"] += 1
    counts["scenarios"] += 1
    counts.update(f"class: {name}" for name in order.order_classes(stages, page_size))


def report(title: str, counts: Counter) -> None:
    print(f"== {title}: {counts['scenarios']} scenarios")
    for kind in order.BATCH_KINDS:
        total, paged = counts[f"{kind} batches"], counts[f"{kind} batches, page size > 1"]
        print(f"{kind} batches: {total} ({paged} with page size > 1)")
        for shape, of in (("rows not ascending", total), ("allocates from a wrapped free list", total),
                          ("new pages handed out not ascending", total),
                          ("a request's pages not contiguous (page size > 1)", paged),
                          ("a request's slots not contiguous (page size 1)", total - paged)):
            n = counts[f"{kind}: {shape}"]
            print(f"  {shape}: {n} of {of} ({100 * n / max(of, 1):.1f}%)")
    print_classes(counts)


def print_classes(counts: Counter) -> None:
    print("scenarios reaching each order class:")
    for name in ORDER_CLASSES:
        n = counts[f"class: {name}"]
        print(f"  {name}: {n} of {counts['scenarios']} ({100 * n / max(counts['scenarios'], 1):.1f}%)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=None, help="default: the check's own (880; 440 with --sglang)")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--sglang", metavar="RELEASE", help="also count the classes real SGLang reaches (torch backend)")
    parser.add_argument("--against", metavar="RELEASE", help="with --sglang: the real reference")
    args = parser.parse_args(argv)
    if bool(args.sglang) != bool(args.against):
        parser.error("--sglang and --against go together")
    profiles.load("ci")
    every, cold = Counter(), Counter()
    real_every, real_cold = Counter(), Counter()
    play = runner.run_scenario

    def measured(scenario: Scenario, *a, **k):  # the sweep's own draws, measured as they are played
        measure(scenario, every)
        if not warmed(scenario):
            measure(scenario, cold)
        result = play(scenario, *a, **k)
        if args.sglang:  # the classes of a real-reference run come from real SGLang's own snapshots
            for counts in (real_every,) if warmed(scenario) else (real_every, real_cold):
                counts["scenarios"] += 1
                counts.update(f"class: {name}" for name in result.classes & set(ORDER_CLASSES))
        return result

    harness_drive.run_scenario = measured  # type: ignore[assignment]  # what the harness drive plays with
    if args.sglang:
        from kvparity.engine.real.lane import RealLane

        with RealLane([args.against, args.sglang], ("torch",)) as lane:
            harness_drive.check_harness(REFERENCE, args.examples or 440, args.seed, lane=lane, real_reference=True,
                                        finding_budget_s=0)
    else:
        harness_drive.check_harness(REFERENCE, args.examples or 880, args.seed, finding_budget_s=0)
    report("every scenario (the default check's draws, ci profile)", every)
    # The other templates draw what they drew before the warm start was added: this is "before".
    report("without the warm-start template (the scenarios of the check before it)", cold)
    if args.sglang:
        for title, counts in (("every scenario", real_every), ("without the warm-start template", real_cold)):
            print(f"== real SGLang {args.sglang} against {args.against}, {title}: {counts['scenarios']} scenarios")
            print_classes(counts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
