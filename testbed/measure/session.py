"""A run's session: what `testbed run`, the scenarios, the benchmarks and a measuring pytest
session hold while they create tb- objects and write results.

    with Session(topology) as ses:          # host lock, leftovers check, owned state folder
        writer = ses.open_run(accelerator, image=image)   # environment + results writer
        ...                                 # ses.stack takes whatever else the run creates

Everything is entered on one ExitStack, so it is undone in reverse order on success, error
and Ctrl-C: state folder removed, run.json finished with its status, lock released.

The owner registration (cleanup.owned_state: tb-<tag>/owner.json with this process's pid) is
what tells a concurrent `testbed cleanup` or test session that the run's tb- objects are alive.
Code that makes tb- objects outside a Session (tests making a namespace pair, say) takes its
tag from :func:`claim_tag`, which registers it the same way.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from testbed.admin import capabilities, cleanup
from testbed.host import environment, paths
from testbed.records import results
from testbed.topology.model import Accelerator, HostSpec, Topology


class Session:
    """Lock, leftovers check, owned state, environment fingerprint and results writer of one run.

    ``lock`` and ``check_leftovers`` are off only for a pytest session: it shares the host
    with the `testbed run` processes its own tests start, and the plugin removes a dead run's
    leftovers itself. ``results_dir`` defaults to paths.results_dir() (--results,
    $TESTBED_RESULTS, ./results)."""

    def __init__(self, topology: Topology, *, results_dir: Path | None = None, lock: bool = True,
                 check_leftovers: bool = True, keep_logs: bool = True,
                 hosts: Sequence[HostSpec] | None = None, resume: Path | None = None) -> None:
        self.topology = topology
        #: an interrupted run's directory to go on with (`testbed run --resume`)
        self.resume = resume
        self.results_root = results_dir
        self.lock = lock
        self.check_leftovers = check_leftovers
        self.keep_logs = keep_logs
        self.hosts = tuple(hosts if hosts is not None else topology.hosts)
        self.run_id, self.tag = results.new_run_id()
        if resume is not None:
            self.run_id = Path(resume).name     # the lock and the owner say which run goes on
        self.stack = contextlib.ExitStack()
        self.state: Path | None = None
        self.env: Mapping[str, Any] = {}
        self.writer: results.RunWriter | None = None

    def __enter__(self) -> Session:
        with self.stack as stack:
            # The tag first: it is drawn again while another run's folder has it, and the run
            # id (which the lock names) ends with it. A folder owned by this live process is
            # no leftover for the check below, nor for another run's.
            drawn = iter([(self.run_id, self.tag)])
            resumed = self.resume is not None

            def draw() -> tuple[str, str]:
                first = next(drawn, None)
                if first is not None:
                    return first
                run_id, tag = results.new_run_id()
                return (self.run_id if resumed else run_id), tag    # a resumed run keeps its id
            self.run_id, self.tag, self.state = stack.enter_context(cleanup.owned_fresh_state(draw))
            if self.lock:
                stack.enter_context(cleanup.host_lock(self.run_id))
            if self.check_leftovers:
                # With the lock held, any tb- object of a tag no live process owns is a dead run's.
                cleanup.refuse_if_leftovers(self.hosts[0].uri)
                cleanup.refuse_if_leftovers_on([h for h in self.hosts if h.remote])
            self.stack = stack.pop_all()
        return self

    def __exit__(self, *exc: object) -> bool | None:
        return self.stack.__exit__(*exc)  # type: ignore[arg-type]

    def open_run(self, accelerator: Accelerator | None, *, image: object = None,
                 extra: Mapping[str, Any] | None = None,
                 writer_type: type[results.RunWriter] = results.RunWriter) -> results.RunWriter:
        """The run directory (results/<run-id>) with the environment fingerprint of this
        host: the accelerator guests run under (None: namespaces only), the guest image."""
        from testbed.host import tuning
        self.env = environment.fingerprint(accelerator, image=image, extra=extra,  # type: ignore[arg-type]
                                           nics=tuning.nics_under_test(self.topology),
                                           versions=capabilities.tool_versions())
        root = self.results_root if self.results_root is not None else paths.results_dir()
        if self.resume is not None:
            self.writer = self.stack.enter_context(
                writer_type.reopen(Path(self.resume), self.topology, self.env))
        else:
            self.writer = self.stack.enter_context(writer_type(root, self.run_id, self.topology, self.env))
        if self.keep_logs and self.state is not None:
            # Console logs and domain XML go into the run directory before the state folder goes.
            self.stack.callback(keep_logs, self.state, self.writer.dir / "guests")
        return self.writer

    @property
    def clock_ghz(self) -> float | None:
        mhz = self.env.get("cpu_mhz")
        return mhz / 1000 if mhz else None


def keep_logs(state: Path, dest: Path) -> None:
    """Console logs and domain XML of the run's guests, copied into its run directory."""
    dest.mkdir(parents=True, exist_ok=True)
    for f in state.glob("*"):
        if f.suffix in (".log", ".xml"):
            with contextlib.suppress(OSError):
                shutil.copy2(f, dest / f.name)


# -- tags owned outside a Session ------------------------------------------------------------

_claimed: dict[str, Path] = {}
_claim_lock = threading.Lock()


def claim_tag() -> str:
    """A fresh run tag registered as owned by this process (tb-<tag>/owner.json, as a
    Session's state folder is), for code that makes tb- objects without a Session. The
    registration lasts until :func:`release_tags` or the process exits."""
    _, tag, d = cleanup.register_fresh(results.new_run_id, lambda _: {"pid": os.getpid(), "claimed": True})
    with _claim_lock:
        if not _claimed:
            atexit.register(release_tags)
        _claimed[tag] = d
    return tag


def release_tags() -> list[str]:
    """Drop this process's claims (a pytest session does this before it looks for objects its
    tests leaked: a claimed tag's objects are then a dead run's, as they should be)."""
    with _claim_lock:
        tags, dirs = list(_claimed), list(_claimed.values())
        _claimed.clear()
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
    return tags


def release_tag(tag: str) -> None:
    """Drop one claim (its objects are gone, or are to be judged as a dead run's)."""
    with _claim_lock:
        d = _claimed.pop(tag, None)
    if d is not None:
        shutil.rmtree(d, ignore_errors=True)


def owned(tag: str) -> bool:
    """Whether a live process owns ``tag`` (a Session's or a claimed one)."""
    return tag in cleanup.live_tags()


__all__ = ["Session", "claim_tag", "release_tag", "release_tags", "keep_logs", "owned"]
