"""WRONG: reads column prefix_len instead of prefix_len - 1 (one past the prefix), so it returns
the filler of the cell after each prefix."""

import torch


def get_last_loc(req_to_token, req_pool_indices_tensor, prefix_lens_tensor):
    cols = prefix_lens_tensor.clamp(max=req_to_token.shape[1] - 1)  # the bug: no "- 1"
    read = req_to_token[req_pool_indices_tensor, cols].to(torch.int64)
    return torch.where(prefix_lens_tensor > 0, read, torch.full_like(read, -1))
