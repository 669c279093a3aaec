"""Mutants: small, realistic breakages of this repository's code, applied to a COPY of it, used
to show that the properties have teeth (a harness that passes proves nothing until it has been
seen failing on the bugs it exists to catch)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
COPIED = ("kernels", "mem_cache", "legacy", "refactored", "parity", "tests", "conftest.py", "pyproject.toml")


@dataclass(frozen=True)
class Mutant:
    name: str
    bug_class: str
    path: str
    old: str
    new: str


MUTANTS = (
    Mutant(
        "chunk-cache-int32-view",
        "the refactored chunk cache hands out the int32 view of the row (what the refactor fixed)",
        "refactored/chunk_cache.py",
        "return row_slots.to(dtype=torch.int64, copy=True)",
        "return row_slots",
    ),
    Mutant(
        "offset-includes-own-request",
        "the write kernel's running offset includes its own request",
        "kernels/refactored_write.py",
        "for earlier in range(pid):",
        "for earlier in range(pid + 1):",
    ),
    Mutant(
        "extend-without-prefix-len",
        "the extend part is written from column 0 instead of prefix_len",
        "kernels/refactored_write.py",
        "tl.store(row_base + prefix_len + offsets, slots.to(tl.int32), mask=mask)",
        "tl.store(row_base + offsets, slots.to(tl.int32), mask=mask)",
    ),
    Mutant(
        "last-loc-second-to-last",
        "last_loc is the second-to-last prefix element",
        "refactored/schedule_batch.py",
        "p[-1:].to(device) if len(p) > 0",
        "p[-2:-1].to(device) if len(p) > 1",
    ),
)


def mutated_copy(mutant: Mutant, into: Path) -> Path:
    """Copy the repository's code into ``into`` and apply ``mutant`` (its text must occur once)."""
    for name in COPIED:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, into / name, ignore=shutil.ignore_patterns("__pycache__", ".hypothesis"))
        else:
            shutil.copy2(source, into / name)
    target = into / mutant.path
    text = target.read_text()
    if text.count(mutant.old) != 1:
        raise ValueError(f"mutant {mutant.name}: {mutant.old!r} occurs {text.count(mutant.old)} times in {mutant.path}")
    target.write_text(text.replace(mutant.old, mutant.new))
    return into


def run_properties(
    mutant: Mutant, profile: str = "ci", timeout: float = 600, *, examples: bool = True
) -> subprocess.CompletedProcess:
    """Run the parity properties against a mutated copy; returns the finished pytest process.
    ``examples=False`` leaves out the permanent @examples: generated scenarios alone."""
    with tempfile.TemporaryDirectory(prefix=f"kvparity-mutant-{mutant.name}-") as tmp:
        root = mutated_copy(mutant, Path(tmp))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "KVPARITY_LEDGER"))}
        env.update(HYPOTHESIS_PROFILE=profile, PYTHONPATH=str(root), PYTHONDONTWRITEBYTECODE="1")
        if not examples:
            env["KVPARITY_NO_EXAMPLES"] = "1"
        command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                   "tests/properties/test_parity.py::test_four_worlds_agree"]
        return subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
