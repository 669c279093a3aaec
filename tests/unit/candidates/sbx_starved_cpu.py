"""A correct write_cache_indices that first needs CPU_SECONDS of CPU, pinned to one CPU (the test
crowds that CPU with busy processes: the call gets a share of it, not the whole)."""

import os
import time

import torch

CPU_SECONDS = float(os.environ.get("KVPARITY_SBX_CPU_SECONDS", "1.0"))


def write_cache_indices(out_cache_loc, req_pool_indices_tensor, req_pool_indices_cpu, prefix_lens_tensor,
                        prefix_lens_cpu, seq_lens_tensor, seq_lens_cpu, extend_lens_tensor, extend_lens_cpu,
                        prefix_tensors, req_to_token_pool):
    os.sched_setaffinity(0, {int(os.environ.get("KVPARITY_SBX_CPU", "0"))})
    start = time.process_time()
    while time.process_time() - start < CPU_SECONDS:
        pass
    pt = 0
    for i in range(len(req_pool_indices_cpu)):
        row, prefix, seq = int(req_pool_indices_cpu[i]), int(prefix_lens_cpu[i]), int(seq_lens_cpu[i])
        req_to_token_pool.write((row, slice(0, prefix)), prefix_tensors[i])
        req_to_token_pool.write((row, slice(prefix, seq)), out_cache_loc[pt:pt + seq - prefix])
        pt += seq - prefix
    return None


_ = torch
