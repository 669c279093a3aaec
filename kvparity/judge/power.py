"""What a parity verdict rules out. A task that played ``n`` independently drawn scenarios and saw
no difference would have seen, with probability ``confidence``, any difference reached by more
than ``rules_out(n)`` of the scenarios its strategy draws: a difference reached by a fraction ``p``
is missed by all ``n`` with probability ``(1 - p) ** n``. Ten scenarios rule out only differences
reached by more than 26% of draws; a difference reached by 5% is missed by ten more often than not
(issue 33)."""

from __future__ import annotations

import math

CONFIDENCE = 0.95


def rules_out(scenarios: int, confidence: float = CONFIDENCE) -> float:
    """The smallest reach ``p`` a difference can have and still be missed by ``scenarios`` draws with
    probability at most ``1 - confidence``: ``1 - (1 - confidence) ** (1 / scenarios)``. No
    scenario rules nothing out (1.0)."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence {confidence} is not a probability strictly between 0 and 1")
    if scenarios <= 0:
        return 1.0
    return 1.0 - (1.0 - confidence) ** (1.0 / scenarios)


def scenarios_for(reach: float, confidence: float = CONFIDENCE) -> int:
    """The fewest draws that see a difference reached by ``reach`` of them with probability
    ``confidence``: the inverse of ``rules_out``."""
    if not 0.0 < reach < 1.0:
        raise ValueError(f"reach {reach} is not a fraction strictly between 0 and 1")
    return math.ceil(math.log(1.0 - confidence) / math.log(1.0 - reach))


def percent(fraction: float) -> str:
    """A reach as a report shows it: ``7.2%``."""
    return f"{100 * fraction:.1f}%"


def parse_reach(text: str) -> float:
    """``2%`` or ``0.02``: the reach a run is to rule out (``--power``); a ``ValueError`` naming the
    text otherwise. From 0.1% (2,995 scenarios a task) to below 100%."""
    stripped = text.strip()
    try:
        value = float(stripped[:-1]) / 100 if stripped.endswith("%") else float(stripped)
    except ValueError:
        raise ValueError(f"--power {text!r} is not a reach such as 2% or 0.02") from None
    if not 0.001 <= value < 1.0:
        raise ValueError(f"--power {text!r} must be from 0.1% to below 100%")
    return value
