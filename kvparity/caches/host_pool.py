"""A host tier's pool (HiCache, issue 44) and a Mamba model's host state pool (issue 47): their
records in a snapshot, their oracles and how two runs' host pools differ. A Mamba model's host tier
has both: its KV's host pool, then its states' (a node's one host state is no per-token copy)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from kvparity.caches.pool import Pool, size_difference


class HostNode(NamedTuple):
    """A tree node with host KV (or listed by a load-back): its full token path in its extra key's
    tree, its host slots, its device slots (None once the device evicted them), and whether a
    backup or a load-back lists it."""

    path: tuple[int, ...]
    host: tuple[int, ...]
    device: tuple[int, ...] | None
    writing: bool
    loading: bool
    extra_key: str | None = None

    def to_plain(self) -> list[Any]:
        return [list(self.path), list(self.host), None if self.device is None else list(self.device),
                self.writing, self.loading, self.extra_key]

    @classmethod
    def from_plain(cls, data: list[Any]) -> HostNode:
        path, host, device, writing, loading, *extra = data
        return cls(tuple(path), tuple(host), None if device is None else tuple(device), bool(writing), bool(loading),
                   extra[0] if extra else None)


def in_tree_order(nodes: Iterable[HostNode]) -> list[HostNode]:
    """Host nodes by extra key's tree (the plain tree first), then path: as trees list their nodes."""
    return sorted(nodes, key=lambda n: (n.extra_key is not None, n.extra_key or "", n.path))


@dataclass
class HostState:
    """A host tier's pool after an iteration: its slots (``0 .. slots-1``), the free ones, and the
    tree's nodes holding host KV (``HostNode``: path, host slots, device slots or None once the
    device evicted them, whether a backup or a load-back lists them), and the host slots a fetch
    from storage holds outside the tree (``in_flight``). Every host slot is exactly one of free,
    backing one node, or in flight; none a transfer lists is free. ``fetched``: the tokens brought
    from storage so far (up to 0.5.18 a fetch lands within the iteration it starts in, so no
    snapshot sees it in flight)."""

    slots: int
    free: tuple[int, ...]
    nodes: tuple[HostNode, ...]
    available_size: int
    in_flight: tuple[int, ...] = ()
    fetched: int = 0
    storage_faults: tuple[str, ...] = ()  # the storage calls SGLang's injector failed so far, by name (the nemesis)
    prefetches_cut: int = 0  # prefetches from storage the release's policy ended before every page came
    backups_refused: int = 0  # backups to the host that found no host room (the release's write returned None)
    loads_refused: int = 0  # load-backs to the device that found no device room (its load returned None)

    def to_plain(self) -> dict[str, Any]:
        return {"slots": self.slots, "free": list(self.free), "available_size": self.available_size,
                "in_flight": list(self.in_flight), "fetched": self.fetched, "storage_faults": list(self.storage_faults),
                "prefetches_cut": self.prefetches_cut, "backups_refused": self.backups_refused,
                "loads_refused": self.loads_refused, "nodes": [node.to_plain() for node in self.nodes]}

    @classmethod
    def from_plain(cls, data: dict[str, Any]) -> HostState:
        return cls(slots=int(data["slots"]), free=tuple(data["free"]), available_size=int(data["available_size"]),
                   in_flight=tuple(data.get("in_flight", ())), fetched=int(data.get("fetched", 0)),
                   storage_faults=tuple(data.get("storage_faults", ())),
                   prefetches_cut=int(data.get("prefetches_cut", 0)),
                   backups_refused=int(data.get("backups_refused", 0)), loads_refused=int(data.get("loads_refused", 0)),
                   nodes=tuple(HostNode.from_plain(node) for node in data["nodes"]))

    @property
    def read_faults(self) -> int:
        """The storage reads (``batch_get``, ``batch_get_v1``, ...) SGLang's injector failed so far."""
        return sum(call.startswith("batch_get") for call in self.storage_faults)

    @property
    def host_only_tokens(self) -> int:
        """Tokens the tree keeps on the host alone (the device evicted them)."""
        return sum(len(node.host) for node in self.nodes if node.device is None)

    @property
    def loading(self) -> tuple[int, ...]:
        """Host slots a load-back lists (sorted)."""
        return tuple(sorted(s for node in self.nodes if node.loading for s in node.host))


def host_slots_conserved(host: HostState) -> list[str]:
    """Every host slot is exactly one of free, backing one node (a backup in flight already backs
    its node) or held by a fetch from storage, none a transfer lists is free, and nothing else is
    handed out."""
    backing = Counter(s for node in host.nodes for s in node.host)
    places = Counter(host.free) + backing + Counter(host.in_flight)
    problems = []
    twice = sorted(s for s, n in places.items() if n > 1)
    if twice:
        problems.append(f"host slots in two places at once (free, backing a node, fetched from storage): {twice[:6]}")
    stray = sorted(s for s in places if not 0 <= s < host.slots)
    if stray:
        problems.append(f"host slots that are no slots of the pool: {stray[:6]}")
    lost = sorted(set(range(host.slots)) - set(places))
    if lost:
        problems.append(f"host slots neither free, nor backing a node, nor fetched from storage (leaked): {lost[:6]}")
    listed = sorted(set(host.free) & ({s for n in host.nodes if n.writing or n.loading for s in n.host}
                                      | set(host.in_flight)))
    if listed:
        problems.append(f"host slots freed while a transfer lists them: {listed[:6]}")
    if host.available_size != len(host.free):
        problems.append(f"host available_size {host.available_size} is not the {len(host.free)} free slots")
    return problems


def host_nodes_consistent(host: HostState, tree: tuple) -> list[str]:
    """A node's device and host states agree: a node on both holds as many slots on each, a node
    being loaded back has its device slots, and no device KV hangs below a node the device evicted
    (eviction demotes leaves first) in the same extra key's tree."""
    problems = []
    for n in host.nodes:
        if n.device is not None and len(n.device) != len(n.host):
            problems.append(f"node {_short(n.path)}: {len(n.device)} device slots but {len(n.host)} host slots")
        if n.loading and n.device is None:
            problems.append(f"node {_short(n.path)}: a load-back lists it, but it has no device slots")
        if n.loading and not n.host:
            problems.append(f"node {_short(n.path)}: a load-back lists it, but its host KV was freed")
    evicted = [(n.extra_key, n.path) for n in host.nodes if n.device is None]
    below = [e[1] for e in tree
             if any(e[0] == key and len(e[1]) > len(p) and e[1][: len(p)] == p for key, p in evicted)]
    if below:
        problems.append(f"device KV below a node the device evicted: {_short(below[0])}")
    return problems


def _short(path: tuple[int, ...]) -> str:
    return f"[{len(path)} tokens ending {list(path[-3:])}]"


def host_pool_difference(name: str, a: HostState | None, b: HostState | None,
                         exact: bool) -> tuple[str, str] | None:
    """The first way two runs' host pools (``name``) differ after an iteration: present in one
    only, the free host slots, the paths the host keeps and which the device evicted (no
    renumbering changes these), and, ``exact`` (the same release), which host slots back what."""
    sizes = size_difference(name, a, b, sizes=("available_size",))
    if sizes is not None or a is None or b is None:
        return sizes
    shape_a = [(n.extra_key, n.path, len(n.host), n.device is None) for n in a.nodes]
    shape_b = [(n.extra_key, n.path, len(n.host), n.device is None) for n in b.nodes]
    if shape_a != shape_b:
        return f"{name} nodes", (f"{len(shape_b)} nodes, {b.host_only_tokens} tokens on the host alone, against the "
                                 f"reference's {len(shape_a)} and {a.host_only_tokens}")
    if exact and (a.nodes, sorted(a.free)) != (b.nodes, sorted(b.free)):
        return f"{name} slots", "the same nodes back other host slots"
    return None


def _host_problems(host: HostState, tree: tuple) -> list[str]:
    return host_slots_conserved(host) + host_nodes_consistent(host, tree)


POOL: Pool[HostState] = Pool(name="host", oracle="host tier", from_plain=HostState.from_plain, problems=_host_problems,
                             difference=lambda a, b, exact: host_pool_difference("host", a, b, exact))
STATE_POOL: Pool[HostState] = Pool(name="state_host", oracle="host tier", from_plain=HostState.from_plain,
                                   problems=lambda states, tree: [f"states: {p}" for p in host_slots_conserved(states)],
                                   difference=lambda a, b, exact: host_pool_difference("state host", a, b, exact))
