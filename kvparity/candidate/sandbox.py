"""Run candidate calls in a child process, so no candidate can crash, hang or corrupt kvparity.

Three processes. The parent (``Sandbox``, in kvparity) starts a *keeper* (``python -m kvparity.candidate.sandbox
--keeper``), which starts ONE *worker* (``python -m kvparity.candidate.sandbox``) that serves many calls,
because importing torch and Triton takes seconds; both are restarted after the worker crashes,
exits or times out.

Ownership of everything a candidate starts. The keeper runs no candidate code. On Linux it makes
itself a *child subreaper* (``prctl(PR_SET_CHILD_SUBREAPER)``): a process whose parent dies is
re-parented to its nearest living subreaper ancestor instead of to init, and neither a new session
(``setsid``, ``start_new_session=True``) nor a double fork changes a process's parent. So every
process the worker or its descendants start stays a descendant of the keeper for as long as it
lives, whatever it does to its session or process group. To end them, the keeper repeatedly finds
its descendants (walking ``/proc``, by parent pid), sends each SIGKILL and reaps its children,
until it has no child left; since an orphaned descendant becomes the keeper's child, "no child"
means "no descendant": nothing survives, not even a process forked during the kill. It does this
when the worker dies, and when the parent closes the control pipe (the end of a check, a call
that timed out, or kvparity's own death, which closes the pipe too); then it exits. The worker
dies with the keeper (``PR_SET_PDEATHSIG``). Where the keeper cannot be a subreaper (not Linux)
it falls back to killing its process group, which a new session escapes.

Naming a fault. The keeper is the worker's parent, so it learns the worker's own end from
``waitpid`` (the signal, or the exit code) and reports it at once on its event pipe; the parent
watches that pipe as well as the worker's reply pipe, so a grandchild that keeps the reply pipe
open cannot turn a crash into a timeout. A call ends as: "returned"; "raised" (an exception: its
type and message; ``KeyboardInterrupt`` included); "exited" (``sys.exit`` / ``SystemExit`` or
``os._exit``: the exit code); "crashed" (killed by a signal: its name); "timed_out"; and
"guard_damaged" for a store into the sandbox's extra guard (``kvparity.candidate.sandbox_guard``). ``Outcome.kind``
is that exact name; ``Outcome.status`` is the name ``kvparity.candidate.check.judge`` knows ("exited" and
"guard_damaged" travel as "raised", their ``error`` text starting with the exact name).

Messages are JSON lines: the parent sends the target, the candidate spec and the batch as plain
data; the worker loads the candidate itself (after ``kernels``, so the Triton mode is fixed first),
places the guarded tensors (``kvparity.candidate.sandbox_guard``), calls the candidate and sends back every
buffer (guards included) as plain lists and a description of the return value, or the exception.
The parent judges; it never touches candidate memory. The worker's protocol channels are private
copies of its stdin and stdout; fd 0 is /dev/null and fd 1 is pointed at stderr, so a candidate
that prints or reads cannot break the protocol. Stderr (worker and keeper) goes to a temporary
file; the part a call wrote is quoted when the worker dies, capped by bytes (``cap_text``), as is
every other piece of child text that enters a report.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvparity.engine.processes import ended_children

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_CALL_TIMEOUT = 10.0
DEFAULT_START_TIMEOUT = 120.0
KILLED = "the worker and every process it started were killed"  # after a timeout
OUTPUT_CAP = 4096  # bytes of child text (stderr, messages, tracebacks) per piece of a report
MAX_REPLY_BYTES = 256 << 20  # a reply line longer than this is a broken protocol
KILL_DEADLINE = 10.0  # seconds the keeper spends ending descendants; the parent waits as long for it
EOF_GRACE = 5.0  # after the reply pipe closes, how long to wait for the keeper's word on the worker
_KEEPER_ENV = "KVPARITY_SANDBOX_KEEPER"
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


@dataclass
class Outcome:
    """What one call came to. ``kind``: "returned" (``reply`` holds buffers and return), "loaded",
    "load_error", "raised", "exited", "crashed", "timed_out" or "guard_damaged" (``error`` says
    what happened). ``status`` is the same, except that "exited" and "guard_damaged" are "raised"
    there (the names ``kvparity.candidate.check.judge`` knows); empty ``kind`` means ``status``."""

    status: str
    reply: dict[str, Any] | None = None
    error: str = ""
    kind: str = ""

    def __post_init__(self) -> None:
        self.kind = self.kind or self.status


class WorkerDied(Exception):
    """The worker ended (``death``: {"signal": n} or {"code": n}) or broke the protocol ({"reason": text})."""

    def __init__(self, death: dict[str, Any]) -> None:
        super().__init__(death_text(death))
        self.death = death


class WorkerTimedOut(Exception):
    pass


def cap_text(text: str | bytes, limit: int = OUTPUT_CAP) -> str:
    """``text`` if it is at most ``limit`` bytes (UTF-8), else its first quarter and last three
    quarters of ``limit`` bytes around "... [N bytes cut] ..."."""
    data = text if isinstance(text, bytes) else text.encode("utf-8", "replace")
    if len(data) <= limit:
        return text if isinstance(text, str) else data.decode("utf-8", "replace")
    head, tail = limit // 4, limit - limit // 4
    return _cut(data[:head], len(data) - head - tail, data[-tail:])


def _cut(head: bytes, cut: int, tail: bytes) -> str:
    return f"{head.decode('utf-8', 'replace')} ... [{cut} bytes cut] ... {tail.decode('utf-8', 'replace')}"


def _read_capped(fd: int, start: int, limit: int = OUTPUT_CAP) -> str:
    """What the file ``fd`` holds from ``start`` on, capped like ``cap_text`` without reading more
    than ``limit`` bytes of it."""
    size = os.fstat(fd).st_size
    length = max(0, size - start)
    if length <= limit:
        return os.pread(fd, length, start).decode("utf-8", "replace")
    head, tail = limit // 4, limit - limit // 4
    return _cut(os.pread(fd, head, start), length - head - tail, os.pread(fd, tail, size - tail))


def _cap_strings(value: Any) -> Any:
    """Every string in a reply capped (the buffers, lists of ints, are left alone)."""
    if isinstance(value, str):
        return cap_text(value)
    if isinstance(value, dict):
        return {k: v if k == "buffers" else _cap_strings(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_cap_strings(v) for v in value]
    return value


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def death_text(death: dict[str, Any]) -> str:
    if "signal" in death:
        core = ", core dumped" if death.get("core") else ""
        return f"was killed by {_signal_name(death['signal'])} (signal {death['signal']}{core})"
    if "code" in death:
        return f"exited with code {death['code']}"
    return str(death.get("reason", "ended"))


def _death_outcome(death: dict[str, Any], output: str) -> Outcome:
    """The outcome of a call during which the worker ended (``output``: its stderr meanwhile)."""
    quoted = f"\nits output during the call (stderr, capped):\n{output}" if output else ""
    if "code" in death:
        code = death["code"]
        return Outcome("raised", {"status": "raised", "kind": "exited", "code": code, "traceback": output},
                       f"exited with code {code}: the worker process ended during the call "
                       "(os._exit, or an exit from native code)", kind="exited")
    return Outcome("crashed", None, f"the worker process {death_text(death)}{quoted}")


def _libc() -> Any:
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def _prctl(option: int, value: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        return _libc().prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


# A call's limit is on the CPU time its worker gets, not on the wall clock alone: on a busy machine
# a worker still running (using CPU) but given less than the limit's worth of it is waited for, a
# second at a time, up to STARVED_CAP times the limit. A worker that uses no CPU (asleep, stopped,
# deadlocked) or has used its limit's worth is timed out as before. Load is not the candidate's fault.
STARVED_STEP = 1.0
STARVED_CAP = 10.0
STARVED_PROGRESS = 0.1  # of the wall time since the last look: less CPU than this is not running


def keep_waiting(cpu_used: float, cpu_step: float, wall_step: float, limit: float, waited: float) -> bool:
    """Whether a call past its wall limit is only starved: it has used less than ``limit`` seconds
    of CPU, used some in the last ``wall_step`` seconds, and has waited less than the cap."""
    return cpu_used < limit and cpu_step >= STARVED_PROGRESS * wall_step and waited < STARVED_CAP * limit


class _CpuClock:
    """The CPU time (user and system, all threads) a worker has used since a call began, from
    ``/proc`` (where there is none, a call is timed by the wall clock only)."""

    def __init__(self, pid: int | None, limit: float, started: float) -> None:
        self.pid, self.limit, self.started = pid, limit, started
        self.first = self.last = self._read()
        self.last_at = started

    def _read(self) -> float | None:
        if self.pid is None:
            return None
        try:
            fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def starved(self, now: float) -> bool:
        cpu = self._read()
        if cpu is None or self.first is None or self.last is None:
            return False
        waiting = keep_waiting(cpu - self.first, cpu - self.last, now - self.last_at, self.limit, now - self.started)
        self.last, self.last_at = cpu, now
        return waiting


class Sandbox:
    """A persistent worker process for candidate calls. Use as a context manager, or ``close()``."""

    def __init__(
        self, call_timeout: float = DEFAULT_CALL_TIMEOUT, start_timeout: float = DEFAULT_START_TIMEOUT
    ) -> None:
        self.call_timeout = call_timeout
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen[bytes] | None = None  # the keeper
        self.worker_pid: int | None = None
        self.owns = ""  # how the keeper owns descendants: "subreaper" or "process group"
        self.stderr_file: Any = None
        self.request_fd: int | None = None
        self.reply_fd: int | None = None
        self.events_fd: int | None = None
        self.pending = b""
        self.events_pending = b""
        self.reply_closed_at: float | None = None
        self.death: dict[str, Any] | None = None
        self.call_output_start = 0
        self.starts = 0
        self.device: str | None = None

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ process management

    def _env(self) -> dict[str, str]:
        from kvparity.kernels import runtime  # the child must run kernels exactly as this process does

        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([REPO_ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        env["KVPARITY_DEVICE"] = runtime.DEVICE.type
        env["PYTHONFAULTHANDLER"] = "1"  # a segfault prints the Python stack to the stderr file
        return env

    def start(self) -> None:
        self.close()
        self.stderr_file = tempfile.TemporaryFile()
        request_r, request_w = os.pipe()
        reply_r, reply_w = os.pipe()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "kvparity.candidate.sandbox", "--keeper", str(request_r), str(reply_w)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr_file, cwd=REPO_ROOT,
                env=self._env(), pass_fds=(request_r, reply_w),
                start_new_session=True,  # no terminal signal reaches it: it ends when the control pipe closes
            )
        finally:
            os.close(request_r)
            os.close(reply_w)
        assert self.proc.stdout is not None
        self.request_fd, self.reply_fd, self.events_fd = request_w, reply_r, self.proc.stdout.fileno()
        os.set_blocking(request_w, False)
        self.pending, self.events_pending, self.reply_closed_at, self.death = b"", b"", None, None
        self.worker_pid = None
        self.call_output_start = 0
        self.starts += 1
        try:
            ready = self._receive(self.start_timeout)
        except (WorkerDied, WorkerTimedOut) as exc:
            output = self.output_since(0)
            self.close()
            quoted = f"; its stderr:\n{output}" if output else ""
            raise RuntimeError(f"kvparity sandbox worker failed to start: {exc}{quoted}") from exc
        self.device = ready.get("device")

    def close(self) -> None:
        """End the worker and everything it started (the keeper does it when its control pipe
        closes), and wait for that."""
        for name in ("request_fd", "reply_fd"):
            fd = getattr(self, name)
            if fd is not None:
                os.close(fd)
                setattr(self, name, None)
        if self.proc is not None:
            proc, self.proc = self.proc, None
            if proc.stdin:
                try:
                    proc.stdin.close()  # EOF on the control pipe: the keeper ends every descendant, then itself
                except OSError:
                    pass
            self._wait_then_kill_group(proc)
            if proc.stdout:
                proc.stdout.close()
            self.events_fd = None
            self.worker_pid = None
        if self.stderr_file is not None:
            self.stderr_file.close()
            self.stderr_file = None

    @staticmethod
    def _wait_then_kill_group(proc: subprocess.Popen[bytes]) -> None:
        """Wait for the keeper; then SIGKILL its process group (only stragglers of a keeper that
        could not be a subreaper, or of one that hung) while the keeper is still unreaped, so the
        group id cannot have been reused; then reap it."""
        deadline = time.monotonic() + KILL_DEADLINE
        if hasattr(os, "waitid"):
            while time.monotonic() < deadline:
                try:
                    if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                        break
                except ChildProcessError:
                    break
                time.sleep(0.002)
        else:
            try:
                proc.wait(timeout=KILL_DEADLINE)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the group this Sandbox started, nothing else
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()

    def output_since(self, start: int) -> str:
        """The worker's and keeper's stderr from byte ``start`` on, capped."""
        if self.stderr_file is None:
            return ""
        return _read_capped(self.stderr_file.fileno(), start).strip()

    def stderr_tail(self) -> str:
        """What the worker wrote to stderr during the last call (capped)."""
        return self.output_since(self.call_output_start)

    # ------------------------------------------------------------------ events and messages

    def _handle_events(self, data: bytes) -> None:
        if not data:
            if self.death is None:
                self.death = {"reason": "lost its keeper process (it ended unexpectedly)"}
            self.events_fd = None
            return
        self.events_pending += data
        while b"\n" in self.events_pending:
            line, _, self.events_pending = self.events_pending.partition(b"\n")
            event = json.loads(line)
            if event.get("event") == "started":
                self.worker_pid, self.owns = event["pid"], event.get("owns", "")
            elif event.get("event") == "exited" and self.death is None:
                self.death = {k: v for k, v in event.items() if k in ("signal", "code", "core")}

    def _wait_for_data(self, timeout: float, write: bool = False) -> bool:
        """One wait on the event pipe and the reply pipe (and, with ``write``, the request pipe
        becoming writable); reads what arrived. True when the request pipe is writable."""
        if self.reply_closed_at is not None and self.death is None:
            if time.monotonic() - self.reply_closed_at > EOF_GRACE:
                self.death = {"reason": "closed its reply channel"}
                return False
            timeout = min(timeout, 0.1)
        readable_fds = [fd for fd in (self.events_fd, self.reply_fd if self.reply_closed_at is None else None)
                        if fd is not None]
        writable_fds = [self.request_fd] if write and self.request_fd is not None else []
        readable, writable, _ = select.select(readable_fds, writable_fds, [], max(0.0, timeout))
        if self.reply_fd is not None and self.reply_fd in readable:
            chunk = os.read(self.reply_fd, 1 << 20)
            if chunk:
                self.pending += chunk
            else:
                self.reply_closed_at = time.monotonic()
        if self.events_fd is not None and self.events_fd in readable:
            self._handle_events(os.read(self.events_fd, 1 << 16))
        return bool(writable)

    def _poll(self) -> None:
        if self.proc is not None:
            self._wait_for_data(0.0)

    def _take_line(self) -> bytes | None:
        if b"\n" in self.pending:
            line, _, self.pending = self.pending.partition(b"\n")
            return line
        if len(self.pending) > MAX_REPLY_BYTES:
            raise WorkerDied({"reason": f"sent more than {MAX_REPLY_BYTES} bytes without ending its reply"})
        return None

    def _parse(self, line: bytes) -> dict[str, Any]:
        try:
            reply = json.loads(line)
        except ValueError:
            reply = None
        if not isinstance(reply, dict):
            raise WorkerDied({"reason": f"sent a malformed reply: {cap_text(line, 256)!r}"})
        return reply

    def _send(self, message: dict[str, Any]) -> None:
        data = (json.dumps(message) + "\n").encode()
        deadline = time.monotonic() + self.call_timeout
        while data:
            if self.death is not None:
                raise WorkerDied(self.death)
            left = deadline - time.monotonic()
            if left <= 0:
                raise WorkerTimedOut(f"the worker did not take the call within {self.call_timeout:g} s")
            if self._wait_for_data(left, write=True):
                try:
                    data = data[os.write(self.request_fd, data):]  # type: ignore[arg-type]
                except BlockingIOError:
                    continue
                except (BrokenPipeError, OSError) as err:
                    self._await_death()
                    raise WorkerDied(self.death or {"reason": "closed its request channel"}) from err

    def _await_death(self) -> None:
        deadline = time.monotonic() + EOF_GRACE
        while self.death is None and self.events_fd is not None and time.monotonic() < deadline:
            self._wait_for_data(deadline - time.monotonic())

    def _receive(self, timeout: float) -> dict[str, Any]:
        started = time.monotonic()
        deadline = started + timeout
        clock = _CpuClock(self.worker_pid, timeout, started)
        while True:
            line = self._take_line()
            if line is not None:
                return self._parse(line)
            if self.death is not None:
                self._drain_reply()  # an answer written just before the end still counts
                line = self._take_line()
                if line is not None:
                    return self._parse(line)
                raise WorkerDied(self.death)
            left = deadline - time.monotonic()
            if left <= 0 and clock.starved(time.monotonic()):
                deadline, left = time.monotonic() + STARVED_STEP, STARVED_STEP
            if left <= 0:
                raise WorkerTimedOut(f"no answer within {timeout:g} s")
            self._wait_for_data(left)

    def _drain_reply(self) -> None:
        while self.reply_fd is not None and self.reply_closed_at is None and b"\n" not in self.pending:
            readable, _, _ = select.select([self.reply_fd], [], [], 0)
            if not readable:
                return
            chunk = os.read(self.reply_fd, 1 << 20)
            if not chunk:
                self.reply_closed_at = time.monotonic()
            self.pending += chunk

    def call(self, target: str, spec: str, batch: dict[str, Any]) -> Outcome:
        """One candidate call on one batch (``KernelBatch.to_dict()``), judged by status only."""
        return self._exchange({"op": "call", "target": target, "spec": spec, "batch": batch})

    def load(self, target: str, spec: str) -> Outcome:
        """Load (and signature-check) the candidate in the worker: status "loaded" or "load_error"
        (or "crashed" / "timed_out" when the candidate's module does that on import)."""
        return self._exchange({"op": "load", "target": target, "spec": spec})

    def _exchange(self, message: dict[str, Any]) -> Outcome:
        self._poll()  # a worker that ended between calls is restarted, not blamed on this call
        if self.proc is None or self.death is not None or self.reply_closed_at is not None or self.pending:
            self.start()  # (``pending``: it wrote something nobody asked for; its protocol is not to be trusted)
        assert self.stderr_file is not None
        self.call_output_start = os.fstat(self.stderr_file.fileno()).st_size
        try:
            self._send(message)
            reply = self._receive(self.call_timeout)
        except WorkerTimedOut:
            self.close()
            return Outcome("timed_out", error=f"the call did not return within {self.call_timeout:g} s; {KILLED}")
        except WorkerDied as exc:
            output = self.stderr_tail()
            self.close()
            return _death_outcome(exc.death, output)
        reply = _cap_strings(reply)
        if reply.get("restart"):  # e.g. a CUDA fault: the worker's device context is unusable now
            self.close()
        return Outcome(reply.get("status", "crashed"), reply, reply.get("error", ""), reply.get("kind", ""))


# ---------------------------------------------------------------------- the keeper


def _emit(event: dict[str, Any]) -> None:
    data = (json.dumps(event) + "\n").encode()
    while data:
        data = data[os.write(1, data):]


def _descendants(root: int) -> list[int]:
    """The processes whose chain of parents leads to ``root``, from /proc (empty without it)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # ended meanwhile
        fields = stat[stat.rfind(b")") + 2 :].split()  # after "pid (comm) ": state, ppid, ...
        if len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _kill_descendants(subreaper: bool, worker: int) -> None:
    """SIGKILL every descendant and reap, until this process has no child (as a subreaper, that
    means no descendant: see the module's doc)."""
    deadline = time.monotonic() + KILL_DEADLINE
    me = os.getpid()
    try:  # the worker's own group first (all there is to go by without a subreaper or /proc)
        os.killpg(worker, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    while True:
        for pid in _descendants(me):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        _, children_left = ended_children()
        if not children_left or time.monotonic() > deadline:
            break
        time.sleep(0.002)


def _status_event(pid: int, status: int) -> dict[str, Any]:
    if os.WIFSIGNALED(status):
        return {"event": "exited", "pid": pid, "signal": os.WTERMSIG(status), "core": os.WCOREDUMP(status)}
    return {"event": "exited", "pid": pid, "code": os.WEXITSTATUS(status)}


def keeper_main(request_fd: int, reply_fd: int) -> None:
    """The keeper: owns the worker and its descendants; its stdin is the parent's control pipe,
    its stdout the event pipe ("started", then "exited" with the worker's signal or code)."""
    subreaper = _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wake the select below when a child ends
    env = dict(os.environ, **{_KEEPER_ENV: str(os.getpid())})
    # Its own session and group, so that a candidate signalling "its" group (kill(0, ...)) cannot hit the keeper.
    worker = subprocess.Popen([sys.executable, "-m", "kvparity.candidate.sandbox"], stdin=request_fd, stdout=reply_fd, env=env,
                              start_new_session=True)
    os.close(request_fd)
    os.close(reply_fd)
    _emit({"event": "started", "pid": worker.pid, "owns": "subreaper" if subreaper else "process group"})
    worker_alive = True
    while True:
        readable, _, _ = select.select([0, wake_r], [], [], 1.0)
        if wake_r in readable:
            while True:
                try:
                    if not os.read(wake_r, 4096):
                        break
                except BlockingIOError:
                    break
        for pid, status in ended_children()[0]:
            if pid == worker.pid and worker_alive:
                worker_alive = False
                _emit(_status_event(pid, status))
                _kill_descendants(subreaper, worker.pid)  # the worker is gone: so is everything it started
        if 0 in readable and not os.read(0, 4096):
            break  # the parent closed the control pipe (or died)
    if worker_alive:
        try:
            os.kill(worker.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    _kill_descendants(subreaper, worker.pid)


# ---------------------------------------------------------------------- the worker (child) side


def _launch(candidate: Any, target: str, args: list[Any], kwargs: dict[str, Any], bs: int) -> Any:
    """Candidates of a target launched on a grid (alloc_extend) are Triton kernels
    (``kernel[(bs,)](...)``) or plain functions."""
    from kvparity.candidate.targets import lookup

    if lookup(target).grid_launch and hasattr(candidate, "__getitem__"):
        return candidate[(bs,)](*args, **kwargs)
    return candidate(*args, **kwargs)


def _candidate_traceback(exc: BaseException, limit: int = 8) -> str:
    """The traceback without the sandbox's own frames (the candidate's part is what matters)."""
    own = {os.path.abspath(__file__), os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_guard.py")}
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if os.path.abspath(f.filename) not in own]
    lines = "".join(traceback.format_list(frames[-limit:])).rstrip().splitlines()
    return cap_text("\n".join(lines + [_exception_text(exc)]))


def _exception_text(exc: BaseException) -> str:
    """``Type: message`` (just ``Type`` without a message), capped."""
    try:
        message = str(exc)
    except Exception:
        message = "<its message cannot be printed>"
    return cap_text(f"{type(exc).__name__}: {message}" if message else type(exc).__name__)


def _exit_code(exc: SystemExit) -> int:
    """The status Python exits with for ``exc``: None is 0, an int is itself, anything else 1."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    return 1


def _failure(exc: BaseException) -> dict[str, Any]:
    """The reply for a candidate call or load that did not return: an exit or an exception."""
    if isinstance(exc, SystemExit):
        code = _exit_code(exc)
        error = cap_text(f"exited with code {code}: the candidate raised SystemExit({exc.code!r})")
        return {"status": "raised", "kind": "exited", "code": code, "error": error,
                "traceback": _candidate_traceback(exc)}
    return {"status": "raised", "kind": "raised", "error": _exception_text(exc), "traceback": _candidate_traceback(exc)}


def _device_usable() -> bool:
    """False when the candidate left the CUDA context broken (an illegal address, say)."""
    from kvparity.kernels import runtime

    if runtime.DEVICE.type != "cuda":
        return True
    try:
        import torch

        torch.cuda.synchronize()
        return True
    except Exception:
        return False


def _load(message: dict[str, Any], cache: dict[tuple[str, str], Any]) -> dict[str, Any] | None:
    from kvparity.candidate.loader import CandidateLoadError, load_candidate

    key = (message["spec"], message["target"])
    if key in cache:
        return None
    try:
        cache[key] = load_candidate(*key)
    except CandidateLoadError as exc:
        return {"status": "load_error", "error": cap_text(str(exc))}
    except BaseException as exc:  # SystemExit, KeyboardInterrupt... while its module runs
        failure = _failure(exc)
        what = failure["error"] if failure["kind"] == "exited" else f"raised {failure['error']}"
        return {"status": "load_error", "error": cap_text(f"candidate {key[0]!r}: loading it {what}")}
    return None


def _handle_call(message: dict[str, Any], cache: dict[tuple[str, str], Any]) -> dict[str, Any]:
    from kvparity.candidate.inputs import KernelBatch, candidate_args, describe_return
    from kvparity.candidate.sandbox_guard import GuardedMemory
    from kvparity.kernels import runtime

    problem = _load(message, cache)
    if problem is not None:
        return problem
    if message["op"] == "load":
        return {"status": "loaded"}
    batch = KernelBatch.from_dict(message["batch"])
    memory = GuardedMemory(batch, runtime.DEVICE)
    try:
        args, kwargs = candidate_args(memory.materialised)
        try:
            value = _launch(cache[(message["spec"], message["target"])], batch.target, args, kwargs, batch.bs)
            if runtime.DEVICE.type == "cuda":
                import torch

                torch.cuda.synchronize()
        except BaseException as exc:  # sys.exit() or KeyboardInterrupt in a candidate is its fault, not a crash
            return {**_failure(exc), "restart": not _device_usable()}
        try:
            returned = describe_return(value)
        except Exception as exc:
            returned = {"type": cap_text(f"{type(value).__name__} (kvparity could not read it: {_exception_text(exc)})")}
        reply: dict[str, Any] = {"status": "returned", "buffers": memory.snapshot(), "returned": returned}
        if memory.moat_damaged():
            hits = memory.guard_hits()
            reply.update(status="raised", kind="guard_damaged", traceback=cap_text("\n".join(hits)),
                         error=f"guard damaged: wrote outside the tensors it was given, beyond kvparity's guard "
                               f"margins: {hits[0]}")
        return reply
    finally:
        memory.release()


def _die_with_keeper() -> None:
    """SIGKILL this worker when the keeper ends (and end now if it already has)."""
    keeper = os.environ.pop(_KEEPER_ENV, None)
    if keeper is None:
        return
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != int(keeper):
        os._exit(70)


def worker_main() -> None:
    _die_with_keeper()
    requests = os.fdopen(os.dup(0), "rb")  # private copies: the candidate gets /dev/null and stderr
    protocol = os.fdopen(os.dup(1), "wb")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)  # candidate prints go to stderr, never into the protocol
    sys.stdout = sys.stderr

    from kvparity.kernels import runtime  # fixes TRITON_INTERPRET before any candidate imports triton

    def send(message: dict[str, Any]) -> None:
        protocol.write((json.dumps(message) + "\n").encode())
        protocol.flush()

    send({"ready": True, "device": str(runtime.DEVICE)})
    cache: dict[tuple[str, str], Any] = {}
    for line in requests:
        message = json.loads(line)
        if message.get("op") not in ("call", "load"):
            send({"status": "load_error", "error": f"sandbox: unknown op {message.get('op')!r}"})
            continue
        try:
            reply = _handle_call(message, cache)
        except Exception as exc:  # kvparity's own part failed (the candidate's faults are replies above)
            reply = {"status": "crashed", "error": f"kvparity's sandbox worker failed: {_exception_text(exc)}",
                     "traceback": cap_text(traceback.format_exc()), "restart": True}
        send(reply)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--keeper"]:
        keeper_main(int(sys.argv[2]), int(sys.argv[3]))
    else:
        worker_main()
