"""The project's own test suite (the testbed's pytest plugin does the rest).

Its workers run root-tier tests beside each other (`./tb test` uses pytest-xdist), so the
`testbed run` processes they start share the host (``--shared-host``): several hold the
host lock at once, and a noisy sample is kept, marked, rather than measured again. A test
that needs the host alone drops the variable for its own runs and is marked ``alone``."""
from __future__ import annotations

import os

os.environ.setdefault("TESTBED_SHARED_HOST", "1")
