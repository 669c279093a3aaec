"""SANDBOX: writes a line that is not JSON into every pipe it can write to (the worker's private
reply channel among them) and returns without writing any row: the reply stream is broken, which
is the worker's fault, and kvparity's own process must survive it."""

import os
import stat


def write_cache_indices(out_cache_loc, req_pool_indices_tensor, req_pool_indices_cpu, prefix_lens_tensor,
                        prefix_lens_cpu, seq_lens_tensor, seq_lens_cpu, extend_lens_tensor, extend_lens_cpu,
                        prefix_tensors, req_to_token_pool):
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if fd > 2 and stat.S_ISFIFO(os.fstat(fd).st_mode):
                os.write(fd, b"this is not a kvparity reply\n")
        except OSError:
            pass
