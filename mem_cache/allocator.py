"""KV-slot allocators: page size 1 and paged (SPEC section 1).

Both keep ``free_pages`` (``int64``) and, while a sort is pending (``need_sort``), a
``release_pages`` list that freed pages go to. When they are merged and sorted depends on the call,
as in SGLang: ``alloc`` merges when it would otherwise fall short; the paged ``alloc_extend`` merges
when ``extend_num_tokens // page_size + bs + 1 > len(free_pages)`` (a cheap upper bound, whatever
the real need) and ``alloc_decode`` when ``bs > len(free_pages)``. A merge stays done even when the
call then fails. The paged allocator's ``alloc_extend`` runs the kernel of ``kernels.alloc_extend``
on the backend given to the constructor.
"""

from __future__ import annotations

import torch

from kvparity.kernels import runtime
from kvparity.kernels.alloc_extend import alloc_extend as alloc_extend_slots
from kvparity.kernels.alloc_extend import new_pages_needed, next_power_of_2


class TokenToKVPoolAllocator:
    """Page size 1: a page is a slot. Slot 0 is reserved, so ``free_pages`` is ``1..size``."""

    page_size = 1

    def __init__(self, size: int, device: torch.device | str, *, need_sort: bool = False, backend: str = "torch"):
        self.size = size
        self.device = torch.device(device)
        self.need_sort = need_sort
        self.backend = runtime.check_backend(backend)
        self.clear()

    # ---- state -------------------------------------------------------------------------------
    def clear(self) -> None:
        num_pages = self.size // self.page_size
        self.free_pages = torch.arange(1, num_pages + 1, dtype=torch.int64, device=self.device)
        self.release_pages = torch.empty((0,), dtype=torch.int64, device=self.device)
        self.is_not_in_free_group = True
        self.free_group: list[torch.Tensor] = []
        self.num_merges = 0

    def available_size(self) -> int:
        return (len(self.free_pages) + len(self.release_pages)) * self.page_size

    def backup_state(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.free_pages.clone(), self.release_pages.clone()

    def restore_state(self, state: tuple[torch.Tensor, torch.Tensor]) -> None:
        self.free_pages, self.release_pages = state[0].clone(), state[1].clone()

    def merge_and_sort_free(self) -> None:
        if len(self.release_pages) > 0:
            self.num_merges += 1  # a statistic for the harness's scenario classes
            merged = torch.cat((self.free_pages, self.release_pages))
            self.free_pages = torch.sort(merged).values
            self.release_pages = torch.empty((0,), dtype=torch.int64, device=self.device)

    def _merge_if(self, short: bool) -> None:
        """Merge a pending sort when ``short`` (each call has its own rule for "short")."""
        if self.need_sort and short:
            self.merge_and_sort_free()

    def _ensure_pages(self, num_pages: int) -> bool:
        """``alloc``'s rule: merge when the free list alone is short; True when ``num_pages`` pages
        can be taken."""
        self._merge_if(num_pages > len(self.free_pages))
        return num_pages <= len(self.free_pages)

    def _take_pages(self, num_pages: int) -> torch.Tensor:
        taken = self.free_pages[:num_pages]
        self.free_pages = self.free_pages[num_pages:]
        return taken

    # ---- free groups ---------------------------------------------------------------------------
    def free_group_begin(self) -> None:
        self.is_not_in_free_group = False
        self.free_group = []

    def free_group_end(self) -> None:
        self.is_not_in_free_group = True
        if self.free_group:
            self.free(torch.cat(self.free_group))
        self.free_group = []

    # ---- alloc / free ----------------------------------------------------------------------------
    def alloc(self, need_size: int) -> torch.Tensor | None:
        if not self._ensure_pages(need_size):
            return None
        return self._take_pages(need_size)

    def free(self, free_index: torch.Tensor) -> None:
        if free_index.numel() == 0:
            return
        if not self.is_not_in_free_group:
            self.free_group.append(free_index)
            return
        self._release(free_index.to(device=self.device, dtype=torch.int64))

    def _release(self, pages: torch.Tensor) -> None:
        # Page size 1: freed slots go to the END of the list.
        if self.need_sort:
            self.release_pages = torch.cat((self.release_pages, pages))
        else:
            self.free_pages = torch.cat((self.free_pages, pages))


class PagedTokenToKVPoolAllocator(TokenToKVPoolAllocator):
    """``free_pages`` holds page ids ``1..size//page_size``; freed pages go to the FRONT."""

    def __init__(
        self,
        size: int,
        page_size: int,
        device: torch.device | str,
        *,
        need_sort: bool = False,
        backend: str = "torch",
    ):
        if page_size < 1 or page_size & (page_size - 1):
            raise ValueError(f"PagedTokenToKVPoolAllocator: page_size={page_size} must be a power of two")
        self.page_size = page_size
        # SGLang's running maximum of next_power_of_2(extend_num_tokens): the kernel's tile size,
        # so a batch is compiled for the largest extend seen so far, not for its own.
        self.seen_max_num_extend_tokens_next_power_of_2 = 1
        super().__init__(size, device, need_sort=need_sort, backend=backend)

    def _slots_of(self, pages: torch.Tensor) -> torch.Tensor:
        within = torch.arange(self.page_size, dtype=torch.int64, device=self.device)
        return (pages[:, None] * self.page_size + within).reshape(-1)

    def alloc(self, need_size: int) -> torch.Tensor | None:
        if need_size % self.page_size != 0:
            raise ValueError(f"paged alloc: need_size={need_size} is not a multiple of page_size={self.page_size}")
        num_pages = need_size // self.page_size
        if not self._ensure_pages(num_pages):
            return None
        return self._slots_of(self._take_pages(num_pages))

    def alloc_extend(
        self,
        prefix_lens: torch.Tensor,
        prefix_lens_cpu: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor,
        last_loc: torch.Tensor,
        extend_num_tokens: int,
    ) -> torch.Tensor | None:
        """Slots of positions ``prefix_len .. seq_len-1`` of every request (SPEC section 1), or
        ``None`` (with ``free_pages`` unchanged, a merge kept) when there are not enough free pages.

        SGLang launches its kernel before checking; here the check comes first (the kernel would
        read past ``free_pages``), which returns the same thing and consumes the same pages."""
        self.seen_max_num_extend_tokens_next_power_of_2 = max(
            self.seen_max_num_extend_tokens_next_power_of_2, next_power_of_2(extend_num_tokens)
        )
        bs = len(prefix_lens_cpu)
        self._merge_if(extend_num_tokens // self.page_size + bs + 1 > len(self.free_pages))
        num_new_pages = new_pages_needed(prefix_lens_cpu, seq_lens_cpu, self.page_size)
        if num_new_pages > len(self.free_pages):
            return None
        out = alloc_extend_slots(
            prefix_lens,
            seq_lens,
            last_loc,
            self.free_pages,
            self.page_size,
            extend_num_tokens,
            backend=self.backend,
            max_num_extend_tokens=self.seen_max_num_extend_tokens_next_power_of_2,
        )
        self._take_pages(num_new_pages)
        return out

    def alloc_decode(
        self, seq_lens: torch.Tensor, seq_lens_cpu: torch.Tensor, last_loc: torch.Tensor
    ) -> torch.Tensor | None:
        """One slot per request for position ``seq_len - 1`` (``seq_lens`` are the NEW lengths):
        ``last_loc + 1`` inside the current page, else the first slot of a new page, pages taken in
        request order. A pending sort is merged when ``bs > len(free_pages)``, whatever the need.
        Torch only: the refactor did not touch decode."""
        self._merge_if(len(seq_lens_cpu) > len(self.free_pages))
        starts_page = (seq_lens_cpu - 1) % self.page_size == 0
        num_new_pages = int(starts_page.sum().item())
        if num_new_pages > len(self.free_pages):
            return None
        pages = self._take_pages(num_new_pages)
        out = (last_loc.to(torch.int64) + 1).clone()
        out[starts_page.to(out.device)] = pages * self.page_size
        return out

    def _release(self, slots: torch.Tensor) -> None:
        # Paged: the distinct pages of the freed slots go to the FRONT of the list.
        pages = torch.unique(slots // self.page_size)
        if self.need_sort:
            self.release_pages = torch.cat((pages, self.release_pages))
        else:
            self.free_pages = torch.cat((pages, self.free_pages))
