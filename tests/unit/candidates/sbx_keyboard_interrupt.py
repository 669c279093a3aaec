"""SANDBOX: raises KeyboardInterrupt (an exception of the candidate, not a signal)."""


def write_cache_indices(out_cache_loc, req_pool_indices_tensor, req_pool_indices_cpu, prefix_lens_tensor,
                        prefix_lens_cpu, seq_lens_tensor, seq_lens_cpu, extend_lens_tensor, extend_lens_cpu,
                        prefix_tensors, req_to_token_pool):
    raise KeyboardInterrupt("the candidate pressed ctrl-c")
