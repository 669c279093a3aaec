"""kvparity's faulty storage backend (the nemesis's storage faults before 0.5.23): where a release
has no ``HiCacheStorageFailureInjector`` of its own, a proxy over its storage backend fails calls
as that injector does in 0.5.23 - the same calls, and a failed call answers what the injector's
answers (a read of nothing, a write refused, no page found) - drawn from the world's seeded
generator, so that a run replays its faults exactly.

The proxy stands where the release's cache controller keeps its backend (``storage_backend``);
every call the controller makes goes through it. Calls that no injector fails (``clear``,
``get_stats``, a v2 existence query whose empty answer only SGLang can build) pass through.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _each(value: Any) -> Callable[..., Any]:
    """A failed batch call's answer: ``value`` once per key (the call's first argument)."""
    return lambda keys, *args, **kwargs: [value] * len(keys)


def _once(value: Any) -> Callable[..., Any]:
    return lambda *args, **kwargs: value


def _per_transfer(transfers: Any, *args: Any, **kwargs: Any) -> dict[str, list[bool]]:
    return {transfer.name: [False] * len(transfer.keys or []) for transfer in transfers}


# What a failed call answers, by the call's name (SGLang 0.5.23's injector's answers).
FAILED_ANSWERS: dict[str, Callable[..., Any]] = {
    "batch_get": _each(None), "batch_get_v1": _each(False), "batch_set_v1": _each(False),
    "get": _once(None), "set": _once(False), "batch_set": _once(False), "exists": _once(False),
    "batch_exists": _once(0), "batch_get_v2": _per_transfer, "batch_set_v2": _per_transfer,
}


class FaultyStorage:
    """``backend`` with the calls ``fails(name)`` says fail answering as failed (see ``FAILED_ANSWERS``)."""

    def __init__(self, backend: Any, fails: Callable[[str], bool]) -> None:
        self._backend = backend
        self._fails = fails

    def __getattr__(self, name: str) -> Any:
        real = getattr(self._backend, name)
        failed = FAILED_ANSWERS.get(name)
        if failed is None:
            return real

        def call(*args: Any, **kwargs: Any) -> Any:
            return failed(*args, **kwargs) if self._fails(name) else real(*args, **kwargs)

        return call
