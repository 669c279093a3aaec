"""WRONG only in batches of more than 512 requests: launches at most two blocks of 256 requests
(a grid sized for a largest batch of 512), so requests from 513 on (index 512 on) keep -1."""

import torch

BLOCK = 256


def get_last_loc(req_to_token, req_pool_indices_tensor, prefix_lens_tensor):
    result = torch.full_like(prefix_lens_tensor, -1)
    blocks = min(2, -(-prefix_lens_tensor.numel() // BLOCK))  # the bug: at most two blocks
    for block in range(blocks):
        lo, hi = block * BLOCK, (block + 1) * BLOCK
        rows, lens = req_pool_indices_tensor[lo:hi], prefix_lens_tensor[lo:hi]
        read = req_to_token[rows, (lens - 1).clamp(min=0)].to(torch.int64)
        result[lo:hi] = torch.where(lens > 0, read, torch.full_like(read, -1))
    return result
