"""A correct write_cache_indices in two files: it imports its helper from its own folder."""

from kvp_sibling_helper import write_row


def write_cache_indices(out_cache_loc, req_pool_indices_tensor, req_pool_indices_cpu, prefix_lens_tensor,
                        prefix_lens_cpu, seq_lens_tensor, seq_lens_cpu, extend_lens_tensor, extend_lens_cpu,
                        prefix_tensors, req_to_token_pool):
    start = 0
    for i, row in enumerate(req_pool_indices_cpu.tolist()):
        ext = int(extend_lens_cpu[i])
        write_row(req_to_token_pool.req_to_token, row, prefix_tensors[i], out_cache_loc[start : start + ext])
        start += ext
