"""``kvparity golden``: regenerate, check and list the golden files (tests/golden/)."""

from __future__ import annotations

import argparse
import sys

USAGE_ERROR = 2


def _names(requested: list[str]) -> list[str] | None:
    from kvparity.golden import store as golden

    unknown = [n for n in requested if n not in golden.GOLDENS]
    if unknown:
        print(f"kvparity golden: unknown golden {', '.join(map(repr, unknown))}; known: {', '.join(golden.GOLDENS)}",
              file=sys.stderr)
        return None
    return requested or list(golden.GOLDENS)


def _golden_regen(args: argparse.Namespace) -> int:
    from kvparity.golden import store as golden

    names = _names(args.names)
    if names is None:
        return USAGE_ERROR
    status = 0
    for name in names:
        try:
            path, changed = golden.regen(name, args.directory)
        except golden.GoldenError as exc:
            print(exc, file=sys.stderr)
            status = 1  # refuse this one, still regenerate the others
            continue
        print(f"{'wrote' if changed else 'unchanged'} {golden.display_path(path)}")
    return status | _report_stale(args.directory)


def _golden_check(args: argparse.Namespace) -> int:
    from kvparity.golden import store as golden

    names = _names(args.names)
    if names is None:
        return USAGE_ERROR
    failed = 0
    for name in names:
        problems = golden.check(name, args.directory)
        if problems:
            failed += 1
            print(f"golden {name}: {len(problems)} difference{'s' if len(problems) != 1 else ''}", file=sys.stderr)
            for line in problems[: args.limit]:
                print(f"  {line}", file=sys.stderr)
            if len(problems) > args.limit:
                print(f"  ... ({len(problems) - args.limit} more)", file=sys.stderr)
            print(f"  regenerate it, if the change is intended: {golden.regen_command(name, args.directory)}",
                  file=sys.stderr)
    stale = _report_stale(args.directory) if not args.names else 0
    if not failed and not stale:
        print(f"golden check: {len(names)} goldens match a fresh recording")
    return 1 if failed or stale else 0


def _report_stale(directory: str | None) -> int:
    from kvparity.golden import store as golden

    stale = golden.stale_files(directory)
    for path in stale:
        print(f"{golden.display_path(path)}: no golden of that name in kvparity/golden/scenarios.py (delete the file or define it)",
              file=sys.stderr)
    return 1 if stale else 0


def _golden_list(args: argparse.Namespace) -> int:
    from kvparity.golden import store as golden

    for name in golden.GOLDENS:
        print(f"{name}: {golden.WHY[name]}")
    return 0


def add(commands: argparse._SubParsersAction, parser_class: type) -> None:
    group = commands.add_parser("golden", help="golden files under tests/golden/")
    actions = group.add_subparsers(dest="action", required=True, parser_class=parser_class)
    for action, func, text in (
        ("regen", _golden_regen, "record goldens from legacy on torch and write them"),
        ("check", _golden_check, "compare goldens with a fresh recording; writes nothing"),
    ):
        sub = actions.add_parser(action, help=text, description=text)
        sub.add_argument("names", nargs="*", metavar="NAME", help="golden names (default: all)")
        sub.add_argument("--directory", default=None, help="where the golden files are (default: tests/golden)")
        if action == "check":
            sub.add_argument("--limit", type=int, default=20, help="differences shown per golden (default 20)")
        sub.set_defaults(func=func)
    actions.add_parser("list", help="golden names and why each is pinned").set_defaults(func=_golden_list)


