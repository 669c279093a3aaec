"""Which adapter entry drives a folder of SGLang: chosen by what its code is, not by its version.

Every entry of the version table (``versions.SUPPORTED``) implies facts about SGLang's API: where
``write_cache_indices`` lives, which parameters ``ScheduleBatch.init_new`` takes, whether
``ChunkCache`` or ``checkpoint_kv_cache`` exist, how a request's fill boundary is set. The folder's
sources are read as syntax trees (never imported: this runs in the kvparity process) and every
entry's facts are checked; the entries whose facts all hold are the ones that can drive it. The
version, when the folder has one, only chooses among those (the release itself, else the newest
not after it) and names the world. A folder no entry fits is refused, naming the nearest
generation and the first fact that did not hold.

Facts name things the way the version table does: ``"pkg.module"`` (a module),
``"pkg.module:Name"`` (defined or imported at its top level) and ``"pkg.module:Class.member"`` (a
method, a class attribute, or an attribute a method assigns to ``self``).
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path

from kvparity.engine.real import RealSGLangError
from kvparity.engine.real.versions import (
    GENERATIONS,
    SUPPORTED,
    VersionEntry,
    latest_release_at_or_below,
    version_key,
)
from kvparity.engine.releases import UNIFIED_RADIX_CACHE

_SB = "sglang.srt.managers.schedule_batch"
_COMMON = "sglang.srt.mem_cache.common"
_REQ = f"{_SB}:Req"
_URC_MODULE = UNIFIED_RADIX_CACHE.split(":")[0]


@dataclass(frozen=True)
class Fact:
    """Something an entry needs of SGLang's code: that ``qualified`` exists (or, ``present=False``,
    that it does not), and, for a function, the parameters it takes after ``self`` / ``cls``."""

    qualified: str
    present: bool = True
    params: tuple[str, ...] | None = None
    # Text the function's source holds (``present``) or lacks: for a behaviour no name shows.
    says: str | None = None

    def describe(self) -> str:
        if self.says is not None:
            return f"{self.qualified} {'says' if self.present else 'does not say'} {self.says!r}"
        if not self.present:
            return f"{self.qualified} is absent"
        if self.params is not None:
            return f"{self.qualified} takes ({', '.join(self.params)})"
        return f"{self.qualified} exists"


def _admission_facts(style: str) -> list[Fact]:
    """How the PrefillAdder sets a request's fill boundary (``VersionEntry.admission``)."""
    setter, fill_len = Fact(f"{_REQ}.set_extend_input_len"), Fact(f"{_REQ}.fill_len")
    extend_range, extend_end = Fact(f"{_REQ}.set_extend_range"), Fact(f"{_REQ}.extend_end")
    absent = lambda fact: Fact(fact.qualified, present=False)  # noqa: E731 - a one-line helper
    return {
        "assign": [],  # 0.5.7 and 0.5.8 have the setter, unused by their PrefillAdder
        "setter": [setter, absent(fill_len)],
        "fill_len": [fill_len, absent(extend_range)],
        "extend_range": [extend_range],
        "extend_end": [extend_end, absent(extend_range)],
    }[style]


def _generation_facts(entry: VersionEntry) -> list[Fact]:
    """What marks the state model: where the matched prefix lives and what the caches take."""
    checkpoint = Fact(f"{_COMMON}:checkpoint_kv_cache", present=entry.generation == "prefix_len")
    if entry.generation == "prefix_len":
        return [checkpoint, Fact(f"{_REQ}.prefix_len"), Fact(f"{_REQ}.prefix_indices", present=False),
                Fact("sglang.srt.mem_cache.allocation:_prefix_kv_indices")]
    return [checkpoint, Fact(f"{_REQ}.prefix_indices")]


def _hybrid_cache_facts(entry: VersionEntry) -> list[Fact]:
    """Where the sliding-window and Mamba caches live, and that the trees of their own are gone
    where the entry says so."""
    facts = [Fact(entry.swa_allocator), Fact(entry.swa_kv_pool)]
    facts.append(Fact(f"{entry.swa_allocator}.__init__", says="page_size", present=entry.paged_swa))
    for tree, module in ((entry.swa_tree, "sglang.srt.mem_cache.swa_radix_cache"),
                         (entry.mamba_tree, "sglang.srt.mem_cache.mamba_radix_cache")):
        facts.append(Fact(tree) if tree is not None else Fact(module, present=False))
    if entry.component_types is not None:
        facts.append(Fact(entry.component_types))
    facts.append(Fact("sglang.srt.managers.scheduler:Scheduler._get_new_batch_prefill_raw",
                      says="revert matched mamba idx", present=entry.mamba_refusal_frees))
    # From 0.5.16 the factory builds a sliding-window model's tree as UnifiedRadixCache, not SWARadixCache.
    if entry.hybrid_tree == "unified":
        facts.append(Fact("sglang.srt.mem_cache.registry:default_radix_cache_factory",
                          says="swa_radix_cache import SWARadixCache", present=False))
    return facts


def _host_tier_facts(entry: VersionEntry) -> list[Fact]:
    """What a host tier's cache controller offers the stand-ins that run its storage inline."""
    controller = "sglang.srt.managers.cache_controller"
    return [Fact(f"{controller}:HiCacheController.storage_stop_event", present=entry.storage_stop_event),
            Fact(f"{controller}:HiCacheController._page_transfer_kv_batch", present=entry.batched_page_transfer),
            Fact(f"{controller}:get_tensor_model_parallel_rank", present=entry.controller_rank_functions),
            Fact("sglang.srt.runtime_context:ParallelContext.override_permanently",
                 present=entry.permanent_parallel_override),
            Fact(f"{controller}:HiCacheController.prefetch_sync_thread", present=entry.prefetch_acks),
            Fact(f"{controller}:HiCacheController.prefetch_thread_func", says="self.prefetch_buffer = Queue()",
                 present=not entry.prefetch_acks),
            Fact(f"{controller}:PrefetchAck", present=entry.prefetch_acks)]


def entry_facts(entry: VersionEntry) -> list[Fact]:
    """Every fact ``entry`` implies about SGLang's code, the state model's first."""
    facts = _generation_facts(entry)
    if entry.write_cache_indices is None:
        facts.append(Fact(f"{_SB}:ScheduleBatch.write_cache_indices", present=False))
    else:
        facts.append(Fact(entry.write_cache_indices))
    facts += [Fact(entry.get_last_loc), Fact(entry.alloc_extend_caller), Fact(entry.globals_target)]
    facts.append(Fact(f"{_SB}:ScheduleBatch.init_new", params=entry.init_new_params))
    facts.append(Fact(f"{_SB}:ScheduleBatch.release_req", params=entry.release_req_params))
    facts.append(Fact(entry.chunk_cache) if entry.chunk_cache else Fact("sglang.srt.mem_cache.chunk_cache", present=False))
    # Where the entry says a release has none of these, it has none (a later release added them).
    for where, absent in ((entry.finish_via, f"{_COMMON}:release_kv_cache"),
                          (entry.evict_params, "sglang.srt.mem_cache.base_prefix_cache:EvictParams"),
                          (entry.cache_init_params, "sglang.srt.mem_cache.cache_init_params")):
        facts.append(Fact(where) if where is not None else Fact(absent, present=False))
    if entry.unified_radix_cache is not None:  # it exists from 0.5.11; servers build it from 0.5.19
        facts.append(Fact(entry.unified_radix_cache))
    facts.append(Fact(f"{_REQ}.req_pool_idx", present=not entry.req_kv_info))  # moved to req.kv (0.5.19)
    facts += [Fact(f"{UNIFIED_RADIX_CACHE}._execute_kv_backup", present=entry.unified_tree_core),
              Fact(f"{_SB}:ScheduleBatch.req_pool_indices_cpu", present=entry.batch_rows_on_host),
              Fact(f"{_REQ}.host_loaded_length", present=entry.host_loaded_length),
              Fact(f"{_REQ}.lock_receipt", present=entry.lock_receipt),
              Fact(f"{_REQ}.needs_host_load_back", present=entry.needs_host_load_back),
              Fact(f"{_REQ}.cache_request_handle", present=entry.cache_request_handle),
              Fact(f"{UNIFIED_RADIX_CACHE}.tree_core", present=entry.unified_tree_core),
              Fact(f"{_URC_MODULE}:_OngoingLoadBack.node_id", present=entry.unified_tree_core),
              Fact("sglang.srt.mem_cache.unified_cache.unified_tree_core:UnifiedTreeNode.load_back_pending_id",
                   present=entry.node_pending_ids),
              Fact("sglang.srt.mem_cache.memory_pool:HybridReqToTokenPool.mamba_allocator", present=entry.mamba_allocator),
              Fact(f"{_SB}:ReqKvInfo.mamba_pool_idx", present=entry.req_kv_info),
              Fact("sglang.srt.managers.scheduler:Scheduler.ipc_channels", present=entry.scheduler_ipc_channels),
              Fact(entry.release_req_function or f"{_SB}:release_req", present=entry.release_req_function is not None),
              Fact("sglang.srt.mem_cache.radix_cache:RadixKey.extra_key"),
              Fact("sglang.srt.mem_cache.radix_cache:RadixKey.token_ids"),
              Fact(f"{_SB}:ScheduleBatch.mamba_clear_indices", present=entry.deferred_mamba_state_work),
              Fact(f"{_SB}:ScheduleBatch.mamba_cow_src_indices", present=entry.deferred_mamba_state_work)]
    if entry.mamba_tree is not None and entry.hybrid_tree == "own":
        facts.append(Fact(f"{entry.mamba_tree}.all_mamba_values_flatten", present=entry.mamba_values_flatten))
    if entry.write_cache_indices is None:  # nor a module function of that name
        facts.append(Fact(f"{_COMMON}:write_cache_indices", present=False))
    facts += _host_tier_facts(entry)
    facts += _hybrid_cache_facts(entry)
    facts += _admission_facts(entry.admission)
    # 0.5.4: a retracted request keeps its row index (the one behaviour of 0.5.3.post2 .. 0.5.5 no name shows).
    facts.append(Fact(f"{_REQ}.reset_for_retract", says="self.req_pool_idx = None",
                      present=entry.retract_clears_req_pool_idx))
    return facts


# --------------------------------------------------------------------------- reading the sources


class SourceApi:
    """What the ``sglang`` package under ``folder`` defines, read from its files' syntax trees."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)

    def _module_path(self, module: str) -> Path | None:
        base = self.folder.joinpath(*module.split("."))
        for path in (base.with_suffix(".py"), base / "__init__.py"):
            if path.is_file():
                return path
        return None

    @functools.cache  # noqa: B019 - one SourceApi per folder and probe; the trees are read once
    def _tree(self, module: str) -> ast.Module | None:
        path = self._module_path(module)
        if path is None:
            return None
        try:
            return ast.parse(path.read_text(encoding="utf-8"))
        except (OSError, SyntaxError, ValueError):
            return None

    def _top_level(self, module: str, name: str, hops: int = 3) -> ast.AST | None:
        """The definition of ``name`` in ``module``: a def or class (followed through
        ``from X import name`` up to ``hops`` times), or an assignment / an import (returned as is)."""
        tree = self._tree(module)
        if tree is None:
            return None
        for node in _top_statements(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
                return node
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and name in _assigned_names(node):
                return node
            if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == name for a in node.names):
                original = next(a.name for a in node.names if (a.asname or a.name) == name)
                source = _absolute(module, node, self._module_path(module))
                found = self._top_level(source, original, hops - 1) if hops > 0 and source else None
                return found or node
        return None

    def _resolve(self, qualified: str) -> ast.AST | None | bool:
        module, _, attr = qualified.partition(":")
        if not attr:
            return self._module_path(module) is not None
        name, _, member = attr.partition(".")
        node = self._top_level(module, name)
        if not member:
            return node
        if not isinstance(node, ast.ClassDef):
            return None
        return _class_member(node, member)

    def has(self, qualified: str) -> bool:
        return bool(self._resolve(qualified))

    def says(self, qualified: str, text: str) -> bool:
        """Whether the source of the function ``qualified`` holds ``text``."""
        node = self._resolve(qualified)
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return False
        module = qualified.partition(":")[0]
        path = self._module_path(module)
        source = ast.get_source_segment(path.read_text(encoding="utf-8"), node) if path else None
        return text in (source or "")

    def params(self, qualified: str) -> tuple[str, ...] | None:
        """The parameters of a function after ``self`` / ``cls`` (methods that are not static)."""
        node = self._resolve(qualified)
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return None
        args = node.args
        names = [a.arg for a in args.posonlyargs + args.args]
        static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in node.decorator_list)
        if ":" in qualified and "." in qualified.partition(":")[2] and not static:
            names = names[1:]
        return tuple(names + [a.arg for a in args.kwonlyargs])

    def problems(self, facts: list[Fact]) -> list[str]:
        """The facts that do not hold here, in order, each said in one phrase."""
        out = []
        for fact in facts:
            if fact.says is not None:
                if self.says(fact.qualified, fact.says) != fact.present:
                    out.append(f"{fact.qualified} {'does not say' if fact.present else 'says'} {fact.says!r}")
                continue
            present = self.has(fact.qualified)
            if present != fact.present:
                out.append(f"{fact.qualified} is {'missing' if fact.present else 'present'}")
            elif fact.params is not None and self.params(fact.qualified) != fact.params:
                found = self.params(fact.qualified)
                out.append(f"{fact.qualified} takes ({', '.join(found or ())}), not ({', '.join(fact.params)})")
        return out


def _top_statements(tree: ast.Module) -> list[ast.stmt]:
    """Top-level statements, with those inside ``if`` / ``try`` blocks (TYPE_CHECKING imports,
    optional imports) after the rest."""
    out: list[ast.stmt] = []
    nested: list[ast.stmt] = []
    for node in tree.body:
        if isinstance(node, (ast.If, ast.Try)):
            for block in (node.body, node.orelse, *(h.body for h in getattr(node, "handlers", []))):
                nested.extend(block)
        else:
            out.append(node)
    return out + nested


def _assigned_names(node: ast.Assign | ast.AnnAssign) -> set[str]:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    return {t.id for t in targets if isinstance(t, ast.Name)}


def _absolute(module: str, node: ast.ImportFrom, path: Path | None) -> str | None:
    """The module an ``ImportFrom`` in ``module`` names, relative imports resolved."""
    if not node.level:
        return node.module
    package = module.split(".")
    if path is None or path.name != "__init__.py":
        package = package[:-1]
    package = package[: len(package) - (node.level - 1)]
    return ".".join(package + ([node.module] if node.module else []))


def _class_member(cls: ast.ClassDef, member: str) -> ast.AST | None:
    """A method, property or class attribute named ``member``, else an assignment to
    ``self.member`` in one of its methods."""
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == member:
            return node
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and member in _assigned_names(node):
            return node
    for inner in ast.walk(cls):
        if isinstance(inner, ast.Attribute) and isinstance(inner.ctx, ast.Store) and inner.attr == member:
            if isinstance(inner.value, ast.Name) and inner.value.id == "self":
                return inner
    return None


# --------------------------------------------------------------------------- choosing


@dataclass(frozen=True)
class Choice:
    entry: VersionEntry  # the entry that drives the folder
    candidates: tuple[str, ...]  # every release whose facts hold there, oldest first


def choose_entry(folder: str | Path, version: str | None) -> Choice:
    """The entry that drives the ``sglang`` package in ``folder`` (see the module docstring).
    ``version``: the folder's version, or None when it has none. Raises RealSGLangError when no
    entry's facts hold, naming the nearest generation and the first fact that failed."""
    api = SourceApi(folder)
    ordered = sorted(SUPPORTED, key=version_key)
    problems = {release: api.problems(entry_facts(SUPPORTED[release])) for release in ordered}
    fits = [release for release in ordered if not problems[release]]
    if not fits:
        raise _refusal(folder, version, problems)
    chosen = None
    if version is not None:
        chosen = version if version in fits else latest_release_at_or_below(version, fits)
    return Choice(SUPPORTED[chosen or fits[-1]], tuple(fits))


def _refusal(folder: str | Path, version: str | None, problems: dict[str, list[str]]) -> RealSGLangError:
    """The nearest entry: fewest failed facts, then the one nearest the version (the newest when
    there is none)."""
    releases = list(problems)
    fewest = min(len(p) for p in problems.values())
    near = [r for r in releases if len(problems[r]) == fewest]
    pick = (latest_release_at_or_below(version, near) if version else None) or near[-1]
    generation = SUPPORTED[pick].generation
    named = f"version {version}" if version else "no version"
    return RealSGLangError(
        f"the sglang package in {str(folder)!r} ({named}) matches no SGLang generation kvparity drives: the nearest is "
        f"the {generation!r} generation ({GENERATIONS[generation]}), as in {pick}, where {problems[pick][0]}"
        + (f" (and {fewest - 1} more)" if fewest > 1 else "")
    )
