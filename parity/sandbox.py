"""Run candidate calls in a child process, so no candidate can crash, hang or corrupt kvparity.

The parent (``Sandbox``) keeps ONE worker process (``python -m parity.sandbox``) for many calls,
because importing torch and Triton takes seconds; the worker is restarted after it crashes or
times out. Messages are JSON lines: the parent sends the target, the candidate spec and the batch
as plain data; the worker loads the candidate itself (after ``kernels``, so the Triton mode is
fixed first), materialises the guarded tensors, calls the candidate and sends back every buffer
(guards included) and a description of the return value, or the exception. The parent judges.

The worker's protocol channel is a private copy of its stdout; fd 1 is pointed at stderr, so a
candidate that prints cannot break the protocol. The worker's stderr goes to a temporary file whose
tail is quoted when the worker dies.
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
from typing import Any

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_CALL_TIMEOUT = 10.0
DEFAULT_START_TIMEOUT = 120.0


@dataclass
class Outcome:
    """What one call came to. ``status``: "returned" (``reply`` holds buffers and return),
    "raised", "load_error", "crashed" or "timed_out" (``error`` says what happened)."""

    status: str
    reply: dict[str, Any] | None = None
    error: str = ""


class WorkerDied(Exception):
    pass


class WorkerTimedOut(Exception):
    pass


def _signal_text(returncode: int | None) -> str:
    if returncode is None:
        return "did not exit"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name} (exit code {returncode})"
    return f"exited with status {returncode}"


class Sandbox:
    """A persistent worker process for candidate calls. Use as a context manager, or ``close()``."""

    def __init__(
        self, call_timeout: float = DEFAULT_CALL_TIMEOUT, start_timeout: float = DEFAULT_START_TIMEOUT
    ) -> None:
        self.call_timeout = call_timeout
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self.stderr_file: Any = None
        self.pending = b""
        self.starts = 0
        self.device: str | None = None

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ process management

    def _env(self) -> dict[str, str]:
        from kernels import runtime  # the child must run kernels exactly as this process does

        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([REPO_ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        env["KVPARITY_DEVICE"] = runtime.DEVICE.type
        env["PYTHONFAULTHANDLER"] = "1"  # a segfault prints the Python stack to the stderr file
        return env

    def start(self) -> None:
        self.close()
        self.stderr_file = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "parity.sandbox"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self.stderr_file, cwd=REPO_ROOT, env=self._env(),
            start_new_session=True,  # its own process group: close() also ends what a candidate spawned
        )
        self.pending = b""
        self.starts += 1
        try:
            ready = self._receive(self.start_timeout)
        except (WorkerDied, WorkerTimedOut) as exc:
            self.close()
            raise RuntimeError(f"kvparity sandbox worker failed to start: {exc}") from exc
        self.device = ready.get("device")

    def close(self) -> None:
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # the group this Sandbox started, nothing else
            except (ProcessLookupError, PermissionError):
                pass
            self.proc.wait()
            for stream in (self.proc.stdin, self.proc.stdout):
                if stream:
                    stream.close()
            self.proc = None
        if self.stderr_file is not None:
            self.stderr_file.close()
            self.stderr_file = None

    def stderr_tail(self, lines: int = 12) -> str:
        if self.stderr_file is None:
            return ""
        self.stderr_file.seek(0)
        text = self.stderr_file.read().decode(errors="replace")
        return "\n".join(text.strip().splitlines()[-lines:])

    # ------------------------------------------------------------------ messages

    def _send(self, message: dict[str, Any]) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write((json.dumps(message) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise WorkerDied(f"worker gone before the call ({exc})") from exc

    def _receive(self, timeout: float) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self.pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WorkerTimedOut(f"no answer within {timeout:g} s")
            readable, _, _ = select.select([fd], [], [], left)
            if not readable:
                continue
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                self.proc.wait()
                raise WorkerDied(_signal_text(self.proc.returncode))
            self.pending += chunk
        line, _, self.pending = self.pending.partition(b"\n")
        return json.loads(line)

    def call(self, target: str, spec: str, batch_json: str) -> Outcome:
        """One candidate call on one batch (``KernelBatch.to_json()``), judged by status only."""
        return self._exchange({"op": "call", "target": target, "spec": spec, "batch": json.loads(batch_json)})

    def load(self, target: str, spec: str) -> Outcome:
        """Load (and signature-check) the candidate in the worker: status "loaded" or "load_error"
        (or "crashed" / "timed_out" when the candidate's module does that on import)."""
        return self._exchange({"op": "load", "target": target, "spec": spec})

    def _exchange(self, message: dict[str, Any]) -> Outcome:
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        try:
            self._send(message)
            reply = self._receive(self.call_timeout)
        except WorkerTimedOut:
            self.close()
            return Outcome("timed_out", error=f"the call did not return within {self.call_timeout:g} s; worker killed")
        except WorkerDied as exc:
            tail = self.stderr_tail()
            self.close()
            quoted = f"; its stderr ends with:\n{tail}" if tail else ""
            return Outcome("crashed", error=f"the worker process {exc}{quoted}")
        if reply.get("restart"):  # e.g. a CUDA fault: the worker's device context is unusable now
            self.close()
        return Outcome(reply["status"], reply, reply.get("error", ""))


# ---------------------------------------------------------------------- the worker (child) side


def _launch(candidate: Any, target: str, args: list[Any], kwargs: dict[str, Any], bs: int) -> Any:
    """alloc_extend candidates are Triton kernels (``kernel[(bs,)](...)``) or plain functions."""
    if target == "alloc_extend" and hasattr(candidate, "__getitem__"):
        return candidate[(bs,)](*args, **kwargs)
    return candidate(*args, **kwargs)


def _candidate_traceback(exc: BaseException, limit: int = 8) -> str:
    """The traceback without the sandbox's own frames (the candidate's part is what matters)."""
    own = os.path.abspath(__file__)
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if os.path.abspath(f.filename) != own]
    lines = "".join(traceback.format_list(frames[-limit:])).rstrip().splitlines()
    return "\n".join(lines + [f"{type(exc).__name__}: {exc}"])


def _device_usable() -> bool:
    """False when the candidate left the CUDA context broken (an illegal address, say)."""
    from kernels import runtime

    if runtime.DEVICE.type != "cuda":
        return True
    try:
        import torch

        torch.cuda.synchronize()
        return True
    except Exception:
        return False


def _handle_call(message: dict[str, Any], cache: dict[tuple[str, str], Any]) -> dict[str, Any]:
    from kernels import runtime
    from parity.candidates import CandidateLoadError, load_candidate
    from parity.target_inputs import KernelBatch, candidate_args, describe_return, materialise

    key = (message["spec"], message["target"])
    if key not in cache:
        try:
            cache[key] = load_candidate(*key)
        except CandidateLoadError as exc:
            return {"status": "load_error", "error": str(exc)}
    if message["op"] == "load":
        return {"status": "loaded"}
    batch = KernelBatch.from_dict(message["batch"])
    m = materialise(batch, runtime.DEVICE)
    args, kwargs = candidate_args(m)
    try:
        value = _launch(cache[key], batch.target, args, kwargs, batch.bs)
        if runtime.DEVICE.type == "cuda":
            import torch

            torch.cuda.synchronize()
    except (Exception, SystemExit) as exc:  # sys.exit() in a candidate is its fault, not a crash
        return {"status": "raised", "error": f"{type(exc).__name__}: {exc}", "traceback": _candidate_traceback(exc),
                "restart": not _device_usable()}
    return {"status": "returned", "buffers": m.snapshot(), "returned": describe_return(value)}


def worker_main() -> None:
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # candidate prints go to stderr, never into the protocol
    sys.stdout = sys.stderr

    from kernels import runtime  # fixes TRITON_INTERPRET before any candidate imports triton

    def send(message: dict[str, Any]) -> None:
        protocol.write(json.dumps(message) + "\n")
        protocol.flush()

    send({"ready": True, "device": str(runtime.DEVICE)})
    cache: dict[tuple[str, str], Any] = {}
    for line in sys.stdin:
        message = json.loads(line)
        if message.get("op") not in ("call", "load"):
            send({"status": "load_error", "error": f"sandbox: unknown op {message.get('op')!r}"})
            continue
        send(_handle_call(message, cache))


if __name__ == "__main__":
    worker_main()
