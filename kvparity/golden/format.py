"""The text of a golden file: JSON in a fixed reading order, one line per flat list (a row of
``req_to_token`` is one line, however long), so that a pull request's diff shows changed cells."""

from __future__ import annotations

import json
import re
from typing import Any

_KEY_ORDER = (
    "format_version", "name", "why", "regenerate", "recorded_from", "notes", "legend", "scenario", "stages",
    "geometry", "pool_rows", "max_context_len", "kv_slots", "page_size", "need_sort", "cache_kind", "chunk_size",
    "step", "kind", "rids", "rid", "tokens", "arrival", "return_logprob", "logprob_start_len", "max_new_tokens",
    "extra_key", "admit", "chunked_last", "num_tokens",
    "outcome", "error", "batch_rows", "out_cache_loc", "last_loc", "req_to_token", "allocator", "free_rows", "tree",
    "requests", "steps", "refactored",
    "dtype", "values", "rows", "free_pages", "release_pages", "available_size", "nodes", "slots",
    "lock_ref",
    "status", "fill_ids", "extend_input_len", "req_pool_idx", "cached_tokens", "already_computed",
    "extend_logprob_start_len", "last_matched_prefix_len", "output_len", "prefix", "allowed", "overrides",
)
_RANK = {key: i for i, key in enumerate(_KEY_ORDER)}


def key_order(key: str) -> tuple:
    """Reading order: known keys as listed, then the rest naturally (row "2" before row "10")."""
    natural = tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", key))
    return (_RANK.get(key, len(_RANK)), natural)


_INLINE_WIDTH = 100


def _inline_list(value: list) -> bool:
    """Integers always (a row is one line, however long); strings while the line stays short."""
    if any(isinstance(v, (dict, list)) for v in value):
        return False
    return all(isinstance(v, int) for v in value) or len(json.dumps(value)) <= _INLINE_WIDTH


def _flat(value: Any) -> bool:
    return not isinstance(value, (dict, list)) or (
        isinstance(value, list) and not any(isinstance(v, (dict, list)) for v in value)
    )


def _render(value: Any, depth: int) -> str:
    pad, end = " " * (depth + 1), " " * depth
    if isinstance(value, dict) and value and all(_flat(v) for v in value.values()):
        # A small record of plain values (a tensor, a prefix, a step) reads best on one line.
        inline = "{" + ", ".join(f"{json.dumps(k)}: {_render(value[k], 0)}" for k in sorted(value, key=key_order)) + "}"
        if len(inline) <= _INLINE_WIDTH:
            return inline
    if isinstance(value, dict) and value:
        items = [f"{pad}{json.dumps(k)}: {_render(value[k], depth + 1)}" for k in sorted(value, key=key_order)]
        return "{\n" + ",\n".join(items) + "\n" + end + "}"
    if isinstance(value, list) and not _inline_list(value):
        return "[\n" + ",\n".join(pad + _render(v, depth + 1) for v in value) + "\n" + end + "]"
    if isinstance(value, float):
        raise TypeError("a golden holds integers only")
    return json.dumps(value, separators=(", ", ": "))  # scalars, and a list of them on one line


def to_text(golden: dict) -> str:
    """Deterministic text: fixed key order, one line per flat list (a row is one line), newline at end."""
    return _render(golden, 0) + "\n"
