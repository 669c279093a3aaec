"""The one way into real SGLang's layer from the layers above it (the judge, the runs, the reports'
callers, the command line, candidates and the mutant zoo): what they may use of it, by name. Every
other module of ``kvparity.engine.real`` is its own business (``tests/unit/test_layers.py`` checks
that nothing above imports one).

What passes through: a release or checkout as a source (``resolve``, ``SGLangSource``, a copy of one
with edits, where releases are kept, which releases are supported), a real release as a player (its
own scheduler, ``RealTrafficPlayer``; kvparity's loop in its worlds, ``RealLane``), warm workers
(``Zygotes``, the plugins they load, the variable naming the folder a worker loaded), and what
kvparity knows of releases (their named changes, their known defects).

Each name is looked up when first asked for (PEP 562): most of this layer imports kvparity's
kernels, and the command line must choose the device before they load.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names as type checkers see them
    from kvparity.engine.real import WORKER_PLUGINS
    from kvparity.engine.real.defects import KnownDefect, known_defect
    from kvparity.engine.real.install import SGLangSource, cache_root, copy_with_edits, resolve
    from kvparity.engine.real.lane import RealLane
    from kvparity.engine.real.players import RealTrafficPlayer
    from kvparity.engine.real.versions import SUPPORTED
    from kvparity.engine.real.worker import LOADED_ENV
    from kvparity.engine.real.zygote import Zygotes

# Each name, and the module of this layer that holds it.
_WHERE = {
    "WORKER_PLUGINS": "kvparity.engine.real",
    "KnownDefect": "kvparity.engine.real.defects",
    "known_defect": "kvparity.engine.real.defects",
    "SGLangSource": "kvparity.engine.real.install",
    "cache_root": "kvparity.engine.real.install",
    "copy_with_edits": "kvparity.engine.real.install",
    "resolve": "kvparity.engine.real.install",
    "RealLane": "kvparity.engine.real.lane",
    "RealTrafficPlayer": "kvparity.engine.real.players",
    "SUPPORTED": "kvparity.engine.real.versions",
    "LOADED_ENV": "kvparity.engine.real.worker",
    "Zygotes": "kvparity.engine.real.zygote",
}
__all__ = ["LOADED_ENV", "SUPPORTED", "WORKER_PLUGINS", "KnownDefect", "RealLane", "RealTrafficPlayer",
           "SGLangSource", "Zygotes", "cache_root", "copy_with_edits", "known_defect", "resolve"]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"kvparity.engine.real.door has no {name!r}: what passes through is {', '.join(__all__)}")
    # Looked up afresh each time, never kept here: the module that holds a name stays where it is
    # read (a test that replaces it there replaces it for every caller).
    return getattr(importlib.import_module(_WHERE[name]), name)
