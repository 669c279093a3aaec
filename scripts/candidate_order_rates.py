"""How production-ordered the kernel inputs of ``kvparity check --target ...`` are (issue 25,
"candidates too"): per plug-in target, over batches drawn as the ci profile draws them, how many
have request rows that are not ascending, a request whose prefix slots span non-adjacent pages,
prefix slots laid out as page runs (of more than one slot) from scattered pages, and the batch
sizes and prefix lengths reached.

    python scripts/candidate_order_rates.py [--examples 400]

A batch's page size is the one its slots are laid out in: ``page_size`` for a target that takes
one (alloc_extend); for the others, which see every slot on its own, the largest of
``PAGE_SIZES_TRIED`` whose page runs every prefix is made of (read from the slots, as a server's
paged allocator would have laid them out), else 1.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hypothesis import HealthCheck, given, settings  # noqa: E402

from kvparity.candidate.inputs import KernelBatch, kernel_batches, kernel_shape  # noqa: E402
from kvparity.candidate.targets import TARGETS  # noqa: E402

PAGE_SIZES_TRIED = (256, 128, 64, 32, 16, 8, 4, 2)  # largest first; 1 when none fits


def _is_page_runs(prefix: tuple[int, ...], page_size: int) -> bool:
    """Position j of the prefix is offset j % page_size of its page, one page per page_size positions."""
    return all(s % page_size == j % page_size and s // page_size == prefix[j - j % page_size] // page_size
               for j, s in enumerate(prefix))


def effective_page_size(batch: KernelBatch) -> int:
    """The batch's page size, or for a target without one the page size its prefixes are laid out in."""
    if batch.spec.paged:
        return batch.page_size
    prefixes = [p for p in batch.prefixes if len(p) > 1]
    for size in PAGE_SIZES_TRIED:
        if prefixes and all(_is_page_runs(p, size) for p in prefixes):
            return size
    return 1


def _pages(prefix: tuple[int, ...], page_size: int) -> list[int]:
    """The prefix's pages in order, each once (page size 1: its slots)."""
    pages = [s // page_size for s in prefix]
    return [p for i, p in enumerate(pages) if i == 0 or p != pages[i - 1]]


def spans_non_adjacent_pages(batch: KernelBatch, page_size: int) -> bool:
    return any(any(b != a + 1 for a, b in zip(pages, pages[1:]))
               for pages in (_pages(p, page_size) for p in batch.prefixes))


def rows_not_ascending(batch: KernelBatch) -> bool:
    return list(batch.rows) != sorted(batch.rows)


@dataclass
class Tally:
    """What one target's batches reached."""

    batches: int = 0
    multi_row: int = 0  # batches of more than one request
    not_ascending: int = 0
    non_adjacent: int = 0
    page_runs: int = 0  # page size > 1 and a prefix spanning non-adjacent pages
    prefix_over_512: int = 0
    medium: int = 0  # more requests than the shape's small batches
    sizes: list[int] = field(default_factory=list)
    longest_prefixes: list[int] = field(default_factory=list)  # each batch's

    def add(self, batch: KernelBatch, small_high: int) -> None:
        page_size = effective_page_size(batch)
        non_adjacent = spans_non_adjacent_pages(batch, page_size)
        self.batches += 1
        self.multi_row += batch.bs > 1
        self.not_ascending += batch.bs > 1 and rows_not_ascending(batch)
        self.non_adjacent += non_adjacent
        self.page_runs += page_size > 1 and non_adjacent
        self.prefix_over_512 += max(batch.prefix_lens) > 512
        self.medium += batch.bs > small_high
        self.sizes.append(batch.bs)
        self.longest_prefixes.append(max(batch.prefix_lens))


def tally(target: str, examples: int) -> Tally:
    """Draw ``examples`` batches for ``target`` the way a check does (derandomized, ci shape)."""
    shape, counts = kernel_shape("ci"), Tally()
    config = settings(derandomize=True, max_examples=examples, database=None, deadline=None,
                      suppress_health_check=list(HealthCheck))

    @config
    @given(kernel_batches(target, shape))
    def draw(batch: KernelBatch) -> None:
        counts.add(batch, shape.small[1])

    draw()
    return counts


def _percent(n: int, of: int) -> str:
    return f"{100 * n / max(of, 1):.0f}% ({n}/{of})"


COLUMNS: tuple[tuple[str, Callable[[Tally], str]], ...] = (
    ("batches", lambda t: str(t.batches)),
    ("rows not ascending (bs > 1)", lambda t: _percent(t.not_ascending, t.multi_row)),
    ("prefix spans non-adjacent pages", lambda t: _percent(t.non_adjacent, t.batches)),
    ("page runs > 1 from scattered pages", lambda t: _percent(t.page_runs, t.batches)),
    ("medium or wide", lambda t: _percent(t.medium, t.batches)),
    ("bs max / median", lambda t: f"{max(t.sizes)} / {statistics.median(t.sizes):g}"),
    ("prefix > 512", lambda t: _percent(t.prefix_over_512, t.batches)),
    ("longest prefix max / median", lambda t: f"{max(t.longest_prefixes)} / {statistics.median(t.longest_prefixes):g}"),
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=400, help="batches drawn per target")
    args = parser.parse_args(argv)
    tallies = {name: tally(name, args.examples) for name in TARGETS}
    rows = [[name] + [cell(counts) for _, cell in COLUMNS] for name, counts in tallies.items()]
    header = ["target"] + [title for title, _ in COLUMNS]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
