"""A fixed small sequence played on one real world (worker side): the worker's ``smoke`` method.

1. ``extend``: requests ``a`` = A_TOKENS and ``b`` = B_TOKENS (a shared 4-token prefix) are
   matched against the tree (``init_next_round_input``), locked as the PrefillAdder locks them,
   and extended together in one real ``prepare_for_extend``;
2. ``prefill_result``: each appends its sampled token (a: 100, b: 200); neither is finished, so
   each goes through ``cache_unfinished_req`` (SPEC section 6: "so that others can match");
3. ``decode``: a running batch of both: ``check_decode_mem`` then ``prepare_for_decode``; each
   appends its token (a: 101, b: 201);
4. ``retract``: ``b`` is retracted (``release_req(1, 1)``, then ``filter([0])``);
5. ``finish``: ``a`` finishes: ``cache_finished_req`` inside a free group, as a decode result is
   processed.

After each step: the world's ``state()`` (whole req_to_token table, free pages, release pages,
available size, free rows, tree contents) and both requests' views, as plain data.
"""

from __future__ import annotations

from typing import Any

import torch

from kvparity.engine.real.adapter import RealWorld

A_TOKENS = (1, 2, 3, 4, 5, 6)
B_TOKENS = (1, 2, 3, 4, 7, 8, 9)


def _plain(t: torch.Tensor | None) -> list[int] | None:
    return None if t is None else [int(v) for v in t.tolist()]


def play_smoke(world: RealWorld, a_tokens: tuple[int, ...] = A_TOKENS, b_tokens: tuple[int, ...] = B_TOKENS) -> dict[str, Any]:
    steps: list[dict[str, Any]] = []
    a = world.new_req("a", list(a_tokens), max_new_tokens=8)
    b = world.new_req("b", list(b_tokens), max_new_tokens=8)

    def record(name: str, **extra: Any) -> None:
        steps.append({"step": name, **extra, "state": world.state(), "requests": {r.rid: world.req_view(r) for r in (a, b)}})

    for req in (a, b):
        world.init_next_round_input(req)
        world.admit(req, None, continuing=False)
        world.tree_cache.inc_lock_ref(req.last_node)
    extend = world.batch([a, b])
    out_cache_loc = extend.prepare_for_extend()
    record("extend", out_cache_loc=_plain(out_cache_loc), last_loc=_plain(extend.last_loc),
           out_cache_loc_dtype=str(out_cache_loc.dtype))

    for req, token in ((a, 100), (b, 200)):
        req.output_ids.append(token)
        world.cache_unfinished_req(req)
    record("prefill_result")

    running = world.batch([a, b])
    fits = running.check_decode_mem()
    running.prepare_for_decode()
    for req, token in ((a, 101), (b, 201)):
        req.output_ids.append(token)
    record("decode", check_decode_mem=fits, out_cache_loc=_plain(running.out_cache_loc),
           last_loc=_plain(running.decode_last_loc))

    running.release_req(1, 1)
    running.filter([0])
    record("retract", running=[r.rid for r in running.reqs])

    with world.free_group():
        world.cache_finished_req(a)
    record("finish")
    return {"world": world.name, "version": world.version, "family": world.family, "steps": steps}
