"""The errors of getting and running a real SGLang, below every layer that raises or catches them
(real SGLang's own, ``kvparity.engine.real``, raises them; the sweep, the matrix and the command
line catch them, and need nothing else of real SGLang's to do so)."""

from __future__ import annotations


class RealSGLangError(Exception):
    """A problem with getting or running a real SGLang: one sentence naming it."""


class WorkerStartError(RealSGLangError):
    """The worker could not get ready (SGLang failed to import, wrong version, ...)."""
