"""The documentation checked against the code: README.md and every docs/*.md page.

Every list a page gives of something the code defines (worlds, oracles, scenario classes,
goldens, mutants, GPU lanes) is compared with the code's own list, both ways; every repository
path, dotted Python name, markdown link and ``kvparity`` sub-command (with its options) written in
a page must exist. The lists are read from the code, never written out here, so that a rename or a
move in the code fails this test until the pages follow.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvparity.cli.main import build_parser
from kvparity.golden.scenarios import WHY
from kvparity.judge import oracles
from kvparity.model import classes
from kvparity.run import runner
from kvparity.teeth import zoo as mutants

ROOT = Path(__file__).resolve().parents[2]
PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
PAGE_IDS = [str(p.relative_to(ROOT)) for p in PAGES]

# Words in code spans that look like paths but name no file of this repository, each with why.
NOT_REPOSITORY_PATHS = {
    "kvparity/kvparity@v1": "the placeholder for where the GitHub Action is published, in docs/github-action.md",
    "path/to/file.py": "the placeholder of --candidate's file form",
    "I/N": "the placeholder of kvparity matrix --shard's value, shard I of N",
    "python/": "the folder of an SGLang checkout that holds the sglang package",
    "reports/": "the nightly GPU job's output folder, created when it runs",
    "try/except": "Python's statement, in docs/real-sglang.md",
}
# SGLang's own package layout (``sglang/srt/...``), named in docs/real-sglang.md where a release
# moved code: these are SGLang's files, not this repository's.
SGLANG_PATH = re.compile(r"^(sglang/.*|mem_cache/(common\.py|allocation\.py|allocator/))$")
# GitHub's own actions (``actions/checkout@v4``), named where a workflow uses them.
GITHUB_ACTION = re.compile(r"^actions/[\w-]+(@v\d+)?$")
PATH_WORD = re.compile(r"^\.?[A-Za-z0-9_][\w.@+-]*(/[\w.@+-]+)*/?$")
# Dotted names are checked when they start with kvparity, the one import name, or with a name that
# is not one any more (the harness was ``parity``; the four shared folders are ``kvparity.kernels``
# and so on): those never resolve, so a page still naming them fails.
PACKAGES = ("kvparity", "parity", "kernels", "mem_cache", "legacy", "refactored")
DOTTED = re.compile(rf"^(?:{'|'.join(PACKAGES)})(?:\.\w+)+(?::\w+)?$")
COMMAND = re.compile(r"(?:^|[\s/(`])(?:kvparity|python3? -m (?:parity|kvparity))((?:[ \t]+[^\s#`]+)*)")


# --- reading the pages --------------------------------------------------------------------------

def _fenced_blocks(text: str) -> list[str]:
    return re.findall(r"^```[^\n]*\n(.*?)^```", text, re.M | re.S)


def _prose(text: str) -> str:
    return re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.M | re.S)


def _inline_code(text: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", _prose(text))


def _block_lines(block: str) -> list[str]:
    """A fenced block's lines, with a usage line's continuations (``    [--option ...]``) joined to it."""
    lines: list[str] = []
    for line in block.splitlines():
        if lines and line.lstrip().startswith("["):
            lines[-1] += " " + line.strip()
        else:
            lines.append(line)
    return lines


def _code_texts(text: str) -> list[str]:
    """Everything a page writes as code: each inline span, and each line of each fenced block."""
    return _inline_code(text) + [line for block in _fenced_blocks(text) for line in _block_lines(block)]


def _words(text: str) -> Iterator[str]:
    for code in _code_texts(text):
        for word in code.split():
            word = word.strip("()[],;'\"").removesuffix(".")
            if "=" in word:  # VAR=value or --option=value: the value
                word = word.split("=", 1)[1]
            yield word


def _section(text: str, heading: str) -> str:
    """The body of the section titled ``heading`` (any level), up to the next heading of its level
    or higher; lines inside fenced blocks are never headings."""
    body: list[str] | None = None
    level, fenced = 0, False
    for line in text.splitlines():
        fenced ^= line.startswith("```")
        title = None if fenced else re.match(r"^(#+) (.*)$", line)
        if body is not None and title and len(title.group(1)) <= level:
            break
        if body is not None:
            body.append(line)
        elif title and title.group(2) == heading:
            body, level = [], len(title.group(1))
    assert body is not None, f"no section {heading!r}"
    return "\n".join(body) + "\n"


def described(page: str, heading: str) -> dict[str, str]:
    """What a section lists: the first code span of each bullet (``- `name`: text``) or table row,
    with the text after it (``: `` and the rest of the bullet line; empty for a table row)."""
    items: dict[str, str] = {}
    for line in _section((ROOT / page).read_text(), heading).splitlines():
        match = re.match(r"^\s*(?:[-*]|\|)\s*`([^`]+)`(.*)$", line)
        if match:
            assert match.group(1) not in items, f"{page}, {heading!r}: {match.group(1)!r} listed twice"
            items[match.group(1)] = match.group(2).removeprefix(": ").strip()
    assert items, f"{page}, {heading!r}: lists nothing"
    return items


def listed(page: str, heading: str) -> list[str]:
    return list(described(page, heading))


def _same(page: str, heading: str, in_code: list[str] | tuple[str, ...], where: str) -> None:
    in_docs = listed(page, heading)
    missing = [n for n in in_code if n not in in_docs]
    extra = [n for n in in_docs if n not in in_code]
    assert not missing and not extra, (
        f"{page}, {heading!r} against {where}: not in the page {missing}, not in the code {extra}"
    )


# --- what the code defines ----------------------------------------------------------------------

def world_names() -> list[str]:
    return [getattr(w, "name", None) or "/".join(w) for w in runner.ALL_WORLDS]


def backends() -> set[str]:
    return {name.rsplit("/", 1)[1] for name in world_names()}


def oracle_names() -> list[str]:
    """The module's public functions that ``check_stage`` runs: named in its body directly, or
    through a module-level table it names."""
    module = ast.parse(inspect.getsource(oracles))
    functions = {n.name for n in module.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")}
    tables = {t.id: n.value for n in module.body if isinstance(n, ast.Assign) for t in n.targets
              if isinstance(t, ast.Name)}
    check_stage = next(n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == "check_stage")
    found: list[str] = []

    def visit(node: ast.AST) -> None:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name) and sub.id in functions and sub.id not in found:
                found.append(sub.id)
            elif isinstance(sub, ast.Name) and sub.id in tables:
                visit(tables.pop(sub.id))

    visit(check_stage)
    return found


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The sub-parsers ``parser`` dispatches to, by name (empty for a leaf command)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def options(parser: argparse.ArgumentParser) -> set[str]:
    return {o for action in parser._actions for o in action.option_strings}


def ci_commands() -> list[str]:
    """The command lines ``.ci/run`` runs, in order (comments, ``set``, ``cd`` and the shell's own
    bookkeeping of a command run in the background left out; that command without its ``&``)."""
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    return [line.strip().removesuffix("&").strip() for line in lines
            if line.strip() and not line.startswith(("#", "set ", "cd ", "wait ")) and not re.match(r"\w+=\$!$", line)]


# --- paths, names, links, commands: every page ----------------------------------------------------

def _is_path(word: str) -> bool:
    if not PATH_WORD.match(word) or word.startswith(".venv/") or "..." in word:
        return False
    parts = word.rstrip("/").split("/")
    if len(parts) == 2 and parts[1].split("+")[0] in backends():
        return False  # a world's name, ``version/backend`` or ``version/backend+variant``
    # A bare file name (``ci.yml``, ``linear_write.py``) is a short name its sentence places.
    return "/" in word


def _exists(word: str, page: Path) -> bool:
    word = re.sub(r"(\.py):\w+$", r"\1", word)  # file.py:name, a candidate
    return (ROOT / word).exists() or (page.parent / word).exists()


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_every_repository_path_exists(page: Path) -> None:
    words = {re.sub(r"(\.py):\w+$", r"\1", w) for w in _words(page.read_text())}
    paths = sorted(w for w in words if _is_path(w) and w not in NOT_REPOSITORY_PATHS and not SGLANG_PATH.match(w)
                   and not GITHUB_ACTION.match(w))
    missing = [p for p in paths if not _exists(p, page)]
    assert not missing, f"{page.name} names paths that do not exist: {missing}"


def _top_level_names(source: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.ImportFrom):
            names |= {a.asname or a.name for a in node.names}
    return names


def resolves(dotted: str) -> bool:
    """``package.module[.attribute]`` or ``package.module:attribute`` names a module of this
    repository and, after it, a name defined at its top level (read from the source, not imported)."""
    parts = dotted.replace(":", ".").split(".")
    if parts[0] != "kvparity":
        return False
    place, rest = ROOT, parts
    while rest and ((place / rest[0]).is_dir() or (place / f"{rest[0]}.py").is_file()):
        place, rest = (place / rest[0]) if (place / rest[0]).is_dir() else (place / f"{rest[0]}.py"), rest[1:]
    if place == ROOT:
        return False
    source = place / "__init__.py" if place.is_dir() else place
    return not rest or (source.is_file() and rest[0] in _top_level_names(source))


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_every_dotted_python_name_resolves(page: Path) -> None:
    names = sorted({w for w in _words(page.read_text()) if DOTTED.match(w)})
    bad = [n for n in names if not resolves(n)]
    assert not bad, f"{page.name} names Python modules or attributes that do not exist: {bad}"


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_every_relative_link_exists(page: Path) -> None:
    targets = re.findall(r"\]\(([^)\s]+)\)", _prose(page.read_text()))
    local = [t.split("#", 1)[0] for t in targets if not re.match(r"^[a-z]+:", t) and not t.startswith("#")]
    missing = [t for t in local if not (page.parent / t).exists()]
    assert not missing, f"{page.name} links to files that do not exist: {missing}"


def _command_problems(words: list[str]) -> Iterator[str]:
    """What is wrong with ``kvparity WORDS...``: an unknown sub-command, or an option it lacks."""
    parser, path = build_parser(), ["kvparity"]
    for word in words:
        choices = subcommands(parser)
        if not choices or word.startswith("-") or not re.match(r"^[a-z][\w-]*$", word):
            break
        if word not in choices:
            yield f"{' '.join(path)} has no sub-command {word!r} (it has {sorted(choices)})"
            return
        parser, path = choices[word], [*path, word]
    known = options(parser)
    for word in words:
        flag = word.split("=", 1)[0].rstrip("]")
        if flag.startswith("--") and flag not in known:
            yield f"{' '.join(path)} has no option {flag!r}"


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_every_kvparity_command_is_real(page: Path) -> None:
    problems = []
    for code in _code_texts(page.read_text()):
        for match in COMMAND.finditer(code):
            words = [w.strip("[](){},;") for w in match.group(1).split()]
            problems += [f"`{code.strip()}`: {p}" for p in _command_problems([w for w in words if w])]
    assert not problems, f"{page.name}:\n" + "\n".join(problems)


def test_commands_have_a_sub_command_each() -> None:
    # Guard the guard: the parser this test reads does have sub-commands, each with options.
    commands = subcommands(build_parser())
    assert {"check", "golden", "mutants", "matrix"} <= set(commands)
    assert "--sglang" in options(commands["check"]) and "list" in subcommands(commands["golden"])


# --- the README's two commands ------------------------------------------------------------------

def readme_commands() -> dict[str, str]:
    """The README's "Two commands" block: label (its comment's first words) -> command line."""
    block = _fenced_blocks(_section((ROOT / "README.md").read_text(), "Two commands"))[0]
    commands = {}
    for line in block.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            command, _, comment = line.partition("#")
            commands[comment.strip().split(":")[0]] = command.strip()
    return commands


def test_the_readme_names_two_commands_and_ci_runs_the_tests_one() -> None:
    commands = readme_commands()
    assert list(commands) == ["the main job", "the tests"], commands
    for command in commands.values():
        shell, script = command.split()
        assert shell == "bash" and (ROOT / script).is_file(), command
    assert commands["the tests"] in ci_commands(), (commands["the tests"], ci_commands())


def test_every_command_ci_runs_is_in_the_readme() -> None:
    readme = (ROOT / "README.md").read_text()
    for command in ci_commands():
        shown = command.removeprefix(".venv/bin/").split(" >", 1)[0]
        assert shown in readme, f".ci/run runs {command!r}, which README.md does not name"


# --- the lists the pages give ---------------------------------------------------------------------

def test_worlds_page_lists_the_worlds() -> None:
    _same("docs/worlds.md", "The five worlds", world_names(), "kvparity.run.runner.ALL_WORLDS")


def test_worlds_page_lists_the_scenario_classes() -> None:
    _same("docs/worlds.md", "Classes CI must reach", classes.REQUIRED, "kvparity.model.classes.REQUIRED")
    _same("docs/worlds.md", "Classes nightly adds", classes.NIGHTLY_EXTRA, "kvparity.model.classes.NIGHTLY_EXTRA")


def test_oracles_page_lists_the_oracles() -> None:
    names = oracle_names()
    assert len(names) >= 5, names  # the enumeration itself still finds the oracles
    _same("docs/oracles.md", "The oracles", names, "the functions kvparity.judge.oracles.check_stage runs")


def test_goldens_page_lists_the_golden_files() -> None:
    files = sorted(p.stem for p in (ROOT / "tests" / "golden").glob("*.json"))
    assert files
    _same("docs/goldens.md", "The golden files", files, "tests/golden/*.json")
    # Each is described in the words ``kvparity golden list`` prints.
    stale = {n: why for n, why in described("docs/goldens.md", "The golden files").items() if why != WHY.get(n)}
    assert not stale, f"docs/goldens.md: reasons that are not kvparity.golden.scenarios.WHY's: {stale}"


def test_teeth_page_lists_the_mutant_zoo() -> None:
    _same("docs/teeth.md", "The zoo", [m.name for m in mutants.MUTANTS], "kvparity.teeth.zoo.MUTANTS")
    bug_classes = {m.name: m.bug_class for m in mutants.MUTANTS}
    stale = {n: text for n, text in described("docs/teeth.md", "The zoo").items() if text != bug_classes[n]}
    assert not stale, f"docs/teeth.md: bug classes that are not the mutants' own: {stale}"


def test_gpu_lane_page_lists_the_lanes() -> None:
    lanes = re.findall(r"^lane_(\w+)\(\)", (ROOT / "scripts" / "nightly_gpu.sh").read_text(), re.M)
    assert lanes
    _same("docs/gpu-lane.md", "Lanes", lanes, "the lane_* functions of scripts/nightly_gpu.sh")


def test_every_docs_page_is_reachable_from_the_readme() -> None:
    readme = (ROOT / "README.md").read_text()
    unlinked = [p for p in PAGE_IDS[1:] if p not in readme]
    assert not unlinked, f"README.md does not name {unlinked}"
