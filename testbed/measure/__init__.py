"""From a planned cell to samples: runs, sessions, test paths, the sampling loop and its cross-checks."""
