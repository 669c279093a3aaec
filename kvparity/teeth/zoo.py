"""Mutants: small, realistic breakages of this repository's code, applied to a COPY of it, used
to show that the properties have teeth (a harness that passes proves nothing until it has been
seen failing on the bugs it exists to catch)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kvparity.teeth.copy_pytest import run_pytest

REPO = Path(__file__).resolve().parents[2]
COPIED = ("kernels", "mem_cache", "legacy", "refactored", "kvparity", "tests", "conftest.py", "pyproject.toml")


@dataclass(frozen=True)
class Edit:
    """One exact text replacement: ``old`` must occur exactly once in ``path``."""

    path: str
    old: str
    new: str


@dataclass(frozen=True)
class Mutant:
    """A named breakage tied to the bug class it stands for; one or more edits."""

    name: str
    bug_class: str
    edits: tuple[Edit, ...]


def _one(name: str, bug_class: str, path: str, old: str, new: str) -> Mutant:
    return Mutant(name, bug_class, (Edit(path, old, new),))


_WRITE = "kernels/refactored_write.py"
_BATCH = "refactored/schedule_batch.py"
_REQ = "refactored/req.py"

# The refactored Req keeps the old prefix on retract: the shared ReqState.reset_for_retract stays
# right (so legacy stays the reference) and the refactored Req overrides it, as a refactor that
# moved the method into the new Req and dropped the reset would.
_RETRACT_OVERRIDE = """    def reset_for_retract(self) -> None:
        kept = self.prefix_indices
        super().reset_for_retract()
        self.prefix_indices = kept

    def init_next_round_input(self, tree_cache: Any = None) -> None:"""

# Prefixes written only when every request of the batch has one: both backends of the write.
_EVERY_PREFIX_KERNEL = """    every = tl.cast(1, tl.int64)
    for other in range(tl.num_programs(0)):
        every = tl.minimum(every, tl.load(prefix_lens + other))
    for block in range(tl.cdiv(tl.where(every > 0, prefix_len, 0), BLOCK)):"""

# alloc_extend part 2 reads pages from the previous request's first new page.
_PART2_PREVIOUS = """    prev = tl.maximum(pid - 1, 0)
    prev_seq = tl.load(seq_lens_ptr + prev)
    prev_pre = tl.load(pre_lens_ptr + prev)
    prev_pages = tl.where(pid > 0, (prev_seq + page_size - 1) // page_size - (prev_pre + page_size - 1) // page_size, 0)
    page = tl.load(free_page_ptr + first_page - prev_pages + k // page_size, mask=part2, other=0)"""

# Order assumed (issue 25): right on a fresh pool, wrong on a server's churned one.
# The prefix's slots taken as its first slot plus an offset (pages assumed contiguous), both backends.
_PREFIX_CONTIGUOUS = (
    Edit(_WRITE, "        slots = tl.load(prefix + offsets, mask=mask)\n",
         "        slots = tl.load(prefix) + offsets\n"),
    Edit(_WRITE, "req_to_token[row, :pre] = prefix[:pre].to(device=req_to_token.device, dtype=torch.int32)",
         "req_to_token[row, :pre] = (prefix[0] + torch.arange(pre)).to(device=req_to_token.device, dtype=torch.int32)"),
)
# A request's new slots taken as its first new slot plus an offset (the free list assumed in order).
_NEW_SLOTS_CONTIGUOUS = (
    Edit(_WRITE, "        slots = tl.load(out_cache_loc + out_start + offsets, mask=mask)\n",
         "        slots = tl.load(out_cache_loc + out_start) + offsets\n"),
    Edit(_WRITE, "req_to_token[row, pre:seq] = out_cache_loc[start : start + seq - pre].to(torch.int32)",
         "req_to_token[row, pre:seq] = (out_cache_loc[start : start + 1] + torch.arange(seq - pre)).to(torch.int32)"),
)

MUTANTS: tuple[Mutant, ...] = (
    _one("chunk-cache-int32-view",
         "the refactored chunk cache hands out the int32 view of the row (what the refactor fixed)",
         "refactored/chunk_cache.py", "return row_slots.to(dtype=torch.int64, copy=True)", "return row_slots"),
    _one("offset-includes-own-request", "the write kernel's running offset includes its own request",
         _WRITE, "for earlier in range(pid):", "for earlier in range(pid + 1):"),
    _one("offset-sums-seq-lens", "the write kernel's running offset sums seq_lens instead of extend_lens",
         _WRITE, "out_start += tl.load(extend_lens + earlier)", "out_start += tl.load(seq_lens + earlier)"),
    _one("extend-without-prefix-len", "the extend part is written from column 0 instead of prefix_len",
         _WRITE, "tl.store(row_base + prefix_len + offsets, slots.to(tl.int32), mask=mask)",
         "tl.store(row_base + offsets, slots.to(tl.int32), mask=mask)"),
    _one("last-loc-second-to-last", "last_loc is the second-to-last prefix element",
         _BATCH, "p[-1:].to(device) if len(p) > 0", "p[-2:-1].to(device) if len(p) > 1"),
    Mutant("last-loc-before-row-write",
           "refactored reads last_loc from the request's row before the row is written",
           (Edit(_BATCH, "from kvparity.kernels.refactored_write import write_prefix_and_extend_slots\n",
                 "from kvparity.kernels.last_loc import get_last_loc\n"
                 "from kvparity.kernels.refactored_write import write_prefix_and_extend_slots\n"),
            Edit(_BATCH, "last_loc = last_loc_from_prefixes(prefix_tensors, self.device) if self.page_size > 1 else None",
                 "last_loc = get_last_loc(self.req_to_token_pool.req_to_token, req_pool_indices, "
                 "lens.prefix_lens_tensor, backend=self.backend) if self.page_size > 1 else None"))),
    # (Was "prefix-indices-list-default", Req's default prefix as []: with cache kind "none" retired,
    # every prefix the extend path sees comes from a cache's match_prefix, so that default never
    # reaches write_cache_indices in any SGLang configuration and the mutant became equivalent.)
    _one("empty-match-as-list",
         "an empty match handed to the refactored write as [] instead of an empty int64 tensor (chunk cache)",
         "mem_cache/chunk_cache.py", "return ChunkMatch(torch.empty((0,), dtype=torch.int64), None)",
         "return ChunkMatch([], None)"),
    Mutant("prefix-only-when-all-have-one", "prefixes are written only when every request in the batch has one",
           (Edit(_WRITE, "    for block in range(tl.cdiv(prefix_len, BLOCK)):", _EVERY_PREFIX_KERNEL),
            Edit(_WRITE, "        if pre > 0:\n", "        if pre > 0 and bool((prefix_lens > 0).all()):\n"))),
    _one("match-key-ignores-logprob", "the match key ignores logprob_start_len",
         _REQ, "max_prefix_len = min(max_prefix_len, self.logprob_start_len)", "max_prefix_len = max_prefix_len"),
    _one("match-key-whole-input", "the match key may cover the whole input (max_prefix_len = len(fill_ids))",
         _REQ, "max_prefix_len = input_len - 1", "max_prefix_len = input_len"),
    _one("retract-keeps-prefix", "reset_for_retract keeps the old prefix_indices (refactored Req only)",
         _REQ, "    def init_next_round_input(self, tree_cache: Any = None) -> None:", _RETRACT_OVERRIDE),
    _one("prefix-read-as-int32", "the refactored kernel reads prefixes through an int32 pointer",
         _WRITE, ".to(tl.pointer_type(tl.int64))", ".to(tl.pointer_type(tl.int32))"),
    _one("unfinished-row-not-rewritten", "the radix cache's cache_unfinished_req forgets to rewrite the row",
         "mem_cache/radix_cache.py",
         "self.req_to_token_pool.write(\n            (req.req_pool_idx, slice(old_prefix_len, len(new_indices))), "
         "new_indices[old_prefix_len:]\n        )",
         "pass"),
    _one("alloc-part2-previous-first-page", "alloc_extend part 2 starts at the previous request's first new page",
         "kernels/alloc_extend.py",
         "    page = tl.load(free_page_ptr + first_page + k // page_size, mask=part2, other=0)", _PART2_PREVIOUS),
    _one("rows-deduplicated-before-write",
         "the rows are de-duplicated (torch.unique, which also sorts them) before the write: rows assumed ascending",
         _BATCH, "req_pool_indices = torch.tensor(rows, dtype=torch.int64, device=self.device)",
         "req_pool_indices = torch.unique(torch.tensor(rows, dtype=torch.int64, device=self.device))"),
    Mutant("prefix-assumed-contiguous", "a prefix is written as its first slot plus an offset: pages assumed contiguous",
           _PREFIX_CONTIGUOUS),
    Mutant("new-slots-assumed-contiguous",
           "a request's new slots are its first new slot plus an offset: the free list assumed in order",
           _NEW_SLOTS_CONTIGUOUS),
    _one("last-loc-from-first-slot", "last_loc is the prefix's first slot plus its length: pages assumed contiguous",
         _BATCH, "p[-1:].to(device) if len(p) > 0", "(p[:1] + len(p) - 1).to(device) if len(p) > 0"),
)

# Mutants of kvparity's model of SGLang's scheduler (``kvparity/engine/traffic_loop.py``), which only
# the scheduler-driven check plays: each is killed by ``kvparity check --drive scheduler``
# (tests/properties/test_teeth.py), by the memory oracles kvparity's own model must never break.
SCHEDULER_MUTANTS: tuple[Mutant, ...] = (
    _one("retract-keeps-kv", "retract_decode sends a request back to the queue without releasing its KV and row",
         "kvparity/engine/traffic_loop.py", "            batch.release_req(idx, len(order))\n",
         "            pass  # the request's KV and row are kept\n"),
)

BY_NAME: dict[str, Mutant] = {m.name: m for m in MUTANTS}


class MutantError(ValueError):
    """A mutant that does not apply cleanly: its ``old`` text is missing or not unique."""


def apply_edits(mutant: Mutant, root: Path) -> None:
    """Apply every edit of ``mutant`` to the files under ``root``; raise ``MutantError`` when an
    ``old`` text does not occur exactly once (checked before the file is written)."""
    for edit in mutant.edits:
        target = root / edit.path
        text = target.read_text()
        count = text.count(edit.old)
        if count != 1:
            raise MutantError(f"mutant {mutant.name}: {edit.old!r} occurs {count} times in {edit.path} (needs 1)")
        target.write_text(text.replace(edit.old, edit.new))


def mutated_copy(mutant: Mutant, into: Path) -> Path:
    """Copy the repository's code into ``into`` and apply ``mutant`` (its text must occur once)."""
    for name in COPIED:
        source = REPO / name
        if source.is_dir():
            # symlinks=True: kvparity/kernels and its siblings stay links to the copy's own
            # folders, so the mutated file is the one the copy's package imports.
            shutil.copytree(source, into / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", ".hypothesis"))
        else:
            shutil.copy2(source, into / name)
    apply_edits(mutant, into)
    return into


def run_properties(
    mutant: Mutant,
    profile: str = "ci",
    timeout: float = 600,
    *,
    examples: bool = True,
    ledger_dir: Path | None = None,
    result_file: Path | None = None,
    minimize: bool = True,
) -> subprocess.CompletedProcess:
    """Run the parity properties against a mutated copy; returns the finished pytest process.
    ``examples=False`` leaves out the permanent @examples: generated scenarios alone.
    ``ledger_dir`` (an empty directory) receives the child's scenario ledger; ``result_file``
    (not there yet) its first failing test, as data (``kvparity.teeth.results.read``).
    ``minimize=False``: a failure is reported as drawn, not shrunk (whether it is killed is the same)."""
    from kvparity.run.minimize import NO_MINIMIZE_ENV
    from kvparity.teeth.results import ENV as RESULT_ENV

    with tempfile.TemporaryDirectory(prefix=f"kvparity-mutant-{mutant.name}-") as tmp:
        root = mutated_copy(mutant, Path(tmp))
        drop = ("PYTEST_", "KVPARITY_LEDGER", "KVPARITY_NO_EXAMPLES", RESULT_ENV, NO_MINIMIZE_ENV)
        env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
        env.update(HYPOTHESIS_PROFILE=profile, PYTHONPATH=str(root), PYTHONDONTWRITEBYTECODE="1")
        if not examples:
            env["KVPARITY_NO_EXAMPLES"] = "1"
        if not minimize:
            env[NO_MINIMIZE_ENV] = "1"
        if ledger_dir is not None:
            env["KVPARITY_LEDGER"] = str(ledger_dir)
        if result_file is not None:
            env[RESULT_ENV] = str(result_file)
        argv = ["-x", "-q", "-p", "no:cacheprovider", "-p", "kvparity.teeth.plugin",
                "tests/properties/test_parity.py::test_all_worlds_agree"]
        return run_pytest(argv, root, env, timeout)
