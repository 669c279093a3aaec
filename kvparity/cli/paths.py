"""Checks made before a run starts, so that a bad option costs one sentence and exit 2, not a
traceback after the whole run."""

from __future__ import annotations

from pathlib import Path


def output_path_problem(option: str, path: str | None) -> str | None:
    """Why ``path`` (given to ``option``) cannot be written, or None when it can (or is not given).

    The file is really opened for writing (and removed again when the probe made it): permission
    bits say nothing to root, and some folders (``/proc``, a read-only mount) refuse every new
    file whatever they say."""
    if path is None:
        return None
    target = Path(path)
    if target.is_dir():
        return f"{option} {path}: is a folder, not a file"
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        return f"{option} {path}: the folder {str(parent)!r} does not exist"
    existed = target.exists()
    try:
        with open(target, "a"):  # appends nothing: an existing file keeps its contents
            pass
    except OSError as exc:
        return f"{option} {path}: cannot be written ({exc.strerror or exc})"
    if not existed:
        target.unlink(missing_ok=True)
    return None


def write_problem(option: str, path: str, exc: OSError) -> str:
    """The one sentence for an output file that could not be written after all."""
    return f"{option} {path}: could not be written ({exc.strerror or exc}); the verdict above stands"


def positive_number_problem(option: str, value: float | None, *, upper: float | None = None) -> str | None:
    """Why ``value`` is no valid value of ``option`` (> 0, and at most ``upper`` when given)."""
    if value is None:
        return None
    if value <= 0:
        return f"{option} must be greater than 0 (got {value:g})"
    if upper is not None and value > upper:
        return f"{option} must be at most {upper:g} (got {value:g})"
    return None
