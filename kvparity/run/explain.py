"""Which source change of release B makes it differ from release A on one scenario (``kvparity
explain``): hybrids of A with some of B's changes are replayed against A, and delta debugging
(``kvparity.run.ddmin``) finds a smallest set of changes that still carries the difference: first
B's changed files (only those either run loaded: no other can matter), then the functions within
the files found.

A hybrid carries the difference when its replay against A differs as B does (the drive's ``same``:
the same kind of first difference). A hybrid that cannot be played (it does not import, a worker
dies or hangs, the probe finds no adapter for it) is *unresolved*: never taken for a verdict, only
left out of the search. The answer says what it is: a culprit (the files, the functions and the
unified diff that carries the difference), or why none was found.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from kvparity.engine.errors import RealSGLangError
from kvparity.engine.real.door import LOADED_ENV
from kvparity.judge.verdict import Played
from kvparity.run.ddmin import FAIL, PASS, UNRESOLVED, ddmin
from kvparity.run.hybrid import (
    MODULE_REST,
    FileChange,
    FunctionChange,
    build_hybrid,
    changed_files,
    defined_names,
    function_changes,
    hybrid_text,
    imported_names,
    module_path,
    unified_diff,
    unit_texts,
)
from kvparity.run.hybrid_outcomes import HybridOutcomes

# Where a difference on the KV path usually comes from: tried first, alone (with what it needs to
# import), and searched alone when it carries the difference. Most of what two releases change (models,
# kernels, the HTTP server) is loaded beside it, and hybrids that mix those rarely even run.
FOCUS = ("sglang/srt/mem_cache/", "sglang/srt/managers/", "sglang/global_config.py", "sglang/srt/server_args.py",
         "sglang/srt/environ.py")
REPAIRS = 6  # how many companions one hybrid may learn before it is left unresolved
CULPRIT, NOT_CARRIED, NO_DIFFERENCE = "culprit", "not carried by the source", "no difference"


class Replayer(Protocol):
    """One scenario replayed by a drive against release A (the reference)."""

    def play(self, folder: str) -> Played:
        """A against the SGLang in ``folder`` (B, or a hybrid); raises ``RealSGLangError`` when it
        cannot be played."""
        ...

    def same(self, played: Played, first: Played) -> bool:
        """Whether ``played`` differs from A as ``first`` (B's) does."""
        ...

    def broken(self, played: Played) -> str | None:
        """Why the folder's SGLang could not be judged on the scenario (it raised, or its world
        failed), or None: a hybrid broken where B was not is unresolved, never a verdict."""
        ...


@dataclass
class Explanation:
    reference: str  # A's folder
    checked: str  # B's folder
    difference: str = ""  # B's first difference from A, in one line
    status: str = NO_DIFFERENCE
    why: str = ""
    files: tuple[FileChange, ...] = ()
    carried: tuple[FileChange, ...] = ()  # B's files the hybrids took for their imports, not the culprit
    companions: tuple[str, ...] = ()  # B's functions every hybrid took to run at all (learnt from what they missed)
    functions: tuple[FileChange | FunctionChange, ...] = ()  # a file that cannot be split stays whole
    diff: str = ""
    changed_files: int = 0  # files of the package that differ between A and B
    loaded_files: int = 0  # of those, the ones either run loaded (what the search starts from)
    hybrids: int = 0  # hybrids played
    unresolved: int = 0  # of those, the ones that could not be played
    reused: int = 0  # of those, the ones an earlier run of the same search had played (read back)
    seconds: float = 0.0
    attempts: list[dict[str, Any]] = field(default_factory=list)

    def lines(self) -> list[str]:
        head = [f"explain: {self.checked} against {self.reference}: {self.difference or 'no difference'}",
                f"  {self.changed_files} files differ, {self.loaded_files} of them loaded by the replay; "
                f"{self.hybrids} hybrids played ({self.unresolved} unresolved"
                f"{f', {self.reused} read back from an earlier run' if self.reused else ''}) in {self.seconds:.0f} s"]
        if self.status != CULPRIT:
            return head + [f"  no culprit: {self.why}"]
        found = [f"  culprit: {len(self.files)} file(s), {len(self.functions)} function(s)"]
        found += [f"    {c.path} ({c.kind})" for c in self.files]
        if self.companions:
            found.append(f"    (with B's {', '.join(self.companions)}, which the hybrids needed to run)")
        if self.carried:
            found.append(f"    (the hybrids also took {len(self.carried)} other file(s) of B whole, to import)")
        found += [f"    {c.path}: {_name(c)} ({c.kind})" for c in self.functions]
        return head + found + ["", self.diff.rstrip("\n")]

    def to_dict(self) -> dict[str, Any]:
        return {"reference": self.reference, "checked": self.checked, "difference": self.difference,
                "status": self.status, "why": self.why,
                "files": [{"path": c.path, "kind": c.kind} for c in self.files],
                "carried": [{"path": c.path, "kind": c.kind} for c in self.carried],
                "companions": list(self.companions),
                "functions": [{"path": c.path, "name": _name(c), "kind": c.kind} for c in self.functions],
                "diff": self.diff, "changed_files": self.changed_files, "loaded_files": self.loaded_files,
                "hybrids": self.hybrids, "unresolved": self.unresolved, "reused": self.reused, "seconds": round(self.seconds, 1)}


def _name(change: FileChange | FunctionChange) -> str:
    return change.name if isinstance(change, FunctionChange) else "(the whole file)"


def explain(a: str, b: str, replayer: Replayer, say: Callable[[str], None] = lambda line: None,
            outcomes: HybridOutcomes | None = None) -> Explanation:
    """The smallest set of B's changes (files, then functions) that makes A differ as B does on
    the replayer's scenario; a hybrid whose outcome ``outcomes`` holds (an earlier run of the same
    search) is not played again."""
    started = time.monotonic()
    found = Explanation(reference=a, checked=b)
    first, loaded, called = _baseline(b, replayer)
    if first.agree:
        found.why = "A and B agree on this scenario: nothing to explain"
        return _timed(found, started)
    found.difference = first.line
    search = _Search(a, b, replayer, first, found, say, outcomes or HybridOutcomes(None))
    search.called = called
    every = changed_files(a, b)
    files = [c for c in every if c.path in loaded]
    search.candidates = tuple(files)
    search.data = {c.path: _b_text(b, c) for c in every if c.kind == "added" and not c.path.endswith(".py")}
    found.changed_files, found.loaded_files = len(every), len(files)
    say(f"explain: {found.changed_files} files differ, {len(files)} loaded; replaying hybrids")
    whole = search.files(tuple(files)) if files else PASS
    if whole == UNRESOLVED:
        found.status, found.why = NOT_CARRIED, (
            "A with every file B changed that the replay loads could not be run (" + found.attempts[-1]["line"][-200:]
            + "): the files B changed do not mix with A's, so no hybrid can tell where the difference comes from")
        return _timed(found, started)
    if whole != FAIL:
        found.status, found.why = NOT_CARRIED, (
            "A with every file B changed that the replay loads does not differ as B does: the difference comes "
            "from elsewhere (the version file, how kvparity drives the release, or a file neither run loaded)")
        return _timed(found, started)
    focus = tuple(c for c in files if c.path.startswith(FOCUS))
    chosen = ddmin(focus if focus and search.files(focus) == FAIL else files, search.files)
    group = search.needed(chosen)
    # The functions searched: those of the files found and of the companions the hybrids learnt
    # they need (a culprit can hide there); the files taken only for their imports go whole.
    searched = tuple(c for c in group if c in chosen or c.path in search.companions)
    search.whole = tuple(c for c in group if c not in searched)
    minimal = _within_companions(_function_search(a, b, searched, search), search)
    # What every hybrid needed to run is named apart, unless it is all the search is left with.
    found.functions = tuple(c for c in minimal if c not in search.unit_companions) or minimal
    found.companions = tuple(sorted(_label(c) for c in search.unit_companions if c not in found.functions))
    culprit_paths = {c.path for c in found.functions}
    found.files = tuple(c for c in group if c.path in culprit_paths)
    found.carried = tuple(c for c in group if c.path not in culprit_paths)
    found.diff = "".join(_diff(a, b, path, [c for c in found.functions if c.path == path]) for path in sorted(culprit_paths))
    found.status = CULPRIT
    return _timed(found, started)


def _function_search(a: str, b: str, group: tuple[FileChange, ...],
                     search: _Search) -> tuple[FileChange | FunctionChange, ...]:
    """The smallest set of changed functions (and module-level code) of ``group`` (the files found
    and the companions learnt) that carries the difference; a file that cannot be split is one unit.
    Only functions either run called are searched (module-level code always is), unless those alone
    do not carry the difference (a function called only while importing, say): then all."""
    every = tuple(u for c in group for u in _units(a, b, c))
    ran = tuple(u for u in every if _ran(u, search.called))
    search.units, search.all_units = ran, every
    if len(ran) < len(every):
        search.say(f"explain: {len(ran)} of {len(every)} changed functions ran; searching those")
        if search.functions(ran) != FAIL:
            search.say("explain: the functions that ran do not carry the difference alone; searching all")
            search.units = every
    return ddmin(search.units, search.functions)


def _within_companions(minimal: tuple[FileChange | FunctionChange, ...],
                       search: _Search) -> tuple[FileChange | FunctionChange, ...]:
    """``minimal``, unless A with the companions the hybrids learnt, and nothing else, does not
    plainly agree with A: ddmin keeps at least one change and every hybrid took the companions, so
    when they carry the difference the one it kept is arbitrary, and when they cannot run without
    it, it may only be what lets a companion run (0.5.11's first answer, three pool-statistics
    functions, may be that: A with its companions alone cannot run). Then the companions that ran are searched too, as
    changes of their own, and nothing more is learnt: a hybrid that misses a name is left
    unresolved, so a companion that carries the difference and the changes it needs stay together.
    The companions learnt from import errors stay in every hybrid of that search where A with them
    alone agrees with A (``_kept_for_imports``)."""
    if not search.unit_companions or search.functions(()) == PASS:
        return minimal
    search.say("explain: A with the companions alone does not agree with A; searching the ones that ran too")
    ran = {u for u in search.unit_companions if _ran(u, search.called)}
    search.learning = False
    ran -= _kept_for_imports(ran & search.import_companions, search)
    search.unit_companions -= ran
    units = tuple(u for u in search.all_units if u in ran or u in minimal)
    return ddmin(units, search.functions)


def _kept_for_imports(imported: set[FileChange | FunctionChange],
                      search: _Search) -> set[FileChange | FunctionChange]:
    """The companions learnt from import errors that the companion search may take as given (every
    hybrid has them): only when A with them alone plainly agrees with A, so none of them carries the
    difference on its own. Without them nearly every hybrid of that search fails to import (0.5.19
    -> 0.5.20: 29 of 60 on one missing name)."""
    if not imported:
        return set()
    alone, _ = search._test(search.overrides_for(tuple(imported)), sorted(map(_label, imported)))
    return imported if alone == PASS else set()


def _ran(unit: FileChange | FunctionChange, called: set[tuple[str, str]]) -> bool:
    """Whether a run called the unit (a function, or a method or nested function of a class or
    function the unit is); a whole file and module-level code always count."""
    if isinstance(unit, FileChange) or unit.name == MODULE_REST:
        return True
    return any(file == unit.path and (name == unit.name or name.startswith(unit.name + "."))
               for file, name in called)


def _diff(a: str, b: str, path: str, culprit: list[FileChange | FunctionChange]) -> str:
    """A's file -> A's file with only the culprit's functions as B has them (the whole file for a
    file that cannot be split; one line, as git writes it, for a binary file such as a compiled
    extension, whose bytes read as text would be megabytes of noise)."""
    if _binary(a, path) or _binary(b, path):
        return f"Binary files a/{path} and b/{path} differ\n"
    if any(isinstance(c, FileChange) for c in culprit):
        return unified_diff(path, _text(a, path), _text(b, path))
    names = {c.name for c in culprit if isinstance(c, FunctionChange)}
    return unified_diff(path, _text(a, path), hybrid_text(_text(a, path), _text(b, path), names))


def _timed(found: Explanation, started: float) -> Explanation:
    found.seconds = time.monotonic() - started
    return found


def _baseline(b: str, replayer: Replayer) -> tuple[Played, set[str], set[tuple[str, str]]]:
    """A against B, with the files of the package either run loaded and the functions either
    called (file, qualified name)."""
    folder = tempfile.mkdtemp(prefix="kvparity-loaded-")
    saved = os.environ.get(LOADED_ENV)
    os.environ[LOADED_ENV] = folder
    try:
        played = replayer.play(b)
        loaded: set[str] = set()
        called: set[tuple[str, str]] = set()
        for path in Path(folder).glob("*.json"):
            record = json.loads(path.read_text())
            loaded.update(record["files"])
            called.update((file, name) for file, name in record["functions"])
        return played, loaded, called
    finally:
        if saved is None:
            os.environ.pop(LOADED_ENV, None)
        else:
            os.environ[LOADED_ENV] = saved
        shutil.rmtree(folder, ignore_errors=True)


def _units(a: str, b: str, change: FileChange) -> list[FileChange | FunctionChange]:
    """The functions of a changed Python file (the file itself where it cannot be split: added,
    removed, not Python, or not parsed)."""
    if change.kind != "changed" or not change.path.endswith(".py"):
        return [change]
    try:
        return list(function_changes(change.path, _text(a, change.path), _text(b, change.path))) or [change]
    except SyntaxError:
        return [change]


def _binary(root: str, path: str) -> bool:
    """Whether the file holds a NUL byte in its first 8 KiB (git's test for a binary file)."""
    full = Path(root) / path
    if not full.exists():
        return False
    with full.open("rb") as f:
        return b"\0" in f.read(8192)


def _text(root: str, path: str) -> str:
    full = Path(root) / path
    return full.read_text(errors="replace") if full.exists() else ""


class _Search:
    """The tests ddmin runs: a hybrid built, replayed against A and judged."""

    def __init__(self, a: str, b: str, replayer: Replayer, first: Played, found: Explanation,
                 say: Callable[[str], None], outcomes: HybridOutcomes | None = None) -> None:
        self.a, self.b, self.replayer, self.first, self.found, self.say = a, b, replayer, first, found, say
        self.outcomes = outcomes or HybridOutcomes(None)  # hybrids an earlier run of this search played
        self.candidates: tuple[FileChange, ...] = ()  # the files the search chooses from
        self.companions: set[str] = set()  # files learnt to be needed by every hybrid
        self.units: tuple[FileChange | FunctionChange, ...] = ()  # what the function search chooses from
        self.all_units: tuple[FileChange | FunctionChange, ...] = ()  # every changed unit of the files searched
        self.unit_companions: set[FileChange | FunctionChange] = set()  # units learnt to be needed by every hybrid
        self.import_companions: set[FileChange | FunctionChange] = set()  # of those, the ones learnt from an import error
        self.learning = True  # whether a hybrid that misses a name learns the unit that brings it
        self.unit_text_cache: dict[str, dict[str, tuple[str, str]]] = {}
        self.called: set[tuple[str, str]] = set()  # (file, qualified name) of what either run called
        self.whole: tuple[FileChange, ...] = ()  # files every hybrid of the function search takes whole from B
        # B's added files that are not Python (kernel sources, headers, configs): every hybrid has
        # them. A's code never reads them, and B's code taken into a hybrid may (0.5.17's JIT kernels
        # look for their csrc/ and include/ folders beside them and refuse to start without).
        self.data: dict[str, str | bytes | None] = {}
        self.import_cache: dict[tuple[str, str], set[tuple[str, str]]] = {}
        self.names_cache: dict[tuple[str, str], set[str] | None] = {}
        self.module_cache: dict[tuple[str, str], str | None] = {}
        self.provider_cache: dict[str, set[str]] = {}
        self.a_import_cache: dict[str, set[str]] = {}

    def files(self, chosen: tuple[FileChange, ...]) -> str:
        """B's ``chosen`` files on A, with the other changed files a hybrid needs (``needed``). A
        hybrid that fails on a name (an attribute, an import, a keyword) that only some other
        changed file of B brings is tried again with that file (a companion, taken from then on)."""
        for _ in range(REPAIRS + 1):
            group = self.needed(chosen)
            outcome, line = self._test({c.path: _b_text(self.b, c) for c in group}, [c.path for c in chosen],
                                       len(group) - len(chosen))
            learned = self._providers(line, group) if outcome == UNRESOLVED else set()
            if not learned:
                return outcome
            self.companions |= learned
            self.say(f"    taken from now on, for what the hybrid missed: {', '.join(sorted(learned))}")
        return outcome

    def _providers(self, line: str, group: tuple[FileChange, ...]) -> set[str]:
        """The candidate files outside ``group`` whose B text brings a name the error says is
        missing, or drops it (``_brings_or_drops``)."""
        inside = {c.path for c in group}
        lacks = _lacks(line)
        found = {path for m in lacks.modules for path in (module_path(m, self.b),) if path}
        if lacks.raised is not None:  # A's version of the file raised: B's is what it lacks
            found.add(lacks.raised[0])
        found |= {c.path for c in self.candidates
                  if c.kind == "removed" and c.path.removesuffix(".py").removesuffix("/__init__") in lacks.removed}
        for c in self.candidates:
            if c.path in inside or not c.path.endswith(".py") or c.kind == "removed":
                continue
            theirs = _text(self.b, c.path)
            if _brings_or_drops(_text(self.a, c.path), theirs, lacks.names) or _calls(theirs, lacks.callees):
                found.add(c.path)
        return {p for p in found if p in {c.path for c in self.candidates}} - inside

    def needed(self, chosen: tuple[FileChange, ...]) -> tuple[FileChange, ...]:
        """``chosen`` and the other candidate files a hybrid needs to import at all: a module whose
        B version defines a name a chosen file imports and A's does not, and a file whose A version
        imports a name a chosen module no longer defines; transitively."""
        kept = {c.path for c in chosen} | self.companions
        given = {p for k in kept for p in self._b_only_providers(k)}  # what B's kept files import from B alone
        folders = {f for k in kept for f in _folders(k)}  # every package folder a kept file sits in
        grown = True
        while grown:
            grown = False
            for c in self.candidates:
                if c.path not in kept and (c.path in given or self._needed_beside(c.path, kept, folders)):
                    kept.add(c.path)
                    given |= self._b_only_providers(c.path)
                    folders.update(_folders(c.path))
                    grown = True
        return tuple(c for c in self.candidates if c.path in kept)

    def _needed_beside(self, path: str, kept: set[str], folders: set[str]) -> bool:
        # ``path`` is a package's __init__ and a kept module sits in that package ...
        if path.endswith("/__init__.py") and path.removesuffix("__init__.py") in folders:
            return True
        # ... or A's ``path`` takes a module B removed, or a name a kept file no longer defines in B
        # (only a kept file among those its imports name can make it so: looked at first, it is cheap).
        if not self._a_import_files(path) & kept:
            return False
        return any(self._gone_in_b(module, name, kept) for module, name in self._imports(self.a, path))

    def _a_import_files(self, path: str) -> set[str]:
        """The files ``_gone_in_b`` looks for in the kept set, for A's ``path``'s imports."""
        if path not in self.a_import_cache:
            self.a_import_cache[path] = {
                f for module, name in self._imports(self.a, path)
                for f in (self._module(self.a, f"{module}/{name}") if name else None,
                          self._module(self.a, module), self._module(self.b, module)) if f is not None}
        return self.a_import_cache[path]

    def _gone_in_b(self, module: str, name: str, kept: set[str]) -> bool:
        if name and self._module(self.a, f"{module}/{name}") in kept:  # a submodule B removed or changed
            return self._module(self.b, f"{module}/{name}") is None
        if self._module(self.a, module) in kept and self._module(self.b, module) is None:
            return True
        return self._module(self.b, module) in kept and bool(name) and not self._defines(self.b, module, name)

    def _b_only_providers(self, path: str) -> set[str]:
        """The files whose B version alone gives what B's ``path`` imports: a submodule A lacks, or
        a module A lacks or whose A version does not define the name (computed once a file: the
        search asks for every kept file on every hybrid)."""
        if path not in self.provider_cache:
            found = set()
            for module, name in self._imports(self.b, path):
                sub = self._module(self.b, f"{module}/{name}") if name else None
                if sub is not None and self._module(self.a, f"{module}/{name}") is None:
                    found.add(sub)
                whole = self._module(self.b, module)
                if whole is not None and whole != sub and (
                        self._module(self.a, module) is None or bool(name) and not self._defines(self.a, module, name)):
                    found.add(whole)
            self.provider_cache[path] = found
        return self.provider_cache[path]

    def _module(self, root: str, module: str) -> str | None:
        key = (root, module)
        if key not in self.module_cache:
            self.module_cache[key] = module_path(module, root)
        return self.module_cache[key]

    def _imports(self, root: str, path: str) -> set[tuple[str, str]]:
        key = (root, path)
        if key not in self.import_cache:
            self.import_cache[key] = imported_names(root, path) if path.endswith(".py") else set()
        return self.import_cache[key]

    def _defines(self, root: str, module: str, name: str) -> bool:
        key = (root, module)
        if key not in self.names_cache:
            self.names_cache[key] = defined_names(root, module)
        names = self.names_cache[key]
        return names is None or name in names

    def functions(self, chosen: tuple[FileChange | FunctionChange, ...]) -> str:
        """A with B's ``chosen`` functions (and the companions learnt so far, which a hybrid of
        them needed to run: a function that defines or sets a name another one uses)."""
        names = [c.path if isinstance(c, FileChange) else f"{c.path}: {c.name}" for c in chosen]
        for _ in range(REPAIRS + 1):
            taken = tuple(dict.fromkeys((*chosen, *self.unit_companions)))
            outcome, line = self._test(self.overrides_for(taken), names, len(taken) - len(chosen))
            learned = self._unit_providers(line, set(taken)) if outcome == UNRESOLVED and self.learning else set()
            if not learned:
                return outcome
            self.unit_companions.update(learned)
            if _import_error(line):
                self.import_companions.update(learned)
            self.say(f"    taken from now on, for what the hybrid missed: {', '.join(sorted(map(_label, learned)))}")
        return outcome

    def _unit_providers(self, line: str, taken: set[FileChange | FunctionChange]) -> set[FileChange | FunctionChange]:
        """The units outside ``taken`` whose B text brings or drops a name the error says is missing."""
        lacks = _lacks(line)
        found: set[FileChange | FunctionChange] = set()
        for unit in self.all_units:  # a companion may be a function no run called (one only named)
            if unit in taken or not isinstance(unit, FunctionChange):
                continue
            if unit.path not in self.unit_text_cache:
                self.unit_text_cache[unit.path] = unit_texts(_text(self.a, unit.path), _text(self.b, unit.path))
            mine, theirs = self.unit_text_cache[unit.path].get(unit.name, ("", ""))
            if (_brings_or_drops(mine, theirs, lacks.names) or _calls(theirs, lacks.callees)
                    or _is_callee(unit, lacks.callees) or _is_where(unit, lacks.raised)):
                found.add(unit)
        return found

    def overrides_for(self, chosen: tuple[FileChange | FunctionChange, ...]) -> dict[str, str | bytes | None]:
        """The files of a hybrid: whole files of B, and files of A with some of B's functions."""
        whole = {c.path: _b_text(self.b, c) for c in (*self.whole, *chosen) if isinstance(c, FileChange)}
        by_file: dict[str, set[str]] = {}
        for c in chosen:
            if isinstance(c, FunctionChange):
                by_file.setdefault(c.path, set()).add(c.name)
        return whole | {path: hybrid_text(_text(self.a, path), _text(self.b, path), names)
                        for path, names in by_file.items()}

    def _test(self, overrides: dict[str, str | bytes | None], names: list[str], carried: int = 0) -> tuple[str, str]:
        self.found.hybrids += 1
        files = self.data | overrides
        known = self.outcomes.get(files)
        outcome, line = known if known is not None else self._played(files)
        self.found.unresolved += outcome == UNRESOLVED
        self.found.reused += known is not None
        shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "") + \
            (f" (+{carried} it imports)" if carried else "") + (" [played before]" if known is not None else "")
        self.say(f"  hybrid {self.found.hybrids}: A + {shown}: {outcome}" + (f" ({line[-160:]})" if outcome == UNRESOLVED else ""))
        self.found.attempts.append({"changes": names, "outcome": outcome, "line": line})
        return outcome, line

    def _played(self, files: dict[str, str | bytes | None]) -> tuple[str, str]:
        """The hybrid of A with ``files`` of B, built, replayed and judged (and kept in ``outcomes``)."""
        folder = tempfile.mkdtemp(prefix="kvparity-hybrid-")
        try:
            hybrid = build_hybrid(self.a, files, Path(folder) / "sglang-hybrid")
            outcome, line = self._judged(self.replayer.play(str(hybrid)))
        except (RealSGLangError, SyntaxError, OSError) as exc:
            outcome, line = UNRESOLVED, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        self.outcomes.put(files, outcome, line)
        return outcome, line

    def _judged(self, played: Played) -> tuple[str, str]:
        """UNRESOLVED: the hybrid broke where B did not (first: a hybrid that stopped on an error can
        show the same first difference as B, and is still no reproduction of it); FAIL: it differs
        from A as B does; else PASS."""
        broke = self.replayer.broken(played)
        if broke is not None and self.replayer.broken(self.first) is None:
            return UNRESOLVED, broke
        if self.replayer.same(played, self.first):
            return FAIL, played.line
        return PASS, played.line


def _folders(path: str) -> set[str]:
    """The folders ``path`` sits in, each with its trailing slash: ``a/b/c.py`` -> ``a/``, ``a/b/``."""
    parts = path.split("/")[:-1]
    return {"/".join(parts[:i]) + "/" for i in range(1, len(parts) + 1)}


def _brings_or_drops(mine: str, theirs: str, names: set[str]) -> bool:
    """Whether B's text of a file or function brings one of ``names`` A's lacks (B defines or sets
    what a hybrid missed), or drops one A's uses (A uses what B's other changes removed)."""
    def has(text: str, name: str) -> bool:
        return re.search(rf"\b{name}\b", text) is not None

    return any(has(theirs, n) != has(mine, n) for n in names)


class _Lacks(NamedTuple):
    """What a hybrid's error says it lacked, read once for both searches' repairs."""

    names: set[str]  # names B's text brings or drops (``_missing_names``)
    callees: set[str]  # functions called with arguments that do not fit (``_misfit_callees``)
    modules: set[str]  # modules not found, as paths without suffix
    removed: set[str]  # modules B removed that the probe found still there (between two generations)
    raised: tuple[str, str] | None  # the file and function a scheduler raised in (``_raised_in``)


def _lacks(line: str) -> _Lacks:
    def paths(pattern: str) -> set[str]:
        return {m.replace(".", "/") for m in re.findall(pattern, line)}

    return _Lacks(_missing_names(line), _misfit_callees(line), paths(r"No module named '([\w.]+)'"),
                  paths(r"where ([\w.]+) is present"), _raised_in(line))


def _missing_names(line: str) -> set[str]:
    """The names an error says are missing: an attribute, an imported name, a keyword, a name, an
    abstract method a class lacks, a name the probe found missing or present; and the parameters
    one side of a signature has and the other lacks, where kvparity's adapter check compares them
    (``release_req takes ['idx'], the entry says ['idx', 'offload_kv']``)."""
    names = set(re.findall(r"(?:attribute|import name|keyword argument|name) '(\w+)'", line))
    names |= {n.rsplit(".", 1)[-1] for n in re.findall(r"where [\w.]+:([\w.]+) is (?:missing|present)", line)}  # the probe
    for methods in re.findall(r"with abstract methods? ([\w, ]+)", line):  # a class B's base requires them of
        names |= {m.strip() for m in methods.split(",") if m.strip()}
    for found, expected in re.findall(r"takes \[([^\]]*)\], the entry says \[([^\]]*)\]", line):
        names |= set(re.findall(r"'(\w+)'", found)) ^ set(re.findall(r"'(\w+)'", expected))
    return names


def _misfit_callees(line: str) -> set[str]:
    """The functions an error says were called with arguments that do not fit (``f() missing 1
    required positional argument``, ``takes 2 positional arguments but 3 were given``, ``got an
    unexpected keyword argument`` (where A's text may use the keyword elsewhere), kvparity's
    adapter check ``release_req takes [...], the entry says [...]``): one side's
    caller meets the other side's signature, so B's callers (or B's definition) of it are what the
    hybrid lacks. A class's ``__init__`` is named by its class."""
    found = re.findall(r"([\w.]+)(?:\(\) (?:missing \d+ required|takes \d+ positional|got an unexpected keyword)"
                       r"| takes \[)", line)
    return {name.removesuffix(".__init__").rsplit(".", 1)[-1] for name in found}


def _import_error(line: str) -> bool:
    """Whether a hybrid failed for a name or module it could not import or find."""
    return re.search(r"\b(?:ImportError|ModuleNotFoundError|NameError)\b|cannot import name|No module named", line) is not None


def _raised_in(line: str) -> tuple[str, str] | None:
    """Where a scheduler that raised stopped, as the replayer says it (``(at sglang/x.py:12 in f)``,
    the innermost frame in SGLang): the file and the function's own name."""
    found = re.search(r"\(at (sglang/[\w/.]+\.py):\d+ in (\w+)\)", line)
    return (found.group(1), found.group(2)) if found else None


def _is_where(unit: FunctionChange, raised: tuple[str, str] | None) -> bool:
    """Whether the unit is the function a hybrid raised in: A's version of it met B's data, so B's
    version is what the hybrid lacks."""
    return raised is not None and unit.path == raised[0] and (
        unit.name == raised[1] or unit.name.endswith("." + raised[1]))


def _calls(text: str, callees: set[str]) -> bool:
    """Whether ``text`` calls (or defines) one of ``callees`` (a class by its ``class`` line)."""
    return any(re.search(rf"\b{name}\(|\bclass {name}\b", text) for name in callees)


def _is_callee(unit: FunctionChange, callees: set[str]) -> bool:
    """Whether the unit is one of ``callees`` (a function or method, or a class's ``__init__``)."""
    parts = unit.name.split(".")
    return parts[-1] in callees or (parts[-1] == "__init__" and len(parts) > 1 and parts[-2] in callees)


def _label(change: FileChange | FunctionChange) -> str:
    return f"{change.path}: {_name(change)}"


def _b_text(b: str, change: FileChange) -> bytes | None:
    return None if change.kind == "removed" else (Path(b) / change.path).read_bytes()
