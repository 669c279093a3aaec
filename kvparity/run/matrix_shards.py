"""The release matrix spread over machines: ``kvparity matrix --shard I/N`` plays one share of the
release pairs, and ``kvparity matrix merge`` joins the shares' JSON into the one matrix an
unsharded run writes. The scheduling is left to whoever starts the shards (a CI job matrix).

A matrix document (what ``--json`` writes), either drive, is plain data:

- ``plan``: the whole run, equal in every shard of it: ``drive``, ``releases`` (every release of the
  matrix), ``release_pairs`` ([reference, release], in the matrix's order), ``backends``,
  ``examples`` and ``seed`` (the scenarios: the same in every pair and every shard);
- ``shard``: ``index`` and ``count`` (1 and 1 for a whole matrix) and ``release_pairs``, its share;
- ``pairs``: one row per release pair (its verdict, ``kvparity.run.matrix.pair_row``), in the plan's order;
- ``releases``: per release, what its own runs found and what it cost, in the plan's order.

Nothing here imports the kernels or real SGLang: a merge reads JSON and nothing else.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")
_SHARD_RE = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


@dataclass(frozen=True)
class Shard:
    index: int  # 1-based
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


WHOLE = Shard(1, 1)
# What every row of ``pairs`` holds (``kvparity.run.matrix.pair_row`` writes them; the verdict's own
# keys, ``kvparity.judge.verdict.to_json``, and the pair's).
ROW_KEYS = frozenset({
    "drive", "verdict", "summary", "reference", "checked", "scenarios", "differing", "rows", "findings",
    "first_difference", "reference_release", "other_release", "label", "release_changes"})


class MergeError(ValueError):
    """Shards that cannot be merged; the message names the file at fault."""


def parse_shard(text: str) -> Shard:
    """``"2/4"`` -> Shard(2, 4); a ValueError naming ``--shard`` for anything else."""
    match = _SHARD_RE.match(text)
    if match is None or not 1 <= int(match[1]) <= int(match[2]):
        raise ValueError(f"--shard must be I/N with whole numbers 1 <= I <= N, e.g. 2/4 (got {text!r})")
    return Shard(int(match[1]), int(match[2]))


def share(pairs: Sequence[T], shard: Shard) -> list[T]:
    """The pairs shard ``index`` of ``count`` plays: a contiguous run of ``pairs``, the runs as even
    as can be (the first ``len(pairs) % count`` shards hold one pair more; shards past the last
    pair hold none). Contiguous because neighbouring pairs share a release: in both shapes of the
    matrix (each release against the one before it, or all against ``--base``) a run of k pairs
    needs k + 1 releases, so shards even in pairs are even in releases to play, and all of them
    together play one release more per shard than an unsharded run."""
    size, extra = divmod(len(pairs), shard.count)
    start = (shard.index - 1) * size + min(shard.index - 1, extra)
    return list(pairs[start:start + size + (shard.index <= extra)])


def releases_of(pairs: Sequence[Sequence[str]], releases: Sequence[str]) -> list[str]:
    """The releases ``pairs`` need (a worker each), in the order of ``releases``."""
    needed = {release for pair in pairs for release in pair}
    return [release for release in releases if release in needed]


def plan(drive: str, releases: Sequence[str], pairs: Sequence[Sequence[str]], backends: Sequence[str], examples: int,
         seed: int | None, caches: Sequence[str] = ("full",)) -> dict:
    """What a run plays (shards of one run share it; ``caches``: the models the scheduler drive's
    tasks serve, recorded only where they are not full attention alone)."""
    out = {"drive": drive, "releases": list(releases), "release_pairs": [list(p) for p in pairs],
           "backends": list(backends), "examples": examples, "seed": seed}
    return out if tuple(caches) == ("full",) else dict(out, caches=list(caches))


def _row_key(plan: dict, row: dict) -> int:
    return plan["release_pairs"].index([row["reference_release"], row["other_release"]])


def document(rows: list[dict], releases: list[dict], plan: dict, shard: Shard) -> dict:
    """The matrix document of ``rows`` (one per release pair) and ``releases`` (one per release),
    in the plan's order (a release in two shards: the first shard's)."""
    seen: dict[str, dict] = {}
    for row in releases:
        seen.setdefault(row["release"], row)
    return {"plan": plan,
            "shard": {"index": shard.index, "count": shard.count,
                      "release_pairs": share(plan["release_pairs"], shard)},
            "pairs": sorted(rows, key=lambda row: _row_key(plan, row)),
            "releases": [seen[r] for r in plan["releases"] if r in seen]}


def load(path: str) -> dict:
    """One shard's document, checked to hold exactly the rows of its share; a MergeError naming
    ``path`` when it cannot be read or is not one."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except OSError as exc:
        raise MergeError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MergeError(f"{path}: not JSON ({exc})") from None
    try:
        p, s, rows = doc["plan"], doc["shard"], doc["pairs"]
        if not isinstance(s["index"], int) or not isinstance(s["count"], int) or not 1 <= s["index"] <= s["count"]:
            raise ValueError("shard")
        if not isinstance(p["releases"], list) or not isinstance(doc["releases"], list):
            raise TypeError("plan")
        shard = Shard(s["index"], s["count"])
        wanted = [(a, b) for a, b in share(p["release_pairs"], shard)]
        held = [(r["reference_release"], r["other_release"]) for r in rows]
        holds_its_share = Counter(held) == Counter(wanted) and s["release_pairs"] == share(p["release_pairs"], shard)
    except (KeyError, TypeError, ValueError) as exc:
        raise MergeError(f"{path}: not the JSON of a kvparity matrix shard (no usable {exc})") from None
    if not holds_its_share:
        raise MergeError(f"{path}: shard {shard} does not hold the pairs of its share of the plan")
    lacking = [sorted(ROW_KEYS - row.keys()) for row in rows if not ROW_KEYS <= row.keys()]
    if lacking:
        raise MergeError(f"{path}: a row of its pairs has no {', '.join(lacking[0])}")
    return doc


def merge(documents: Sequence[tuple[str, dict]]) -> dict:
    """(file name, document) of every shard of one run -> the whole matrix's document, equal to an
    unsharded run's. A MergeError naming the file for shards of another run (another plan or
    shard count), a shard given twice, or a shard missing."""
    if not documents:
        raise MergeError("give the shards' JSON files")
    first_name, first = documents[0]
    count = first["shard"]["count"]
    given: dict[int, str] = {}
    for name, doc in documents:
        if doc["plan"] != first["plan"]:
            differ = [k for k in sorted(first["plan"].keys() | doc["plan"].keys())
                      if doc["plan"].get(k) != first["plan"].get(k)]
            raise MergeError(f"{name}: a shard of another run than {first_name} (its {', '.join(differ)} differ)")
        shard = Shard(doc["shard"]["index"], doc["shard"]["count"])
        if shard.count != count:
            raise MergeError(f"{name}: shard {shard}, but {first_name} is one of {count} shards")
        if shard.index in given:
            also = "is given twice" if given[shard.index] == name else f"overlaps {given[shard.index]}, shard {shard} too"
            raise MergeError(f"{name}: shard {shard} {also}")
        given[shard.index] = name
    missing = [str(Shard(i, count)) for i in range(1, count + 1) if i not in given]
    if missing:
        raise MergeError(f"shard {', '.join(missing)} missing (given: "
                         f"{', '.join(f'{name} {Shard(i, count)}' for i, name in sorted(given.items()))})")
    ordered = [doc for _, doc in sorted(documents, key=lambda item: item[1]["shard"]["index"])]
    rows: list[Any] = [row for doc in ordered for row in doc["pairs"]]
    return document(rows, [r for doc in ordered for r in doc["releases"]], first["plan"], WHOLE)
