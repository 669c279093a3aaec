"""The KV canary (``../shared/kv-canary.md``), as plain definitions: what the KV of a token holds.

For a request with tokens ``t[0..n)`` (prompt, then outputs), the KV at position ``p`` is stamped
``(t[p], p, h[p])``, where ``h`` chains the tokens: ``h[-1] = SEED``, ``h[p] = mix(h[p-1], t[p])``.
Two requests that share a prefix share its canaries, so a prefix hit reads right, and a slot written
for another prefix does not. The forward that stamps and reads them is
``kvparity.engine.canary.KVCanary``; what it finds is a ``CanaryRead``.
"""

from __future__ import annotations

from dataclasses import dataclass

SEED = 0x2545F4914F6CDD1D & ((1 << 62) - 1)
_MASK = (1 << 62) - 1  # hashes stay below 2**62: an int64 tensor holds them without a sign
_MULTIPLIER = 0x100000001B3  # FNV-1a's prime: one xor and one multiply per token
UNSTAMPED = -1  # what a slot holds before any forward wrote it (every lane)

Canary = tuple[int, int, int]  # (token, position, chained hash)


def mix(h: int, token: int) -> int:
    """The next link of the chain (FNV-1a over the token, with a final xor-shift so that nearby
    tokens do not give nearby hashes)."""
    h = ((h ^ (token & _MASK)) * _MULTIPLIER) & _MASK
    return h ^ (h >> 29)


def chain(tokens: list[int] | tuple[int, ...], h: int = SEED) -> list[int]:
    """``h[p]`` for every position of ``tokens``, starting from ``h`` (the hash before them)."""
    out = []
    for token in tokens:
        h = mix(h, token)
        out.append(h)
    return out


def canaries(tokens: list[int] | tuple[int, ...]) -> list[Canary]:
    return [(t, p, h) for p, (t, h) in enumerate(zip(tokens, chain(tokens)))]


def token_from(h: int, vocab_size: int) -> int:
    """The next token a forward samples, from the hash it read at the last position: a function of
    the KV read, so that a wrong read changes what the request generates (as a model's would)."""
    return 10 + h % (vocab_size - 10)


@dataclass(frozen=True)
class CanaryRead:
    """A read of wrong KV: request ``rid``'s forward (the batch formed at ``iteration``, or the
    harness's ``step``) read, at ``position``, the slot ``slot`` (named by row ``row``), which holds
    ``found`` (stamped by ``stamped_by``, or never stamped) where its own token's canary
    ``expected`` belongs. ``when``: "launch" (the table as the batch was launched), "in flight"
    (a cell changed while the batch was in flight, read as a GPU could), "window" (a sliding-window
    model's window layer, through the window slot ``slot``; 0: none mapped, the slot was freed) or
    "state" (a Mamba model's state slot ``slot``, which must hold the state after the request's
    tokens up to ``position``: the canary of that position, or the empty state before position 0)."""

    rid: str
    row: int
    position: int
    slot: int
    expected: Canary
    found: Canary | None
    stamped_by: str | None
    iteration: int = -1
    when: str = "launch"

    def line(self) -> str:
        held = "nothing (never stamped)" if self.found is None else (
            f"token {self.found[0]} at position {self.found[1]}" + (f" of {self.stamped_by}" if self.stamped_by else ""))
        if self.when == "state":
            held = "the empty state" if self.found is None else f"the state after {held}"
            belongs = "the empty state" if self.position < 0 else f"the state after its token at position {self.position}"
            return (f"request {self.rid} (row {self.row}) read state slot {self.slot}, which holds {held}; "
                    f"{belongs} belongs there (state)")
        return (f"request {self.rid} read position {self.position} through row {self.row} from slot {self.slot}, "
                f"which holds {held}; its own token {self.expected[0]} belongs there ({self.when})")

    def to_plain(self) -> dict[str, object]:
        return {"rid": self.rid, "row": self.row, "position": self.position, "slot": self.slot,
                "expected": list(self.expected), "found": None if self.found is None else list(self.found),
                "stamped_by": self.stamped_by, "iteration": self.iteration, "when": self.when}

    @classmethod
    def from_plain(cls, data: dict) -> CanaryRead:
        found = data["found"]
        return cls(str(data["rid"]), int(data["row"]), int(data["position"]), int(data["slot"]),
                   _canary(data["expected"]), None if found is None else _canary(found), data["stamped_by"],
                   int(data["iteration"]), str(data["when"]))


def _canary(values: list[int]) -> Canary:
    t, p, h = (int(v) for v in values)
    return t, p, h
