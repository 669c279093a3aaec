"""What a world is, as plain data: its identity (``WorldId``: version or SGLang release, backend,
family, real or modelled), the versions and tree caches there are, and a world's geometry. The
engine builds worlds from these (``kvparity.engine.world``); scenarios and reports only name them."""

from __future__ import annotations

from dataclasses import dataclass

VERSIONS = ("legacy", "refactored")  # SGLang's two versions
# The SGLang release each version models (pull request #11200 lies between them).
MODELLED_RELEASES = {"0.5.3": "legacy", "0.5.3.post1": "refactored"}
# Versions that are not SGLang's, each the family it belongs to: the refactored path with the
# linear-time write kernel (``kernels/linear_write.py``), checked as an extra world.
EXTRA_VERSIONS = {"refactored-linear": "refactored"}
# The two tree caches a real server can have (SPEC 1, "Which cache a server has"): the radix cache,
# or, with the radix cache disabled, the chunk cache (with chunking or without, chunk_size None).
CACHE_KINDS = ("radix", "chunk")
RETIRED_CACHE_KINDS = {
    "none": "cache kind 'none' was retired: no SGLang server runs without a tree cache; with the radix "
    "cache disabled it has a ChunkCache, so use cache_kind 'chunk' (chunk_size None for no chunking)",
}


def check_cache_kind(cache_kind: str) -> str:
    """Return ``cache_kind`` if a server can have it, else raise a ValueError that says why not."""
    if cache_kind in RETIRED_CACHE_KINDS:
        raise ValueError(RETIRED_CACHE_KINDS[cache_kind])
    if cache_kind not in CACHE_KINDS:
        raise ValueError(f"cache_kind={cache_kind!r}: expected one of {CACHE_KINDS}")
    return cache_kind


@dataclass(frozen=True)
class Geometry:
    pool_rows: int
    max_context_len: int
    kv_slots: int
    page_size: int = 1
    need_sort: bool = False


def family(version: str) -> str:
    """The SGLang version a modelled world's version behaves as (what comparisons and goldens key
    on). A real SGLang world's family is in its ``WorldId``."""
    if version in VERSIONS:
        return version
    if version in EXTRA_VERSIONS:
        return EXTRA_VERSIONS[version]
    raise ValueError(f"version={version!r}: expected one of {VERSIONS + tuple(EXTRA_VERSIONS)} or a real SGLang world")


@dataclass(frozen=True)
class WorldId:
    """Which world: its version (``legacy``, ``refactored``, ``refactored-linear``, or a real
    SGLang world's label such as ``sglang-0.5.3``), its backend, the SGLang version it behaves as
    (``family``) and, for a real SGLang world, the release it is. ``str()`` is the world's name,
    ``version/backend``: the name every report, ledger and JSON file shows."""

    version: str
    backend: str
    family: str
    release: str | None = None  # a real SGLang world's release ("0.5.3"); None: modelled
    # What sets the world apart from the same release on the same backend: "python-tree" (a 0.5.22+
    # world on the Python radix-tree core instead of the Rust one a server builds); None: nothing.
    variant: str | None = None

    def __post_init__(self) -> None:
        if self.family not in VERSIONS:
            raise ValueError(f"family={self.family!r}: expected one of {VERSIONS}")

    @classmethod
    def modelled(cls, version: str, backend: str) -> WorldId:
        """A world of kvparity's own model of SGLang (``build_world``)."""
        return cls(version, backend, family(version))

    @property
    def real(self) -> bool:
        return self.release is not None

    def __str__(self) -> str:
        return f"{self.version}/{self.backend}" + (f"+{self.variant}" if self.variant else "")
