"""The real-SGLang worker process, and ``RealWorker``, its handle in the kvparity process.

Worker: ``python -m kvparity.engine.real.worker --sglang DIR [--expect VERSION] [--plugin MODULE ...]``
(``DIR`` holds the ``sglang`` package). It imports kvparity's ``kernels.runtime`` first (which sets
``TRITON_INTERPRET=1`` when there is no CUDA), puts ``DIR`` first on ``sys.path``, installs the
stand-ins, imports the real SGLang, checks its version and the adapter entry, imports the plugins,
then serves calls. ``--bare`` skips SGLang entirely (protocol tests).

Protocol: JSON lines on a private copy of the worker's stdout/stdin (fd 1 is pointed at stderr and
fd 0 at /dev/null, so nothing SGLang prints can break it). The worker first sends
``{"ready": true, "info": {...}}`` (or ``{"ready": false, "error": ...}`` and exits); then for
each ``{"id", "method", "kwargs"}`` it answers ``{"id", "ok": true, "result"}`` or ``{"id", "ok":
false, "error": {"type", "message", "traceback", "oom"}}``. Arguments and results are plain data
(ints, floats, strings, bools, None, lists, dicts with string keys).

Remote methods are functions ``fn(ctx, **kwargs)`` registered with ``@remote``; ``ctx.objects``
holds named objects (worlds, batches, requests) across calls. Plugins register more methods by
importing this module (``from kvparity.engine.real.worker import remote``).

Parent: ``RealWorker(source)`` with ``start()``, ``call(method, timeout=..., **kwargs)`` and
``close()``. A worker that dies or hangs raises ``WorkerDied`` / ``WorkerHung`` (the process is
gone afterwards, the next ``call`` starts a fresh one); the kvparity process never dies or hangs.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvparity.engine.errors import WorkerStartError
from kvparity.engine.real import RealSGLangError
from kvparity.engine.release_order import parse_version

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
DEFAULT_CALL_TIMEOUT = 120.0
DEFAULT_START_TIMEOUT = 180.0

# Modules the worker imports from SGLang before it reports ready (the rest is imported lazily by
# SGLang itself). Timed as "import_s".
SGLANG_MODULES = (
    "sglang.srt.managers.schedule_batch",
    "sglang.srt.mem_cache.radix_cache",
    "sglang.srt.mem_cache.allocator",
    "sglang.srt.mem_cache.memory_pool",
    "sglang.srt.sampling.sampling_params",
    "sglang.srt.sampling.sampling_batch_info",
    "sglang.srt.speculative.spec_info",
    "sglang.srt.server_args",
)


# --------------------------------------------------------------------------- errors (parent side)


class _Pickled(RealSGLangError):
    """An error rebuilt from its constructor's arguments when unpickled (a job process's exception
    reaches the parent pickled; the default rebuilds from the message alone)."""

    _args: tuple[Any, ...] = ()

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return type(self), self._args


class WorkerDied(_Pickled):
    """The worker process ended during a call (a signal such as SIGSEGV, or an exit)."""

    def __init__(self, method: str, returncode: int | None, stderr_tail: str = "", label: str = "worker") -> None:
        self._args = (method, returncode, stderr_tail, label)  # how it pickles (a job's exception crosses processes)
        self.method = method
        self.returncode = returncode
        self.signal = -returncode if returncode is not None and returncode < 0 else None
        self.exit_code = returncode if returncode is not None and returncode >= 0 else None
        self.stderr_tail = stderr_tail
        if self.signal is not None:
            try:
                how = f"signal {self.signal} {signal.Signals(self.signal).name}"
            except ValueError:
                how = f"signal {self.signal}"
        else:
            how = f"exit code {self.exit_code}"
        quoted = f"; its stderr ends with:\n{stderr_tail}" if stderr_tail else ""
        super().__init__(f"the {label} died ({how}) during {method}{quoted}")


class WorkerHung(_Pickled):
    """A call did not answer within its timeout; the worker was killed."""

    def __init__(self, method: str, timeout: float, label: str = "worker") -> None:
        self._args = (method, timeout, label)
        self.method = method
        self.timeout = timeout
        super().__init__(f"the {label} hung for more than {timeout:g} s during {method} (killed)")


class RemoteError(_Pickled):
    """The remote method raised. ``type`` / ``remote_message`` / ``remote_traceback`` are the
    worker's; ``oom`` is the kind of SGLang out-of-memory error (see VersionEntry.oom_messages) or None."""

    def __init__(self, method: str, error: dict[str, Any]) -> None:
        self._args = (method, error)
        self.method = method
        self.type = error.get("type", "?")
        self.remote_message = error.get("message", "")
        self.remote_traceback = error.get("traceback", "")
        self.oom = error.get("oom")
        super().__init__(f"{method} raised {self.type}: {self.remote_message}")


# --------------------------------------------------------------------------- parent side


def worker_env(extra: dict[str, str]) -> dict[str, str]:
    """A worker's environment: this one, ``extra``, kvparity on the path, crash dumps on."""
    env = dict(os.environ)
    env.update(extra)
    env["PYTHONPATH"] = os.pathsep.join([REPO_ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env["PYTHONFAULTHANDLER"] = "1"  # a segfault prints the Python stack into the stderr file
    env["PYTHONUNBUFFERED"] = "1"
    return env


class RealWorker:
    """One worker process holding one real SGLang version.

    ``source``: an ``install.SGLangSource``, or anything ``install.resolve`` accepts (a version or
    a path), or None with ``bare=True`` (no SGLang: protocol tests)."""

    def __init__(
        self,
        source: Any = None,
        *,
        call_timeout: float = DEFAULT_CALL_TIMEOUT,
        start_timeout: float = DEFAULT_START_TIMEOUT,
        plugins: tuple[str, ...] = (),
        bare: bool = False,
        env: dict[str, str] | None = None,
        auto_restart: bool = True,
    ) -> None:
        if source is not None and not hasattr(source, "path"):
            from kvparity.engine.real import install

            source = install.resolve(str(source))
        if source is None and not bare:
            raise RealSGLangError("RealWorker needs an SGLang source (a version, a path or an SGLangSource), or bare=True")
        self.source = source
        self.call_timeout = call_timeout
        self.start_timeout = start_timeout
        self.plugins = tuple(plugins)
        self.bare = bare
        self.extra_env = dict(env or {})
        self.auto_restart = auto_restart  # a call on a dead worker starts a fresh one (objects are lost)
        self.proc: subprocess.Popen[bytes] | None = None
        self.stderr_file: Any = None
        self.pending = b""
        self.next_id = 0
        self.starts = 0
        self.info: dict[str, Any] = {}
        self.last_stderr = ""

    @property
    def label(self) -> str:
        if self.source is None:
            return "bare worker"
        return f"sglang-{self.source.version} worker"

    def __enter__(self) -> RealWorker:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def _command(self) -> list[str]:
        cmd = [sys.executable, "-m", "kvparity.engine.real.worker"]
        if self.bare:
            cmd.append("--bare")
        else:
            cmd += ["--sglang", self.source.path, "--expect", self.source.version, "--entry", self.source.entry.version]
        for plugin in self.plugins:
            cmd += ["--plugin", plugin]
        return cmd

    def _env(self) -> dict[str, str]:
        return worker_env(self.extra_env)

    def start(self) -> dict[str, Any]:
        """(Re)start the worker; returns its ``info`` (version, import time, stand-ins, ...)."""
        self.close()
        self.stderr_file = tempfile.TemporaryFile()
        self.proc = self._forked()
        if self.proc is None:
            self.proc = subprocess.Popen(
                self._command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr_file,
                cwd=REPO_ROOT, env=self._env(),
                start_new_session=True,  # its own process group: close() ends what it spawned, nothing else
            )
        assert self.proc.stdin is not None
        os.set_blocking(self.proc.stdin.fileno(), False)  # see _send
        self.pending = b""
        self.starts += 1
        t0 = time.monotonic()
        try:
            ready = self._receive(self.start_timeout, "startup")
        except (WorkerDied, WorkerHung) as exc:
            self.close()
            raise WorkerStartError(f"the {self.label} failed to start: {exc}") from exc
        if not ready.get("ready"):
            tail = self.stderr_tail()
            self.close()
            raise WorkerStartError(f"the {self.label} failed to start: {ready.get('error', 'no reason given')}"
                                   + (f"\n{tail}" if tail else ""))
        self.info = dict(ready.get("info", {}))
        self.info["start_s"] = round(time.monotonic() - t0, 3)
        return self.info

    def _forked(self) -> Any:
        """This worker forked from the run's zygote of its source (``kvparity.engine.real.zygote``),
        or None: there is none (or it cannot fork), and the worker is spawned."""
        if self.bare or self.extra_env:
            return None
        from kvparity.engine.real import zygote

        try:
            path = zygote.socket_for(zygote.source_key(self.source, self.plugins), self.start_timeout)
            assert self.stderr_file is not None
            return zygote.ForkedProcess(path, self.stderr_file.fileno(), self.start_timeout)
        except zygote.Unavailable:
            return None

    def close(self) -> None:
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # the group this RealWorker started
            except (ProcessLookupError, PermissionError):
                pass
            if hasattr(self.proc, "kill"):  # a forked worker not yet in a group of its own
                self.proc.kill()
            self.proc.wait()
            for stream in (self.proc.stdin, self.proc.stdout):
                if stream:
                    try:
                        stream.close()
                    except OSError:
                        pass
            self.proc = None
        if self.stderr_file is not None:
            self.last_stderr = self.stderr_tail(80)  # what a died or hung worker said last
            self.stderr_file.close()
            self.stderr_file = None

    def stderr_tail(self, lines: int = 15) -> str:
        if self.stderr_file is None:
            return ""
        self.stderr_file.seek(0)
        text = self.stderr_file.read().decode(errors="replace")
        return "\n".join(text.strip().splitlines()[-lines:])

    def _died(self, method: str) -> WorkerDied:
        assert self.proc is not None
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        exc = WorkerDied(method, self.proc.returncode, self.stderr_tail(80), self.label)
        self.close()
        return exc

    def _send(self, data: bytes, deadline: float, limit: float, method: str) -> None:
        """Write ``data`` to the worker without ever blocking past ``deadline`` (a busy worker
        that does not read its stdin cannot hang this process through a full pipe)."""
        assert self.proc is not None and self.proc.stdin is not None
        fd = self.proc.stdin.fileno()
        view = memoryview(data)
        while view:
            left = deadline - time.monotonic()
            if left <= 0:
                self.close()
                raise WorkerHung(method, limit, self.label)
            _, writable, _ = select.select([], [fd], [], left)
            if not writable:
                continue
            try:
                sent = os.write(fd, view)
            except BlockingIOError:
                continue
            except (BrokenPipeError, OSError):
                raise self._died(method) from None
            view = view[sent:]

    def _receive(self, timeout: float, method: str, limit: float | None = None) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self.pending:
            left = deadline - time.monotonic()
            if left <= 0:
                self.close()
                raise WorkerHung(method, timeout if limit is None else limit, self.label)
            readable, _, _ = select.select([fd], [], [], left)
            if not readable:
                continue
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                raise self._died(method)
            self.pending += chunk
        line, _, self.pending = self.pending.partition(b"\n")
        return json.loads(line)

    def call(self, method: str, timeout: float | None = None, **kwargs: Any) -> Any:
        """Run remote ``method(**kwargs)``; returns its plain-data result. Raises RemoteError when
        it raised, WorkerDied / WorkerHung when the process died or did not answer within
        ``timeout`` (default ``call_timeout``); the next call then starts a fresh worker."""
        if not self.alive:
            if self.starts and not self.auto_restart:
                raise RealSGLangError(f"the {self.label} is not running (it died or hung earlier): call start()")
            self.start()
        assert self.proc is not None and self.proc.stdin is not None
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "kwargs": kwargs}
        try:
            data = (json.dumps(message) + "\n").encode()
        except (TypeError, ValueError) as exc:
            raise RealSGLangError(f"the arguments of {method} are not plain data: {exc}") from None
        limit = self.call_timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        self._send(data, deadline, limit, method)
        reply = self._receive(max(deadline - time.monotonic(), 0.0), method, limit)
        if reply.get("id") != self.next_id:
            self.close()
            raise RealSGLangError(f"the {self.label} answered call {reply.get('id')} to call {self.next_id} ({method})")
        if not reply.get("ok"):
            raise RemoteError(method, reply.get("error", {}))
        return reply.get("result")


# --------------------------------------------------------------------------- worker side

REMOTE: dict[str, Callable[..., Any]] = {}


def remote(fn: Callable[..., Any] | None = None, *, name: str | None = None) -> Any:
    """Register ``fn(ctx, **kwargs)`` as a remote method (``@remote`` or ``@remote(name=...)``)."""

    def register(f: Callable[..., Any]) -> Callable[..., Any]:
        key = name or f.__name__
        if key in REMOTE and REMOTE[key] is not f:
            raise RealSGLangError(f"remote method {key!r} is registered twice")
        REMOTE[key] = f
        return f

    return register(fn) if fn is not None else register


@dataclass
class Context:
    """What remote methods see: the version entry, named objects kept across calls, startup facts."""

    entry: Any = None  # versions.VersionEntry, None in a bare worker
    sglang_dir: str | None = None
    objects: dict[str, Any] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    standins: Any = None

    def get(self, name: str) -> Any:
        if name not in self.objects:
            raise KeyError(f"no object named {name!r} in the worker (have: {sorted(self.objects)})")
        return self.objects[name]

    def require_sglang(self) -> Any:
        if self.entry is None:
            raise RealSGLangError("this is a bare worker: it has no SGLang")
        return self.entry


def plain(value: Any) -> Any:
    """``value`` as JSON-able plain data (tensors and tuples become lists)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if hasattr(value, "tolist"):  # torch tensors, numpy values
        return plain(value.tolist())
    raise TypeError(f"{type(value).__name__} is not plain data")


def _plain_leaf(value: Any) -> Any:
    """What ``json.dumps`` cannot write itself: a tensor or NumPy value, as ``plain`` makes it."""
    if hasattr(value, "tolist"):
        return plain(value.tolist())
    raise TypeError(f"{type(value).__name__} is not plain data")


@remote
def hello(ctx: Context) -> dict[str, Any]:
    """Startup facts: version, family, import time, stand-ins, Triton mode, pid."""
    return dict(ctx.info, methods=sorted(REMOTE))


@remote
def echo(ctx: Context, **kwargs: Any) -> dict[str, Any]:
    return kwargs


@remote
def sleep(ctx: Context, seconds: float) -> float:
    """Sleep (tests use it to simulate a hung call)."""
    time.sleep(seconds)
    return seconds


@remote
def crash(ctx: Context, how: str = "exit", code: int = 3) -> None:
    """End the worker abruptly (tests of the parent's reporting): ``how`` "exit" (exit status
    ``code``, no cleanup) or "signal" (``code`` is the signal number sent to itself)."""
    if how == "exit":
        os._exit(code)
    if how == "signal":
        os.kill(os.getpid(), code)
        time.sleep(5)
    raise ValueError(f"how={how!r}: expected 'exit' or 'signal'")


def _device() -> str:
    from kvparity.kernels import runtime  # kvparity's choice: the CPU under Triton's interpreter, or the GPU

    return str(runtime.DEVICE)


@remote
def build_world(ctx: Context, name: str, backend: str, geometry: dict[str, Any], cache_kind: str) -> dict[str, Any]:
    """Build a real world and keep it as ``name``; returns its description."""
    from kvparity.engine.real.adapter import build_real_world

    world = build_real_world(ctx.require_sglang(), backend, geometry, cache_kind, _device())
    ctx.objects[name] = world
    return {"name": world.name, "version": world.version, "backend": world.backend, "family": world.family}


@remote
def world_state(ctx: Context, name: str) -> dict[str, Any]:
    """``RealWorld.state()`` of the world ``name``."""
    return plain(ctx.get(name).state())


@remote
def new_req(ctx: Context, world: str, name: str, rid: str, tokens: list[int], **options: Any) -> dict[str, Any]:
    """``RealWorld.new_req`` on the world ``world`` (options: return_logprob, logprob_start_len,
    max_new_tokens, extra_key); the request is kept as ``name``; returns its view plus
    ``is_prefill_only``."""
    w = ctx.get(world)
    req = w.new_req(rid, tokens, **options)
    ctx.objects[name] = req
    return plain(dict(w.req_view(req), is_prefill_only=bool(req.is_prefill_only)))


@remote
def req_view(ctx: Context, world: str, name: str) -> dict[str, Any]:
    return plain(ctx.get(world).req_view(ctx.get(name)))


@remote
def drop(ctx: Context, names: list[str] | None = None) -> list[str]:
    """Forget the named objects (all when ``names`` is None); returns what is left."""
    for n in list(ctx.objects) if names is None else names:
        ctx.objects.pop(n, None)
    return sorted(ctx.objects)


@remote
def smoke(ctx: Context, backend: str, geometry: dict[str, Any], cache_kind: str) -> dict[str, Any]:
    """Build a fresh world and play ``kvparity.engine.real.smoke.play_smoke`` on it (see there)."""
    from kvparity.engine.real.adapter import build_real_world
    from kvparity.engine.real.smoke import play_smoke

    t0 = time.perf_counter()
    world = build_real_world(ctx.require_sglang(), backend, geometry, cache_kind, _device())
    result = play_smoke(world)
    result["seconds"] = round(time.perf_counter() - t0, 4)
    return plain(result)


@remote
def probe_standin(ctx: Context, name: str, attr: str) -> str:
    """Use ``getattr(module name, attr)`` outside any import (it should raise StandInUsed)."""
    import importlib

    module = importlib.import_module(name)
    value = getattr(module, attr)
    return repr(value)


def _error(exc: BaseException, entry: Any) -> dict[str, Any]:
    message = str(exc)
    oom = entry.oom_kind(message) if entry is not None and isinstance(exc, RuntimeError) else None
    return {
        "type": type(exc).__name__,
        "message": message,
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-12:]),
        "oom": oom,
    }


def _startup(args: argparse.Namespace, ctx: Context) -> None:
    from kvparity.kernels import runtime  # fixes TRITON_INTERPRET before anything imports triton

    ctx.info.update(
        pid=os.getpid(), device=str(runtime.DEVICE), triton_interpret=os.environ.get("TRITON_INTERPRET") == "1",
        python=sys.version.split()[0],
    )
    if args.bare:
        ctx.info.update(version=None, family=None)
        return
    import importlib

    from kvparity.engine.real import install, standins, versions

    folder = os.path.abspath(args.sglang)
    on_disk, version_from = install.folder_version(folder)
    if args.expect and on_disk != args.expect:
        raise RealSGLangError(f"the folder {folder!r} holds sglang {on_disk}, not the expected {args.expect}")
    # The entry was chosen in the parent by probing the code (install.probe_source); without one
    # (a worker started by hand), probe here.
    entry = versions.SUPPORTED[args.entry] if args.entry else install.probe_source(folder, on_disk, "path").entry
    sys.path.insert(0, folder)
    # A release kvparity installed keeps the bytecode of the modules its workers import (written
    # beside them, whatever PYTHONDONTWRITEBYTECODE says): each later worker, and each copy of it (a
    # mutant, a change undone: a copy keeps its files' times, so an edited file's bytecode is stale
    # and compiled afresh; an explain hybrid removes what it replaces), skips compiling them.
    if os.path.realpath(folder).startswith(os.path.realpath(install.cache_root()) + os.sep):
        sys.dont_write_bytecode = False
    # A release whose host tier kvparity drives needs its real host pools (importable on a CPU).
    ctx.standins = standins.install(standins.table(host_pools=entry.host_tier is not None))
    if entry.host_pool_imports_kvcacheio:
        from kvparity.engine.real.host_tier import import_host_pool_with_copies

        import_host_pool_with_copies()
    if entry.host_controller_cuda_streams:
        from kvparity.engine.real.host_tier import cpu_streams_for_controller

        cpu_streams_for_controller()
    t0 = time.perf_counter()
    where = (
        entry.write_cache_indices or "", entry.get_last_loc, entry.alloc_extend_caller, entry.globals_target,
        entry.chunk_cache or "", entry.cache_init_params or "", entry.finish_via or "", entry.evict_params or "",
        entry.unified_radix_cache or "",
    )
    for module in SGLANG_MODULES + tuple(q.partition(":")[0] for q in where if q):
        importlib.import_module(module)
    import_s = time.perf_counter() - t0
    import sglang

    loaded_from = os.path.dirname(os.path.dirname(os.path.abspath(sglang.__file__)))
    if os.path.realpath(loaded_from) != os.path.realpath(folder):
        raise RealSGLangError(f"sglang was imported from {loaded_from!r}, not from {folder!r}")
    real_version = importlib.import_module("sglang.version").__version__
    if version_from == "file" and parse_version(real_version) != on_disk:
        raise RealSGLangError(f"sglang reports version {real_version}, its version file says {on_disk}")
    from kvparity.engine.real import adapter

    problems = adapter.verify_entry(entry)
    if problems:
        raise RealSGLangError(f"the adapter entry for {entry.version} does not match the imported SGLang: {'; '.join(problems)}")
    ctx.info["differs_from_release"] = adapter.world_class(entry).behaviour_notes(entry)
    # A real package imported above may install a crash handler of its own (apache-tvm-ffi prints C
    # frames on SIGSEGV): Python's, re-enabled last, is the one whose frames name the step's operation.
    faulthandler.disable()  # enable() alone keeps the handler it already had registered
    faulthandler.enable()
    ctx.entry = entry
    ctx.sglang_dir = folder
    ctx.info.update(
        version=on_disk, version_from=version_from, entry=entry.version, generation=entry.generation,
        label=entry.label, family=entry.family, sglang_dir=folder,
        import_s=round(import_s, 3), standins=ctx.standins.used(), standin_table=list(ctx.standins.stand_ins),
        real_packages=list(ctx.standins.real),
        absent=[m for m in standins.NEVER_STAND_IN[:2] if m not in sys.modules],
    )


def _protocol_streams() -> tuple[Any, Any]:
    """The protocol's private copies of fds 1 and 0; fd 1 then points at stderr and fd 0 at
    /dev/null, so that nothing SGLang prints or reads can break the protocol."""
    out = os.fdopen(os.dup(1), "w")
    inp = os.fdopen(os.dup(0), "r")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    return out, inp


def _send(out: Any, message: dict[str, Any]) -> None:
    out.write(json.dumps(message) + "\n")
    out.flush()


def worker_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvparity.engine.real.worker")
    parser.add_argument("--sglang", help="the folder holding the sglang package")
    parser.add_argument("--expect", help="the version that folder must hold")
    parser.add_argument("--entry", help="the release whose adapter entry drives it (probed when absent)")
    parser.add_argument("--plugin", action="append", default=[], help="a module registering more remote methods")
    parser.add_argument("--bare", action="store_true", help="no SGLang (protocol tests)")
    args = parser.parse_args(argv)

    out, inp = _protocol_streams()
    ctx = Context()
    _record_calls()
    try:
        if not args.bare and not args.sglang:
            raise RealSGLangError("give --sglang DIR (or --bare)")
        _startup(args, ctx)
        import importlib

        for plugin in args.plugin:
            importlib.import_module(plugin)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, then exit
        traceback.print_exc()
        _send(out, {"ready": False, "error": f"{type(exc).__name__}: {exc}"})
        return 2
    return _serve_calls(ctx, out, inp)


def zygote_main(path: str, sglang: str, version: str, entry: str, plugins: tuple[str, ...]) -> int:
    """A zygote (``kvparity.engine.real.zygote``): the worker's startup, then a worker forked for
    each client of the socket ``path``, each serving calls as a spawned worker does. A startup
    that fails is left to the spawned workers to report: the zygote only says it cannot serve."""
    from kvparity.engine.real import zygote

    ctx = Context()
    _record_calls()
    try:
        _startup(argparse.Namespace(bare=False, sglang=sglang, expect=version, entry=entry), ctx)
        import importlib

        for plugin in plugins:
            importlib.import_module(plugin)
    except BaseException as exc:  # noqa: BLE001 - said in the marker file
        traceback.print_exc()
        return zygote.refuse(path, f"{type(exc).__name__}: {exc}")
    zygote_pid = os.getpid()

    def serve_child() -> int:
        ctx.info.update(pid=os.getpid(), forked_from=zygote_pid)
        return _serve_calls(ctx, *_protocol_streams())

    return zygote.serve_forks(path, serve_child)


def _serve_calls(ctx: Context, out: Any, inp: Any) -> int:
    """Say ready, then answer calls until stdin closes."""
    _send(out, {"ready": True, "info": plain(ctx.info)})
    loaded = _LoadedSources()
    loaded.note()
    for line in inp:
        if not line.strip():
            continue
        message = json.loads(line)
        call_id = message.get("id")
        method = message.get("method")
        fn = REMOTE.get(method)
        if fn is None:
            known = f"no remote method {method!r} (have: {sorted(REMOTE)})"
            _send(out, {"id": call_id, "ok": False, "error": {"type": "KeyError", "message": known}})
            continue
        try:
            reply = {"id": call_id, "ok": True, "result": fn(ctx, **message.get("kwargs", {}))}
            data = json.dumps(reply, default=_plain_leaf)  # plain containers go as they are, in C
        except Exception as exc:  # noqa: BLE001 - the parent judges
            data = json.dumps({"id": call_id, "ok": False, "error": _error(exc, ctx.entry)})
        loaded.note()  # before the reply: a caller that has its answer may kill the worker at once
        out.write(data + "\n")
        out.flush()
    return 0


LOADED_ENV = "KVPARITY_LOADED_SOURCES"  # a folder: each worker writes there the SGLang files it has loaded
_CALLED: dict[int, Any] = {}  # id -> code object of every function called, where LOADED_ENV asks for it


def _record_calls() -> None:
    """Where ``LOADED_ENV`` is set, remember every function this process calls, from startup on
    (``kvparity explain`` searches only changed functions a run called; module-level code is always
    searched). A profile hook costs a little on every call: only explain's baseline run sets it."""
    if not os.environ.get(LOADED_ENV):
        return
    import threading

    def called(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and id(frame.f_code) not in _CALLED:
            _CALLED[id(frame.f_code)] = frame.f_code  # the code kept alive, so its id is never reused

    sys.setprofile(called)
    threading.setprofile(called)


class _LoadedSources:
    """What of its SGLang a worker has loaded (files) and called (functions, by qualified name),
    written after every call that changed it (for ``kvparity explain``: only a changed file a run
    loads, or function it calls, can carry a difference). A worker is killed, not asked to stop,
    so the record is kept current rather than written at the end."""

    def __init__(self) -> None:
        self.folder = os.environ.get(LOADED_ENV)
        self.seen = (0, 0)
        self.relative: dict[str, str | None] = {}  # a file's path under the package's root, or None

    def note(self) -> None:
        if not self.folder or (len(sys.modules), len(_CALLED)) == self.seen or "sglang" not in sys.modules:
            return
        self.seen = (len(sys.modules), len(_CALLED))
        root = os.path.dirname(os.path.dirname(os.path.realpath(sys.modules["sglang"].__file__ or "")))

        def inside(path: str) -> str | None:
            if path not in self.relative:
                real = os.path.realpath(path)
                self.relative[path] = os.path.relpath(real, root) if real.startswith(root + os.sep) else None
            return self.relative[path]

        files = sorted({rel for m in list(sys.modules.values())
                        if (f := getattr(m, "__file__", None)) and (rel := inside(f))})
        functions = sorted({(rel, code.co_qualname) for code in list(_CALLED.values())
                            if (rel := inside(code.co_filename))})
        path = os.path.join(self.folder, f"{os.getpid()}.json")
        with open(path + ".tmp", "w") as out:
            json.dump({"files": files, "functions": functions}, out)
        os.replace(path + ".tmp", path)


if __name__ == "__main__":
    # Run as the module ``kvparity.engine.real.worker`` (not ``__main__``), so plugins that import it
    # register into the same REMOTE table.
    from kvparity.engine.real import worker as _worker

    sys.exit(_worker.worker_main())
