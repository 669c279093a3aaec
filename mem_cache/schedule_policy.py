"""``SchedulePolicy.calc_priority`` as SGLang 0.5.3 ranks the waiting queue under ``fcfs``, ``lpm``,
``dfs-weight`` and ``lof`` (no priorities, no hierarchical cache; ``random`` is left out: it
shuffles with Python's global generator). Both versions share it: pull request
#11200 changed only the key each waiting request is matched with, which each version's
``Req.ranking_key`` gives (legacy: ``adjust_max_prefix_ids()``, capped at ``len - 1`` and at the
logprob start; refactored: the whole ``origin_input_ids + output_ids``).

Like SGLang's, ranking leaves each request's ``prefix_indices`` and ``last_node`` as matched with
that key (admission matches again, with the request's own match key)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

from kvparity.mem_cache.radix_cache import RadixCache, RadixKey, TreeNode

POLICIES = ("fcfs", "lpm", "dfs-weight", "lof")
# SGLang's defaults (environment variables there): a request whose cached prefix is this short is
# checked against the other waiting requests; one that shares this much with an earlier one waits.
IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD = 32
IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD = 32
LPM_LONGEST_QUEUE = 128  # above it, lpm ranks as fcfs (matching every request costs too much)


def calc_priority(policy: str, waiting_queue: list[Any], tree_cache: Any,
                  ranking_key: Callable[[Any], list[int]] | None = None) -> bool:
    """Reorder ``waiting_queue`` in place as ``policy`` ranks it; True when the requests were
    matched against the tree. A policy that needs the tree ranks as ``fcfs`` without one (the
    chunk cache), as SGLang's does when its radix cache is disabled. ``ranking_key``: the key a
    request is matched with (default: its version's own ``Req.ranking_key``)."""
    if policy not in POLICIES:
        raise ValueError(f"schedule policy {policy!r}: expected one of {', '.join(POLICIES)}")
    if policy == "lof":  # longest output first; the tree plays no part (a stable sort: ties keep their order)
        waiting_queue.sort(key=lambda r: -r.max_new_tokens)
        return False
    if policy == "fcfs" or not isinstance(tree_cache, RadixCache):
        return False
    if policy == "lpm" and len(waiting_queue) > LPM_LONGEST_QUEUE:
        return False
    waiting_last = _compute_prefix_matches(waiting_queue, tree_cache, ranking_key or (lambda req: req.ranking_key()))
    if policy == "lpm":
        waiting_queue.sort(key=lambda r: float("inf") if r.rid in waiting_last else -len(r.prefix_indices))
    else:
        _sort_by_dfs_weight(waiting_queue, tree_cache)
    return True


def _compute_prefix_matches(waiting_queue: list[Any], tree_cache: RadixCache,
                            ranking_key: Callable[[Any], list[int]]) -> set[str]:
    """Match every request's ranking key; a request with little in the cache that shares a long
    prefix with an earlier such request waits (in-batch prefix caching: run one of them first,
    so the others can hit its prefix). SGLang keeps those keys in a page-size-1 radix tree of its
    own, where a match is the longest common prefix with a key inserted before."""
    deprioritized: set[str] = set()
    inserted: list[tuple[str | None, list[int]]] = []
    for req in waiting_queue:
        key = ranking_key(req)
        req.prefix_indices, req.last_node = tree_cache.match_prefix(RadixKey(key, req.extra_key))
        if len(req.prefix_indices) > IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD:
            continue
        shared = max((_common_prefix(key, other) for extra, other in inserted if extra == req.extra_key), default=0)
        if shared >= IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD:
            deprioritized.add(req.rid)
        else:
            inserted.append((req.extra_key, key))
    return deprioritized


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _sort_by_dfs_weight(waiting_queue: list[Any], tree_cache: RadixCache) -> None:
    """Depth first from the root, heavier subtrees first (a node weighs the waiting requests whose
    match ends there or below), each node's own requests after its children's."""
    at_node: dict[TreeNode, list[Any]] = defaultdict(list)
    for req in waiting_queue:
        at_node[req.last_node].append(req)
    weight: dict[TreeNode, int] = defaultdict(int, {node: len(reqs) for node, reqs in at_node.items()})
    _add_weights(tree_cache.root_node, weight)
    waiting_queue.clear()
    _depth_first(tree_cache.root_node, weight, at_node, waiting_queue)


def _add_weights(node: TreeNode, weight: dict[TreeNode, int]) -> None:
    for child in node.children.values():
        _add_weights(child, weight)
        weight[node] += weight[child]


def _depth_first(node: TreeNode, weight: dict[TreeNode, int], at_node: dict[TreeNode, list[Any]],
                 out: list[Any]) -> None:
    for child in sorted(node.children.values(), key=lambda c: -weight[c]):
        _depth_first(child, weight, at_node, out)
    out.extend(at_node[node])
