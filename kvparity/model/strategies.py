"""Hypothesis strategies for scenarios.

Generators decide what the harness can see, so each scenario is drawn from a *template*: a set of
knobs aimed at one family of situations (shared prefixes, chunked rounds, near out-of-memory, long
lengths, ...), with every knob still random. ``kvparity.model.classes`` then names what each run actually
reached. Invalid steps are impossible by construction: a step that does not apply when it is
played is skipped identically in every world.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from hypothesis import strategies as st

from kvparity.model.profiles import PAGE_SIZES_CI, PAGE_SIZES_NIGHTLY
from kvparity.model.scenario import Decode, Evict, Extend, RequestSpec, Retract, Scenario
from kvparity.model.worlds import Geometry

T = TypeVar("T")


@dataclass(frozen=True)
class Shape:
    """How large scenarios get: small on CPU CI, larger in the nightly GPU profile."""

    page_sizes: tuple[int, ...]
    max_requests: int
    max_prompt: int
    long_prompt: tuple[int, int]
    max_steps: int


CI_SHAPE = Shape(page_sizes=PAGE_SIZES_CI, max_requests=16, max_prompt=40, long_prompt=(513, 600), max_steps=10)
NIGHTLY_SHAPE = Shape(page_sizes=PAGE_SIZES_NIGHTLY, max_requests=256, max_prompt=96, long_prompt=(513, 1100), max_steps=24)


def current_shape() -> Shape:
    return NIGHTLY_SHAPE if os.environ.get("HYPOTHESIS_PROFILE") == "nightly" else CI_SHAPE


@dataclass(frozen=True)
class Template:
    name: str
    caches: tuple[str, ...] = ("radix", "chunk")  # chunk: the radix cache disabled
    chunk: str = "maybe"  # never | maybe | small | unaligned | pages (maybe, at least a page)
    kv: str = "roomy"  # roomy | tight | decode (just the prompts: decodes run short and retract) | warm (less than all)
    rows: str = "roomy"  # roomy | tight (2) | warm (a few)
    long_prompts: bool = False
    logprobs: bool = False
    repeats: bool = False
    chunked_last: bool = False
    reuse_first: bool = False  # r0 runs and finishes first; later prompts reuse its tokens
    admit_all_first: bool = False  # the first step admits every request (the pool sized for them)
    need_sort: str = "maybe"  # maybe | always
    paged: bool = False  # page sizes > 1 only
    ops: tuple[str, ...] = ("extend", "extend", "decode", "finish", "retract", "evict")
    # A warm-up of random traffic before the scenario proper (requests w0, w1, ...): admissions,
    # finishes in scrambled order, retractions and evictions leave the rows, the pages and the
    # tree as a long-running server has them. Ordinary steps: every world plays them, they shrink.
    warmup: bool = False


TEMPLATES = (
    Template("free form"),
    Template("shared prefixes", caches=("radix",), chunk="never", repeats=True,
             ops=("extend", "extend", "finish", "finish", "decode")),
    Template("chunked rounds", chunk="unaligned", repeats=True, chunked_last=True,
             ops=("extend", "extend", "extend", "decode", "finish")),
    Template("near out of memory", kv="tight", reuse_first=True, ops=("extend", "extend", "decode", "decode", "finish")),
    Template("retract and re-admit", ops=("extend", "decode", "retract", "retract", "extend")),
    Template("long lengths", long_prompts=True, repeats=True, reuse_first=True,
             ops=("extend", "finish", "extend")),
    Template("logprobs", caches=("radix",), chunk="never", logprobs=True, repeats=True, reuse_first=True,
             ops=("extend", "finish", "extend", "finish", "decode")),
    Template("row reuse", caches=("chunk",), chunk="small", rows="tight",
             ops=("extend", "extend", "extend", "decode", "finish")),
    # Decodes that outgrow the pool: the memory check evicts, then retracts (SPEC 6).
    Template("decode pressure", chunk="never", kv="decode", admit_all_first=True,
             ops=("decode", "decode", "decode", "finish", "retract", "extend")),
    # Pages freed while a sort is pending, then allocated again: alloc_extend's and alloc_decode's
    # merge rules, several paged finishes in one free group, allocations that evict from the tree.
    Template("free-page churn", caches=("radix",), chunk="never", kv="tight", repeats=True, need_sort="always",
             paged=True, ops=("extend", "extend", "finish", "finish", "decode", "evict")),
    # Production-shaped state: a churned pool, then free-form traffic with few rows.
    Template("warm start", chunk="pages", kv="warm", rows="warm", repeats=True, warmup=True),
)


# Drawing is a large part of the harness's cost, and most of it went to building and validating
# a new strategy object for every draw. So the strategies are built once: fixed ones here, an
# index into a list of a given length by ``_pick``, and the helpers below are plain functions
# taking ``draw`` rather than composites (a composite is a new strategy object per call).
_EXTRA_KEYS = st.sampled_from((None, None, None, "lora-a"))
_MAX_NEW_TOKENS = st.sampled_from((64, 64, 64, 1, 2, 3))


@functools.cache
def _indices(n: int) -> st.SearchStrategy[int]:
    return st.sampled_from(range(n))


def _pick(draw: Any, values: Sequence[T]) -> T:
    """``draw(st.sampled_from(values))``, through one cached strategy per length: the same uniform
    choice of an index (``st.integers`` would favour the ends of a range above 128)."""
    return values[draw(_indices(len(values)))]


def token_run(start: int, n: int) -> tuple[int, ...]:
    """``n`` consecutive token ids from ``start`` (prints compactly as a range)."""
    return tuple(range(start, start + n))


def _prompts(draw: Any, template: Template, shape: Shape, n: int) -> list[tuple[int, ...]]:
    """``n`` prompts cut from a few shared stems, so that prefixes overlap and differ mid-page."""
    stem_len = st.integers(1, shape.max_prompt)
    if template.long_prompts:
        stem_len = st.integers(*shape.long_prompt)
    stems = [token_run(100_000 * (k + 1), draw(stem_len, label="stem length")) for k in range(draw(st.integers(1, 3)))]
    prompts: list[tuple[int, ...]] = []
    for i in range(n):
        if prompts and template.reuse_first and draw(st.booleans()):
            first = prompts[0]
            # Long prompts: reuse past the 512-token block, so cached prefixes cross it too.
            low = min(len(first), 520) if template.long_prompts else len(first) // 2
            keep = draw(st.integers(low, len(first)))
            prompts.append(first[:keep] + token_run(10_000 * (i + 1), draw(st.integers(0 if keep else 1, 8))))
            continue
        if prompts and template.repeats and draw(st.booleans()):
            prompts.append(_pick(draw, prompts))
            continue
        stem = _pick(draw, stems)
        # Long prompts: the first keeps its whole stem (over 512 tokens), so that the prompts that
        # reuse it bring a cached prefix across the 512-token block.
        keep = len(stem) if template.long_prompts and i == 0 else draw(st.integers(0, len(stem)))
        longest_suffix = shape.long_prompt[1] if template.long_prompts and draw(st.booleans()) else shape.max_prompt // 2
        suffix = draw(st.integers(0 if keep else 1, max(1, longest_suffix)))
        prompts.append(stem[:keep] + token_run(10_000 * (i + 1), suffix))
    return prompts


def _request(draw: Any, rid: str, tokens: tuple[int, ...], template: Template) -> RequestSpec:
    logprob = template.logprobs and draw(st.booleans())
    start = -1
    if logprob:
        # len // 2 // 16 * 16: a start on a page boundary for every page size, so that it can cap
        # a paged match exactly ("start inside the cached prefix").
        half = len(tokens) // 2
        start = _pick(draw, (-1, 0, half, half // 16 * 16, len(tokens) - 1, len(tokens) + 3))
    extra = draw(_EXTRA_KEYS)
    # Mostly long enough that the steps decide when a request finishes; sometimes it finishes by
    # itself (1: right after its prefill; a few: in a decode step).
    max_new = draw(_MAX_NEW_TOKENS, label="max_new_tokens")
    return RequestSpec(rid, tokens, return_logprob=logprob, logprob_start_len=start, extra_key=extra,
                       max_new_tokens=max_new)


@st.composite
def _steps(draw, template: Template, rids: list[str], shape: Shape) -> tuple:
    """Steps drawn against a rough model of the scheduler (admitted, retracted), so that finish
    and retract usually name a request that may be running, and retracted ones come back."""
    steps: list = []
    pending = list(rids)
    admitted: list[str] = []
    retracted: list[str] = []
    if template.reuse_first and len(rids) > 1:
        steps += [Extend((rids[0],)), Decode(finish=(rids[0],))]
        pending = pending[1:]
    if template.admit_all_first:
        steps.append(Extend(tuple(pending)))
        pending, admitted = [], list(pending)
    for _ in range(draw(st.integers(1, shape.max_steps))):
        op = draw(st.sampled_from(template.ops))
        if op in ("finish", "retract") and not admitted:
            op = "extend"
        if op == "extend" or not steps:
            take = draw(st.integers(0, len(pending))) if pending else 0
            back = retracted[: draw(st.integers(0, len(retracted)))] if retracted else []
            admit = tuple(pending[:take]) + tuple(back)
            pending, retracted = pending[take:], retracted[len(back) :]
            admitted += admit
            steps.append(Extend(admit, chunked_last=template.chunked_last and draw(st.booleans())))
        elif op == "decode":
            steps.append(Decode())
        elif op == "finish":
            # A decode step in which one or more requests sample a stop token (one free group).
            many = draw(st.integers(1, min(3, len(admitted))))
            finish = tuple(draw(st.permutations(admitted))[:many])
            for rid in finish:
                admitted.remove(rid)
            steps.append(Decode(finish=finish))
        elif op == "retract":
            rid = _pick(draw, admitted)
            admitted.remove(rid)
            retracted.append(rid)
            steps.append(Retract(rid))
        else:
            steps.append(Evict(draw(st.integers(1, 64))))
    if pending or retracted:
        steps.append(Extend(tuple(pending + retracted)))
    return tuple(steps)


_WARMUP_MAX_NEW = st.sampled_from((2, 3, 4, 64))
WARMUP_PREFIX = "w"  # warm-up requests are w0, w1, ...


def _warmup(draw: Any, shape: Shape, prompts: list[tuple[int, ...]], rows: int) -> tuple[list[RequestSpec], list]:
    """A warm-up of random traffic: requests ``w0, w1, ...`` (each a cut of one of the scenario's
    ``prompts`` plus tokens of its own, so the tree fills and splits, and the scenario's requests
    later match prefixes whose pages were handed out in a churned order), admitted in scrambled
    order and in groups, finished in scrambled order, some retracted and re-admitted, the tree
    evicted now and then. What it leaves behind is a churned pool: free rows and free pages out of
    order, rows freed at different times. More requests than ``rows`` (the pool's), admitted no
    more than the free rows take, so every row is given out, back and out again."""
    count = draw(st.integers(rows + 1, 2 * rows), label="warm-up requests")
    requests = []
    for i in range(count):
        base = _pick(draw, prompts)
        keep = draw(st.integers(0, len(base)))
        tokens = base[:keep] + token_run(900_000 + 1_000 * i, draw(st.integers(0 if keep else 1, shape.max_prompt // 2)))
        requests.append(RequestSpec(f"{WARMUP_PREFIX}{i}", tokens, max_new_tokens=draw(_WARMUP_MAX_NEW)))
    pending = list(draw(st.permutations([r.rid for r in requests])))
    running: list[str] = []
    steps: list = []
    # Every round finishes at least one request for good, so the warm-up ends.
    while pending:
        take = draw(st.integers(1, min(len(pending), rows - len(running))))
        steps.append(Extend(tuple(pending[:take])))
        running, pending = running + pending[:take], pending[take:]
        if draw(st.booleans()):
            steps.append(Decode())
        finish = tuple(draw(st.permutations(running))[: draw(st.integers(1, len(running)))])
        running = [rid for rid in running if rid not in finish]
        steps.append(Decode(finish=finish))
        extra = draw(st.sampled_from(("none", "none", "retract", "evict")))
        if extra == "retract" and running:
            rid = _pick(draw, running)
            running.remove(rid)
            pending.append(rid)
            steps.append(Retract(rid))
        elif extra == "evict":
            steps.append(Evict(draw(st.integers(1, 64))))
    return requests, steps


def _chunk_size(draw, template: Template, cache: str, ps: int, prompts) -> int | None:
    if template.chunk == "never":
        return None
    if template.chunk in ("maybe", "pages") and draw(st.booleans()):
        return None
    if template.long_prompts:
        return draw(st.integers(513, 560))
    if template.chunk == "unaligned" and ps > 1:
        return draw(st.integers(1, 3)) * ps + draw(st.integers(1, ps - 1))
    if template.chunk == "pages":  # at least a page: a smaller budget admits nothing at all
        return draw(st.integers(1, 3)) * ps + draw(st.integers(0, ps - 1))
    longest = max(len(p) for p in prompts)
    return draw(st.integers(1, max(1, min(24, longest))))


def _kv_slots(draw, template: Template, ps: int, prompts, steps: int, rows: int) -> int:
    need = sum(len(p) + steps + ps for p in prompts)
    if template.kv == "tight":
        need = draw(st.integers(max(ps, need // 4), max(ps, need // 2 + ps)))
    elif template.kv == "warm":
        # About enough for every row to hold the longest prompt (a prefill seldom runs out; decodes
        # that outgrow it retract), far less than all the traffic: the tree gives pages back, and
        # the free list is used round and round.
        need = rows * (max(len(p) for p in prompts) + 2 * ps)
    elif template.kv == "decode":
        # Room for the prompts (page-rounded) and a few decode pages: decodes soon run short.
        prompts_need = sum(-(-len(p) // ps) * ps for p in prompts)
        need = prompts_need + draw(st.integers(0, 1)) * ps
    else:
        need = 2 * need
    return -(-need // ps) * ps


def hybrid_templates(paged: bool) -> tuple[Template, ...]:
    """The templates a hybrid model's world plays: those with the radix cache (a hybrid model's
    chunk cache is not driven), and, where its pools take page size 1 only, not the paged ones."""
    return tuple(t for t in TEMPLATES if "radix" in t.caches and (paged or not t.paged))


@st.composite
def scenarios(draw, shape: Shape | None = None, templates: tuple[Template, ...] = TEMPLATES,
              page_sizes: tuple[int, ...] | None = None, radix_only: bool = False) -> Scenario:
    """``page_sizes``: only these (a model whose pools take no other; None: the shape's);
    ``radix_only``: the radix cache only (a hybrid model's: ``hybrid_templates`` says which
    templates can)."""
    shape = shape or current_shape()
    template = draw(st.sampled_from(templates), label="template")
    sizes = page_sizes or shape.page_sizes
    ps = draw(st.sampled_from(tuple(p for p in sizes if p > 1) if template.paged else sizes), label="page size")
    cache = draw(st.sampled_from(("radix",) if radix_only else template.caches), label="cache")
    n = draw(st.integers(1, min(shape.max_requests, 16 if not template.long_prompts else 3)), label="requests")
    if shape.max_requests > 16 and draw(st.booleans()):
        n = draw(st.integers(17, shape.max_requests))
    prompts = _prompts(draw, template, shape, n)
    rids = [f"r{i}" for i in range(n)]
    drawn = [_request(draw, rid, tokens, template) for rid, tokens in zip(rids, prompts)]
    steps = draw(_steps(template, rids, shape))
    warm_rows = draw(st.integers(3, 6), label="pool rows") if template.warmup else 0
    if template.warmup:
        warm, warm_steps = _warmup(draw, shape, prompts, warm_rows)
        drawn, steps = warm + drawn, tuple(warm_steps) + steps
        prompts = [r.tokens for r in warm] + prompts
    first_seen: dict[str, int] = {}
    for i, step in enumerate(steps):
        for rid in getattr(step, "admit", ()):
            first_seen.setdefault(rid, i)
    requests = tuple(
        RequestSpec(r.rid, r.tokens, first_seen.get(r.rid, 0), r.return_logprob, r.logprob_start_len, r.max_new_tokens, r.extra_key)
        for r in drawn
    )
    if template.rows == "tight":
        rows = 2
    elif template.rows == "warm":
        rows = warm_rows  # few: rows come back and go out again, in a churned order
    else:
        rows = n + draw(st.integers(1, 3))
    geometry = Geometry(
        pool_rows=rows,
        max_context_len=max(len(p) for p in prompts) + len(steps) + 2,
        kv_slots=_kv_slots(draw, template, ps, prompts, len(steps), rows),
        page_size=ps,
        need_sort=template.need_sort == "always" or draw(st.booleans(), label="need_sort"),
    )
    return Scenario(geometry, cache, requests, steps, _chunk_size(draw, template, cache, ps, prompts))
