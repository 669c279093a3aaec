"""Load a plug-in candidate named ``package.module:name`` or ``path/to/file.py:name``.

A candidate replaces one SGLang function (SPEC section 9) and must have exactly its parameters.
Loading runs the candidate's module, so kvparity does it only inside the sandbox's child process
(``kvparity.candidate.sandbox``); the child sends a ``CandidateLoadError`` back as text and the parent raises
it again. The CLI maps ``CandidateLoadError`` to exit code 2 (a usage error, not a divergence).
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable
from typing import Any

from kvparity.candidate.targets import REGISTRY

# SGLang's parameter names per target (SPEC section 9), in order, from the targets' records.
# SGLang calls all three POSITIONALLY, so a candidate's own names do not matter: only how many
# positional parameters it takes, and that none is keyword-only. The names are for messages and
# documentation.
SIGNATURES: dict[str, tuple[str, ...]] = {name: target.signature for name, target in REGISTRY.items()}


class CandidateLoadError(Exception):
    """The candidate cannot be used at all (bad spec, missing file/module/name, wrong signature).
    A usage error: the CLI exits with code 2."""


def split_spec(spec: str) -> tuple[str, str]:
    """``"where:name"`` -> ``(where, name)``; the name is after the LAST colon."""
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name:
        raise CandidateLoadError(
            f"candidate {spec!r}: expected 'package.module:name' or 'path/to/file.py:name'")
    if not name.isidentifier():
        raise CandidateLoadError(f"candidate {spec!r}: {name!r} is not a Python name")
    return where, name


def is_file_spec(where: str) -> bool:
    return where.endswith(".py") or os.sep in where or "/" in where


def absolute_spec(spec: str) -> str:
    """The same spec with a file path made absolute (the sandbox child may run elsewhere)."""
    where, name = split_spec(spec)
    return f"{os.path.abspath(where)}:{name}" if is_file_spec(where) else spec


def _load_file(path: str, spec: str) -> Any:
    if not os.path.isfile(path):
        raise CandidateLoadError(f"candidate {spec!r}: file {path!r} does not exist")
    # The file's own folder goes first on sys.path, as ``python path/to/file.py`` would put it, so
    # a candidate may import a sibling module of its folder by its plain name. (Only the sandbox
    # child loads candidates; a sibling named like a module already imported there, say ``torch``,
    # is not the one it gets.)
    folder = os.path.dirname(os.path.abspath(path))
    if folder in sys.path:
        sys.path.remove(folder)
    sys.path.insert(0, folder)
    digest = hashlib.sha1(os.path.abspath(path).encode()).hexdigest()[:12]
    module_name = f"kvparity_candidate_{digest}"
    module_spec = importlib.util.spec_from_file_location(module_name, path)
    if module_spec is None or module_spec.loader is None:
        raise CandidateLoadError(f"candidate {spec!r}: cannot load {path!r} as a Python module")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module  # triton.jit needs the module to be importable by name
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(module_name, None)
        raise CandidateLoadError(
            f"candidate {spec!r}: running file {path!r} raised {type(exc).__name__}: {exc}") from exc
    return module


def _load_module(dotted: str, spec: str) -> Any:
    try:
        return importlib.import_module(dotted)
    except ModuleNotFoundError as exc:
        raise CandidateLoadError(f"candidate {spec!r}: module {dotted!r} not found ({exc})") from exc
    except Exception as exc:
        raise CandidateLoadError(
            f"candidate {spec!r}: importing module {dotted!r} raised {type(exc).__name__}: {exc}") from exc


def _attribute(module: Any, name: str, where: str, spec: str) -> Any:
    if hasattr(module, name):
        return getattr(module, name)
    public = [n for n in dir(module) if not n.startswith("_")]
    close = difflib.get_close_matches(name, public, n=3)
    defined = ", ".join(public[:12]) or "nothing public"
    hint = f"; did you mean {', '.join(close)}?" if close else f"; it defines {defined}"
    raise CandidateLoadError(f"candidate {spec!r}: {where!r} has no attribute {name!r}{hint}")


def _parameters(obj: Any) -> list[inspect.Parameter] | None:
    """The parameters of a function or a Triton kernel; ``None`` when they cannot be known."""
    fn = getattr(obj, "fn", None) if not inspect.isfunction(obj) else None  # triton JITFunction
    try:
        return list(inspect.signature(fn if callable(fn) else obj).parameters.values())
    except (TypeError, ValueError):
        return None


def signature_problem(obj: Any, target: str) -> str | None:
    """Why ``obj`` cannot be called as SGLang calls ``target``: with exactly
    ``len(SIGNATURES[target])`` positional arguments. ``None`` when it can (or cannot be told)."""
    expected = SIGNATURES[target]
    params = _parameters(obj)
    if params is None:
        return None
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    keyword_only = [p.name for p in params if p.kind == p.KEYWORD_ONLY and p.default is p.empty]
    takes_rest = any(p.kind == p.VAR_POSITIONAL for p in params)
    problems = []
    if keyword_only:
        problems.append(f"required keyword-only parameters ({', '.join(keyword_only)}) cannot be passed positionally")
    if len(required) > len(expected):
        problems.append(f"it requires {len(required)} positional arguments, SGLang passes {len(expected)}")
    elif len(positional) < len(expected) and not takes_rest:
        problems.append(f"it takes {len(positional)} positional arguments, SGLang passes {len(expected)}")
    if not problems:
        return None
    shown = ", ".join(p.name for p in params)
    return (f"SGLang calls {target} positionally as ({', '.join(expected)}); the candidate's parameters "
            f"({shown}) do not fit: " + "; ".join(problems))


def load_candidate(spec: str, target: str | None = None) -> Callable[..., Any]:
    """The object ``spec`` names. With ``target``, also check it is callable (or, for
    a target launched on a grid such as ``alloc_extend``, launchable as ``kernel[(bs,)](...)``)
    with SGLang's positional arguments.
    Raises ``CandidateLoadError`` naming the spec, the file or module, and what is wrong."""
    if target is not None and target not in SIGNATURES:
        raise CandidateLoadError(f"target {target!r} is not one of {tuple(SIGNATURES)}")
    where, name = split_spec(spec)
    module = _load_file(where, spec) if is_file_spec(where) else _load_module(where, spec)
    obj = _attribute(module, name, where, spec)
    launchable = hasattr(obj, "__getitem__") and target is not None and REGISTRY[target].grid_launch
    if not callable(obj) and not launchable:
        raise CandidateLoadError(f"candidate {spec!r}: {name!r} in {where!r} is a {type(obj).__name__}, not a function")
    if target is not None:
        problem = signature_problem(obj, target)
        if problem:
            raise CandidateLoadError(f"candidate {spec!r} for target {target}: {problem}")
    return obj
