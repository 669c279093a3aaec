"""WRONG: the right values, as int32 (SGLang returns int64)."""

import torch


def get_last_loc(req_to_token, req_pool_indices_tensor, prefix_lens_tensor):
    read = req_to_token[req_pool_indices_tensor, (prefix_lens_tensor - 1).clamp(min=0)]
    return torch.where(prefix_lens_tensor > 0, read, torch.full_like(read, -1))
