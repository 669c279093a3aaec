"""Golden files: what the legacy index path IS, pinned in readable JSON under ``tests/golden/``.

Generated scenarios prove that the two versions agree with each other; a golden file pins the
behaviour itself, so a change that moves both at once (to ``legacy/``, to torch, to Triton) is
still caught, and a reviewer sees in a pull request exactly which cells a change affects.

A golden is recorded from legacy on torch (the reference), after every stage of its scenario, and
only when all the worlds (``kvparity.run.runner.ALL_WORLDS``) agree and every oracle holds: a file
recorded from a broken state would bless the bug. Where the refactored version differs by design (``kvparity.judge.compare.ALLOWED``), the
stage carries a ``refactored`` section with the reason and the fields that differ; every other
field must be equal in all the worlds, dtypes included.

    python scripts/regen_golden.py [NAME...]        kvparity golden regen | check [NAME...]

Files hold integers and strings only, never a device, a time or an address, so a regeneration is
byte-identical on any machine (CPU or GPU).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from kvparity.engine.scheduler import Scheduler, StageRecord, dtype_name
from kvparity.engine.snapshot import Snapshot, prefix_kind
from kvparity.golden.format import key_order, to_text
from kvparity.golden.scenarios import GOLDENS, REACHES, WHY
from kvparity.judge.compare import ALIAS_DEFECT, ALLOWED, aliases_a_row_it_left
from kvparity.judge.differ import list_diff
from kvparity.model.poison import POISON
from kvparity.model.scenario import Scenario, scenario_from_dict, scenario_to_dict
from kvparity.model.worlds import family
from kvparity.report.failure import format_failure
from kvparity.run.runner import Lockstep, run_scenario

FORMAT_VERSION = 1
REPO_ROOT = Path(__file__).resolve().parents[2]
DIRECTORY = REPO_ROOT / "tests" / "golden"
REFERENCE = ("legacy", "torch")
# The one prefix type the refactored version may hand to its write (SPEC 8), whatever legacy's is.
REFACTORED_PREFIX_KIND = "int64 tensor"
FAILURE = "after allocation failure"
# A stage's 'refactored' section names its excuses by kvparity.judge.compare.ALLOWED's own keys.
if FAILURE not in ALLOWED or ALIAS_DEFECT not in ALLOWED:
    raise RuntimeError(f"kvparity.judge.compare.ALLOWED no longer names {FAILURE!r} or {ALIAS_DEFECT!r}: update kvparity.golden.store")

# Every golden file holds this legend, word for word. Its name for the excuses, parity.compare.ALLOWED,
# is what the files were recorded with (before the harness became kvparity.judge.compare); it
# stays, so that moving a module does not rewrite every golden file.
LEGEND = [
    "stages: one entry per stage, in order; a step may have two (cache_unfinished, then extend)",
    f"req_to_token.rows: the used part of every row that is not entirely POISON ({POISON}); columns after "
    "the list, and rows not listed, hold POISON",
    "requests.prefix.kind: legacy's type of prefix_indices; the refactored version's is always "
    f"'{REFACTORED_PREFIX_KIND}' (parity.compare.ALLOWED: 'prefix type')",
    "refactored: where the refactored version differs from what is recorded here, by design: 'allowed' names "
    "the entries of parity.compare.ALLOWED that excuse it, 'overrides' holds the refactored values",
]


class GoldenError(Exception):
    """A golden that cannot be recorded or read; the message says which, why and what to run."""


# ---- paths and messages --------------------------------------------------------------------------
def path_of(name: str, directory: Path | str | None = None) -> Path:
    return Path(directory if directory is not None else DIRECTORY) / f"{name}.json"


def display_path(path: Path) -> str:
    """The path as a reviewer types it: relative to the repository when inside it."""
    try:
        return str(path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def regen_command(name: str, directory: Path | str | None = None) -> str:
    command = f"python scripts/regen_golden.py {name}"
    if directory is not None and Path(directory).resolve() != DIRECTORY.resolve():
        command += f" --directory {display_path(Path(directory))}"
    return command


def explain(name: str, problems: list[str], world: str, directory: Path | str | None = None) -> str:
    """The failure message of the golden test: the file, the first difference, how to regenerate."""
    first = problems[0] if problems else "(none)"
    more = f"\n({len(problems) - 1} more; `kvparity golden check {name}` lists them all)" if len(problems) > 1 else ""
    return (
        f"golden file {display_path(path_of(name, directory))} does not match what {world} does now "
        f"(expected: the file, got: {world}).\n"
        f"first difference: {first}{more}\n"
        "If the change in behaviour is intended, regenerate the file and review its diff:\n"
        f"    {regen_command(name, directory)}"
    )


def _check_name(name: str) -> None:
    if name not in GOLDENS:
        raise KeyError(f"no golden named {name!r}; known: {', '.join(GOLDENS)}")


# ---- recording one world -------------------------------------------------------------------------
def _values(dtype: str | None, values: Sequence[int]) -> dict:
    return {"dtype": dtype, "values": [int(v) for v in values]}


def _tensor(tensor: torch.Tensor) -> dict:
    return _values(dtype_name(tensor), tensor.tolist())


def _batch_values(dtype: str | None, values: Sequence[int] | None) -> dict | None:
    """A batch tensor the record holds as values and dtype; None where the stage had none."""
    return None if values is None else _values(dtype, values)


def _used_rows(table: torch.Tensor) -> dict[str, list[int]]:
    """Each row that is not all POISON, up to its last non-POISON column (POISON shown inside)."""
    rows = {}
    for row, values in enumerate(table.tolist()):
        written = [col for col, v in enumerate(values) if v != POISON]
        if written:
            rows[str(row)] = values[: written[-1] + 1]
    return rows


def _request(scheduler: Scheduler, snap: Snapshot, rid: str) -> dict:
    view = snap.requests[rid]
    return {
        "status": view.status,
        "fill_ids": list(view.fill_ids),
        "extend_input_len": view.extend_input_len,
        "req_pool_idx": view.req_pool_idx,
        "cached_tokens": view.cached_tokens,
        "already_computed": view.already_computed,
        "extend_logprob_start_len": view.extend_logprob_start_len,
        "last_matched_prefix_len": view.last_matched_prefix_len,
        "output_len": view.output_len,
        "prefix": {
            "kind": prefix_kind(scheduler.reqs[rid].prefix_indices, view.alias_row, golden=True),
            "values": list(view.prefix_values),
        },
    }


def _tree(scheduler: Scheduler, snap: Snapshot) -> dict | None:
    if scheduler.scenario.cache_kind != "radix":
        return None
    nodes = [
        {"tokens": list(path), "extra_key": extra_key, "slots": list(slots), "lock_ref": lock_ref}
        for extra_key, path, slots, lock_ref in snap.tree
    ]
    return {"dtype": dtype_name(scheduler.world.tree_cache.all_values_flatten()), "nodes": nodes}


def _stage(scheduler: Scheduler, snap: Snapshot) -> dict:
    """One stage in the golden layout: the snapshot and its record, plus the two types a snapshot
    does not hold, read from the world while it is still in the stage."""
    record: StageRecord = snap.record
    return {
        "step": record.step,
        "kind": record.kind,
        "rids": list(record.rids),
        "outcome": record.outcome,
        "error": record.error,
        "batch_rows": list(record.rows),
        "out_cache_loc": _batch_values(record.out_cache_loc_dtype, record.out_cache_loc),
        "last_loc": _batch_values(record.last_loc_dtype, record.last_loc),
        "req_to_token": {"dtype": dtype_name(snap.req_to_token), "rows": _used_rows(snap.req_to_token)},
        "allocator": {
            "free_pages": _tensor(snap.free_pages),
            "release_pages": _tensor(snap.release_pages),
            "available_size": snap.available_size,
        },
        "free_rows": list(snap.free_rows),
        "tree": _tree(scheduler, snap),
        "requests": {rid: _request(scheduler, snap, rid) for rid in scheduler.reqs},
    }


def play(scenario: Scenario, version: str, backend: str, snapshots: list[Snapshot] | None = None) -> list[dict]:
    """Play ``scenario`` in one world, through the harness's own lockstep (no oracles: ``record``
    runs them, on every world), and record every stage in the golden layout; each stage's
    snapshot is appended to ``snapshots`` when it is given."""
    stages: list[dict] = []

    def observe(_name: str, scheduler: Scheduler, snap: Snapshot) -> None:
        stages.append(_stage(scheduler, snap))
        if snapshots is not None:
            snapshots.append(snap)

    lockstep = Lockstep(scenario, ((version, backend),), oracles=False, observe=observe)
    for index, step in enumerate(scenario.steps):
        lockstep.play(index, step)
    return stages


# ---- the refactored version's allowed differences ------------------------------------------------
def _delta(legacy: Any, refactored: Any) -> Any:
    """The part of ``refactored`` that differs from ``legacy`` (nested dicts); ``_NO_DELTA`` when equal.
    A key missing on one side counts as ``[]``: only ``req_to_token.rows`` omits keys (an empty row)."""
    if isinstance(legacy, dict) and isinstance(refactored, dict):
        out = {}
        for key in sorted(set(legacy) | set(refactored)):
            part = _delta(legacy.get(key, []), refactored.get(key, []))
            if part is not _NO_DELTA:
                out[key] = part
        return out or _NO_DELTA
    return _NO_DELTA if legacy == refactored else refactored


_NO_DELTA = object()


def _leaves(tree: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    if isinstance(tree, dict) and tree:
        for key, value in tree.items():
            yield from _leaves(value, path + (key,))
    else:
        yield path


def _reason(path: tuple[str, ...], legacy: dict, snap: Snapshot) -> str | None:
    """Which ALLOWED entry excuses a refactored difference at ``path``, or None."""
    failed = legacy["outcome"] != "ok"
    if failed and path[:1] == ("error",):
        return FAILURE
    if failed and path[:2] == ("req_to_token", "rows") and int(path[2]) in legacy["batch_rows"]:
        return FAILURE
    if path[:1] == ("requests",) and len(path) >= 3:
        rid = path[1]
        if failed and rid in legacy["rids"]:
            return FAILURE
        if path[2:] == ("prefix", "values") and aliases_a_row_it_left(snap.requests[rid]):
            return ALIAS_DEFECT
    return None


def _refactored_section(name: str, legacy: dict, refactored: dict, snap: Snapshot) -> dict | None:
    """The stage's ``refactored`` section, refusing any difference that ALLOWED does not excuse."""
    delta = _delta(legacy, _with_prefix_kind(refactored, legacy))
    if delta is _NO_DELTA:
        return None
    reasons = set()
    for path in _leaves(delta):
        reason = _reason(path, legacy, snap)
        if reason is None:
            raise GoldenError(
                f"golden {name}: refusing to record: in {_stage_title(legacy)}, refactored/torch differs from "
                f"legacy/torch at {'.'.join(path)}, a difference kvparity.judge.compare.ALLOWED does not excuse"
            )
        reasons.add(reason)
    return {"allowed": sorted(reasons), "overrides": delta}


def _with_prefix_kind(stage: dict, legacy: dict) -> dict:
    """``stage`` with each refactored prefix kind replaced by legacy's when it is the documented one,
    so the kind difference is excused by rule (ALLOWED "prefix type") and any other kind shows."""
    out = copy.deepcopy(stage)
    for rid, request in out["requests"].items():
        if request["prefix"]["kind"] == REFACTORED_PREFIX_KIND:
            request["prefix"]["kind"] = legacy["requests"][rid]["prefix"]["kind"]
    return out


def expected_stages(golden: dict, version: str) -> list[dict]:
    """What a world of ``version`` must record: the stages as written, plus for the refactored
    version its prefix kind rule and each stage's overrides."""
    stages = []
    for stage in golden["stages"]:
        stage = copy.deepcopy(stage)
        section = stage.pop("refactored", None)
        if family(version) == "refactored":
            for request in stage["requests"].values():
                request["prefix"]["kind"] = REFACTORED_PREFIX_KIND
            if section is not None:
                stage = _merge(stage, section["overrides"])
        stages.append(stage)
    return stages


def _merge(base: Any, overrides: Any) -> Any:
    if not isinstance(base, dict) or not isinstance(overrides, dict):
        return overrides
    merged = dict(base)
    for key, value in overrides.items():
        merged[key] = _merge(base.get(key), value)
    rows = merged.get("rows")
    if isinstance(rows, dict):  # an override [] says the row is all POISON there
        merged["rows"] = {k: v for k, v in rows.items() if v != []}
    return merged


# ---- recording a golden --------------------------------------------------------------------------
def record(name: str) -> dict:
    """Record golden ``name`` from legacy on torch. Refuses (GoldenError) when the worlds
    disagree, an oracle fails or the scenario no longer reaches what the golden documents."""
    _check_name(name)
    scenario = GOLDENS[name]
    result = run_scenario(scenario)
    if not result.ok:
        raise GoldenError(f"golden {name}: refusing to record a golden the worlds disagree on\n\n{format_failure(result)}")
    missing = [c for c in REACHES[name] if c not in result.classes]
    if missing:
        raise GoldenError(f"golden {name}: the scenario no longer reaches {missing}, which the golden documents")
    snapshots: list[Snapshot] = []  # legacy's: what the excuses read
    legacy = play(scenario, *REFERENCE, snapshots=snapshots)
    refactored = play(scenario, "refactored", "torch")
    if [_stage_title(s) for s in legacy] != [_stage_title(s) for s in refactored]:
        raise GoldenError(f"golden {name}: refusing to record: legacy and refactored ran different stages")
    for stage, other, snap in zip(legacy, refactored, snapshots):
        section = _refactored_section(name, stage, other, snap)
        if section is not None:
            stage["refactored"] = section
    return {
        "format_version": FORMAT_VERSION,
        "name": name,
        "why": WHY[name],
        "regenerate": regen_command(name),
        "recorded_from": "/".join(REFERENCE),
        "notes": _notes(legacy),
        "legend": LEGEND,
        "scenario": scenario_to_dict(scenario),
        "stages": legacy,
    }


def _notes(stages: list[dict]) -> list[str]:
    """One sentence per stage where the refactored version differs by design, for the reviewer."""
    notes = []
    for stage in stages:
        section = stage.get("refactored")
        if section is None:
            continue
        title = _stage_title(stage)
        if FAILURE in section["allowed"]:
            notes.append(
                f"{title} fails ({stage['outcome']}); legacy had already written prefixes and updated the requests "
                "(SPEC 4), the refactored version had not: its values are in the stage's 'refactored' section"
            )
        for rid, request in section["overrides"].get("requests", {}).items():
            if ALIAS_DEFECT in section["allowed"] and "values" in request.get("prefix", {}):
                legacy = stage["requests"][rid]
                notes.append(
                    f"{title}: known legacy defect (SPEC 7): {rid}'s prefix is an {legacy['prefix']['kind']}, a row it "
                    f"no longer owns, so legacy reads {legacy['prefix']['values']} there; the refactored copy "
                    f"holds {request['prefix']['values']}"
                )
    return notes


def regen(name: str, directory: Path | str | None = None) -> tuple[Path, bool]:
    """Record golden ``name`` and write it; returns its path and whether the file changed."""
    text = to_text(record(name))
    path = path_of(name, directory)
    if path.exists() and path.read_bytes() == text.encode():
        return path, False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode())
    return path, True


# ---- reading and comparing -----------------------------------------------------------------------
def load(name: str, directory: Path | str | None = None) -> dict:
    """The golden file as data; GoldenError naming the file and the regen command when it is
    missing, not JSON, of another format or not a golden for ``name``."""
    path = path_of(name, directory)
    command = regen_command(name, directory)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise GoldenError(f"golden file {display_path(path)} is missing; create it with: {command}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise GoldenError(f"golden file {display_path(path)} is not valid JSON ({exc}); regenerate it with: {command}") from None
    if not isinstance(data, dict) or data.get("format_version") != FORMAT_VERSION:
        found = data.get("format_version") if isinstance(data, dict) else type(data).__name__
        raise GoldenError(
            f"golden file {display_path(path)} has format_version {found!r}, this code reads {FORMAT_VERSION}; "
            f"regenerate it with: {command}"
        )
    missing = [k for k in ("name", "scenario", "stages") if k not in data]
    if missing or data["name"] != name or not isinstance(data["stages"], list):
        raise GoldenError(
            f"golden file {display_path(path)} is not the golden {name!r} (missing {missing or 'nothing'}, "
            f"name {data.get('name')!r}); regenerate it with: {command}"
        )
    return data


def _stage_title(stage: Any) -> str:
    if not isinstance(stage, dict):
        return f"a malformed stage ({type(stage).__name__})"
    return f"step {stage.get('step')} {stage.get('kind')} {stage.get('rids')}"


def _what(path: tuple[str, ...]) -> str:
    if path[:2] == ("req_to_token", "rows") and len(path) == 3:
        return f"row {path[2]}"
    if path[:1] == ("requests",) and len(path) >= 2:
        return f"request {path[1]} " + " ".join(path[2:])
    return " ".join(path)


def _diff(path: tuple[str, ...], expected: Any, got: Any) -> list[str]:
    if isinstance(expected, dict) and isinstance(got, dict):
        out = []
        rows = path[-1:] == ("rows",)
        for key in sorted(set(expected) | set(got), key=key_order):
            if key in expected and key in got or rows:  # a row not listed is all POISON: []
                out += _diff(path + (key,), expected.get(key, []), got.get(key, []))
            else:
                side = "missing" if key not in got else "unexpected"
                out.append(f"{_what(path + (key,))}: {side} (expected {expected.get(key)!r}, got {got.get(key)!r})")
        return out
    if isinstance(expected, list) and isinstance(got, list) and expected != got:
        if all(isinstance(v, int) for v in expected + got):
            unit = "column" if path[:2] == ("req_to_token", "rows") else "position"
            return list_diff(_what(path), unit, expected, got)
        if len(expected) == len(got):
            return [d for i, (e, g) in enumerate(zip(expected, got)) for d in _diff(path + (str(i),), e, g)]
    if expected != got or type(expected) is not type(got):
        return [f"{_what(path)}: expected {expected!r} got {got!r}"]
    return []


def diff_stages(name: str, expected: list[dict], got: list[dict]) -> list[str]:
    """Semantic differences, one line each: golden, step, stage, field, row or positions, values."""
    out = []
    for stage, fresh in zip(expected, got):
        out += [f"golden {name}, {_stage_title(stage)}, {d}" for d in _diff((), stage, fresh)]
    if len(expected) != len(got):
        first = min(len(expected), len(got))
        extra = (expected if len(expected) > len(got) else got)[first]
        out.append(
            f"golden {name}: expected {len(expected)} stages, got {len(got)} "
            f"(first {'missing' if len(expected) > len(got) else 'unexpected'}: {_stage_title(extra)})"
        )
    return out


def diff_goldens(name: str, expected: dict, got: dict) -> list[str]:
    """Everything that differs between a golden file and a fresh recording, stages last."""
    out = []
    for key in sorted((set(expected) | set(got)) - {"stages"}, key=key_order):
        out += [f"golden {name}: {d}" for d in _diff((key,), expected.get(key), got.get(key))]
    return out + diff_stages(name, expected.get("stages", []), got.get("stages", []))


def _outdated_scenario(name: str, golden: dict, directory: Path | str | None) -> list[str]:
    try:
        in_file = scenario_from_dict(golden["scenario"])
    except ValueError as exc:
        return [f"golden {name}: the file's scenario is unreadable ({exc})"]
    if in_file != GOLDENS[name]:
        return [
            f"golden {name}: outdated: the scenario in {display_path(path_of(name, directory))} is not the one "
            "kvparity/golden/store.py defines"
        ]
    return []


def replay_in_world(name: str, version: str, backend: str, directory: Path | str | None = None) -> list[str]:
    """Play golden ``name`` in one world and list every difference from its file (empty: equal)."""
    _check_name(name)
    try:
        golden = load(name, directory)
    except GoldenError as exc:
        return [str(exc)]
    outdated = _outdated_scenario(name, golden, directory)
    if outdated:
        return outdated
    try:
        expected = expected_stages(golden, version)
    except (KeyError, TypeError, AttributeError) as exc:
        return [f"golden {name}: the file's stages are malformed ({type(exc).__name__}: {exc})"]
    return diff_stages(name, expected, play(GOLDENS[name], version, backend))


def check(name: str, directory: Path | str | None = None) -> list[str]:
    """Differences between golden ``name``'s file and a fresh recording; writes nothing."""
    _check_name(name)
    try:
        golden = load(name, directory)
        fresh = record(name)
    except GoldenError as exc:
        return [str(exc)]
    return diff_goldens(name, golden, fresh)


def stale_files(directory: Path | str | None = None) -> list[Path]:
    """JSON files in the golden directory that no golden of kvparity/golden/store.py names."""
    folder = Path(directory if directory is not None else DIRECTORY)
    return sorted(p for p in folder.glob("*.json") if p.stem not in GOLDENS)
