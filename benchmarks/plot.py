"""Plot ``benchmarks/write_kernels.py --json`` output: kernel time against batch size, one panel
per (prefix length, extend length), legacy / serial (refactored) / linear / floor, log-log.

    python benchmarks/plot.py figures.json out.png       (needs matplotlib)
"""

from __future__ import annotations

import json
import sys


def plot(figures: dict, out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = figures["rows"]
    prefixes = sorted({r["prefix"] for r in rows})
    extends = sorted({r["extend"] for r in rows})
    fig, axes = plt.subplots(len(prefixes), len(extends), figsize=(4 * len(extends), 3.2 * len(prefixes)),
                             squeeze=False, sharex=True)
    series = (("legacy_us", "legacy kernel (new slots only)"), ("serial_us", "refactored kernel (serial offsets)"),
              ("linear_us", "linear-time kernel"), ("floor_us", "floor"))
    for i, prefix in enumerate(prefixes):
        for j, extend in enumerate(extends):
            ax = axes[i][j]
            points = sorted((r for r in rows if r["prefix"] == prefix and r["extend"] == extend), key=lambda r: r["bs"])
            for key, label in series:
                ax.plot([r["bs"] for r in points], [r[key] for r in points], marker="o", ms=3, label=label,
                        linestyle="--" if key == "floor_us" else "-")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"prefix {prefix}, extend {extend}", fontsize=9)
            ax.grid(True, which="both", alpha=0.3)
            if j == 0:
                ax.set_ylabel("GPU time (us)")
            if i == len(prefixes) - 1:
                ax.set_xlabel("batch size")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"req_to_token write, kernel alone, median of device-event timings: {figures['device']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__)
        return 2
    with open(argv[0]) as f:
        plot(json.load(f), argv[1])
    print(f"wrote {argv[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
