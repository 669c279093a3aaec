"""The one interface the scheduler loop and the snapshots use of a world.

kvparity's own worlds (``kvparity.engine.world.World``) and real SGLang's, one adapter class per
state-model generation (``kvparity.engine.real.adapter.RealWorld`` for 0.5.3-0.5.21,
``kvparity.engine.real.adapter_prefix_len.PrefixLenWorld`` for 0.5.22 on), answer it; whatever
differs between SGLang generations lives behind these methods, never in the loop. mypy checks
every world passed to ``Scheduler`` against it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

import torch

from kvparity.caches.pool import PoolRecord
from kvparity.mem_cache.errors import Exhausted


class SchedulerWorld(Protocol):
    """What ``kvparity.engine.scheduler.Scheduler`` and ``kvparity.engine.snapshot`` read and call."""

    req_to_token_pool: Any
    allocator: Any
    tree_cache: Any

    @property
    def family(self) -> str:
        """The SGLang version a world behaves as: "legacy" or "refactored"."""
        ...

    @property
    def stash_frees_row(self) -> bool:
        """Whether the scheduler frees the chunked request's row after caching it (up to 0.5.8)."""
        ...

    def new_req(self, rid: str, tokens: list[int], *, return_logprob: bool = False, logprob_start_len: int = -1,
                max_new_tokens: int = 16, extra_key: str | None = None) -> Any:
        """A request as the tokenizer hands it over (its logprob start set as on arrival)."""
        ...

    def batch(self, reqs: list[Any]) -> Any:
        """A prefill or decode batch of ``reqs`` (``prepare_for_extend``, ``prepare_for_decode``, ...)."""
        ...

    def init_next_round_input(self, req: Any, use_tree_cache: bool = True) -> None:
        """Match the request's prefix (or, without the tree, keep what it has) before admission."""
        ...

    def admit(self, req: Any, tokens: int | None, *, continuing: bool) -> None:
        """The request joins the batch, cut to ``tokens`` new tokens (None: whole)."""
        ...

    def lock(self, req: Any) -> None:
        """The admission lock on the matched tree node."""
        ...

    def host_events(self) -> None:
        """A host tier's acknowledgements, read where a server's pass starts (none without one)."""
        ...

    def load_back(self, req: Any) -> None:
        """A host tier's load-back of the prefix the host keeps for ``req`` (matched, about to be
        admitted): its prefix grows by what the device gets back (nothing without one)."""
        ...

    def cache_unfinished_req(self, req: Any, chunked: bool = False) -> None:
        """Publish what a running (or chunked) request has computed so far."""
        ...

    def cache_finished_req(self, req: Any) -> None:
        """Release a finished request's KV into the tree."""
        ...

    def evict(self, num_tokens: int) -> None:
        """Evict from the tree."""
        ...

    def refuse(self, req: Any) -> None:
        """A request matched this pass and not admitted: what the scheduler gives back (a Mamba
        model's state slot its match took, where the release frees it)."""
        ...

    def out_of_memory(self, exc: BaseException) -> Exhausted | None:
        """What ran out, when ``exc`` is the world's out-of-memory error, else None."""
        ...

    def release_pages(self) -> torch.Tensor:
        """Freed pages waiting for the next merge."""
        ...

    def tree_contents(self) -> list[tuple]:
        """``(extra key, full token path, node slots, lock)`` per tree node, sorted."""
        ...

    def all_tree_slots(self) -> list[int]:
        """Every slot the tree holds."""
        ...

    def pool_records(self, radix: bool, reqs: Iterable[Any]) -> dict[str, PoolRecord]:
        """The records of the pools beside the device's KV, by the names ``kvparity.caches``
        registers (a window's, a state pool's, a host tier's; none for full attention), ``reqs``:
        the player's waiting requests."""
        ...
