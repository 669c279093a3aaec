"""WRONG signature: ten parameters (prefix_tensors left out), SGLang passes eleven positionally."""


def write_cache_indices(out_cache_loc, req_pool_indices, req_pool_indices_cpu, prefix_lens_tensor,
                        prefix_lens_cpu, seq_lens_tensor, seq_lens_cpu, extend_lens_tensor, extend_lens_cpu,
                        req_to_token_pool):
    pass
