"""Guarded memory for the sandbox worker: where the tensors a candidate gets actually live.

``kvparity.candidate.inputs.materialise`` (as the target's record lays it out) decides WHAT a candidate
gets: the names, the contents, and each tensor inside a buffer with guard margins (``MARGIN``
elements, whole rows for the table), which the parent's ``compare_effect`` checks. This module
decides WHERE those buffers live in the worker, so that an out-of-bounds store has the same effect on every run:

- every buffer is copied into a *region* of its own: the buffer exactly as ``materialise`` built it
  (so the parent's layout still matches), with a *moat* of guard value around it, at least
  ``VECTOR_MOAT`` elements (a whole Triton block of 512 and more) each side of a 1-D buffer and
  ``TABLE_MOAT_ROWS`` whole rows plus ``VECTOR_MOAT`` elements each side of the ``req_to_token``
  table. A store past ``materialise``'s margin lands in the moat, is found there by
  ``guard_hits`` (in this process) and named by tensor and index;
- on the CPU each region is its own ``mmap`` mapping with ``GAP_BYTES`` of inaccessible address
  space (``PROT_NONE``) before and after it: a store past a moat faults (SIGSEGV) instead of
  landing in another tensor, the malloc heap or kvparity's own objects. The layout is relative
  to the mapping, so the verdict on a batch does not depend on where the allocator put things.
  On a GPU (without CUDA's virtual-memory API there are no inaccessible pages to be had) the
  regions share one device buffer, moats between them and ``DEVICE_END_BYTES`` of guard at both
  ends: a store past a moat lands in a neighbour's region, or in an end, the same place on every
  run (named by that place, not by the tensor the kernel meant);
- an EMPTY tensor is a zero-length view inside its guarded buffer. torch reports ``data_ptr() == 0``
  for every tensor without elements, so Triton would get address 0 for it; the view handed to the
  candidate is an ``AddressedView`` whose ``data_ptr()`` is its real place, so a store through
  it lands in its guard;
- ``snapshot`` reads the buffers through this module's own views of the regions (never through the
  objects the candidate was given, which it may have resized or replaced) into plain lists; only
  those lists cross into the parent.
"""

from __future__ import annotations

import ctypes
import mmap
import sys
from dataclasses import dataclass
from typing import Any

import torch

from kvparity.candidate.guarded import (  # where: one wording for where a guard cell is
    GUARD,
    Guarded,
    Materialised,
    where,
)
from kvparity.candidate.inputs import KernelBatch, materialise

VECTOR_MOAT = 1024  # guard elements each side of a 1-D buffer, beyond kvparity.candidate.guarded's MARGIN
TABLE_MOAT_ROWS = 1  # whole guard rows each side of the table (plus VECTOR_MOAT elements), beyond its margin
GAP_BYTES = 64 << 20  # inaccessible address space before, between and after the CPU regions
DEVICE_END_BYTES = 16 << 20  # on a GPU: guard before the first region and after the last (no gaps there)
ALIGN = 64  # every buffer starts on a 64-byte boundary, as torch's allocator gives
MAX_HITS = 24  # guard hits listed per report (the rest are counted)
PAGE = mmap.PAGESIZE

_PROT_NONE = 0
_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000 if sys.platform.startswith("linux") else 0)


class AddressedView(torch.Tensor):
    """A tensor whose ``data_ptr()`` is its place in its storage even when it has no elements
    (torch answers 0 for those). Only empty views are wrapped; for any other tensor the answer is
    the same as torch's, so results of operations on it (which stay of this type) are unaffected."""

    def data_ptr(self) -> int:
        # int(): storage_offset() is typed int | SymInt; an eager tensor's is an int already.
        return self.untyped_storage().data_ptr() + int(self.storage_offset()) * self.element_size()


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


class _Mapping:
    """Anonymous private memory: all of it inaccessible at first; ``open`` makes a span read-write
    and returns it as a ``uint8`` tensor. ``None`` from ``create`` when mmap is not available."""

    def __init__(self, libc: Any, address: int, size: int) -> None:
        self.libc, self.address, self.size = libc, address, size

    @staticmethod
    def create(size: int) -> _Mapping | None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.mmap.restype = ctypes.c_void_p
            libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                  ctypes.c_long]
            libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        except (OSError, AttributeError):
            return None
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE
        address = libc.mmap(None, size, _PROT_NONE, flags, -1, 0)
        if address is None or address == ctypes.c_void_p(-1).value:
            return None
        return _Mapping(libc, address, size)

    def open(self, offset: int, size: int) -> torch.Tensor:
        if self.libc.mprotect(self.address + offset, size, mmap.PROT_READ | mmap.PROT_WRITE) != 0:
            raise OSError(ctypes.get_errno(), "sandbox guard: mprotect failed")
        raw = (ctypes.c_uint8 * size).from_address(self.address + offset)
        return torch.frombuffer(raw, dtype=torch.uint8)  # the tensor keeps `raw` (not the mapping) alive

    def close(self) -> None:
        if self.address:
            self.libc.munmap(self.address, self.size)
            self.address = 0


@dataclass
class _Region:
    """One guarded buffer: ``before`` + ``buffer`` + ``after`` are consecutive, in ``g``'s dtype."""

    guarded: Guarded  # buffer and view now live in the region
    original: torch.Tensor  # the buffer as materialise built it (CPU copy): its margins' expected values
    before: torch.Tensor
    after: torch.Tensor


def _moat_elements(g: Guarded) -> int:
    return TABLE_MOAT_ROWS * g.width + VECTOR_MOAT if g.width else VECTOR_MOAT


def _layout(g: Guarded, extra_before: int = 0, extra_after: int = 0) -> tuple[int, int, int]:
    """(before, buffer, after) in bytes: the buffer 64-byte aligned, each moat at least
    ``_moat_elements`` long (plus ``extra_*`` bytes), the whole a multiple of the page size (so the
    after-moat ends where the inaccessible gap begins)."""
    size = g.buffer.element_size()
    before = _round_up(_moat_elements(g) * size + extra_before, ALIGN)
    body = g.buffer.numel() * size
    total = _round_up(before + body + _moat_elements(g) * size + extra_after, PAGE)
    return before, body, total - before - body


class GuardedMemory:
    """The tensors of one batch in guarded regions (see the module's doc). ``materialised`` is what
    ``candidate_args`` takes; after the call, ``snapshot``, ``guard_hits``, then ``release``."""

    def __init__(self, batch: KernelBatch, device: torch.device) -> None:
        self.batch = batch
        self.mappings: list[_Mapping] = []
        self.regions: list[_Region] = []
        layout = materialise(batch, device).guarded  # names, roles, margins and contents
        cpu = [g for g in layout if g.buffer.device.type == "cpu"]
        other = [g for g in layout if g.buffer.device.type != "cpu"]
        placed = {id(g): r for g, r in zip(cpu, self._place_cpu(cpu))}
        placed.update({id(g): r for g, r in zip(other, self._place_device(other))})
        self.regions = [placed[id(g)] for g in layout]
        self.materialised = Materialised(batch, [r.guarded for r in self.regions])

    # ------------------------------------------------------------------ placement

    def _place_cpu(self, layout: list[Guarded]) -> list[_Region]:
        spans = [_layout(g) for g in layout]
        size = GAP_BYTES + sum(sum(s) + GAP_BYTES for s in spans)
        mapping = _Mapping.create(size) if layout else None
        if mapping is None:  # no mmap: torch memory, moats but no gaps
            return self._place_device(layout)
        self.mappings.append(mapping)
        regions, offset = [], GAP_BYTES
        for g, span in zip(layout, spans):
            regions.append(self._fill(g, mapping.open(offset, sum(span)), span))
            offset += sum(span) + GAP_BYTES
        return regions

    def _place_device(self, layout: list[Guarded]) -> list[_Region]:
        """One buffer for all regions, in order; the first region's before-moat and the last one's
        after-moat ``DEVICE_END_BYTES`` longer, so a store that leaves its region lands, up to that
        far, in memory of this layout (the same place every run), not in whatever the allocator
        put next to it."""
        if not layout:
            return []
        last = len(layout) - 1
        spans = [_layout(g, DEVICE_END_BYTES if i == 0 else 0, DEVICE_END_BYTES if i == last else 0)
                 for i, g in enumerate(layout)]
        arena = torch.empty(sum(sum(s) for s in spans), dtype=torch.uint8, device=layout[0].buffer.device)
        regions, offset = [], 0
        for g, span in zip(layout, spans):
            regions.append(self._fill(g, arena[offset : offset + sum(span)], span))
            offset += sum(span)
        return regions

    @staticmethod
    def _fill(g: Guarded, raw: torch.Tensor, span: tuple[int, int, int]) -> _Region:
        before_bytes, body_bytes, _ = span
        typed = raw.view(g.buffer.dtype)
        typed.fill_(GUARD)
        size = g.buffer.element_size()
        start, end = before_bytes // size, (before_bytes + body_bytes) // size
        buffer = typed[start:end]
        buffer.copy_(g.buffer)
        view = buffer[g.lo : g.hi].view(g.view.shape)
        if view.numel() == 0:
            view = view.as_subclass(AddressedView)
        placed = Guarded(g.name, buffer, view, g.lo, g.hi, g.role, g.width)
        return _Region(placed, g.buffer.detach().cpu().clone(), typed[:start], typed[end:])

    # ------------------------------------------------------------------ after the call

    def snapshot(self) -> dict[str, list[int]]:
        """Every buffer (materialise's margins included, moats not) as plain lists."""
        return {r.guarded.name: r.guarded.buffer.cpu().tolist() for r in self.regions}

    def moat_damaged(self) -> bool:
        return any(bool((moat != GUARD).any()) for r in self.regions for moat in (r.before, r.after))

    def guard_hits(self) -> list[str]:
        """Every guard cell (moat or margin) that no longer holds its value, by tensor and index
        relative to the tensor's first element ("row, col" for the table), as target_inputs names
        margin hits. At most ``MAX_HITS`` lines, then a count."""
        hits: list[str] = []
        total = 0
        for r in self.regions:
            g = r.guarded
            n_before = r.before.numel()
            buffer = g.buffer.cpu()
            margin = torch.zeros(buffer.numel(), dtype=torch.bool)
            margin[: g.lo] = True
            margin[g.hi :] = True
            # The position lambdas are called only in the loop below, within this iteration.
            parts = [
                (r.before.cpu(), lambda k: k - n_before, GUARD),  # noqa: B023
                (buffer, lambda k: k, None),
                (r.after.cpu(), lambda k: buffer.numel() + k, GUARD),  # noqa: B023
            ]
            for values, position, expected in parts:
                if expected is None:
                    bad = ((values != r.original) & margin).nonzero().flatten().tolist()
                else:
                    bad = (values != expected).nonzero().flatten().tolist()
                total += len(bad)
                for k in bad[: max(0, MAX_HITS - len(hits))]:
                    hits.append(f"{g.name}: guard {where(g, position(k))} holds {int(values[k])} "
                                f"(guard value {GUARD})")
        if total > len(hits):
            hits.append(f"... and {total - len(hits)} more guard cell(s)")
        return hits

    def release(self) -> None:
        """Unmap the CPU regions (nothing may touch the tensors afterwards)."""
        self.regions = []
        self.materialised = Materialised(self.batch, [])
        for mapping in self.mappings:
            mapping.close()
        self.mappings = []
