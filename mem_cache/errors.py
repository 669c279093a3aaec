"""The out-of-memory errors of the pools and allocators: typed, so that callers test a type, not
the wording. Both are ``RuntimeError``s, as SGLang's are, and keep SGLang-style messages."""

from __future__ import annotations

from enum import StrEnum
from typing import ClassVar


class Exhausted(StrEnum):
    """What ran out."""

    KV = "kv"  # KV slots (or pages), after eviction
    ROWS = "rows"  # request rows of ``req_to_token``


class OutOfMemory(RuntimeError):
    """A pool ran out. SGLang raises a plain ``RuntimeError``: this is one, so that code catching
    SGLang's error catches it too; ``exhausted`` says which pool."""

    exhausted: ClassVar[Exhausted]


class KVOutOfMemory(OutOfMemory):
    exhausted = Exhausted.KV


class RowsExhausted(OutOfMemory):
    exhausted = Exhausted.ROWS
