"""A scenario as plain data: pool geometry, cache kind, chunk size, requests and scheduler steps.

Everything here is frozen, hashable and printable as Python that rebuilds it (``to_python``), so a
shrunk counterexample can be pasted straight into a test. Steps refer to requests by id; a step
that does not apply when it is played (finishing a request that is not running, say) is skipped
identically in every world, which keeps shrinking simple and every scenario valid.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from kvparity.model.worlds import Geometry, check_cache_kind


@dataclass(frozen=True)
class RequestSpec:
    rid: str
    tokens: tuple[int, ...]
    arrival: int = 0  # index of the first step at which the request is waiting
    return_logprob: bool = False
    logprob_start_len: int = -1
    max_new_tokens: int = 4
    extra_key: str | None = None


@dataclass(frozen=True)
class Extend:
    """One prefill batch: the in-flight chunked request (if any) plus the named waiting requests,
    admitted in order while the token budget (the scenario's chunk size) lasts. The chunked
    request goes first, as in SGLang, unless ``chunked_last``."""

    admit: tuple[str, ...] = ()
    chunked_last: bool = False


@dataclass(frozen=True)
class Decode:
    """One decode step of every running request, as SGLang runs it: memory checked first
    (retracting under pressure), one new slot each, then the results processed inside one free
    group. The requests named in ``finish`` sample a stop token in this step; a request also
    finishes when it reaches its ``max_new_tokens``. While a chunked request is pending, SGLang
    runs no decode: the step runs the chunked request's next chunk instead."""

    finish: tuple[str, ...] = ()


@dataclass(frozen=True)
class Retract:
    rid: str


@dataclass(frozen=True)
class Evict:
    num_tokens: int


Step = Extend | Decode | Retract | Evict
STEP_TYPES = {cls.__name__: cls for cls in (Extend, Decode, Retract, Evict)}
RETIRED_STEPS = {
    "Finish": "step 'Finish' was retired: SGLang finishes requests while it processes a decode step's "
    "results, all in one free group; name them in Decode(finish=(...)) instead",
}


@dataclass(frozen=True)
class Scenario:
    geometry: Geometry
    cache_kind: str
    requests: tuple[RequestSpec, ...]
    steps: tuple[Step, ...]
    chunk_size: int | None = None

    def __post_init__(self) -> None:
        check_cache_kind(self.cache_kind)
        if self.chunk_size is not None and self.chunk_size < 1:
            raise ValueError(f"Scenario.chunk_size={self.chunk_size}: must be >= 1 (None: no chunking)")
        rids = [r.rid for r in self.requests]
        if len(set(rids)) != len(rids):
            raise ValueError(f"Scenario: duplicate request ids in {rids}")
        known = set(rids)
        for i, step in enumerate(self.steps):
            for rid in _rids_of(step):
                if rid not in known:
                    raise ValueError(f"Scenario step {i} ({step}) names unknown request {rid!r}")

    def request(self, rid: str) -> RequestSpec:
        return next(r for r in self.requests if r.rid == rid)

    # ---- printing ------------------------------------------------------------------------------
    def to_python(self) -> str:
        """Python source that rebuilds this scenario (``from kvparity.model.scenario import *``)."""
        g = self.geometry
        lines = [
            "Scenario(",
            f"    geometry=Geometry(pool_rows={g.pool_rows}, max_context_len={g.max_context_len}, "
            f"kv_slots={g.kv_slots}, page_size={g.page_size}, need_sort={g.need_sort}),",
            f"    cache_kind={self.cache_kind!r},",
            f"    chunk_size={self.chunk_size!r},",
            "    requests=(",
        ]
        lines += [f"        {_request_python(r)}," for r in self.requests]
        lines += ["    ),", "    steps=("]
        lines += [f"        {_step_python(s)}," for s in self.steps]
        lines += ["    ),", ")"]
        return "\n".join(lines)

    def to_json(self) -> str:
        return json.dumps(scenario_to_dict(self), sort_keys=True)


def _rids_of(step: Step) -> tuple[str, ...]:
    if isinstance(step, Extend):
        return step.admit
    if isinstance(step, Decode):
        return step.finish
    if isinstance(step, Retract):
        return (step.rid,)
    return ()


def tokens_python(tokens: tuple[int, ...]) -> str:
    """Runs of consecutive ids print as ``range``, so a 600-token prompt stays one short line."""
    parts, i = [], 0
    while i < len(tokens):
        j = i
        while j + 1 < len(tokens) and tokens[j + 1] == tokens[j] + 1:
            j += 1
        if j - i >= 3:
            parts.append(f"*range({tokens[i]}, {tokens[j] + 1})")
        else:
            parts.extend(str(t) for t in tokens[i : j + 1])
        i = j + 1
    return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"


def _request_python(r: RequestSpec) -> str:
    extras = []
    defaults = RequestSpec("", ())
    for name in ("arrival", "return_logprob", "logprob_start_len", "max_new_tokens", "extra_key"):
        if getattr(r, name) != getattr(defaults, name):
            extras.append(f"{name}={getattr(r, name)!r}")
    return f"RequestSpec({r.rid!r}, {tokens_python(r.tokens)}" + "".join(", " + e for e in extras) + ")"


def _step_python(step: Step) -> str:
    if isinstance(step, Extend):
        last = ", chunked_last=True" if step.chunked_last else ""
        return f"Extend(admit={step.admit!r}{last})"
    if isinstance(step, Decode):
        return f"Decode(finish={step.finish!r})" if step.finish else "Decode()"
    if isinstance(step, Retract):
        return f"Retract({step.rid!r})"
    return f"Evict({step.num_tokens})"


# ---- plain-dict form (JSON files, command line) -----------------------------------------------------
def scenario_to_dict(scenario: Scenario) -> dict:
    return {
        "geometry": asdict(scenario.geometry),
        "cache_kind": scenario.cache_kind,
        "chunk_size": scenario.chunk_size,
        "requests": [{**asdict(r), "tokens": list(r.tokens)} for r in scenario.requests],
        "steps": [{"step": type(s).__name__, **{k: list(v) if isinstance(v, tuple) else v for k, v in asdict(s).items()}}
                  for s in scenario.steps],
    }


def scenario_from_dict(data: dict) -> Scenario:
    try:
        steps = []
        for raw in data["steps"]:
            raw = dict(raw)
            name = raw.pop("step")
            if name in RETIRED_STEPS:
                raise ValueError(RETIRED_STEPS[name])
            cls = STEP_TYPES[name]
            for names in ("admit", "finish"):
                if names in raw:
                    raw[names] = tuple(raw[names])
            steps.append(cls(**raw))
        requests = tuple(RequestSpec(**{**r, "tokens": tuple(r["tokens"])}) for r in data["requests"])
        return Scenario(
            geometry=Geometry(**data["geometry"]),
            cache_kind=data["cache_kind"],
            chunk_size=data.get("chunk_size"),
            requests=requests,
            steps=tuple(steps),
        )
    except (KeyError, TypeError) as exc:
        # (ValueErrors from check_cache_kind and RETIRED_STEPS pass through: they say what is wrong.)
        raise ValueError(f"not a kvparity scenario: {exc!r}") from None
