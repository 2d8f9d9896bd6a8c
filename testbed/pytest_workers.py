"""An interrupted pytest-xdist session waits for its workers' teardown before it ends them.

Stopped with Ctrl-C or SIGTERM (a CI job's timeout, `kill`), each worker tears its fixtures
down as a single process would: guests destroyed, links and namespaces deleted, servers
stopped. But xdist's controller, interrupted at the same moment, asks every worker to exit
and kills it 10 s later (NodeManager.EXIT_TIMEOUT), and execnet's worker side interrupts its
own main thread 5 s after the request and calls os._exit 10 s after that. A worker whose
teardown takes longer (two guests on a busy host do) dies in the middle of it and leaves its
tb- objects behind.

So the controller, interrupted, first waits until every worker has finished its session's
teardown (each says so with a file when its pytest_sessionfinish has run), at most
TEARDOWN_WAIT_S, and only then lets xdist end them. The workers it waits for are sent
SIGTERM first, so that one which only the controller's signal stopped (a `kill` of the
controller's pid, not of the process group) starts its teardown; a worker stops on the
first SIGINT or SIGTERM it gets and tears down undisturbed by the next one (the group's
and the forwarded one both arrive).
"""
from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import pytest

from testbed.host import proc

#: how long the interrupted controller waits for its workers' teardown
TEARDOWN_WAIT_S = 300.0
POLL_S = 0.2
_KEY = "tb_teardown_marks"


class Controller:
    """The controller's side: a folder the workers mark, and the wait."""

    def __init__(self) -> None:
        #: made when xdist sets its first worker up (None: no workers, nothing to wait for)
        self.marks: Path | None = None

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node) -> None:
        if self.marks is None:
            self.marks = Path(tempfile.mkdtemp(prefix="tb-pytest-"))
        node.workerinput[_KEY] = str(self.marks)

    def unfinished(self) -> list[int]:
        """The workers that said they started, run still, and have not said they are done."""
        marks = self.marks
        if marks is None:
            return []
        started = sorted(int(p.name.split("-", 1)[1]) for p in marks.glob("started-*"))
        return [pid for pid in started if not (marks / f"done-{pid}").exists() and proc.running(pid)]

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        # tryfirst: before xdist's own pytest_sessionfinish, which ends the workers
        if exitstatus != pytest.ExitCode.INTERRUPTED:
            return
        waiting = self.unfinished()
        if not waiting:
            return
        for pid in waiting:
            # a worker that the group's signal reached ignores this one; one that only the
            # controller's signal stopped starts its teardown
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        print(f"\ntestbed: waiting up to {TEARDOWN_WAIT_S:.0f} s for {len(waiting)} pytest worker(s) "
              f"to tear their fixtures down", file=sys.stderr, flush=True)
        deadline = time.monotonic() + TEARDOWN_WAIT_S
        while waiting and time.monotonic() < deadline:
            time.sleep(POLL_S)
            waiting = self.unfinished()
        if waiting:
            print(f"testbed: worker(s) {', '.join(map(str, waiting))} still tearing down after "
                  f"{TEARDOWN_WAIT_S:.0f} s; `testbed cleanup` removes what they leave",
                  file=sys.stderr, flush=True)

    def pytest_unconfigure(self) -> None:
        if self.marks is not None:
            shutil.rmtree(self.marks, ignore_errors=True)


class Worker:
    """A worker's side: it says it started and, once its fixtures are down, that it is done."""

    def __init__(self, marks: str) -> None:
        self.marks = Path(marks)
        self._mark("started")

    def _mark(self, what: str) -> None:
        try:
            (self.marks / f"{what}-{os.getpid()}").touch()
        except OSError:
            pass        # the controller's folder is gone: it is not waiting

    @pytest.hookimpl(hookwrapper=True)
    def pytest_sessionfinish(self):
        # after every plain pytest_sessionfinish, among them the one that tears the
        # session's fixtures down
        yield
        self._mark("done")


def register(config: pytest.Config) -> None:
    """Register the worker's side in an xdist worker, else the controller's (idle unless
    xdist sets workers up: xdist decides that after this plugin is configured)."""
    if hasattr(config, "workerinput"):
        marks = config.workerinput.get(_KEY)
        if marks:
            config.pluginmanager.register(Worker(marks), "testbed-teardown-worker")
    else:
        config.pluginmanager.register(Controller(), "testbed-teardown-controller")
