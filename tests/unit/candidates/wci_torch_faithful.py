"""A correct write_cache_indices in plain torch (two writes per request), through the pool's write().
It also prints, which must not disturb kvparity's sandbox protocol."""


def write_cache_indices(out_cache_loc, req_pool_indices_tensor, req_pool_indices_cpu, prefix_lens_tensor,
                        prefix_lens_cpu, seq_lens_tensor, seq_lens_cpu, extend_lens_tensor, extend_lens_cpu,
                        prefix_tensors, req_to_token_pool):
    print("candidate: writing", len(prefix_tensors), "rows")
    start = 0
    for i, row in enumerate(req_pool_indices_cpu.tolist()):
        pre, seq = int(prefix_lens_cpu[i]), int(seq_lens_cpu[i])
        if pre > 0:
            req_to_token_pool.write((row, slice(0, pre)), prefix_tensors[i])
        req_to_token_pool.write((row, slice(pre, seq)), out_cache_loc[start : start + seq - pre])
        start += seq - pre
