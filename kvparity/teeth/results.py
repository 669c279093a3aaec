"""The mutant zoo's results as data, not as pytest's output to be read back.

A failing parity property raises ``ScenarioFailed``: an ``AssertionError`` whose message is the
readable report and which carries, as a dict, what the zoo prints of it (``failure_record``).
``kvparity.teeth.zoo.run_properties`` runs pytest with the plugin ``kvparity.teeth.plugin`` and
``KVPARITY_ZOO_RESULT`` naming a file; the plugin writes the first failing test there as JSON
(``RunFailure``): its outcome, the error's type and first line, and the record when the error
carried one. ``kvparity mutants`` reads the file (``read``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENV = "KVPARITY_ZOO_RESULT"


def failure_record(result: Any) -> dict[str, Any]:
    """What the zoo shows of a failed ``RunResult``: the line that says what went wrong (the first
    difference, else the first oracle violation; None for neither) and the replay record
    (``python -m kvparity.run.replay`` takes it), a dict."""
    from kvparity.model.scenario import scenario_to_dict
    from kvparity.report.failure import first_difference_line

    what = None
    if result.first_difference is not None:
        what = first_difference_line(result)
    elif result.violations:
        what = f"oracle: {str(result.violations[0]).strip()}"
    return {"what": what, "replay": scenario_to_dict(result.scenario)}


class ScenarioFailed(AssertionError):
    """A scenario on which the worlds disagree or an oracle fails; ``record`` is ``failure_record``."""

    def __init__(self, report: str, record: dict[str, Any]) -> None:
        super().__init__(report)
        self.record = record


@dataclass(frozen=True)
class RunFailure:
    """The first failing test of a run, as the plugin writes it."""

    test: str
    outcome: str  # pytest's: "failed"
    error_type: str
    error: str  # "Type: first line of the message"
    what: str | None = None  # from the ScenarioFailed record, when the error was one
    replay: dict[str, Any] | None = None


def _scenario_failure(exc: BaseException) -> ScenarioFailed | None:
    """``exc`` itself, or the first ScenarioFailed in it (Hypothesis may group several errors)."""
    if isinstance(exc, ScenarioFailed):
        return exc
    for inner in getattr(exc, "exceptions", ()):
        found = _scenario_failure(inner)
        if found is not None:
            return found
    return None


def failure_of(test: str, outcome: str, exc: BaseException) -> RunFailure:
    """Test ``test`` ended with ``outcome`` by raising ``exc``."""
    message = str(exc).strip().splitlines()
    error = f"{type(exc).__name__}: {message[0]}" if message else type(exc).__name__
    carried = _scenario_failure(exc)
    record = carried.record if carried is not None else {}
    return RunFailure(test, outcome, type(exc).__name__, error, record.get("what"), record.get("replay"))


def read(path: str | Path) -> RunFailure | None:
    """The failure the plugin wrote to ``path``; None when no test failed (no file)."""
    path = Path(path)
    if not path.exists():
        return None
    return RunFailure(**json.loads(path.read_text()))
