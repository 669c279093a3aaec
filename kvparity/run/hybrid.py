"""Hybrids of two SGLang folders, for ``kvparity explain``: release A with some of release B's
changes, file by file or function by function.

A *change* is one unit that differs between A and B: a whole file (``FileChange``: changed, added or
removed) or, within a changed Python file, one top-level function or class method, a class only one
side has, or the rest of the module (``FunctionChange``, the rest named ``<module>``). ``hybrid_text``
writes A's file with the chosen functions taken from B; ``build_hybrid`` makes a folder ``resolve``
takes: A's ``sglang`` package (hard links where the file system allows, else copies) with the chosen
files replaced. Only the version file stays A's always: it names the world, not its behaviour.

Nothing here imports SGLang: the sources are read as text and parsed with ``ast``.
"""

from __future__ import annotations

import ast
import difflib
import filecmp
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "sglang"
VERSION_FILES = ("sglang/version.py", "sglang/_version.py")  # the world's name: always A's
MODULE_REST = "<module>"  # what of a module is not one of its functions or methods


@dataclass(frozen=True, order=True)
class FileChange:
    path: str  # relative to the folder holding the package: "sglang/srt/managers/scheduler.py"
    kind: str  # "changed", "added" (only in B) or "removed" (only in A)


@dataclass(frozen=True, order=True)
class FunctionChange:
    path: str
    name: str  # "Class.method", "function", a class only one side has, or MODULE_REST
    kind: str  # "changed", "added" or "removed"


def _files(root: Path) -> dict[str, Path]:
    package = root / PACKAGE
    found = {}
    for dirpath, dirnames, filenames in os.walk(package):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for name in filenames:
            if not name.endswith((".pyc", ".pyo")):
                full = Path(dirpath) / name
                found[full.relative_to(root).as_posix()] = full
    return found


def changed_files(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> list[FileChange]:
    """Every file of the package that differs between the folders ``a`` and ``b`` (bytes), sorted."""
    mine, theirs = _files(Path(a)), _files(Path(b))
    changes = [FileChange(p, "removed") for p in mine.keys() - theirs.keys()]
    changes += [FileChange(p, "added") for p in theirs.keys() - mine.keys()]
    changes += [FileChange(p, "changed") for p in mine.keys() & theirs.keys()
                if not filecmp.cmp(mine[p], theirs[p], shallow=False)]
    return sorted(c for c in changes if c.path not in VERSION_FILES)


def _module_file(root: Path, parts: tuple[str, ...]) -> str | None:
    for candidate in ("/".join(parts) + ".py", "/".join(parts) + "/__init__.py"):
        if (root / candidate).is_file():
            return candidate
    return None


def _parse(root: Path, path: str) -> ast.Module | None:
    try:
        return ast.parse((root / path).read_text(errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return None


def imported_names(root: str | os.PathLike[str], path: str) -> set[tuple[str, str]]:
    """What the Python file ``path`` (under ``root``) takes from other modules of the package by
    name: (the module, as a path under the package without its suffix, the name), from
    ``from sglang.a import b`` and relative imports. ``import sglang.a`` takes no name."""
    tree = _parse(Path(root), path)
    if tree is None:
        return set()
    package = path.rsplit("/", 1)[0].split("/")  # a module's package is its folder (so is __init__'s)
    taken: set[tuple[str, str]] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            taken.update(("/".join(alias.name.split(".")), "") for alias in node.names
                         if alias.name.split(".")[0] == PACKAGE)
        elif isinstance(node, ast.ImportFrom):
            base = tuple(package[: len(package) - node.level + 1]) if node.level else ()
            module = base + (tuple(node.module.split(".")) if node.module else ())
            if module[:1] == (PACKAGE,):
                taken.update(("/".join(module), alias.name) for alias in node.names)
    return taken


def defined_names(root: str | os.PathLike[str], module: str) -> set[str] | None:
    """The names a module of the package defines at its top level (and its submodules), or None
    when it cannot be told (a star import, a module that does not parse)."""
    root = Path(root)
    path = _module_file(root, tuple(module.split("/")))
    tree = _parse(root, path) if path else None
    if path is None:
        return set()
    if tree is None:
        return None
    names: set[str] = set()
    for node in ast.walk(tree):  # every level: a name bound under ``if`` or ``try`` counts
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            if any(alias.name == "*" for alias in node.names):
                return None
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    if path.endswith("/__init__.py"):
        names.update(p.stem if p.suffix == ".py" else p.name for p in (root / module).iterdir()
                     if not p.name.startswith("__"))
    return names


def module_path(module: str, root: str | os.PathLike[str]) -> str | None:
    """The file of a module (as ``imported_names`` gives it) under ``root``."""
    return _module_file(Path(root), tuple(module.split("/")))


# ---- functions within a file ----------------------------------------------------------------------


@dataclass(frozen=True)
class _Def:
    first: int  # 0-based line of its first decorator or of ``def``/``class``
    end: int  # 0-based, exclusive
    text: str
    owner: str | None  # the class a method belongs to (None at the top level)
    is_class: bool


def _defs(text: str) -> dict[str, _Def]:
    """The units of a module: top-level functions, the methods (and nested classes) of its
    top-level classes, keyed by qualified name; a redefinition gets ``#2``."""
    lines = text.splitlines(keepends=True)
    found: dict[str, _Def] = {}

    def add(name: str, node: ast.stmt, owner: str | None) -> None:
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) - 1
        end = node.end_lineno or node.lineno
        while name in found:
            name += "#2"
        found[name] = _Def(first, end, "".join(lines[first:end]), owner, isinstance(node, ast.ClassDef))

    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            add(node.name, node, None)
        elif isinstance(node, ast.ClassDef):
            add(node.name, node, None)
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    add(f"{node.name}.{item.name}", item, node.name)
    return found


def _units(defs: dict[str, _Def], other: dict[str, _Def]) -> dict[str, _Def]:
    """The units of one side given the other's: a class both sides have is split into its methods;
    a class only this side has is one unit."""
    return {name: d for name, d in defs.items()
            if not (d.owner is None and d.is_class and name in other and other[name].is_class)
            and not (d.owner is not None and not _split(d.owner, other))}


def _split(owner: str, other: dict[str, _Def]) -> bool:
    """Whether the class ``owner`` is split into its methods: the other side has it as a class too."""
    return owner in other and other[owner].is_class and other[owner].owner is None


def _skeleton(text: str, units: dict[str, _Def]) -> list[str]:
    """The module with every unit cut out (a marker line in its place): what ``<module>`` is."""
    lines = text.splitlines(keepends=True)
    for name, d in sorted(units.items(), key=lambda item: -item[1].first):
        lines[d.first:d.end] = [f"<{name}>\n"]
    return lines


def function_changes(path: str, a_text: str, b_text: str) -> list[FunctionChange]:
    """The functions of one Python file that differ between A's text and B's, and ``<module>`` when
    what is left of the module differs."""
    a_all, b_all = _defs(a_text), _defs(b_text)
    a_units, b_units = _units(a_all, b_all), _units(b_all, a_all)
    changes = [FunctionChange(path, n, "removed") for n in a_units.keys() - b_units.keys()]
    changes += [FunctionChange(path, n, "added") for n in b_units.keys() - a_units.keys()]
    changes += [FunctionChange(path, n, "changed") for n in a_units.keys() & b_units.keys()
                if a_units[n].text != b_units[n].text]
    if _skeleton(a_text, a_units) != _skeleton(b_text, b_units):
        changes.append(FunctionChange(path, MODULE_REST, "changed"))
    return sorted(changes)


def unit_texts(a_text: str, b_text: str) -> dict[str, tuple[str, str]]:
    """Each unit's text on both sides (``""`` where a side lacks it); ``<module>``'s is what is
    left of the module once every unit is cut out."""
    a_all, b_all = _defs(a_text), _defs(b_text)
    a_units, b_units = _units(a_all, b_all), _units(b_all, a_all)
    texts = {name: (a_units[name].text if name in a_units else "", b_units[name].text if name in b_units else "")
             for name in a_units.keys() | b_units.keys()}
    texts[MODULE_REST] = ("".join(_skeleton(a_text, a_units)), "".join(_skeleton(b_text, b_units)))
    return texts


def hybrid_text(a_text: str, b_text: str, chosen: set[str]) -> str:
    """A's module with the units named in ``chosen`` as B has them (``<module>`` chosen: B's module
    with the units not chosen as A has them). A unit only one side has is added at the end of its
    class, or of the module."""
    a_all, b_all = _defs(a_text), _defs(b_text)
    a_units, b_units = _units(a_all, b_all), _units(b_all, a_all)
    base_is_b = MODULE_REST in chosen
    base_text, base_all, base_units = (b_text, b_all, b_units) if base_is_b else (a_text, a_all, a_units)
    lines = base_text.splitlines(keepends=True)
    edits: list[tuple[int, int, str]] = []  # (first, end, new text), applied from the bottom up
    for name in sorted(a_units.keys() | b_units.keys()):
        want_b = name in chosen
        if want_b == base_is_b:
            continue  # the base already has the version wanted
        wanted = (b_units if want_b else a_units).get(name)
        present = base_units.get(name)
        if present is not None:
            edits.append((present.first, present.end, wanted.text if wanted is not None else ""))
        elif wanted is not None:
            at = base_all[wanted.owner].end if wanted.owner in base_all else len(lines)
            edits.append((at, at, _ended(wanted.text)))
    for first, end, new in sorted(edits, key=lambda e: (-e[0], -e[1])):
        lines[first:end] = [new] if new else []
    return "".join(lines)


def _ended(text: str) -> str:
    return text if text.endswith("\n") else text + "\n"


# ---- folders ---------------------------------------------------------------------------------------


def build_hybrid(a: str | os.PathLike[str], overrides: dict[str, str | bytes | None],
                 dest: str | os.PathLike[str]) -> Path:
    """A copy of A's package in ``dest`` (``dest/sglang``), each file of ``overrides`` (path -> its
    text, None: removed) replaced. Files are hard-linked where the file system allows: a replaced
    file is unlinked before it is written (A's stays as it is), and its cached bytecode dropped."""
    dest = Path(dest)
    try:
        shutil.copytree(Path(a) / PACKAGE, dest / PACKAGE, copy_function=os.link)
    except OSError:
        shutil.rmtree(dest / PACKAGE, ignore_errors=True)
        shutil.copytree(Path(a) / PACKAGE, dest / PACKAGE)
    for path, text in overrides.items():
        target = dest / path
        if target.exists():
            target.unlink()
        for cached in (target.parent / "__pycache__").glob(f"{target.stem}.*.pyc"):
            cached.unlink()
        if text is not None:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(text if isinstance(text, bytes) else text.encode())
    return dest


def unified_diff(path: str, a_text: str, b_text: str) -> str:
    """``a_text`` -> ``b_text`` of one file, as ``diff -u`` writes it."""
    return "".join(difflib.unified_diff(a_text.splitlines(keepends=True), b_text.splitlines(keepends=True),
                                        f"a/{path}", f"b/{path}"))
