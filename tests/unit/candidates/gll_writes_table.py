"""WRONG: the right answer, but it clears the last prefix cell of each row it reads."""

from kvparity.kernels.last_loc import get_last_loc as _get_last_loc


def get_last_loc(req_to_token, req_pool_indices_tensor, prefix_lens_tensor):
    result = _get_last_loc(req_to_token, req_pool_indices_tensor, prefix_lens_tensor, backend="torch")
    for row, pre in zip(req_pool_indices_tensor.tolist(), prefix_lens_tensor.tolist()):
        if pre > 0:
            req_to_token[row, pre - 1] = 0
    return result
