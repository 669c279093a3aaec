"""``RadixCache``: the prefix cache of KV slots, a radix tree over token ids (SPEC section 1).

Every node holds a run of tokens (``key``) and the ``int64`` KV slots of those tokens (``value``).
A request's prefix is found by walking from the root; requests share the slots of their common
prefix. The refactor did not change this module: legacy and refactored schedulers use it as is.

Choices the spec leaves open (all made for reproducibility, none changes what SGLang users see):

- access times come from a logical clock (an integer bumped on every node access) instead of wall
  time, so eviction order is the same on every run; ties (a split copies its child's time) are
  broken by node creation order;
- ``extra_key`` is part of every child key, so two namespaces never share a node, even at the root;
- node values are stored as independent ``int64`` copies on the cache's device, and
  ``match_prefix`` always returns a fresh tensor, so no caller can alias the tree's storage.
"""

from __future__ import annotations

import heapq
import operator
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from kvparity.kernels import runtime  # (also fixes the Triton mode before triton is imported)

_ChildKey = tuple[str | None, Any]


# ---------------------------------------------------------------------------------------------
# Keys and nodes
# ---------------------------------------------------------------------------------------------
@dataclass
class RadixKey:
    """Token ids plus an optional namespace (``extra_key``, e.g. a LoRA id). Keys whose
    ``extra_key`` differ never share a prefix."""

    token_ids: list[int]
    extra_key: str | None = None

    def __post_init__(self) -> None:
        # Normalise to a list of Python ints: a tensor element or a numpy integer would hash and
        # compare differently from an int, and the tree would silently miss.
        if isinstance(self.token_ids, torch.Tensor) or not isinstance(self.token_ids, (list, tuple)):
            raise ValueError(
                f"RadixKey.token_ids must be a list of ints, got {type(self.token_ids).__name__}"
            )
        try:
            self.token_ids = [operator.index(t) for t in self.token_ids]
        except TypeError as exc:
            raise ValueError(f"RadixKey.token_ids must hold integers: {exc}") from None
        if self.extra_key is not None and not isinstance(self.extra_key, str):
            raise ValueError(f"RadixKey.extra_key must be a str or None, got {type(self.extra_key).__name__}")

    def __len__(self) -> int:
        return len(self.token_ids)

    def __getitem__(self, index: slice) -> RadixKey:
        """Slicing keeps the namespace: ``key[a:b]`` is a ``RadixKey`` with the same extra key."""
        if not isinstance(index, slice):
            raise ValueError("RadixKey supports slicing only; use key.token_ids[i] for one token")
        return RadixKey(self.token_ids[index], self.extra_key)


class TreeNode:
    """One node of the radix tree. The root has an empty key and value and is never locked,
    counted or evicted."""

    def __init__(
        self,
        node_id: int,
        key: list[int],
        value: torch.Tensor,
        parent: TreeNode | None,
        extra_key: str | None,
        last_access_time: int,
        lock_ref: int = 0,
    ) -> None:
        self.id = node_id  # creation order: the deterministic tie-breaker for eviction
        self.children: dict[_ChildKey, TreeNode] = {}
        self.parent = parent
        self.key = key
        self.value = value
        self.lock_ref = lock_ref
        self.last_access_time = last_access_time
        self.extra_key = extra_key

    def is_leaf(self) -> bool:
        return not self.children

    def __repr__(self) -> str:
        return (
            f"TreeNode(id={self.id}, key={self.key}, value={self.value.tolist()}, "
            f"lock_ref={self.lock_ref}, t={self.last_access_time}, extra_key={self.extra_key!r})"
        )


class MatchResult(NamedTuple):
    """``prefix_indices, last_node = cache.match_prefix(key)``."""

    device_indices: torch.Tensor
    last_device_node: TreeNode


# ---------------------------------------------------------------------------------------------
# The cache
# ---------------------------------------------------------------------------------------------
class RadixCache:
    """Radix tree of cached KV slots over a ``ReqToTokenPool`` and a KV-slot allocator."""

    def __init__(self, req_to_token_pool: Any, token_to_kv_pool_allocator: Any, page_size: int) -> None:
        if not isinstance(page_size, int) or page_size < 1:
            raise ValueError(f"RadixCache: page_size={page_size!r} must be a positive int")
        allocator_page_size = getattr(token_to_kv_pool_allocator, "page_size", page_size)
        if allocator_page_size != page_size:
            # Evicted node values are freed page by page; a mismatch would free foreign slots.
            raise ValueError(
                f"RadixCache: page_size={page_size} differs from the allocator's page_size={allocator_page_size}"
            )
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        self.page_size = page_size
        self.device = torch.device(token_to_kv_pool_allocator.device)
        self.reset()

    # ---- state --------------------------------------------------------------------------------
    def reset(self) -> None:
        """Empty tree, zero sizes, clock and node ids restarted (so a reset cache replays exactly)."""
        self._clock = 0
        self._next_id = 0
        self.root_node = self._new_node([], self._empty(), None, None)
        # The root is permanently "locked" so that it can never become an eviction candidate.
        self.root_node.lock_ref = 1
        self.evictable_size_ = 0
        self.protected_size_ = 0
        self.num_splits = 0  # statistics for the harness's scenario classes
        self.num_evicted = 0

    def _empty(self) -> torch.Tensor:
        return torch.empty((0,), dtype=torch.int64, device=self.device)

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _touch(self, node: TreeNode) -> None:
        node.last_access_time = self._tick()

    def _new_node(
        self, key: list[int], value: torch.Tensor, parent: TreeNode | None, extra_key: str | None
    ) -> TreeNode:
        node = TreeNode(self._next_id, key, value, parent, extra_key, self._tick())
        self._next_id += 1
        return node

    # ---- key helpers --------------------------------------------------------------------------
    def _child_key(self, extra_key: str | None, tokens: list[int]) -> _ChildKey:
        """A child is found by its namespace and first token (page size 1) or first page."""
        if self.page_size == 1:
            return (extra_key, tokens[0])
        return (extra_key, tuple(tokens[: self.page_size]))

    def _match_len(self, node_key: list[int], tokens: list[int]) -> int:
        """Length of the common prefix of two token lists, in whole pages when paged."""
        limit = min(len(node_key), len(tokens))
        if self.page_size == 1:
            i = 0
            while i < limit and node_key[i] == tokens[i]:
                i += 1
            return i
        i = 0
        while i + self.page_size <= limit and node_key[i : i + self.page_size] == tokens[i : i + self.page_size]:
            i += self.page_size
        return i

    def _aligned_len(self, n: int) -> int:
        return n // self.page_size * self.page_size

    @staticmethod
    def _check_key(key: RadixKey, where: str) -> None:
        if not isinstance(key, RadixKey):
            raise ValueError(f"RadixCache.{where}: key must be a RadixKey, got {type(key).__name__}")

    # ---- match / insert -----------------------------------------------------------------------
    def match_prefix(self, key: RadixKey) -> MatchResult:
        """Slots of the longest cached prefix of ``key`` (whole pages when paged) and its node.

        A match ending inside a node splits it, so the returned node covers exactly the match and
        can be locked without locking tokens the request does not use."""
        self._check_key(key, "match_prefix")
        tokens = key.token_ids[: self._aligned_len(len(key))]
        node = self.root_node
        self._touch(node)
        pieces: list[torch.Tensor] = []
        while tokens:
            child = node.children.get(self._child_key(key.extra_key, tokens))
            if child is None:
                break
            self._touch(child)
            matched = self._match_len(child.key, tokens)
            if matched < len(child.key):
                node = self._split_node(child, matched)
                pieces.append(node.value)
                break
            pieces.append(child.value)
            node = child
            tokens = tokens[matched:]
        # torch.cat always copies, so the caller never aliases node storage.
        indices = torch.cat(pieces) if pieces else self._empty()
        return MatchResult(indices, node)

    def insert(self, key: RadixKey, value: torch.Tensor) -> int:
        """Add ``key`` with its slots ``value``; return how many leading tokens were already cached
        (their slots in the tree win; the caller frees its duplicates)."""
        self._check_key(key, "insert")
        value = self._check_value(key, value)
        aligned = self._aligned_len(len(key))  # defensive: callers already pass whole pages
        tokens, value = key.token_ids[:aligned], value[:aligned]
        node = self.root_node
        self._touch(node)
        already_present = 0
        while tokens:
            child = node.children.get(self._child_key(key.extra_key, tokens))
            if child is None:
                break
            self._touch(child)
            matched = self._match_len(child.key, tokens)
            already_present += matched
            tokens, value = tokens[matched:], value[matched:]
            node = self._split_node(child, matched) if matched < len(child.key) else child
        if tokens:
            self._add_leaf(node, tokens, value, key.extra_key)
        return already_present

    def _check_value(self, key: RadixKey, value: torch.Tensor) -> torch.Tensor:
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"RadixCache.insert: value must be a tensor of KV slots, got {type(value).__name__}")
        if value.dim() != 1:
            raise ValueError(f"RadixCache.insert: value must be 1-D, got shape {tuple(value.shape)}")
        if value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
            raise ValueError(f"RadixCache.insert: value must hold integer slots, got dtype {value.dtype}")
        if len(value) != len(key):
            raise ValueError(f"RadixCache.insert: value length {len(value)} != key length {len(key)}")
        return value

    def _add_leaf(self, parent: TreeNode, tokens: list[int], value: torch.Tensor, extra_key: str | None) -> None:
        # An independent int64 copy: the caller's tensor may be a view of req_to_token.
        stored = value.to(device=self.device, dtype=torch.int64).clone()
        leaf = self._new_node(list(tokens), stored, parent, extra_key)
        parent.children[self._child_key(extra_key, tokens)] = leaf
        self.evictable_size_ += len(tokens)

    def _split_node(self, child: TreeNode, split_len: int) -> TreeNode:
        """Cut ``child`` after ``split_len`` tokens; return the new upper node. ``child`` keeps its
        identity as the lower part, so a request holding it as ``last_node`` stays valid."""
        upper = self._new_node(child.key[:split_len], child.value[:split_len].clone(), child.parent, child.extra_key)
        self.num_splits += 1
        # The upper node is on every path that went through child: same locks, same recency.
        upper.lock_ref = child.lock_ref
        upper.last_access_time = child.last_access_time
        parent = child.parent
        assert parent is not None  # a split node is attached (the root is never split)
        parent.children[self._child_key(child.extra_key, child.key)] = upper
        child.key = child.key[split_len:]
        child.value = child.value[split_len:].clone()
        child.parent = upper
        upper.children[self._child_key(child.extra_key, child.key)] = child
        return upper

    # ---- requests -----------------------------------------------------------------------------
    def _row_slots(self, req: Any, num_tokens: int) -> torch.Tensor:
        """An int64 COPY of the first ``num_tokens`` slots of the request's row (read once, before
        the row is rewritten, so nothing below aliases req_to_token)."""
        if req.req_pool_idx is None:
            raise ValueError("RadixCache: req.req_pool_idx is None (the request holds no row)")
        width = self.req_to_token_pool.req_to_token.shape[1]
        if num_tokens > width:
            raise ValueError(f"RadixCache: request has {num_tokens} tokens but rows are {width} wide")
        row = self.req_to_token_pool.req_to_token[req.req_pool_idx, :num_tokens]
        return row.to(device=self.device, dtype=torch.int64, copy=True)

    def _free_slots(self, slots: torch.Tensor) -> None:
        if slots.numel() > 0:
            self.token_to_kv_pool_allocator.free(slots)

    def cache_finished_req(self, req: Any) -> None:
        """Keep a finished request's KV in the tree; give back its row, duplicates and tail.

        The last output token was sampled but never computed, so it has no slot: it is left out.
        """
        token_ids = (list(req.origin_input_ids) + list(req.output_ids))[:-1]
        kv = self._row_slots(req, len(token_ids))
        aligned = self._aligned_len(len(token_ids))
        # A partial last page cannot live in the tree; SGLang frees it before inserting.
        self._free_slots(kv[aligned:])
        new_prefix_len = self.insert(RadixKey(token_ids[:aligned], req.extra_key), kv[:aligned])
        # Tokens the tree already held beyond what this request matched: its own copies are spare.
        self._free_slots(kv[len(req.prefix_indices) : new_prefix_len])
        self.req_to_token_pool.free(req.req_pool_idx)
        self.dec_lock_ref(self._last_node(req))

    def cache_unfinished_req(self, req: Any, chunked: bool = False) -> None:
        """After a chunk, and after every completed prompt of a request that keeps running (SPEC 1
        and 6): cache the computed tokens and point the request at the tree's slots.

        1. insert the page-aligned part; the request's own slots for tokens the tree already held
           (beyond its old prefix) are duplicates and are freed (whole pages when paged);
        2. re-match, and write the tree's slots into row columns ``[old, aligned)``. Columns before
           ``old`` are NOT rewritten, as in SGLang: when step 1 freed a page under them (an
           unaligned old prefix whose page turned out to be a duplicate), the row keeps slots of a
           freed page. Harmless when the row is freed next (a chunked request); stale for a
           request that keeps running. kvparity reports that as a known upstream defect;
        3. ``last_matched_prefix_len`` becomes the aligned length; the lock moves to the new node;
        4. ``prefix_indices`` becomes a NEW int64 tensor: the tree's slots, then (paged) the
           unaligned tail, which the request still owns.
        The row is NOT freed here (the scheduler does that for a chunked request).
        """
        token_ids = list(req.fill_ids)
        kv = self._row_slots(req, len(token_ids))
        aligned = self._aligned_len(len(token_ids))
        key = RadixKey(token_ids[:aligned], req.extra_key)
        old_prefix_len = len(req.prefix_indices)
        new_prefix_len = self.insert(key, kv[:aligned])
        self._free_slots(kv[old_prefix_len:new_prefix_len])
        new_indices, new_last_node = self.match_prefix(key)
        # The row must name the tree's slots, not the duplicates just freed.
        self.req_to_token_pool.write(
            (req.req_pool_idx, slice(old_prefix_len, len(new_indices))), new_indices[old_prefix_len:]
        )
        req.last_matched_prefix_len = len(new_indices)
        self.dec_lock_ref(self._last_node(req))
        self.inc_lock_ref(new_last_node)
        if self.page_size > 1:
            # The unaligned tail stays owned by the request (it is not in the tree).
            req.prefix_indices = torch.cat([new_indices, kv[len(new_indices) :]])
        else:
            req.prefix_indices = new_indices
        req.last_node = new_last_node

    @staticmethod
    def _last_node(req: Any) -> TreeNode:
        if req.last_node is None:
            raise ValueError("RadixCache: req.last_node is None (match_prefix was never called for it)")
        return req.last_node

    # ---- locks --------------------------------------------------------------------------------
    def inc_lock_ref(self, node: TreeNode) -> int:
        """Lock ``node`` and its ancestors; return the change of ``evictable_size`` (<= 0)."""
        delta = 0
        for n in list(self._path_to_root(node)):  # validate the whole path before changing it
            if n.lock_ref == 0:
                self._move_size(n, to_protected=True)
                delta -= len(n.key)
            n.lock_ref += 1
        return delta

    def dec_lock_ref(self, node: TreeNode) -> int:
        """Unlock ``node`` and its ancestors; return the change of ``evictable_size`` (>= 0)."""
        path = list(self._path_to_root(node))
        # Check before changing anything, so a bad call leaves the tree as it was.
        for n in path:
            if n.lock_ref <= 0:
                raise ValueError(f"RadixCache.dec_lock_ref: node {n.id} (key {n.key}) is not locked")
        delta = 0
        for n in path:
            if n.lock_ref == 1:
                self._move_size(n, to_protected=False)
                delta += len(n.key)
            n.lock_ref -= 1
        return delta

    def _path_to_root(self, node: TreeNode) -> Iterator[TreeNode]:
        """``node`` and its ancestors, root excluded."""
        if not isinstance(node, TreeNode):
            raise ValueError(f"RadixCache: expected a TreeNode, got {type(node).__name__}")
        while node is not self.root_node:
            if node.parent is None:
                raise ValueError(f"RadixCache: node {node.id} is not in this tree (evicted or foreign)")
            yield node
            node = node.parent

    def _move_size(self, node: TreeNode, to_protected: bool) -> None:
        sign = 1 if to_protected else -1
        self.protected_size_ += sign * len(node.key)
        self.evictable_size_ -= sign * len(node.key)

    # ---- eviction -----------------------------------------------------------------------------
    def evict(self, num_tokens: int) -> int:
        """Free least-recently-used unlocked leaves until ``num_tokens`` slots are freed or nothing
        is evictable; return how many slots were freed."""
        if num_tokens < 0:
            raise ValueError(f"RadixCache.evict: num_tokens={num_tokens} must be >= 0")
        heap = [self._heap_entry(n) for n in self._nodes() if self._evictable_leaf(n)]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            _, _, node = heapq.heappop(heap)
            self.token_to_kv_pool_allocator.free(node.value)
            freed += len(node.value)
            self.num_evicted += len(node.value)
            parent = node.parent
            assert parent is not None  # an evictable leaf is attached (never the root)
            self._delete_leaf(node)
            # A parent whose last child just went is now a leaf like any other.
            if self._evictable_leaf(parent):
                heapq.heappush(heap, self._heap_entry(parent))
        return freed

    @staticmethod
    def _heap_entry(node: TreeNode) -> tuple[int, int, TreeNode]:
        return (node.last_access_time, node.id, node)  # ids are unique: nodes are never compared

    def _evictable_leaf(self, node: TreeNode) -> bool:
        return node is not self.root_node and node.is_leaf() and node.lock_ref == 0

    def _delete_leaf(self, node: TreeNode) -> None:
        assert node.parent is not None  # only attached leaves are deleted
        del node.parent.children[self._child_key(node.extra_key, node.key)]
        self.evictable_size_ -= len(node.key)
        node.parent = None  # detached: a later lock call on it fails loudly

    # ---- inspection ---------------------------------------------------------------------------
    def _nodes(self) -> Iterator[TreeNode]:
        """Every non-root node, depth first, children in a deterministic order."""
        stack = [self.root_node]
        while stack:
            node = stack.pop()
            if node is not self.root_node:
                yield node
            stack.extend(self._sorted_children(node)[::-1])

    @staticmethod
    def _sorted_children(node: TreeNode) -> list[TreeNode]:
        return sorted(node.children.values(), key=lambda c: (c.extra_key is not None, c.extra_key or "", c.key))

    def total_size(self) -> int:
        return sum(len(n.value) for n in self._nodes())

    def evictable_size(self) -> int:
        return self.evictable_size_

    def protected_size(self) -> int:
        return self.protected_size_

    def all_values_flatten(self) -> torch.Tensor:
        values = [n.value for n in self._nodes()]
        return torch.cat(values) if values else self._empty()

    def contents(self) -> list[tuple]:
        """One ``(extra_key, full token path, node slots, lock_ref)`` per node, sorted: equal for two
        trees holding the same data with the same splits, whatever the insertion order."""
        # Each node's full path is its parent's plus its own key (``_nodes`` yields a parent before
        # its children), so no path is walked up to the root again.
        paths: dict[int, tuple[int, ...]] = {id(self.root_node): ()}
        nodes = list(self._nodes())
        entries = []
        for n, slots in zip(nodes, runtime.host_lists([n.value for n in nodes])):
            path = paths[id(n)] = paths[id(n.parent)] + tuple(n.key)
            entries.append((n.extra_key, path, tuple(slots), n.lock_ref))
        # None and str do not compare, so sort on (has_extra_key, extra_key, ...).
        return sorted(entries, key=lambda e: (e[0] is not None, e[0] or "", e[1], e[2], e[3]))

    def pretty(self) -> str:
        """Indented dump, one node a line, for failure reports."""
        lines = [
            f"RadixCache(page_size={self.page_size}) total={self.total_size()} "
            f"evictable={self.evictable_size_} protected={self.protected_size_}"
        ]

        def walk(node: TreeNode, depth: int) -> None:
            for child in self._sorted_children(node):
                extra = f" extra_key={child.extra_key!r}" if child.extra_key is not None else ""
                lines.append(
                    f"{'  ' * depth}{child.key} -> {child.value.tolist()} "
                    f"lock={child.lock_ref} t={child.last_access_time}{extra}"
                )
                walk(child, depth + 1)

        walk(self.root_node, 1)
        return "\n".join(lines)
