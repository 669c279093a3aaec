"""``python -m parity ...``: the kvparity command line (``parity.cli``)."""

import sys

from kernels import runtime  # noqa: F401  (fixes the Triton mode first)
from parity.cli import main

sys.exit(main())
