"""The plug-in targets, declared once (in the manner of PyTorch's OpInfo): one ``Target`` record
per SGLang function a candidate may replace, holding everything the harness knows about it:

- its **signature** (SPEC section 9: the positional parameters SGLang passes) and how it is
  launched (a plain function, or also a Triton kernel ``kernel[(bs,)](...)``);
- its **input strategy**, declared: where the batch's new slots come from (``new_slots``), what
  the ``req_to_token`` table is to it (``table``), and the request block it takes requests in;
  ``kvparity.candidate.inputs.kernel_batches`` draws batches from these fields;
- its **materialisation** (a drawn ``KernelBatch`` becomes guarded tensors) and its
  **arguments** (those tensors in SGLang's order);
- its **reference** (this repository's torch twin of legacy, run on materialised tensors);
- how its **effect is compared** (``returns``: is the return value the result, must it be None,
  or is it ignored; ``cells_are``: which request a wrong cell belongs to);
- its **error inputs**: batches breaking SPEC section 8 and the violation each is refused with.

Nothing else in the harness branches on a target's name: it looks the record up (``lookup``).
``prepare_for_extend`` (the whole path, checked without a candidate) is not a plug-in target.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from kvparity.model.poison import POISON

# The command line reads the names before it chooses the device, so importing the registry imports
# no torch: the records' functions import it (and the guarded tensors) when they run.
if TYPE_CHECKING:
    import torch

    from kvparity.candidate.guarded import Materialised
    from kvparity.candidate.inputs import KernelBatch  # target_inputs imports this module

WHOLE_PATH = "prepare_for_extend"  # ``kvparity check``'s default target: the whole path, no candidate
WRITE_BLOCK = 512  # the write kernels copy a row in blocks of 512 columns
LAST_LOC_BLOCK = 256  # get_last_loc's Triton kernel takes requests in blocks of 256
FILLER_BASE = 1_000_000  # an input table: cells outside a prefix hold FILLER_BASE + flat index

NewSlots = Literal["given", "allocated", "none"]  # out_cache_loc handed in / allocated from free pages / no new slots
Returns = Literal["result", "none", "ignored"]  # the return is the result / must be None / is not looked at
CellsAre = Literal["rows", "requests", "tokens"]  # a wrong cell's row is a table row / its index a request / a token


@dataclass(frozen=True)
class ErrorInput:
    """A batch (``KernelBatch`` fields besides ``target``) that breaks SPEC section 8, and the one
    violation ``contract_violations`` must name for it."""

    what: str
    fields: dict[str, Any]
    violation: str


@dataclass(frozen=True)
class Target:
    """Everything about one plug-in target (see the module docstring)."""

    name: str
    signature: tuple[str, ...]
    grid_launch: bool  # a candidate may be a Triton kernel, launched as kernel[(bs,)](...)
    new_slots: NewSlots
    table: str | None  # req_to_token's role: "output" (written), "input" (read, filler outside prefixes), None
    returns: Returns
    cells_are: CellsAre
    request_block: int  # requests per block of its kernels, past which a batch "crosses a block"
    request_block_note: str  # after "N batches of more than B requests" in a check's coverage
    column_block_note: str | None  # None: rows past WRITE_BLOCK are not counted (they play no part)
    materialise: Callable[[KernelBatch, torch.device], Materialised]
    arguments: Callable[[Materialised], tuple[list[Any], dict[str, Any]]]
    reference: Callable[[Materialised], Any]  # runs legacy on the views; returns what it returns
    interpreter_cost: Callable[[KernelBatch], float]  # seconds a call may take beyond the usual allowance
    error_inputs: tuple[ErrorInput, ...]

    @property
    def paged(self) -> bool:
        """Allocating targets take a page size; the others see page size 1."""
        return self.new_slots == "allocated"


# --------------------------------------------------------------------------- materialisation


def initial_table(batch: KernelBatch, role: str) -> list[int]:
    """An output table: POISON everywhere (a cell nobody should write stays POISON). An input
    table: each row holds its prefix in ``[0, prefix_len)`` and distinct filler elsewhere, so
    reading a wrong column or row gives a wrong value."""
    n = batch.pool_rows * batch.width
    if role == "output":
        return [POISON] * n
    cells = [FILLER_BASE + k for k in range(n)]
    for row, prefix in zip(batch.rows, batch.prefixes):
        cells[row * batch.width : row * batch.width + len(prefix)] = prefix
    return cells


def _with_table(batch: KernelBatch, device: torch.device, role: str) -> Materialised:
    """The table, then the rows and prefix lengths every target with a table gets."""
    from kvparity.candidate.guarded import Materialised, guarded_table, guarded_vector

    m = Materialised(batch)
    m.add(guarded_table(batch, device, initial_table(batch, role), role))
    m.add(guarded_vector("req_pool_indices_tensor", list(batch.rows), device))
    m.add(guarded_vector("prefix_lens_tensor", batch.prefix_lens, device))
    return m


def _materialise_write(batch: KernelBatch, device: torch.device) -> Materialised:
    import torch

    from kvparity.candidate.guarded import guarded_vector

    m = _with_table(batch, device, "output")
    m.add(guarded_vector("seq_lens_tensor", list(batch.seq_lens), device))
    m.add(guarded_vector("extend_lens_tensor", batch.extend_lens, device))
    cpu = torch.device("cpu")
    for name, values in (("req_pool_indices_cpu", list(batch.rows)), ("prefix_lens_cpu", batch.prefix_lens),
                         ("seq_lens_cpu", list(batch.seq_lens)), ("extend_lens_cpu", batch.extend_lens)):
        m.add(guarded_vector(name, values, cpu))
    m.add(guarded_vector("out_cache_loc", list(batch.out_cache_loc), device))
    for i, prefix in enumerate(batch.prefixes):
        m.add(guarded_vector(f"prefix_tensors[{i}]", list(prefix), device))
    return m


def _materialise_last_loc(batch: KernelBatch, device: torch.device) -> Materialised:
    return _with_table(batch, device, "input")


def _materialise_alloc(batch: KernelBatch, device: torch.device) -> Materialised:
    from kvparity.candidate.guarded import Materialised, guarded_vector

    m = Materialised(batch)
    m.add(guarded_vector("req_pool_indices_tensor", list(batch.rows), device))
    m.add(guarded_vector("prefix_lens_tensor", batch.prefix_lens, device))
    m.add(guarded_vector("seq_lens_tensor", list(batch.seq_lens), device))
    m.add(guarded_vector("last_loc", batch.last_loc, device))
    m.add(guarded_vector("free_pages", list(batch.free_pages), device))
    m.add(guarded_vector("out_indices", [], device, "output", fill=POISON, length=batch.extend_num_tokens))
    return m


# --------------------------------------------------------------------------- arguments (SPEC section 9)
# All positional, as SGLang passes them (the keyword dict stays empty).


def _write_arguments(m: Materialised) -> tuple[list[Any], dict[str, Any]]:
    from kvparity.candidate.guarded import GuardedPool

    v = m.view
    prefixes = [v(f"prefix_tensors[{i}]") for i in range(m.batch.bs)]
    names = WRITE_CACHE_INDICES.signature[:-2]  # then the prefix tensors and the pool
    return [v(n) for n in names] + [prefixes, GuardedPool(v("req_to_token"))], {}


def _last_loc_arguments(m: Materialised) -> tuple[list[Any], dict[str, Any]]:
    v = m.view
    return [v("req_to_token"), v("req_pool_indices_tensor"), v("prefix_lens_tensor")], {}


def _alloc_arguments(m: Materialised) -> tuple[list[Any], dict[str, Any]]:
    from kvparity.kernels.alloc_extend import next_power_of_2

    b, v = m.batch, m.view
    tiles = [next_power_of_2(b.bs), b.page_size, next_power_of_2(b.extend_num_tokens)]
    return [v("prefix_lens_tensor"), v("seq_lens_tensor"), v("last_loc"), v("free_pages"), v("out_indices"), *tiles], {}


# --------------------------------------------------------------------------- references (legacy, torch twins)


def _write_reference(m: Materialised) -> None:
    import torch

    from kvparity.kernels.legacy_write import write_extend_slots

    v, table = m.view, m.view("req_to_token")
    for row, prefix in zip(m.batch.rows, m.batch.prefixes):  # legacy: prefix first, by torch write
        table[row, : len(prefix)] = torch.tensor(prefix, dtype=torch.int32)
    write_extend_slots(table, v("req_pool_indices_tensor"), v("prefix_lens_tensor"), v("seq_lens_tensor"),
                       v("extend_lens_tensor"), v("out_cache_loc"), backend="torch")
    return None  # SGLang's write_cache_indices returns None


def _last_loc_reference(m: Materialised) -> torch.Tensor:
    from kvparity.kernels.last_loc import get_last_loc

    v = m.view
    return get_last_loc(v("req_to_token"), v("req_pool_indices_tensor"), v("prefix_lens_tensor"), backend="torch")


def _alloc_reference(m: Materialised) -> Any:
    from kvparity.kernels.alloc_extend import alloc_extend

    b, v = m.batch, m.view
    return alloc_extend(v("prefix_lens_tensor"), v("seq_lens_tensor"), v("last_loc"), v("free_pages"), b.page_size,
                        b.extend_num_tokens, backend="torch", out=v("out_indices"))


def _no_cost(batch: KernelBatch) -> float:
    return 0.0


def _alloc_cost(batch: KernelBatch) -> float:
    """SGLang's alloc_extend kernel has every program sum over the whole batch and tile: under the
    interpreter a correct candidate on 8,192 requests takes a minute."""
    from kvparity.kernels.alloc_extend import next_power_of_2

    return 3 * batch.bs * (next_power_of_2(batch.bs) + next_power_of_2(batch.extend_num_tokens)) / 5e6


# --------------------------------------------------------------------------- the records

_MISORDERED = ErrorInput(
    "a prefix longer than the row", {"rows": (0,), "prefixes": ((1, 2, 3),), "seq_lens": (3,), "pool_rows": 1,
                                      "width": 2},
    "request 0: not 0 <= prefix_len 3 <= seq_len 3 <= width 2")
_SHARED_ROW = ErrorInput(
    "two requests in one row", {"rows": (0, 0), "prefixes": ((), ()), "seq_lens": (1, 1), "pool_rows": 1, "width": 1,
                                "out_cache_loc": (1, 2)},
    "rows (0, 0) are not distinct rows of [0, 1)")

WRITE_CACHE_INDICES = Target(
    name="write_cache_indices",
    signature=("out_cache_loc", "req_pool_indices_tensor", "req_pool_indices_cpu", "prefix_lens_tensor",
               "prefix_lens_cpu", "seq_lens_tensor", "seq_lens_cpu", "extend_lens_tensor", "extend_lens_cpu",
               "prefix_tensors", "req_to_token_pool"),
    grid_launch=False, new_slots="given", table="output", returns="none", cells_are="rows",
    request_block=WRITE_BLOCK, request_block_note="",
    column_block_note=" (the write kernels copy rows in blocks of 512)",
    materialise=_materialise_write, arguments=_write_arguments, reference=_write_reference, interpreter_cost=_no_cost,
    error_inputs=(
        _SHARED_ROW,
        ErrorInput("fewer new slots than new tokens", {"rows": (0,), "prefixes": ((),), "seq_lens": (2,),
                                                        "pool_rows": 1, "width": 2, "out_cache_loc": (1,)},
                   "out_cache_loc has 1 slots, extend lens sum to 2"),
    ),
)

GET_LAST_LOC = Target(
    name="get_last_loc",
    signature=("req_to_token", "req_pool_indices_tensor", "prefix_lens_tensor"),
    grid_launch=False, new_slots="none", table="input", returns="result", cells_are="requests",
    request_block=LAST_LOC_BLOCK, request_block_note=f" (its Triton kernel takes requests in blocks of {LAST_LOC_BLOCK})",
    column_block_note=None,
    materialise=_materialise_last_loc, arguments=_last_loc_arguments, reference=_last_loc_reference,
    interpreter_cost=_no_cost,
    error_inputs=(_MISORDERED,),
)

ALLOC_EXTEND = Target(
    name="alloc_extend",
    signature=("pre_lens_ptr", "seq_lens_ptr", "last_loc_ptr", "free_page_ptr", "out_indices",
               "bs_upper", "page_size", "max_num_extend_tokens"),
    grid_launch=True, new_slots="allocated", table=None, returns="ignored", cells_are="tokens",
    request_block=WRITE_BLOCK, request_block_note="", column_block_note="",  # as the write kernels'
    materialise=_materialise_alloc, arguments=_alloc_arguments, reference=_alloc_reference,
    interpreter_cost=_alloc_cost,
    error_inputs=(
        ErrorInput("more new pages than free ones", {"rows": (0,), "prefixes": ((),), "seq_lens": (3,),
                                                      "pool_rows": 1, "width": 3, "page_size": 2, "free_pages": (1,)},
                   "2 new pages needed, 1 free"),
        _MISORDERED,
    ),
)

REGISTRY: dict[str, Target] = {t.name: t for t in (WRITE_CACHE_INDICES, GET_LAST_LOC, ALLOC_EXTEND)}
TARGETS: tuple[str, ...] = tuple(REGISTRY)  # the plug-in targets, in the order every listing shows them
CHECK_TARGETS: tuple[str, ...] = (WHOLE_PATH, *TARGETS)  # what ``kvparity check --target`` takes


def lookup(name: str) -> Target:
    """The record of plug-in target ``name``; a ``ValueError`` naming the known ones otherwise."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"target {name!r} is not one of {TARGETS}") from None
