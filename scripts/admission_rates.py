"""How often pull request #11200 changes what SGLang's own scheduler admits (issue 26, measuring):
random request mixes played through the real ``Scheduler.event_loop_normal`` of 0.5.3 and of
0.5.3.post1 (``kvparity.engine.real.scheduler_shell``), per policy; a mix "differs" when some
iteration forms a different batch (request ids in order) in the two releases.

    python scripts/admission_rates.py [--mixes 40] [--seed 0]

A mix: one to three prompts from two stems arrive first and finish (they fill the radix tree),
then two to six requests arrive together: cuts of those prompts (often ending at or one short of
a cached end) plus tokens of their own; ``max_prefill_tokens`` small enough that admission stops
on budget.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvparity.engine.real.install import resolve  # noqa: E402
from kvparity.engine.real.worker import RealWorker  # noqa: E402
from kvparity.mem_cache.schedule_policy import POLICIES  # noqa: E402

RELEASES = ("0.5.3", "0.5.3.post1")


def mix(rng: random.Random) -> tuple[list[list[dict]], int]:
    """Arrivals per iteration, and a max_prefill_tokens."""
    stems = [list(range(100_000 * (k + 1), 100_000 * (k + 1) + 60)) for k in range(2)]
    cached = [rng.choice(stems)[: rng.randint(8, 60)] for _ in range(rng.randint(1, 3))]
    warm = [{"rid": f"c{i}", "tokens": tokens, "max_new_tokens": 1} for i, tokens in enumerate(cached)]
    burst = []
    for i in range(rng.randint(2, 6)):
        base = rng.choice(cached)
        cut = rng.choice((len(base), len(base) - 1, rng.randint(0, len(base))))
        own = list(range(10_000 * (i + 1), 10_000 * (i + 1) + rng.randint(0 if cut else 1, 12)))
        burst.append({"rid": f"r{i}", "tokens": base[:cut] + own, "max_new_tokens": rng.randint(1, 4)})
    return [[w] for w in warm] + [[], burst], rng.randint(4, 24)


def batches(result: dict) -> list[tuple[str, tuple[str, ...]]]:
    return [(rec["mode"], tuple(rec["rids"])) for rec in result["iterations"] if rec["mode"] is not None]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mixes", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    mixes = [mix(rng) for _ in range(args.mixes)]
    differ: Counter = Counter()
    workers = {r: RealWorker(resolve(r), plugins=("kvparity.engine.real.scheduler_shell",)) for r in RELEASES}
    try:
        for policy in POLICIES:
            for arrivals, budget in mixes:
                config = {"schedule_policy": policy, "page_size": 1, "pool_rows": 8, "kv_slots": 1024,
                          "max_prefill_tokens": budget, "chunked_prefill_size": None, "max_running_requests": 8}
                formed = {r: batches(w.call("run_traffic", config=config, arrivals=arrivals)) for r, w in workers.items()}
                differ[policy] += formed[RELEASES[0]] != formed[RELEASES[1]]
    finally:
        for worker in workers.values():
            worker.close()
    print(f"{args.mixes} mixes per policy, seed {args.seed}: batches formed differ between {RELEASES[0]} and {RELEASES[1]}")
    for policy in POLICIES:
        print(f"  {policy}: {differ[policy]} of {args.mixes} ({100 * differ[policy] / args.mixes:.0f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
