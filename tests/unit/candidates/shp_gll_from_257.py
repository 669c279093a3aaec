"""WRONG only in batches of more than 257 requests: -1 for every request with index >= 257."""

import torch


def get_last_loc(req_to_token, req_pool_indices_tensor, prefix_lens_tensor):
    read = req_to_token[req_pool_indices_tensor, (prefix_lens_tensor - 1).clamp(min=0)].to(torch.int64)
    result = torch.where(prefix_lens_tensor > 0, read, torch.full_like(read, -1))
    result[257:] = -1  # the bug
    return result
