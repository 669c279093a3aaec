"""The kvparity command line.

    kvparity golden regen [NAME...] [--directory DIR]   record goldens from legacy on torch and write them
    kvparity golden check [NAME...] [--directory DIR]   compare goldens with a fresh recording; writes nothing
    kvparity golden list                                 the golden names and why each is pinned

Exit status: 0 success, 1 a difference or a refusal, 2 usage (an unknown golden name, say).
Each command group registers itself in ``_COMMANDS``; a new group adds one function there.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable

from kernels import runtime  # noqa: F401  (fixes the Triton mode before anything imports Triton)
from parity import golden

USAGE_ERROR = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse exits 2 itself; keep that, with our prefix
        self.print_usage(sys.stderr)
        self.exit(USAGE_ERROR, f"{self.prog}: error: {message}\n")


def _names(requested: list[str]) -> list[str] | None:
    unknown = [n for n in requested if n not in golden.GOLDENS]
    if unknown:
        print(f"kvparity golden: unknown golden {', '.join(map(repr, unknown))}; known: {', '.join(golden.GOLDENS)}",
              file=sys.stderr)
        return None
    return requested or list(golden.GOLDENS)


def _golden_regen(args: argparse.Namespace) -> int:
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
    stale = golden.stale_files(directory)
    for path in stale:
        print(f"{golden.display_path(path)}: no golden of that name in parity/golden.py (delete the file or define it)",
              file=sys.stderr)
    return 1 if stale else 0


def _golden_list(args: argparse.Namespace) -> int:
    for name in golden.GOLDENS:
        print(f"{name}: {golden.WHY[name]}")
    return 0


def _add_golden(commands: argparse._SubParsersAction) -> None:
    group = commands.add_parser("golden", help="golden files under tests/golden/")
    actions = group.add_subparsers(dest="action", required=True, parser_class=_Parser)
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


# One function per command group; each adds its sub-parser and sets ``func``.
_COMMANDS: tuple[Callable[[argparse._SubParsersAction], None], ...] = (_add_golden,)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kvparity", description="kvparity: parity of the KV-cache index path")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for add in _COMMANDS:
        add(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
