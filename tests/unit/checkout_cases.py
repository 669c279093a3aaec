"""Checkout-shaped folders built at test time from releases installed in ``install.cache_root()``
(``python -m kvparity.engine.real.install 0.5.21`` installs one): a test whose release is not there
skips, saying so. A copy's folders are real and its files are symlinks into the cache: ``_edit``
replaces a symlink with a file of its own, so the cache is never written."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvparity.engine.real import install


def _release(version: str) -> Path:
    folder = install.cache_root() / version
    if install.read_version(folder) != version:
        pytest.skip(f"sglang {version} is not installed in {install.cache_root()} "
                    f"(python -m kvparity.engine.real.install {version} installs it)")
    return folder


def _checkout(release: str, root: Path) -> Path:
    """A checkout's ``python/`` folder under ``root`` holding the installed release's sglang package."""
    src = _release(release) / "sglang"
    python = root / "python"
    for here, _dirs, files in os.walk(src):
        dest = python / "sglang" / Path(here).relative_to(src)
        dest.mkdir(parents=True)
        for name in files:
            (dest / name).symlink_to(Path(here) / name)
    return python


def _edit(path: Path, old: str, new: str) -> None:
    """Replace ``old`` by ``new`` in a file of a copy (the symlink is replaced, the cache untouched)."""
    text = path.read_text(encoding="utf-8")
    assert old in text, f"{old!r} is not in {path}"
    path.unlink()
    path.write_text(text.replace(old, new), encoding="utf-8")
