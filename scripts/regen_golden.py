"""Regenerate golden files (all, or the ones named) from legacy on torch.

    python scripts/regen_golden.py [NAME...] [--directory DIR]
    python scripts/regen_golden.py --check [NAME...]       compare only, write nothing

The same as ``kvparity golden regen`` / ``kvparity golden check``. A golden the worlds
disagree on is refused, not written.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kvparity.cli.main import main  # noqa: E402
from kvparity.kernels import runtime  # noqa: E402,F401  (fixes the Triton mode before anything imports Triton)

if __name__ == "__main__":
    argv = sys.argv[1:]
    action = "regen"
    if "--check" in argv:
        argv.remove("--check")
        action = "check"
    sys.exit(main(["golden", action, *argv]))
