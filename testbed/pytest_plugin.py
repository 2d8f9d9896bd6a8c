"""pytest plugin: tiers, options, fixtures and capability skips.

Tiers follow the folders: suites/unit (no root, no VMs), suites/netns (root, namespaces,
no VMs), suites/store (a database server), suites/vm (boots guests), suites/scenarios (each
study scenario end to end with --quick: namespaces, and guests for macvtap-vs-ovs). A test that cannot
run here is skipped with a reason naming what is missing, found by trying it.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

TIERS = ("unit", "netns", "store", "vm", "scenarios")


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("testbed")
    g.addoption("--attach", default="all",
                help="attachment modes to test: bridge, ovs, macvtap, netns, or all (comma list)")
    g.addoption("--tb-accelerator", default="auto", choices=("auto", "kvm", "tcg"),
                help="accelerator for booted guests (default: probe, kvm else tcg)")


def pytest_configure(config: pytest.Config) -> None:
    for tier in TIERS:
        config.addinivalue_line("markers", f"{tier}: testbed tier {tier}")
    config.addinivalue_line("markers", "attach(mode): test belongs to an attachment mode")


def _tier_of(path: Path) -> str | None:
    """The tier of a test file under this project's suites/<tier>/ folders; None for any other
    file (the plugin is installed for every pytest session, not only this project's)."""
    parts = path.parts
    for i, part in enumerate(parts[:-1]):
        if part == "suites" and parts[i + 1] in TIERS:
            return parts[i + 1]
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    wanted = {m.strip() for m in config.getoption("--attach").split(",")}
    for item in items:
        tier = _tier_of(Path(str(item.fspath)))
        if tier and not item.get_closest_marker(tier):
            item.add_marker(getattr(pytest.mark, tier))
        m = item.get_closest_marker("attach")
        if m and "all" not in wanted and m.args[0] not in wanted:
            item.add_marker(pytest.mark.skip(reason=f"attachment {m.args[0]} not selected (--attach)"))


def require_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (creates host network objects)")


@pytest.fixture(scope="session")
def accelerator(request: pytest.FixtureRequest):
    """The accelerator guests boot with, found by a probe boot."""
    require_root()
    from testbed import capabilities, images
    from testbed.errors import CapabilityError
    try:
        img = images.ensure()
        return capabilities.choose_accelerator(request.config.getoption("--tb-accelerator"), img.kernel)
    except CapabilityError as e:
        pytest.skip(f"no accelerator: {e}")


@dataclass
class GuestPair:
    client: object
    server: object
    tag: str
    run_id: str
    accelerator: object
    state: Path


@pytest.fixture(scope="session")
def guest_pair(accelerator) -> Iterator[GuestPair]:
    """Two booted guests, once per session; NICs under test are hot-plugged by each test."""
    from testbed import cleanup, images, results, virt
    from testbed.model import GuestSpec
    run_id, tag = results.new_run_id()
    with contextlib.ExitStack() as stack:
        state = stack.enter_context(cleanup.owned_state(tag, run_id))
        conn = stack.enter_context(virt.connect("qemu:///system"))
        img = images.ensure()
        gs = [stack.enter_context(virt.guest(conn, GuestSpec(n, "local"), img, accelerator, run_id, tag, state))
              for n in ("g1", "g2")]
        for g in gs:
            g.wait_ready(600)
        yield GuestPair(gs[0], gs[1], tag, run_id, accelerator, state)


# Host networking before and after the whole suite must be identical: every tier that
# creates host objects has to have removed them, and touched nothing else.
_SNAPSHOT_KEY = pytest.StashKey[object]()


_ALONE_KEY = pytest.StashKey[bool]()


def _alone(session: pytest.Session) -> bool:
    """Whether this is the only test session on the host. Tests make tb- objects without
    registering a run for each, so another live session's objects look like a dead run's:
    a session holds a lock for its lifetime, and one that finds the lock taken neither
    removes leftovers nor judges the host by its tb- objects."""
    import fcntl
    from testbed import paths
    d = paths.state_dir()
    d.mkdir(parents=True, exist_ok=True)
    fd = os.open(d / "pytest.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return False
    session.config.add_cleanup(lambda: os.close(fd))   # closing releases the lock
    return True


_ROOT_TIERS = ("netns", "store", "vm", "scenarios")
_GUARD_KEY = pytest.StashKey[bool]()


def _host_guard_wanted(session: pytest.Session) -> bool:
    """The host-wide checks (dead leftovers removed, networking snapshot, tb- objects at the
    end) belong to sessions that run root tiers as root. A unit-only session, or any other
    project's session that merely has this plugin installed, touches nothing on the host."""
    if os.geteuid() != 0 or session.config.option.collectonly:
        return False
    return any(item.get_closest_marker(t) for item in session.items for t in _ROOT_TIERS)


def pytest_collection_finish(session: pytest.Session) -> None:
    if not _host_guard_wanted(session):
        return
    session.config.stash[_GUARD_KEY] = True
    from testbed import cleanup, snapshot
    alone = session.config.stash[_ALONE_KEY] = _alone(session)
    # tb- objects whose owning process is dead (a session or run killed with SIGKILL, a
    # machine image taken while one ran) would make every run-level test refuse to
    # start. They are provably the testbed's and provably orphaned, so they go first,
    # and the session says so; a live run's objects are left alone.
    found = cleanup.find() if alone else cleanup.Leftovers()
    if not found.empty():
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter:
            reporter.write_line(f"removing a dead run's leftovers before testing: {found.describe()}",
                                yellow=True)
        cleanup.remove(found)
    session.config.stash[_SNAPSHOT_KEY] = snapshot.take()


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    before = session.config.stash.get(_SNAPSHOT_KEY, None)
    if not session.config.stash.get(_GUARD_KEY, False) or before is None:
        return
    from testbed import cleanup, snapshot
    diff = snapshot.diff(before, snapshot.take())  # type: ignore[arg-type]
    # Session fixtures are gone by now: any tb- object still here (a domain, a state folder,
    # which the networking snapshot does not see) was leaked by a test or a run it started.
    left = cleanup.find() if session.config.stash.get(_ALONE_KEY, False) else cleanup.Leftovers()
    if not left.empty():
        diff = [*diff, f"tb- objects left behind: {left.describe()}"]
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if diff:
        if reporter:
            reporter.write_line("host networking changed during the test session:", red=True)
            for line in diff:
                reporter.write_line(f"  {line}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    elif reporter:
        reporter.write_sep("-", "host networking snapshot: identical before and after the session")


@pytest.fixture(scope="module")
def netns_pair() -> Iterator[tuple[str, str, str]]:
    """(client namespace, server namespace, server address): two tb- namespaces joined by
    one veth pair, for running real tools without VMs."""
    require_root()
    from testbed import cleanup, results
    from testbed.errors import TestbedError
    from testbed.hostnet import netns
    run_id, tag = results.new_run_id()
    with contextlib.ExitStack() as stack:
        # Registered like a run, so a concurrent `testbed cleanup` leaves it alone.
        stack.enter_context(cleanup.owned_state(tag, run_id))
        try:
            conn = stack.enter_context(netns.veth_pair(tag, subnet="198.18.250.0/30"))
        except TestbedError as e:
            pytest.skip(f"cannot create a namespace pair: {e}")
        yield conn.a.netns, conn.b.netns, conn.b.address


def run_cli(args: list[str], *, env: dict[str, str] | None = None, timeout: float = 900):
    """`testbed ARGS` in a child process. On timeout the child gets SIGTERM, like a user's
    Ctrl-C, and is given two minutes to tear down before the test fails: a SIGKILL would
    leave its guests and links behind for the rest of the session."""
    import signal
    import subprocess
    import sys
    p = subprocess.Popen([sys.executable, "-m", "testbed.cli", *args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGTERM)
        try:
            out, err = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
        pytest.fail(f"testbed {' '.join(args)} timed out after {timeout:.0f} s; stderr tail:\n{err[-2000:]}")
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)
