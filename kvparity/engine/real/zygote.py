"""Warm real-SGLang workers: one process per release of a run (a zygote) imports SGLang once, and
every worker of the run, in every job, is forked from it instead of importing SGLang again.

Importing a release takes 2 to 15 s of CPU per process; ``kvparity check --sglang A --against B``
with two jobs used to import four times (each job its own worker per release), all at once on
2 cores. With zygotes it imports twice, while the parent and the jobs start, and a worker that
died is back in milliseconds.

Three sides, one module:

- ``Zygotes`` (the command line): starts one zygote per release, as early as it can, forked from
  the fork server that also forks the jobs (``kvparity.engine.processes``: torch and kvparity are
  imported there once), and names them in the environment (``KVPARITY_ZYGOTES``), which the jobs
  inherit.
- ``serve_forks`` (the zygote, ``zygote_entry``): after importing its release, listens on a Unix
  socket. A client sends the three file descriptors of the
  worker it wants (its stdin, stdout, stderr); the zygote forks, the child takes them and serves
  calls exactly as a spawned worker does, and the zygote reports the child's exit status back.
- ``ForkedProcess`` (``RealWorker``): the forked worker, with the part of ``subprocess.Popen``'s
  interface the worker handle uses (``pid``, ``stdin``, ``stdout``, ``poll``, ``wait``).

Whatever goes wrong with a zygote (not started, failed to import, more than one thread, gone),
``RealWorker`` spawns its worker as before, and any error is reported on that path. Zygotes are
used on the CPU only: forking a process that may have touched CUDA is not safe.
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from kvparity.engine.processes import ended_children

ENV = "KVPARITY_ZYGOTES"  # JSON: zygote key -> the path of its socket
FAILED = ".failed"  # beside the socket: the zygote could not serve (the reason inside)
PID = ".pid"  # beside the socket: the zygote's pid, written first thing
STARTING_S = 60.0  # how long a zygote may take to write its pid (the fork server imports first)


class Unavailable(Exception):
    """No zygote can fork this worker (the caller spawns one instead)."""


def key(path: str, version: str, entry: str, plugins: tuple[str, ...]) -> str:
    """What a worker must share with a zygote to be forked from it."""
    return json.dumps([os.path.realpath(path), version, entry, list(plugins)])


def source_key(source: Any, plugins: tuple[str, ...]) -> str:
    return key(source.path, source.version, source.entry.version, plugins)


# --------------------------------------------------------------------------- the command line's side


class Zygotes:
    """One zygote per distinct source, for the length of a ``with`` block (none on a GPU run, or
    with ``KVPARITY_NO_ZYGOTES=1``). Each is forked from the fork server of ``kvparity.engine.processes``,
    which has imported torch and kvparity already: a zygote imports only its SGLang."""

    def __init__(self, sources: list[Any], plugins: tuple[str, ...]) -> None:
        self.sources, self.plugins = sources, tuple(plugins)
        self.procs: list[Any] = []
        self.folder: str | None = None
        self.saved_env: str | None = None
        self.starter: threading.Thread | None = None

    def __enter__(self) -> Zygotes:
        from kvparity.engine import processes

        if os.environ.get("KVPARITY_NO_ZYGOTES") == "1" or not processes.cpu_run():
            return self
        self.folder = tempfile.mkdtemp(prefix="kvparity-zygotes-")
        plan: dict[str, tuple[str, Any]] = {}
        for source in self.sources:
            plan.setdefault(source_key(source, self.plugins), (os.path.join(self.folder, f"{len(plan)}.sock"), source))
        self.saved_env = os.environ.get(ENV)
        os.environ[ENV] = json.dumps({name: path for name, (path, _) in plan.items()})
        # Starting a process from the fork server waits for it to finish its own imports: in a
        # thread, so that this process goes on with its imports meanwhile.
        self.starter = threading.Thread(target=self._start, args=(processes.context(), list(plan.values())),
                                        name="kvparity zygotes", daemon=True)
        self.starter.start()
        return self

    def _start(self, context: Any, plan: list[tuple[str, Any]]) -> None:
        from kvparity.engine import processes

        for path, source in plan:
            proc = context.Process(target=zygote_entry, name=f"kvparity zygote {source.version}", daemon=False,
                                   args=(path, source.path, source.version, source.entry.version, self.plugins,
                                         processes.passed_env()))
            try:
                proc.start()
            except OSError as exc:
                refuse(path, f"the zygote could not be started: {exc}")
                continue
            self.procs.append(proc)

    def __exit__(self, *exc: Any) -> None:
        if self.folder is None:
            return
        if self.starter is not None:
            self.starter.join()
        if self.saved_env is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = self.saved_env
        for proc in self.procs:
            for kill in (os.killpg, os.kill):  # its group (the workers it forked have groups of their own)
                try:
                    kill(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            proc.join(5)
        shutil.rmtree(self.folder, ignore_errors=True)
        self.folder = None


def zygote_entry(path: str, sglang: str, version: str, entry: str, plugins: tuple[str, ...],
                 env: dict[str, str]) -> None:
    """A zygote's life, in a process forked from the fork server: import the release, then fork
    workers (``serve_forks``). Its output goes to ``path + '.log'``, never to the terminal."""
    from kvparity.engine import processes

    os.setsid()
    processes.adopt_env(env)
    with open(path + PID, "w") as pid_file:  # how a client knows it is alive before its socket appears
        pid_file.write(str(os.getpid()))
    log = os.open(path + ".log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    for fd in (1, 2):
        os.dup2(log, fd)
    os.close(log)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    from kvparity.engine.real import worker

    os.chdir(worker.REPO_ROOT)  # where a spawned worker runs
    code = 2
    try:
        code = worker.zygote_main(path, sglang, version, entry, plugins)
    finally:
        sys.stderr.flush()
        os._exit(code)


def _cuda_in_use() -> bool:
    runtime = sys.modules.get("kvparity.kernels.runtime")
    return runtime is not None and getattr(runtime.DEVICE, "type", "cpu") == "cuda"


# --------------------------------------------------------------------------- the worker handle's side


def socket_for(name: str, timeout: float) -> str:
    """The socket of the zygote named ``name`` in the environment, once it is ready (it appears
    then); ``Unavailable`` when there is none, it failed, it is gone, or ``timeout`` passes."""
    path = json.loads(os.environ.get(ENV) or "{}").get(name)
    if path is None:
        raise Unavailable("no zygote for this source")
    start = time.monotonic()
    while not os.path.exists(path):
        if os.path.exists(path + FAILED):
            raise Unavailable(open(path + FAILED).read())
        waited = time.monotonic() - start
        if not _alive(path + PID) and (os.path.exists(path + PID) or waited > STARTING_S):
            raise Unavailable("the zygote is gone, or never started")
        if waited > timeout:
            raise Unavailable(f"the zygote was not ready within {timeout:g} s")
        time.sleep(0.02)
    return path


def _alive(pid_path: str) -> bool:
    try:
        os.kill(int(open(pid_path).read()), 0)
    except (OSError, ValueError):
        return False
    return True


class ForkedProcess:
    """A worker forked by the zygote at ``path``, its stderr going to ``stderr_fd``."""

    def __init__(self, path: str, stderr_fd: int, timeout: float) -> None:
        child_in, self_in = os.pipe()
        self_out, child_out = os.pipe()
        self.control = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.buffer = b""
        self.returncode: int | None = None
        try:
            self.control.settimeout(timeout)
            self.control.connect(path)
            socket.send_fds(self.control, [b"fork"], [child_in, child_out, stderr_fd])
            self.pid = int(json.loads(self._line(timeout) or b"{}")["pid"])
        except (OSError, ValueError, KeyError) as exc:
            self.control.close()
            os.close(self_in)
            os.close(self_out)
            raise Unavailable(f"the zygote did not fork: {exc}") from None
        finally:
            os.close(child_in)
            os.close(child_out)
        self.stdin = open(self_in, "wb", buffering=0)
        self.stdout = open(self_out, "rb", buffering=0)

    def _line(self, timeout: float | None) -> bytes | None:
        """The zygote's next line (None: nothing yet within ``timeout``); EOF is an empty line."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self.buffer:
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            self.control.settimeout(left)
            try:
                chunk = self.control.recv(4096)
            except (TimeoutError, BlockingIOError):
                return None
            if not chunk:
                return b""
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line

    def _status(self, timeout: float | None) -> int | None:
        if self.returncode is None:
            line = self._line(timeout)
            if line is not None:  # a status, or the zygote gone (the worker's status lost with it)
                self.returncode = int(json.loads(line)["returncode"]) if line else -signal.SIGKILL
        return self.returncode

    def poll(self) -> int | None:
        return self._status(0.0)

    def wait(self, timeout: float | None = None) -> int:
        status = self._status(timeout)
        if status is None:
            raise subprocess.TimeoutExpired("forked worker", timeout or 0.0)
        return status

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# --------------------------------------------------------------------------- the zygote's side


def serve_forks(path: str, serve_child: Callable[[], int]) -> int:
    """Fork a worker for every client of the socket at ``path`` (``serve_child`` runs in the
    child, its fds 0, 1 and 2 the client's); report each child's exit status to its client.
    Ends when its parent (the fork server, which ends with the command) is gone."""
    threads = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else 1
    if threads > 1:  # a fork keeps only this thread: a lock another one held would never be freed
        return refuse(path, f"the zygote has {threads} threads after importing SGLang: it cannot fork safely")
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():  # a CUDA context does not survive a fork
        return refuse(path, "importing SGLang initialised CUDA: the zygote cannot fork")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".tmp")
    listener.listen(64)
    os.rename(path + ".tmp", path)  # the socket appears ready or not at all
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    children: dict[int, socket.socket] = {}
    parent = os.getppid()

    def close_zygote() -> None:  # in a forked worker: what only the zygote needs
        selector.close()
        os.close(wake_r)
        os.close(wake_w)

    while os.getppid() == parent:
        for ready, _ in selector.select(timeout=1.0):
            if ready.fileobj is listener:
                _fork_one(listener, children, serve_child, close_zygote)
            else:
                os.read(wake_r, 4096)
                _reap(children)
    return 0


def refuse(path: str, reason: str) -> int:
    with open(path + FAILED, "w") as marker:
        marker.write(reason)
    return 3


def _fork_one(listener: socket.socket, children: dict[int, socket.socket], serve_child: Callable[[], int],
              close_zygote: Callable[[], Any]) -> None:
    conn, _ = listener.accept()
    try:
        _, fds, _, _ = socket.recv_fds(conn, 64, 3)
    except OSError:
        conn.close()
        return
    if len(fds) != 3:
        for fd in fds:
            os.close(fd)
        conn.close()
        return
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the worker: never returns into the zygote's loop
        code = 2
        try:
            os.setsid()  # a process group of its own, as a spawned worker has (RealWorker kills the group)
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for other in (listener, conn, *children.values()):
                other.close()
            close_zygote()
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
                os.close(fd)
            code = serve_child()
        except BaseException:  # noqa: BLE001 - the worker's stderr is the client's file
            traceback.print_exc()
        finally:
            sys.stderr.flush()
            os._exit(code)
    for fd in fds:
        os.close(fd)
    children[pid] = conn
    try:
        conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    except OSError:
        pass


def _reap(children: dict[int, socket.socket]) -> None:
    """Tell each ended child's parent-side connection its exit code."""
    for pid, status in ended_children()[0]:
        conn = children.pop(pid, None)
        if conn is not None:
            try:
                conn.sendall(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
            except OSError:
                pass
            conn.close()
