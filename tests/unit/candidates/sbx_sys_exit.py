"""SANDBOX: ends the process: ``sys.exit(3)`` (write_cache_indices), ``sys.exit("bye")``
(exits_with_message: status 1) and ``os._exit(5)`` (os_exit: no exception, the process just ends)."""

import os
import sys


def write_cache_indices(out_cache_loc, req_pool_indices_tensor, req_pool_indices_cpu, prefix_lens_tensor,
                        prefix_lens_cpu, seq_lens_tensor, seq_lens_cpu, extend_lens_tensor, extend_lens_cpu,
                        prefix_tensors, req_to_token_pool):
    sys.exit(3)


def exits_with_message(out_cache_loc, req_pool_indices_tensor, req_pool_indices_cpu, prefix_lens_tensor,
                       prefix_lens_cpu, seq_lens_tensor, seq_lens_cpu, extend_lens_tensor, extend_lens_cpu,
                       prefix_tensors, req_to_token_pool):
    sys.exit("bye")


def os_exit(out_cache_loc, req_pool_indices_tensor, req_pool_indices_cpu, prefix_lens_tensor,
            prefix_lens_cpu, seq_lens_tensor, seq_lens_cpu, extend_lens_tensor, extend_lens_cpu,
            prefix_tensors, req_to_token_pool):
    os._exit(5)
