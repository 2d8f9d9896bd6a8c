"""A namespace pair held like a run, for the benchmarks that measure through one."""
from __future__ import annotations

import contextlib
from pathlib import Path

from testbed.measure.session import Session
from testbed.topology.config import default


@contextlib.contextmanager
def netns_bench(att, lock: bool = True):
    """A namespace pair of kind ``att`` (an Attachment) for a benchmark, held like a run
    (testbed.measure.session: host lock, leftovers check, owned state, this host's environment) with
    a throwaway results folder: (temporary folder, writer, test path). ``lock=False``: as
    the test sessions hold theirs, without the host lock and the leftovers check (a test
    beside other runs; its objects are its own tag's)."""
    import tempfile

    from testbed.measure import testpaths
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="tb-fidelity-"))
        ses = stack.enter_context(Session(default(), results_dir=Path(tmp), keep_logs=False, lock=lock,
                                          check_leftovers=lock))
        writer = ses.open_run(None)
        path = stack.enter_context(testpaths.own_endpoints_path(att, ses.tag, "198.18.0.0/24", 1500, str(ses.state / "netns")))
        yield tmp, writer, path
