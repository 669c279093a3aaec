"""``python -m parity ...``: the kvparity command line (``parity.cli``).

The kernels are not imported here: ``kvparity check --device`` must choose the device, and so
Triton's mode, before they are (each command imports them when it runs)."""

import sys

from parity.cli import main

sys.exit(main())
