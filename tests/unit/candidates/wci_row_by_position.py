"""WRONG unless rows are 0, 1, 2, ...: request i is written into row i, not req_pool_indices[i]."""


def write_cache_indices(out_cache_loc, req_pool_indices_tensor, req_pool_indices_cpu, prefix_lens_tensor,
                        prefix_lens_cpu, seq_lens_tensor, seq_lens_cpu, extend_lens_tensor, extend_lens_cpu,
                        prefix_tensors, req_to_token_pool):
    table = req_to_token_pool.req_to_token
    start = 0
    for i in range(len(prefix_tensors)):
        pre, seq = int(prefix_lens_cpu[i]), int(seq_lens_cpu[i])
        table[i, :pre] = prefix_tensors[i].to(table.dtype)  # the bug: row i
        table[i, pre:seq] = out_cache_loc[start : start + seq - pre].to(table.dtype)
        start += seq - pre
