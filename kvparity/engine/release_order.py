"""SGLang versions as text and in order: a version read from what a user typed or a wheel's metadata
(``parse_version``) and the order of two (``version_key``, PEP 440's). Below the layers that compare
releases (the judge's known differences, the matrix) and real SGLang's layer that installs them."""

from __future__ import annotations

from packaging.version import InvalidVersion, Version

from kvparity.engine.errors import RealSGLangError


def _pep440(text: str) -> Version:
    try:
        return Version(text)
    except InvalidVersion:
        raise RealSGLangError(
            f"{text!r} is not an SGLang version: expected a PEP 440 version such as 0.5.3, sglang==0.5.3.post1 or "
            f"0.5.22.dev12+g1a2b3c4, or a path to a folder holding the sglang package"
        ) from None


def parse_version(text: str) -> str:
    """``"0.5.3"``, ``"sglang==0.5.3"``, ``" v0.5.3.post1 "`` or a checkout's ``"0.5.22.dev12+g1a2b3c4"``
    -> the normalized PEP 440 version string (``.devN``, ``+local``, ``rcN``, ``.postN`` all kept).
    Raises RealSGLangError for anything else, and for a version that is not N.N.N-based as every
    SGLang release is."""
    raw = text.strip()
    bare = raw[len("sglang=="):].strip() if raw.lower().startswith("sglang==") else raw
    parsed = _pep440(bare)
    if len(parsed.release) != 3:
        raise RealSGLangError(f"{text!r} is not an SGLang version: SGLang versions have three numbers, N.N.N")
    return str(parsed)


def version_key(version: str) -> Version:
    """Sort key: PEP 440 order (dev < a < b < rc < final < post; a local label sorts after its
    public version)."""
    return _pep440(version)
