"""SGLang's own defects that kvparity's runs of a release meet, each named with its evidence: which
releases have it, what it is, the upstream issue or fix, and how it shows in a run (the finding's
kind and what its line says). A release's own run that meets one still fails the check (a defect
is a failure, whether or not the reference shares it); the report names it as known instead of
leaving it to be traced again.

Beside ``kvparity.engine.real.changes`` (what changed between releases, on purpose or not): a
defect here is one a release's own run shows by itself, against itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvparity.engine.real.versions import version_key

# The finding kinds a defect shows as (the tail of a scheduler-driven finding's label).
RAISED, ORACLE, CANARY, INFLIGHT = "the scheduler raised", "memory oracle", "KV canary", "in flight"


@dataclass(frozen=True)
class KnownDefect:
    name: str  # short, as a report names it
    first: str  # the first release that has it
    last: str  # the last release that has it (the next one fixes it, or changed the path)
    what: str  # what goes wrong, and why
    evidence: str  # the upstream issue or pull request, the release that fixes it, how it was traced
    shows: str  # the finding kind it shows as (RAISED, ORACLE, CANARY, INFLIGHT)
    says: tuple[str, ...]  # every one of these occurs in the finding's line
    cache: str | None = None  # the model served ("mamba", ...), where only one shows it

    def covers(self, release: str) -> bool:
        return version_key(self.first) <= version_key(release) <= version_key(self.last)

    def matches(self, release: str, cache: str, kind: str, line: str) -> bool:
        """Whether a finding of ``kind`` saying ``line``, in ``release``'s run serving ``cache``, is this one."""
        return (self.covers(release) and kind.startswith(self.shows) and (self.cache is None or self.cache == cache)
                and all(part in line for part in self.says))

    @property
    def line(self) -> str:
        return f"{self.name} ({self.first} to {self.last}): {self.what}; {self.evidence}"


KNOWN_DEFECTS: tuple[KnownDefect, ...] = ()


def known_defect(release: str, cache: str, kind: str, line: str) -> KnownDefect | None:
    """The known defect a finding of a release's own run is, or None."""
    return next((d for d in KNOWN_DEFECTS if d.matches(release, cache, kind, line)), None)
