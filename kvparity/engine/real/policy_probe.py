"""SGLang's own waiting-queue ranking, asked of a real release (issue 26, a first step).

Pull request #11200 changed one line of ``SchedulePolicy._compute_prefix_matches``: the key the
cache-aware policies (``lpm``, ``dfs-weight``) match each waiting request with went from
``Req.adjust_max_prefix_ids()`` (capped at ``len - 1`` and at the logprob start) to the whole
``origin_input_ids + output_ids``. Which request ``PrefillAdder`` admits first follows from that
order. ``rank_waiting_queue`` (a worker-side ``@remote`` function) builds a real world of the
worker's release, puts token sequences into its radix tree, makes the waiting requests and hands
them to the release's own ``SchedulePolicy.calc_priority``; nothing of the ranking is kvparity's.
"""

from __future__ import annotations

from typing import Any

from kvparity.engine.real.adapter import build_real_world
from kvparity.engine.real.worker import Context, remote

# SchedulePolicy(policy, tree_cache, enable_hierarchical_cache, enable_priority_scheduling,
# schedule_low_priority_values_first): the 0.5.3 family's signature.
_POLICY_FLAGS = (False, False, False)


@remote
def rank_waiting_queue(ctx: Context, policy: str, geometry: dict[str, Any], cached: list[list[int]],
                       queue: list[dict[str, Any]]) -> dict[str, Any]:
    """The order the release's ``calc_priority`` gives ``queue`` (dicts with ``rid`` and ``tokens``,
    in arrival order) when its radix tree holds ``cached`` (each sequence inserted whole, on
    slots of its own), and each request's matched prefix length under the policy's key."""
    sglang = ctx.require_sglang()
    from sglang.srt.managers.schedule_policy import SchedulePolicy
    from sglang.srt.mem_cache.radix_cache import RadixKey

    world = build_real_world(sglang, "torch", geometry, "radix", "cpu")
    for tokens in cached:
        slots = world.allocator.alloc(len(tokens))
        if slots is None:
            raise ValueError(f"rank_waiting_queue: no KV room for a cached sequence of {len(tokens)} tokens")
        world.tree_cache.insert(RadixKey(token_ids=list(tokens), extra_key=None), slots)
    reqs = [world.new_req(r["rid"], list(r["tokens"])) for r in queue]
    computed = SchedulePolicy(policy, world.tree_cache, *_POLICY_FLAGS).calc_priority(reqs)
    return {
        "order": [r.rid for r in reqs],
        "matched": {r.rid: len(r.prefix_indices) for r in reqs} if computed else {},
    }
