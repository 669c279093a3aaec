"""A named change between two SGLang releases, as a record (written in the row of the release that
made it, ``kvparity.engine.releases``): which release made it, its kind, what it did, its pull request,
and how to undo it in the release's source or in kvparity's model. Here, below the players, since a
player undoes changes (``TrafficPlayer.undone``) whether it is real SGLang or kvparity's model.

Kinds: "renumbering" (which row, page or slot a token gets, or the order of a free list, and
nothing any token can see), "behaviour" (a value a request or the tree ends up with) or "admission"
(which requests a batch admits, or in which order)."""

from __future__ import annotations

from dataclasses import dataclass, field

RENUMBERING, BEHAVIOUR, ADMISSION = "renumbering", "behaviour", "admission"


@dataclass(frozen=True)
class Change:
    # The release that made it: its row's version (``Release`` stamps it; written once, there).
    release: str = field(default="", kw_only=True)
    kind: str
    what: str
    pull_request: str | None = None  # "#17850", or None where none was found
    # How to undo it in ``release``'s own source: (file under the folder holding ``sglang``, the
    # text the change wrote there, which occurs once, the text before the change).
    undo: tuple[str, str, str] | None = None
    # How to undo it in kvparity's model: (option of ``play_traffic``, value).
    model_undo: tuple[str, str] | None = None
    # How to undo it in kvparity's adapter of ``release`` (``VersionEntry``'s fact, the value before
    # it): in the harness drive kvparity's loop plays the scheduler's part, so a change of the
    # scheduler's that the adapter follows is undone there, not in the source.
    adapter_undo: tuple[str, bool] | None = None
