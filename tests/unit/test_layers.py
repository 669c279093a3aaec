"""The package's shape: one import name, and sub-packages that only import downwards, in the order
the data flows (a scenario is drawn, played, judged, reported; the commands sit on top). Real
SGLang (``engine/real``) is a layer of its own, above the engine core that plays kvparity's worlds
and below what judges and runs them. Imports for type checkers count: a layer that names a type
of one above it depends on it as much as one that calls it."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "kvparity"
# Lowest first. A module may import from its own sub-package and from those before it.
LAYERS = ("model", "caches", "engine", "real", "judge", "report", "run", "golden", "candidate", "teeth", "cli")
# Layers in a folder of another's: real SGLang in the engine's.
NESTED = {"real": ("engine", "real")}
# The one module of real SGLang's layer the layers above it may import.
DOOR = "kvparity.engine.real.door"
# SGLang's model code and what it shares: below every layer (they import none of kvparity's).
SHARED = ("kernels", "mem_cache", "legacy", "refactored")


def _imports(path: Path) -> list[str]:
    """Modules ``path`` imports, at module level, in a function or for type checkers."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names]
    return found


def _layer(module: str) -> str | None:
    parts = module.split(".")
    if len(parts) < 2 or parts[0] != "kvparity":
        return None
    return next((layer for layer, where in NESTED.items() if tuple(parts[1:1 + len(where)]) == where), parts[1])


def _modules(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


def _layer_modules(layer: str) -> list[Path]:
    """A layer's modules, without those of a layer nested in its folder."""
    nested = [PACKAGE.joinpath(*where) for other, where in NESTED.items() if where[:1] == (layer,)]
    return [p for p in _modules(PACKAGE.joinpath(*NESTED.get(layer, (layer,))))
            if not any(p.is_relative_to(folder) for folder in nested)]


@pytest.mark.parametrize("layer", LAYERS)
def test_a_layer_imports_only_itself_and_layers_below(layer):
    allowed = set(LAYERS[: LAYERS.index(layer) + 1]) | set(SHARED)
    upward = [
        f"{path.relative_to(ROOT)} imports {module}"
        for path in _layer_modules(layer)
        for module in _imports(path)
        if _layer(module) is not None and _layer(module) not in allowed
    ]
    assert not upward, "\n".join(upward)


@pytest.mark.parametrize("layer", LAYERS[LAYERS.index("real") + 1:])
def test_the_layers_above_real_sglang_reach_it_through_its_door(layer):
    around = [f"{path.relative_to(ROOT)} imports {module}" for path in _layer_modules(layer) for module in _imports(path)
              if _layer(module) == "real" and module != DOOR and not module.startswith(DOOR + ".")]
    assert not around, "\n".join(around)


def test_the_door_lets_through_what_it_lists_and_names_the_rest():
    from kvparity.engine.real import door

    assert all(getattr(door, name) is not None for name in door.__all__)
    with pytest.raises(AttributeError, match="no 'build_real_world'.*resolve"):
        door.build_real_world  # noqa: B018  (the worker side's: not let through)


@pytest.mark.parametrize("shared", SHARED)
def test_sglangs_model_code_imports_no_harness(shared):
    harness = [f"{p.relative_to(ROOT)} imports {m}" for p in _modules(ROOT / shared) for m in _imports(p)
               if _layer(m) in LAYERS]
    assert not harness, "\n".join(harness)


def test_every_module_lives_in_a_layer():
    loose = [p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py")]
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    top = set(LAYERS) - set(NESTED)
    assert not loose and folders == top | set(SHARED), (loose, folders - top - set(SHARED))
    assert all(PACKAGE.joinpath(*where).is_dir() for where in NESTED.values())


def test_the_distribution_installs_one_top_level_package():
    """``pip install`` adds ``kvparity`` and nothing else: no generic ``kernels`` or ``legacy``
    beside the user's own packages. The four shared folders reach it through links."""
    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    assert find["include"] == ["kvparity", "kvparity.*"]
    for shared in SHARED:
        link = PACKAGE / shared
        assert link.is_symlink() and link.resolve() == (ROOT / shared).resolve(), shared


def test_module_imports_have_no_cycle():
    """Imports at module level form no cycle (a function may import lazily, and does so to choose
    the device before the kernels load)."""
    graph = {}
    for path in _modules(PACKAGE):
        if path.parts[len(PACKAGE.parts)] in SHARED:
            continue
        name = ".".join(("kvparity", *path.relative_to(PACKAGE).with_suffix("").parts)).removesuffix(".__init__")
        tree = ast.parse(path.read_text())
        deps = set()
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("kvparity."):
                deps.add(node.module)
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name.startswith("kvparity.")}
        graph[name] = deps
    state: dict[str, int] = {}

    def visit(node: str, trail: tuple[str, ...]) -> None:
        if state.get(node) == 2 or node not in graph:
            return
        assert state.get(node) != 1, "import cycle: " + " -> ".join((*trail, node))
        state[node] = 1
        for dep in sorted(graph[node]):
            visit(dep, (*trail, node))
        state[node] = 2

    for module in sorted(graph):
        visit(module, ())
