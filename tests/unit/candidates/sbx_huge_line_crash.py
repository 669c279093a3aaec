"""SANDBOX: floods a report: one 4 MB line on stderr, then the worker kills itself with SIGKILL
(no stack dump follows, so the line is the last thing on stderr: write_cache_indices); an
exception whose message is one 4 MB line (raises_huge)."""

import os
import signal
import sys

HUGE = 4 * 1024 * 1024


def write_cache_indices(out_cache_loc, req_pool_indices_tensor, req_pool_indices_cpu, prefix_lens_tensor,
                        prefix_lens_cpu, seq_lens_tensor, seq_lens_cpu, extend_lens_tensor, extend_lens_cpu,
                        prefix_tensors, req_to_token_pool):
    sys.stderr.write("HUGE-LINE-START" + "x" * HUGE + "HUGE-LINE-END\n")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def raises_huge(out_cache_loc, req_pool_indices_tensor, req_pool_indices_cpu, prefix_lens_tensor,
                prefix_lens_cpu, seq_lens_tensor, seq_lens_cpu, extend_lens_tensor, extend_lens_cpu,
                prefix_tensors, req_to_token_pool):
    raise ValueError("HUGE-MESSAGE-START" + "y" * HUGE + "HUGE-MESSAGE-END")
