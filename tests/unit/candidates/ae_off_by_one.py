"""WRONG, and a plain function rather than a kernel: part 1 (the rest of the old page) starts at
last_loc instead of last_loc + 1."""

from kvparity.kernels.alloc_extend import alloc_extend_kernel as _kernel


def alloc_extend(prefix_lens_ptr, seq_lens_ptr, last_loc_ptr, free_page_ptr, out_indices,
                 bs_upper, page_size, max_num_extend_tokens):
    _kernel[(prefix_lens_ptr.numel(),)](prefix_lens_ptr, seq_lens_ptr, last_loc_ptr - 1, free_page_ptr, out_indices,
                                        bs_upper=bs_upper, page_size=page_size,
                                        max_num_extend_tokens=max_num_extend_tokens)
