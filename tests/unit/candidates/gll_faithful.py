"""A correct get_last_loc: this repo's Triton kernel."""

from kvparity.kernels.last_loc import get_last_loc as _get_last_loc


def get_last_loc(req_to_token, req_pool_indices_tensor, prefix_lens_tensor):
    return _get_last_loc(req_to_token, req_pool_indices_tensor, prefix_lens_tensor, backend="triton")
