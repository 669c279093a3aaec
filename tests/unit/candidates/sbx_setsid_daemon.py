"""SANDBOX: a correct torch write that, on its first call in a worker, starts three processes that
try to outlive kvparity: ``subprocess.Popen(start_new_session=True)``, a classic double-fork daemon
(fork, ``os.setsid()``, fork, the middle one exits) and a forked child that calls ``os.setsid()``.
Each sleeps for minutes; their pids are appended to ``$KVPARITY_SBX_PIDFILE``.
``hangs_after_spawning`` starts them and never returns."""

import os
import subprocess
import sys
import time

_started = False


def _record(pid):
    path = os.environ.get("KVPARITY_SBX_PIDFILE")
    if path:
        with open(path, "a") as f:
            f.write(f"{pid}\n")


def _sleep_forever():
    try:
        time.sleep(300)
    finally:
        os._exit(0)


def _spawn():
    global _started
    if _started:
        return
    _started = True
    popen = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True,
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _record(popen.pid)
    read, write = os.pipe()
    middle = os.fork()
    if middle == 0:  # double fork: the daemon ends up with no parent but init (or a subreaper)
        os.close(read)
        os.setsid()
        daemon = os.fork()
        if daemon == 0:
            os.close(write)
            _sleep_forever()
        os.write(write, f"{daemon}\n".encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        _record(int(f.read().strip()))
    os.waitpid(middle, 0)
    child = os.fork()
    if child == 0:
        os.setsid()
        _sleep_forever()
    _record(child)


def write_cache_indices(out_cache_loc, req_pool_indices_tensor, req_pool_indices_cpu, prefix_lens_tensor,
                        prefix_lens_cpu, seq_lens_tensor, seq_lens_cpu, extend_lens_tensor, extend_lens_cpu,
                        prefix_tensors, req_to_token_pool):
    _spawn()
    start = 0
    for i, row in enumerate(req_pool_indices_cpu.tolist()):
        pre, seq = int(prefix_lens_cpu[i]), int(seq_lens_cpu[i])
        if pre > 0:
            req_to_token_pool.write((row, slice(0, pre)), prefix_tensors[i])
        req_to_token_pool.write((row, slice(pre, seq)), out_cache_loc[start : start + seq - pre])
        start += seq - pre


def hangs_after_spawning(out_cache_loc, req_pool_indices_tensor, req_pool_indices_cpu, prefix_lens_tensor,
                         prefix_lens_cpu, seq_lens_tensor, seq_lens_cpu, extend_lens_tensor, extend_lens_cpu,
                         prefix_tensors, req_to_token_pool):
    _spawn()
    while True:
        time.sleep(0.01)
