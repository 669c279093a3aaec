"""SANDBOX: forks a grandchild that keeps every inherited file descriptor open (the worker's reply
pipe included) and sleeps, then the worker itself dies: by SIGSEGV (``write_cache_indices``) or by
``os._exit(7)`` (``exits_seven``). The pipe stays open, so only watching the worker process itself
names the death. The grandchild's pid is appended to ``$KVPARITY_SBX_PIDFILE``."""

import ctypes
import os
import time


def _fork_sleeper():
    pid = os.fork()
    if pid == 0:
        try:
            time.sleep(120)
        finally:
            os._exit(0)
    path = os.environ.get("KVPARITY_SBX_PIDFILE")
    if path:
        with open(path, "a") as f:
            f.write(f"{pid}\n")


def write_cache_indices(out_cache_loc, req_pool_indices_tensor, req_pool_indices_cpu, prefix_lens_tensor,
                        prefix_lens_cpu, seq_lens_tensor, seq_lens_cpu, extend_lens_tensor, extend_lens_cpu,
                        prefix_tensors, req_to_token_pool):
    _fork_sleeper()
    ctypes.string_at(0)


def exits_seven(out_cache_loc, req_pool_indices_tensor, req_pool_indices_cpu, prefix_lens_tensor,
                prefix_lens_cpu, seq_lens_tensor, seq_lens_cpu, extend_lens_tensor, extend_lens_cpu,
                prefix_tensors, req_to_token_pool):
    _fork_sleeper()
    os._exit(7)
