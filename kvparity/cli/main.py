"""The kvparity command line.

    kvparity check [--target T] [--candidate SPEC] [--backend B] [--device D] [--examples N] ...
    kvparity golden regen [NAME...] [--directory DIR]   record goldens from legacy on torch and write them
    kvparity golden check [NAME...] [--directory DIR]   compare goldens with a fresh recording; writes nothing
    kvparity golden list                                 the golden names and why each is pinned
    kvparity mutants [--only NAME] [--json PATH]         every mutant of the zoo must be killed
    kvparity matrix [VERSION ...] [--base V]             real SGLang releases pairwise, exact or up to renumbering
    kvparity matrix ... --shard I/N                      one share of the pairs; merge joins the shares' JSON:
    kvparity matrix merge SHARD.json ... [--json PATH]   the whole matrix, as one unsharded run reports it
    kvparity explain --sglang B --against A --replay F   the source change of B that makes it differ from A

Exit status: 0 success, 1 a difference or a refusal, 2 usage (an unknown golden name, say).
Each command group registers itself in ``_COMMANDS``; a new group adds one function there.
Nothing here imports the kernels: ``check --device`` must choose the device (and so Triton's
mode) before they are imported.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import NoReturn

from kvparity.cli import check as cli_check
from kvparity.cli import explain as cli_explain
from kvparity.cli import golden as cli_golden
from kvparity.cli import matrix as cli_matrix
from kvparity.cli import mutants as cli_mutants

USAGE_ERROR = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse exits 2 itself; keep that, with our prefix
        self.print_usage(sys.stderr)
        self.exit(USAGE_ERROR, f"{self.prog}: error: {message}\n")


# One function per command group; each adds its sub-parser and sets ``func``.
_COMMANDS: tuple[Callable[[argparse._SubParsersAction, type], None], ...] = (
    cli_check.add, cli_golden.add, cli_mutants.add, cli_matrix.add, cli_explain.add
)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kvparity", description="kvparity: parity of the KV-cache index path")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for add in _COMMANDS:
        add(commands, _Parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
