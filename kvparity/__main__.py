"""``python -m kvparity ...``: the kvparity command line (``kvparity.cli.main``).

The kernels are not imported here: ``kvparity check --device`` must choose the device, and so
Triton's mode, before they are (each command imports them when it runs)."""

import sys

from kvparity.cli.main import main

sys.exit(main())
