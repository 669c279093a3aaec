"""A helper module next to ``sibling_candidate.py``: the candidate imports it by its plain name,
which works only when the candidate's own folder is on sys.path."""

import torch


def write_row(table, row, prefix, new):
    table[row, : prefix.numel()] = prefix.to(torch.int32)
    table[row, prefix.numel() : prefix.numel() + new.numel()] = new.to(torch.int32)
