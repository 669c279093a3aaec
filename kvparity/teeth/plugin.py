"""The pytest plugin of the mutant zoo (``-p kvparity.teeth.plugin``): when ``KVPARITY_ZOO_RESULT``
names a file, the first failing test is written there as JSON (``kvparity.teeth.results.RunFailure``),
for ``kvparity mutants`` to read as data."""

from __future__ import annotations

import json
import os
from collections.abc import Generator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from kvparity.teeth.results import ENV, failure_of


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    path = os.environ.get(ENV)
    if not path or not report.failed or call.excinfo is None or Path(path).exists():
        return  # not asked, passed, or not the first failure
    failure = failure_of(item.nodeid, report.outcome, call.excinfo.value)
    Path(path).write_text(json.dumps(asdict(failure)) + "\n")
