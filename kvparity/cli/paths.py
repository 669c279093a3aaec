"""Checks made before a run starts, so that a bad option costs one sentence and exit 2, not a
traceback after the whole run."""

from __future__ import annotations

import os
from pathlib import Path


def output_path_problem(option: str, path: str | None) -> str | None:
    """Why ``path`` (given to ``option``) cannot be written, or None when it can (or is not given)."""
    if path is None:
        return None
    target = Path(path)
    if target.is_dir():
        return f"{option} {path}: is a folder, not a file"
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        return f"{option} {path}: the folder {str(parent)!r} does not exist"
    if not os.access(parent, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        return f"{option} {path}: cannot be written (permission denied)"
    return None


def positive_number_problem(option: str, value: float | None, *, upper: float | None = None) -> str | None:
    """Why ``value`` is no valid value of ``option`` (> 0, and at most ``upper`` when given)."""
    if value is None:
        return None
    if value <= 0:
        return f"{option} must be greater than 0 (got {value:g})"
    if upper is not None and value > upper:
        return f"{option} must be at most {upper:g} (got {value:g})"
    return None
