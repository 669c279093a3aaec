"""The outcomes of the hybrids a search (``kvparity explain``) has played, kept on disk so that a
search stopped part way (a search of two releases can take hours) resumes where it stopped: a hybrid
already played on the same scenario, with the same files, by the same replaying code, is not played
again; its outcome and line are read back.

A search is one file, named by what decides a hybrid's outcome besides the hybrid itself: A's and
B's folders, the drive and its scenario, and the source of kvparity's own code that plays and
judges (a changed harness plays afresh). The search's own rules (``explain.py``) are left out of
that name: they choose which hybrids to play, not what a hybrid gives. A hybrid is named by the
content of every file it takes from B (a file's name and its text's digest, in path order), so the
same hybrid reached by another order of the search is found too.

The folder is ``$KVPARITY_EXPLAIN_CACHE``, else ``$XDG_CACHE_HOME/kvparity/explain``, else
``~/.cache/kvparity/explain`` (the test suite points it at a temporary folder).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path

import kvparity

ENV_CACHE = "KVPARITY_EXPLAIN_CACHE"
# kvparity's files that decide which hybrids are played, not what one gives: left out of a search's name.
SEARCH_RULES = ("run/explain.py", "run/hybrid_outcomes.py", "run/ddmin.py", "cli/explain.py")


def cache_folder() -> Path:
    if os.environ.get(ENV_CACHE):
        return Path(os.environ[ENV_CACHE]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kvparity" / "explain"


class HybridOutcomes:
    """One search's played hybrids: ``get`` what an earlier run found, ``put`` what this one finds
    (appended at once, one JSON line a hybrid: a run killed mid-hybrid loses only that hybrid)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path  # None: nothing kept (a search that must play everything)
        self.known: dict[str, tuple[str, str]] = {}
        if path is not None and path.exists():
            for text in path.read_text().splitlines():
                try:
                    record = json.loads(text)
                    self.known[record["hybrid"]] = (record["outcome"], record["line"])
                except (ValueError, KeyError, TypeError):
                    continue  # a line cut short by a killed run

    @classmethod
    def for_search(cls, *identity: str) -> HybridOutcomes:
        """The outcomes of the search named by ``identity`` (A, B, the drive, the scenario...) and
        kvparity's replaying code."""
        digest = hashlib.sha256("\0".join((*identity, _replaying_code())).encode()).hexdigest()[:24]
        return cls(cache_folder() / f"{digest}.jsonl")

    def get(self, files: Mapping[str, str | bytes | None]) -> tuple[str, str] | None:
        return self.known.get(hybrid_name(files))

    def put(self, files: Mapping[str, str | bytes | None], outcome: str, line: str) -> None:
        name = hybrid_name(files)
        self.known[name] = (outcome, line)
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a") as out:
                out.write(json.dumps({"hybrid": name, "outcome": outcome, "line": line}) + "\n")


def hybrid_name(files: Mapping[str, str | bytes | None]) -> str:
    """A hybrid's name: each file it takes from B (None: removed) by path and content digest."""
    digest = hashlib.sha256()
    for path in sorted(files):
        text = files[path]
        body = b"\0removed" if text is None else text if isinstance(text, bytes) else text.encode()
        digest.update(path.encode() + b"\0" + hashlib.sha256(body).digest())
    return digest.hexdigest()


@functools.cache
def _replaying_code() -> str:
    """A digest of kvparity's source (the package and the modelled SGLang it links), less the search's rules."""
    root = Path(kvparity.__file__).resolve().parent
    digest = hashlib.sha256()
    files = sorted(Path(folder, name) for folder, _, names in os.walk(root, followlinks=True)
                   for name in names if name.endswith(".py"))  # the linked kernels/, mem_cache/... too
    for path in files:
        relative = path.relative_to(root).as_posix()
        if relative not in SEARCH_RULES:
            digest.update(relative.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()
