"""How kvparity's helper processes start: a sweep's jobs, and the zygotes real-SGLang workers are
forked from (``kvparity.engine.real.zygote``). On the CPU both are forked from one fork server that
has imported what all of them need (torch, Triton's interpreter, kvparity's worlds and sweep), so
a job starts in milliseconds and a zygote imports only its SGLang; ``start_early`` starts that
server at the very beginning of a command, so that it imports while the command does its own. A
GPU run spawns each job afresh: a job must pin its GPU before torch looks at CUDA.

Nothing here imports torch: the command line calls it before the kernels are loaded.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from typing import Any

PRELOAD = ["kvparity.kernels.runtime", "kvparity.run.sweep", "kvparity.engine.real.lane"]
# What every SGLang release imports from torch (its compile stack: about 2 s of a 0.5.3 import of
# 2.7 s, 2.4 s of 0.5.22's 4.9 s): imported once, before the zygotes are forked, on a real run.
SGLANG_PRELOAD = ["torch._dynamo", "torch._inductor.compile_fx"]


def cpu_run() -> bool:
    """Whether this run's worlds play on the CPU (decided as ``kvparity.kernels.runtime`` will)."""
    runtime = sys.modules.get("kvparity.kernels.runtime")
    if runtime is not None:
        return runtime.DEVICE.type != "cuda"
    device = os.environ.get("KVPARITY_DEVICE")
    if device:
        return device == "cpu"
    return not os.path.exists("/dev/nvidiactl")  # no NVIDIA driver: torch will find no CUDA device


_preload = list(PRELOAD)


def context() -> Any:
    """The multiprocessing context jobs (and zygotes) start in."""
    if not cpu_run():
        return multiprocessing.get_context("spawn")
    forking = multiprocessing.get_context("forkserver")
    forking.set_forkserver_preload(_preload)
    return forking


def start_early(*, real_sglang: bool = False) -> None:
    """Start the fork server now, on a CPU run (it is started on first use otherwise); with
    ``real_sglang``, it also imports what every SGLang release imports from torch."""
    if cpu_run():
        from multiprocessing import forkserver

        if real_sglang:
            _preload[len(PRELOAD):] = SGLANG_PRELOAD
        context()
        forkserver.ensure_running()


PASSED_ENV = ("KVPARITY_", "HYPOTHESIS_", "TRITON_")  # the caller's variables a helper process takes
# Of those, the ones that are the caller's choices alone: a helper drops what it has and the caller
# has not. (Not TRITON_: the kernels' import sets TRITON_INTERPRET in the fork server, and a caller
# that has not imported them yet has none to pass.)
CALLERS_ONLY = ("KVPARITY_", "HYPOTHESIS_")


def passed_env() -> dict[str, str]:
    """This process's variables a helper process must see as they are now."""
    return {k: v for k, v in os.environ.items() if k.startswith(PASSED_ENV)}


def adopt_env(env: dict[str, str]) -> None:
    """In a helper process: take the caller's variables (``passed_env``), exactly. A process forked
    from a fork server started earlier would otherwise keep what the environment held then (a
    variable set for one run and removed since)."""
    for stale in [k for k in os.environ if k.startswith(CALLERS_ONLY) and k not in env]:
        del os.environ[stale]
    os.environ.update(env)


def ended_children() -> tuple[list[tuple[int, int]], bool]:
    """Every child of this process that has ended, reaped, with its wait status; and whether any
    child is left (a supervisor's one reaping loop: the candidate sandbox's, a zygote's)."""
    ended: list[tuple[int, int]] = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return ended, False
        if pid == 0:
            return ended, True
        ended.append((pid, status))
