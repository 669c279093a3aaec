"""Import-only stand-ins for modules on SGLang's import chain that the KV-index path never uses.

``import sglang.srt.managers.schedule_batch`` drags in SGLang's HTTP server, tokenizer, model
configs, API schemas, ... through ``sglang/__init__`` and ``sglang.srt.utils``; their third-party
packages are not needed to run ``Req`` / ``ScheduleBatch`` / the caches / the allocators. Each
package below is replaced, unless the real one is installed and allowed (``prefer_real``), by a
stand-in module that lets the import finish and raises ``StandInUsed`` on any real use:

- the stand-in's attributes, calls, subscripts, subclasses, ... are permitted only while some
  module is being imported (an ``importlib._bootstrap`` frame is on the stack): that is what
  ``from transformers import PretrainedConfig`` and ``class X(PretrainedConfig): ...`` need;
- anything else (calling it, reading an attribute, instantiating a class built on it, truth
  tests, iteration) raises, naming the stand-in and the caller, so a run that touches one fails
  instead of giving a verdict.

Modules SGLang imports inside ``try/except`` (``sgl_kernel``, ``torch_memory_saver``, ...) have NO
stand-in: their absence selects SGLang's CPU fallback. The table was found by importing each
supported version with nothing but torch, triton and numpy installed and adding one stand-in per
``ModuleNotFoundError`` that escaped SGLang.

This module never imports sglang and is used inside the worker only.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from dataclasses import dataclass
from typing import Any

from kvparity.engine.real import RealSGLangError


@dataclass(frozen=True)
class StandIn:
    reason: str  # who imports it unconditionally, and why this path does not need it
    prefer_real: bool  # use the installed real package when it imports cleanly


# Top-level package -> why it is on the chain (first unconditional importer; 0.5.3 .. 0.5.4 unless a release is named).
STANDINS: dict[str, StandIn] = {
    "tqdm": StandIn("sglang/__init__ -> sglang.lang.interpreter: progress bars of the frontend language", True),
    "pybase64": StandIn("sglang/utils.py: base64 of images for the frontend and HTTP API", True),
    "requests": StandIn("sglang/utils.py: HTTP client of the frontend (talks to a server)", True),
    "IPython": StandIn("sglang/utils.py: notebook display helpers", False),
    "pydantic": StandIn("sglang/utils.py and the OpenAI API schemas (entrypoints/openai/protocol.py)", False),
    "aiohttp": StandIn("sglang.lang.backend.runtime_endpoint: async HTTP client of the frontend", False),
    "safetensors": StandIn("srt/connector/serde/safe_serde.py: weight (de)serialisation for remote model loading", False),
    "psutil": StandIn("srt/utils/common.py: process and memory helpers of the server launcher", True),
    "zmq": StandIn("srt/utils/common.py: the IPC sockets between tokenizer, scheduler and detokenizer", False),
    "fastapi": StandIn("srt/utils/common.py: the HTTP server", False),
    "PIL": StandIn("srt/utils/common.py: image loading for multimodal inputs", False),
    "starlette": StandIn("srt/utils/common.py: the HTTP server's responses", False),
    "openai": StandIn("srt/entrypoints/openai/protocol.py: OpenAI API types", False),
    "partial_json_parser": StandIn("srt/function_call/base_format_detector.py: tool-call parsing", False),
    "huggingface_hub": StandIn("srt/utils/hf_transformers_utils.py: model downloads", False),
    "transformers": StandIn("srt/utils/hf_transformers_utils.py and srt/configs/*: tokenizers and model configs", False),
    "sentencepiece": StandIn("srt/configs/internvl.py: a tokenizer", True),
    "dill": StandIn("srt/managers/schedule_batch.py: pickling custom logit processors (unused here)", True),
    "msgspec": StandIn("srt/disaggregation/kv_events.py: KV-event serialisation (events disabled here)", True),
    "regex": StandIn("srt/configs/nemotron_h.py (0.5.3.post1+): config-pattern parsing", True),
    "orjson": StandIn("srt/server_args.py (0.5.3.post2+): JSON of server arguments", True),
    "xgrammar": StandIn("srt/entrypoints/openai/protocol.py (0.5.4): structured-output grammars", False),
    "torchvision": StandIn("srt/configs/deepseek_ocr.py (0.5.4): image transforms of an OCR model", False),
    "compressed_tensors": StandIn("srt/layers/quantization/compressed_tensors (0.5.9+, via configs.model_config): quantised weights", False),
    "gguf": StandIn("srt/layers/quantization/gguf.py (0.5.6+, via configs.model_config): GGUF weights", False),
    "pydantic_core": StandIn("srt/utils/msgspec_utils.py (0.5.22+): schemas of the API messages", False),
    # The real package (apache-tvm-ffi, the `real` extra on Linux x86_64) is used where it imports; elsewhere the
    # stand-in only has to let ``class PushPlane(tvm_ffi.Object)`` (wrapped by SGLang's lazy_register_class) and
    # ``from tvm_ffi import Module`` run at import: instantiating PushPlane or reaching any other tvm_ffi name raises.
    "tvm_ffi": StandIn(
        "kernels/ops/communication/all_reduce.py (0.5.23+, via srt/distributed/device_communicators/"
        "custom_all_reduce_v2.py): FFI objects of the custom all-reduce's JIT kernels (one process: no all-reduce)", True),
    # SGLang's own modules that import a NEVER_STAND_IN package unconditionally: the module itself
    # is stood in, so the package stays absent (and SGLang's fallbacks elsewhere still see it absent).
    "sglang.srt.layers.moe.moe_runner.deep_gemm": StandIn(
        "srt/layers/moe/moe_runner/runner.py (0.5.6+, via configs.model_config -> quantization): the DeepGEMM MoE "
        "runner, which imports sgl_kernel unconditionally", False),
    "sglang.srt.mem_cache.memory_pool_host": StandIn(
        "srt/mem_cache/hicache_storage.py (0.5.6+): HiCache's host-memory KV pool (hierarchical cache off here), which "
        "imports sgl_kernel.kvcacheio unconditionally on CUDA and CPU", False),
}

HOST_POOL_MODULE = "sglang.srt.mem_cache.memory_pool_host"


def table(host_pools: bool = False) -> dict[str, StandIn]:
    """The stand-ins of a worker; ``host_pools``: keep SGLang's real host pools (a release that
    imports ``sgl_kernel.kvcacheio`` on CUDA only, whose HiCache kvparity drives)."""
    return {name: s for name, s in STANDINS.items() if not (host_pools and name == HOST_POOL_MODULE)}


# Must never get a stand-in: SGLang imports them inside try/except and falls back without them.
NEVER_STAND_IN = ("sgl_kernel", "torch_memory_saver", "flashinfer", "vllm", "deep_gemm", "triton", "torch", "numpy")


class StandInUsed(RealSGLangError):
    """A stand-in was used after import: the run touched code this harness assumed unused."""


def _caller() -> str:
    """The first frame outside this module, as ``file:line in function``."""
    here = __file__
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename == here:
        frame = frame.f_back
    if frame is None:
        return "an unknown caller"
    return f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"


def _importing() -> bool:
    """True while some module is being imported (its body, or code its body calls)."""
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib._bootstrap"):
            return True
        frame = frame.f_back
    return False


# Reasons of the installed stand-ins (install() fills it from the table it was given).
_REASONS: dict[str, str] = {}


def _used(name: str, what: str) -> StandInUsed:
    stood_in = [n for n in (*_REASONS, *STANDINS) if name == n or name.startswith(n + ".")]
    top = max(stood_in, key=len) if stood_in else name.split(".")[0]
    reason = _REASONS.get(top) or (STANDINS[top].reason if top in STANDINS else "a stand-in")
    return StandInUsed(
        f"kvparity stand-in {name!r} was used ({what}) by {_caller()}: the real package {top!r} is not "
        f"installed because this path should not need it ({reason})"
    )


def _guard(name: str, what: str) -> None:
    if not _importing():
        raise _used(name, what)


# Dunder attributes a stand-in still answers (with a placeholder, during import): SGLang's import-time
# monkeypatches of transformers read ``PretrainedConfig.from_dict.__func__`` (0.5.11+) and iterate
# ``PretrainedConfig.__class_validators__`` (0.5.22+). Every other
# dunder stays absent so Python's own protocols (pickling, copying, ...) see no such attribute.
_PATCHABLE_DUNDERS = frozenset({"__func__", "__class_validators__"})


class _StandInMeta(type):
    """Metaclass of classes built on a stand-in (``class C(transformers.PretrainedConfig)``)."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        _guard(cls._standin_name, f"instantiating {cls.__qualname__}")
        return super().__call__(*args, **kwargs)

    def __getattr__(cls, attr: str) -> Any:
        if attr.startswith("__") and attr.endswith("__") and attr not in _PATCHABLE_DUNDERS:
            raise AttributeError(attr)
        _guard(cls._standin_name, f"reading {cls.__qualname__}.{attr}")
        return _Placeholder(f"{cls._standin_name}.{attr}")


class _StandInBase(metaclass=_StandInMeta):
    _standin_name = "?"

    def __init_subclass__(cls, **kwargs: Any) -> None:  # TypedDict-style keywords (total=False)
        pass

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass


class _Placeholder:
    """Any object reached through a stand-in module."""

    __slots__ = ("_standin_name",)

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "_standin_name", name)

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") and attr.endswith("__") and attr not in _PATCHABLE_DUNDERS:
            raise AttributeError(attr)
        name = object.__getattribute__(self, "_standin_name")
        _guard(name, f"reading .{attr}")
        return _Placeholder(f"{name}.{attr}")

    def __setattr__(self, attr: str, value: Any) -> None:
        _guard(self._standin_name, f"setting .{attr}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        _guard(self._standin_name, "calling it")
        return _Placeholder(f"{self._standin_name}()")

    def __getitem__(self, key: Any) -> Any:
        _guard(self._standin_name, "subscripting it")
        return _Placeholder(f"{self._standin_name}[...]")

    def __setitem__(self, key: Any, value: Any) -> None:  # registries: CONFIG_MAPPING._extra_content[k] = C
        _guard(self._standin_name, "assigning an item")

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        _guard(self._standin_name, "subclassing it")
        base = _StandInMeta(self._standin_name.rsplit(".", 1)[-1], (_StandInBase,), {"_standin_name": self._standin_name})
        return (base,)

    def __or__(self, other: Any) -> Any:  # PEP 604 unions in annotations evaluated at import
        _guard(self._standin_name, "a | union")
        return self

    __ror__ = __or__

    def __bool__(self) -> bool:
        _guard(self._standin_name, "a truth test")
        return True

    def __iter__(self) -> Any:
        # While importing, a stand-in iterates as empty: import-time patch loops over a stood-in
        # package's registries then do nothing, which is all an unused package needs.
        if _importing():
            return iter(())
        raise _used(self._standin_name, "iterating it")

    def __repr__(self) -> str:
        return f"<kvparity stand-in {self._standin_name}>"


class _StandInModule(types.ModuleType):
    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        _guard(self.__name__, f"reading {self.__name__}.{attr}")
        return _Placeholder(f"{self.__name__}.{attr}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, tops: frozenset[str]) -> None:
        self.tops = tops

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if any(fullname == name or fullname.startswith(name + ".") for name in self.tops):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StandInModule(spec.name)
        module.__path__ = []  # a package: ``from transformers.models.auto import X`` works
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


@dataclass
class Installed:
    stand_ins: tuple[str, ...]  # top-level names served by stand-ins
    real: tuple[str, ...]  # names of the table whose real package was importable and used
    finder: _Finder

    def used(self) -> list[str]:
        """The stand-in modules actually imported so far (dotted names)."""
        return sorted(n for n, m in list(sys.modules.items()) if isinstance(m, _StandInModule))

    def uninstall(self) -> None:
        if self.finder in sys.meta_path:
            sys.meta_path.remove(self.finder)
        for name in self.stand_ins:
            _REASONS.pop(name, None)


def _real_importable(top: str) -> bool:
    if importlib.util.find_spec(top) is None:
        return False
    try:
        importlib.import_module(top)
    except Exception:
        sys.modules.pop(top, None)
        return False
    return True


def install(table: dict[str, StandIn] | None = None) -> Installed:
    """Put the stand-in finder first on ``sys.meta_path`` (before sglang is imported)."""
    table = STANDINS if table is None else table
    bad = [n for n in table if n in NEVER_STAND_IN]
    if bad:
        raise RealSGLangError(f"stand-ins for {bad} would hide SGLang's own fallback for missing modules")
    real = tuple(sorted(n for n, s in table.items() if s.prefer_real and _real_importable(n)))
    tops = frozenset(n for n in table if n not in real)
    clash = sorted(n for n in tops if n in sys.modules)
    if clash:
        raise RealSGLangError(f"modules {clash} were imported before the stand-ins were installed")
    finder = _Finder(tops)
    _REASONS.update({n: table[n].reason for n in tops})
    sys.meta_path.insert(0, finder)
    return Installed(tuple(sorted(tops)), real, finder)


def is_standin(obj: Any) -> bool:
    return isinstance(obj, (_Placeholder, _StandInModule)) or (isinstance(obj, type) and issubclass(obj, _StandInBase))
