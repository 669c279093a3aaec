"""Triton's interpreter, a little cheaper per launch (CPU runs only; compiled Triton is untouched).

Before every launch the interpreter swaps each builtin of ``triton.language`` (and of its tensor,
math and descriptor classes) for an interpreter version, and puts them back after. To find them it
lists every member of each module and class again (``inspect.getmembers``), on every launch: a
sixth of a small scenario's time on the CPU went there. Which members are builtins never changes,
so the list is taken once per module or class and kept; the swap itself is Triton's, unchanged.

Installed only where this Triton has the function it replaces, with the signature it expects;
elsewhere nothing is changed (``installed()`` says which).
"""

from __future__ import annotations

import inspect
from typing import Any

_BUILTINS: dict[Any, list[tuple[str, Any]]] = {}  # module or class -> its builtins (name, member)
_INSTALLED = False


def builtins_of(pkg: Any) -> list[tuple[str, Any]]:
    """The builtins of ``pkg`` as Triton's interpreter patches them. Listed at ``install``, before
    any launch, for the modules and classes the interpreter patches (a call of a jitted helper
    from inside a kernel patches again while they are patched, when a fresh listing would find
    the interpreter's replacements instead); anything else is listed afresh each time, as Triton
    does."""
    import triton.language as tl

    if pkg in _BUILTINS:
        return _BUILTINS[pkg]
    return [(name, member) for name, member in inspect.getmembers(pkg) if tl.core.is_builtin(member)]


def install() -> bool:
    """Replace the interpreter's per-launch listing with ``builtins_of``; False (nothing changed)
    where this Triton's interpreter is not the one this was written against."""
    global _INSTALLED
    if _INSTALLED:
        return True
    from triton.runtime import interpreter

    original = getattr(interpreter, "_patch_builtin", None)
    patch_attr = getattr(interpreter, "_patch_attr", None)
    if original is None or patch_attr is None or \
            list(inspect.signature(original).parameters) != ["pkg", "builder", "scope"]:
        return False

    import triton.language as tl

    for pkg in (tl, tl.core, tl.tensor, tl.math, getattr(tl.core, "tensor_descriptor_base", None)):
        if pkg is None:
            continue
        _BUILTINS[pkg] = builtins_of(pkg)

    def _patch_builtin(pkg: Any, builder: Any, scope: Any) -> None:
        for name, member in builtins_of(pkg):
            patch_attr(pkg, name, member, builder, scope)

    interpreter._patch_builtin = _patch_builtin
    _INSTALLED = True
    return True


def installed() -> bool:
    return _INSTALLED
