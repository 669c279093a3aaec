"""Hand-written batches for the req_to_token write kernels, and the assertions the kernel tests share.

A write case lists, per request, the row it owns, its prefix slots and its new (extend) slots as
plain Python lists. Everything a kernel needs is derived from those lists, and the EXPECTED table
is built from them in the most literal way the spec allows (SPEC sections 3-5):

    expected = a table full of POISON
    expected[row, 0 : len(prefix)]                         = prefix   (refactored kernel only)
    expected[row, len(prefix) : len(prefix) + len(extend)] = extend

``out_cache_loc`` is simply the concatenation of every request's ``extend`` list, so the expected
table never uses a running sum: a kernel that gets its offset into ``out_cache_loc`` wrong writes
another request's values, which the literal expectation exposes. Each request's values come from
its own numeric range, so a value in the wrong place is easy to spot in a failure message.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvparity.model.poison import POISON


def ramp(start: int, n: int) -> list[int]:
    """``[start, start + 1, ..., start + n - 1]``."""
    return list(range(start, start + n))


@dataclass(frozen=True)
class Req:
    row: int
    prefix: list[int]
    extend: list[int]


@dataclass(frozen=True)
class WriteCase:
    name: str
    rows: int
    cols: int
    reqs: tuple[Req, ...]

    # ---- inputs ---------------------------------------------------------------------------------
    def poisoned_table(self, device: torch.device) -> torch.Tensor:
        return torch.full((self.rows, self.cols), POISON, dtype=torch.int32, device=device)

    def req_pool_indices(self, device: torch.device) -> torch.Tensor:
        return torch.tensor([r.row for r in self.reqs], dtype=torch.int64, device=device)

    def prefix_lens(self, device: torch.device) -> torch.Tensor:
        return torch.tensor([len(r.prefix) for r in self.reqs], dtype=torch.int64, device=device)

    def seq_lens(self, device: torch.device) -> torch.Tensor:
        return torch.tensor([len(r.prefix) + len(r.extend) for r in self.reqs], dtype=torch.int64, device=device)

    def extend_lens(self, device: torch.device) -> torch.Tensor:
        return torch.tensor([len(r.extend) for r in self.reqs], dtype=torch.int64, device=device)

    def out_cache_loc(self, device: torch.device) -> torch.Tensor:
        return torch.tensor([v for r in self.reqs for v in r.extend], dtype=torch.int64, device=device)

    def prefix_tensors(self, device: torch.device) -> list[torch.Tensor]:
        """Contiguous ``int64`` prefix tensors (SPEC section 8). An empty prefix is
        ``torch.empty((0,), dtype=torch.int64)``, the refactored default, whose ``data_ptr()`` is 0."""
        return [
            torch.tensor(r.prefix, dtype=torch.int64, device=device)
            if r.prefix
            else torch.empty((0,), dtype=torch.int64, device=device)
            for r in self.reqs
        ]

    # ---- expectations ---------------------------------------------------------------------------
    def expected_table(self, device: torch.device, *, with_prefix: bool) -> torch.Tensor:
        expected = self.poisoned_table(device)
        for r in self.reqs:
            pre = len(r.prefix)
            if with_prefix and r.prefix:
                expected[r.row, 0:pre] = torch.tensor(r.prefix, dtype=torch.int32)
            if r.extend:
                expected[r.row, pre : pre + len(r.extend)] = torch.tensor(r.extend, dtype=torch.int32)
        return expected

    def written_mask(self, *, with_prefix: bool) -> torch.Tensor:
        """``True`` exactly on the cells the kernel is allowed to write."""
        mask = torch.zeros((self.rows, self.cols), dtype=torch.bool)
        for r in self.reqs:
            pre = len(r.prefix)
            mask[r.row, (0 if with_prefix else pre) : pre + len(r.extend)] = True
        return mask


WRITE_CASES = [
    WriteCase(
        # Rows in non-identity order, a batch mixing a non-empty, an empty and a non-empty prefix.
        # Rows 1 and 4 belong to nobody.
        name="rows_3_0_2_mixed_prefixes",
        rows=5,
        cols=12,
        reqs=(
            Req(row=3, prefix=[31, 32, 33, 34], extend=[41, 42, 43]),
            Req(row=0, prefix=[], extend=[51, 52, 53, 54, 55]),
            Req(row=2, prefix=[61, 62], extend=[71]),
        ),
    ),
    WriteCase(
        # Longer than the kernels' block of 512: a 600-token prefix, a 700-token extend behind an
        # empty prefix, and a 513/513 request (one element past a block on both parts).
        name="prefix_and_extend_longer_than_block_512",
        rows=4,
        cols=1100,
        reqs=(
            Req(row=2, prefix=ramp(100_000, 600), extend=ramp(200_000, 3)),
            Req(row=0, prefix=[], extend=ramp(300_000, 700)),
            Req(row=3, prefix=ramp(400_000, 513), extend=ramp(500_000, 513)),
        ),
    ),
    WriteCase(
        # Every prefix empty: for the refactored Triton kernel the whole pointer table is 0.
        name="all_prefixes_empty",
        rows=3,
        cols=6,
        reqs=(
            Req(row=2, prefix=[], extend=[11, 12]),
            Req(row=1, prefix=[], extend=[21, 22, 23]),
        ),
    ),
    WriteCase(
        # A request with nothing to extend (prefix_len == seq_len, allowed by SPEC section 8) in
        # the middle of the batch must not shift the next request's share of out_cache_loc.
        name="zero_length_extend_in_the_middle",
        rows=3,
        cols=8,
        reqs=(
            Req(row=1, prefix=[1, 2], extend=[3]),
            Req(row=2, prefix=[4, 5, 6], extend=[]),
            Req(row=0, prefix=[], extend=[7, 8]),
        ),
    ),
]


# ---- assertions -----------------------------------------------------------------------------------
def assert_tensor_equal(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Exact equality, with dtype, shape and device checked explicitly first (no tolerances)."""
    assert actual.dtype == expected.dtype, f"dtype {actual.dtype} != {expected.dtype}"
    assert actual.shape == expected.shape, f"shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    assert actual.device.type == expected.device.type, f"device {actual.device} != {expected.device}"
    if not torch.equal(actual, expected):
        diff = (actual != expected).nonzero().tolist()
        shown = ", ".join(f"{tuple(i)}: got {actual[tuple(i)].item()} want {expected[tuple(i)].item()}" for i in diff[:8])
        raise AssertionError(f"{len(diff)} cell(s) differ; first: {shown}")


def assert_untouched_is_poison(table: torch.Tensor, written: torch.Tensor) -> None:
    """Every cell outside the ``written`` mask still holds POISON."""
    outside = table.cpu()[~written]
    stray = (outside != POISON).nonzero().flatten()
    assert stray.numel() == 0, (
        f"{stray.numel()} cell(s) outside the written ranges were changed; "
        f"cells at {(~written).nonzero()[stray[:8]].tolist()}"
    )
