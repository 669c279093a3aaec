"""The registry of cache kinds: each kind's module registers its ``CacheKind`` once, by name."""

from __future__ import annotations

from kvparity.caches.kind import CacheKind
from kvparity.model.traffic import ServerConfig

KINDS: dict[str, CacheKind] = {}  # by name, in registration order


def register(kind: CacheKind) -> CacheKind:
    if kind.name in KINDS:
        raise ValueError(f"cache kind {kind.name!r} is registered twice")
    KINDS[kind.name] = kind
    return kind


def get(name: str) -> CacheKind:
    """The kind of this name, or a ValueError naming the known ones."""
    try:
        return KINDS[name]
    except KeyError:
        raise ValueError(f"cache kind {name!r}: expected one of {', '.join(KINDS)}") from None


def names() -> tuple[str, ...]:
    return tuple(KINDS)


def default_names() -> tuple[str, ...]:
    """What a real release pair's check serves unless ``--caches`` says."""
    return tuple(name for name, kind in KINDS.items() if kind.default)


def classes() -> tuple[str, ...]:
    """Every kind's scenario shapes of its own, each once, in the registry's order."""
    return tuple(dict.fromkeys(name for kind in KINDS.values() for name in kind.classes))


def kind_of(config: ServerConfig) -> CacheKind:
    """The kind a server is of: the one whose caches it holds."""
    found = [kind for kind in KINDS.values() if kind.describes(config)]
    if not found:
        raise ValueError(f"no cache kind holds {', '.join(type(p).__name__ for p in config.caches)}")
    return found[0]
