"""Real SGLang's own functions as candidates: ``--candidate sglang:BACKEND`` (or
``sglang==VERSION:BACKEND``) checks the function SGLang itself runs for the target on that backend,
lifted unchanged from an installed release into a module of its own at check time (nothing of
SGLang's source is stored in this repository).

A lifted module holds the function and the functions and Triton kernels of its own module it calls
(by name, transitively), after a short header: torch and Triton imported, and stand-ins for the two
SGLang helpers these functions consult to choose their backend (``get_global_server_args`` and
``support_triton``), set to the backend asked for. Where SGLang's function takes other arguments
than the target's (its torch allocation twin), the module ends with SGLang's call site, as its
allocator makes it, under the target's signature.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from kvparity.candidate.loader import CandidateLoadError

PREFIX = "sglang"
BACKENDS = ("triton", "torch")
ATTENTION_BACKEND = {"triton": "triton", "torch": "torch_native"}  # what a server on that backend runs


@dataclass(frozen=True)
class Lift:
    release: str  # the release it is lifted from, by default
    path: str  # the file, under the folder holding the package
    function: str  # what is lifted (and its callees of the same module)
    call: str | None = None  # SGLang's call site under the target's signature, when it differs


_MEM = "sglang/srt/mem_cache"
_ALLOC_NAIVE_CALL = '''

def alloc_extend(pre_lens, seq_lens, last_loc, free_pages, out_indices, bs_upper, page_size, max_num_extend_tokens):
    # as PagedTokenToKVPoolAllocator.alloc_extend calls it on a platform without Triton
    alloc_extend_naive(pre_lens, seq_lens, last_loc, free_pages, out_indices, page_size, out_indices.device)
'''
LIFTS: dict[tuple[str, str], Lift] = {
    ("write_cache_indices", "triton"): Lift("0.5.3.post2", f"{_MEM}/common.py", "write_cache_indices"),
    ("write_cache_indices", "torch"): Lift("0.5.3.post2", f"{_MEM}/common.py", "write_cache_indices"),
    ("get_last_loc", "triton"): Lift("0.5.3.post2", f"{_MEM}/common.py", "get_last_loc_triton"),
    ("get_last_loc", "torch"): Lift("0.5.3.post2", f"{_MEM}/common.py", "get_last_loc_torch"),
    ("alloc_extend", "triton"): Lift("0.5.3.post2", f"{_MEM}/allocator.py", "alloc_extend_kernel"),
    # SGLang's torch twin of the allocation kernel (0.5.22 on), with the allocator's call site.
    ("alloc_extend", "torch"): Lift("0.5.22", f"{_MEM}/allocator/paged.py", "alloc_extend_naive", _ALLOC_NAIVE_CALL),
}

_HEADER = '''"""Lifted at check time from SGLang {release} ({path}): {names}."""
from __future__ import annotations

import torch
import triton
import triton.language as tl


class _ServerArgs:  # kvparity's stand-in: a server whose attention backend is {attention!r}
    attention_backend = {attention!r}


def get_global_server_args():
    return _ServerArgs


def support_triton(backend):
    return backend != "torch_native"


'''


def is_lift_spec(spec: str) -> bool:
    where = spec.rpartition(":")[0]
    return where == PREFIX or where.startswith(PREFIX + "==")


def lift(spec: str, target: str, folder: Path) -> str:
    """``sglang[==VERSION]:BACKEND`` lifted for ``target`` into a file of ``folder``; returns the
    ``path/to/file.py:name`` spec the sandbox loads."""
    from kvparity.engine.errors import RealSGLangError
    from kvparity.engine.real.door import resolve

    where, _, backend = spec.rpartition(":")
    entry = LIFTS.get((target, backend))
    if entry is None:
        raise CandidateLoadError(f"candidate {spec!r}: SGLang's own function is lifted for backends "
                                 f"{', '.join(BACKENDS)} of the targets {', '.join(sorted({t for t, _ in LIFTS}))}")
    release = where.partition("==")[2] or entry.release
    try:
        source = Path(resolve(release).path) / entry.path
    except RealSGLangError as exc:
        raise CandidateLoadError(f"candidate {spec!r}: {exc}") from None
    if not source.is_file():
        raise CandidateLoadError(f"candidate {spec!r}: SGLang {release} has no {entry.path}")
    text = source.read_text()
    names = lifted_names(text, entry.function)
    if not names:
        raise CandidateLoadError(f"candidate {spec!r}: SGLang {release}'s {entry.path} has no {entry.function}")
    body = "\n\n".join(_segment(text, node) for node in _top_level(text) if node.name in names)
    header = _HEADER.format(release=release, path=entry.path, names=", ".join(sorted(names)),
                            attention=ATTENTION_BACKEND[backend])
    dest = folder / f"sglang_{release.replace('.', '_')}_{target}_{backend}.py"
    dest.write_text(header + body + "\n" + (entry.call or ""))
    return f"{dest}:{target if entry.call else entry.function}"


def _top_level(text: str) -> list[ast.FunctionDef]:
    return [n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef)]


def lifted_names(text: str, function: str) -> set[str]:
    """``function`` and the top-level functions of its module it calls, transitively."""
    defs = {n.name: n for n in _top_level(text)}
    if function not in defs:
        return set()
    found, todo = {function}, [function]
    while todo:
        for node in ast.walk(defs[todo.pop()]):
            if isinstance(node, ast.Name) and node.id in defs and node.id not in found:
                found.add(node.id)
                todo.append(node.id)
    return found


def _segment(text: str, node: ast.FunctionDef) -> str:
    decorators = "".join(f"@{ast.get_source_segment(text, d)}\n" for d in node.decorator_list)
    return decorators + (ast.get_source_segment(text, node) or "")
