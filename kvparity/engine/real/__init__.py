"""Driving REAL SGLang releases as kvparity worlds.

Every SGLang release is the package ``sglang``, so one process holds one version: real SGLang is
only ever imported inside a worker subprocess (``python -m kvparity.engine.real.worker``), never in the
kvparity / pytest process. Modules here that the parent imports (``install``, ``versions``,
``worker``'s ``RealWorker``) never import sglang; ``adapter`` and ``standins`` are used inside the
worker only.

- ``install``:  ``resolve(spec)`` -> an ``SGLangSource`` (a pip-installed version, cached, or a path)
- ``versions``: the adapter table, one frozen ``VersionEntry`` per supported version
- ``standins``: import-only stand-ins for modules on SGLang's import chain this path never uses
- ``adapter``:  ``build_real_world(...)`` (worker side)
- ``worker``:   the worker process and the parent's ``RealWorker``
- ``zygote``:   one import per release per run: workers forked from a process that has imported it
"""

from kvparity.engine.errors import RealSGLangError

__all__ = ["WORKER_PLUGINS", "RealSGLangError"]

# The plugins every real SGLang worker loads, whichever drive it serves: the harness drive's
# (``kvparity.engine.real.play``: kvparity's loop playing step scenarios) and the scheduler drive's
# (``kvparity.engine.real.scheduler_shell``: the release's own scheduler playing traffic). One set,
# so that one zygote per release (``kvparity.engine.real.zygote``) forks the workers of both drives.
WORKER_PLUGINS = ("kvparity.engine.real.play", "kvparity.engine.real.scheduler_shell")
