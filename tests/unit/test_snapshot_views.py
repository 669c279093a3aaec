"""A snapshot's request views are built without ``RequestView.__init__`` (for speed); these tests
stand where ``__init__``'s own checks stood: every view names exactly the class's fields, and
equals the view ``__init__`` builds from the same values."""

from __future__ import annotations

import dataclasses

import pytest

from kvparity.engine.snapshot import RequestView
from kvparity.golden.scenarios import GOLDENS
from kvparity.run.runner import ALL_WORLDS, Lockstep

FIELDS = {f.name for f in dataclasses.fields(RequestView)}


@pytest.mark.parametrize("name", ["chunked-chunk-cache", "mixed-prefixes"])
def test_every_view_of_every_world_names_exactly_the_fields_of_request_view(name):
    scenario = GOLDENS[name]
    lockstep = Lockstep(scenario, ALL_WORLDS)
    for index, step in enumerate(scenario.steps):
        lockstep.play(index, step)
    assert lockstep.result.ok
    views = [view for snap in lockstep.last.values() for view in snap.requests.values()]
    views += [view for snap in lockstep.reference_stages for view in snap.requests.values()]
    assert views
    for view in views:
        assert vars(view).keys() == FIELDS
        assert RequestView(**vars(view)) == view
