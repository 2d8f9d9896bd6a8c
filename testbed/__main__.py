"""`python -m testbed ...` runs the CLI from whatever checkout is first on sys.path (a git
worktree included), not only through the installed `testbed` script."""
import sys

from testbed.cli import main

sys.exit(main())
