"""SGLang's objects by the qualified names kvparity's version entries hold (``"pkg.module:Name.attr"``)."""

from __future__ import annotations

import importlib
from typing import Any


def lookup(qualified: str) -> Any:
    """``"pkg.module:Name.attr"`` -> the object."""
    module_name, _, attr_path = qualified.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in attr_path.split("."):
        obj = getattr(obj, part)
    return obj


def optional(qualified: str | None) -> Any:
    """``lookup(qualified)``, or None when the entry says the version has no such thing."""
    return None if qualified is None else lookup(qualified)
