"""The project's own test suite machinery (not part of the public plugin): tiers, parallel
scheduling, the host checks and the helpers its tests share. suites/conftest.py loads it;
a team's session, which has only the public plugin (testbed.pytest_plugin), has none of it.

Tiers follow the folders: suites/unit (no root, no VMs), suites/netns (root, namespaces,
no VMs), suites/store (a database server), suites/vm (boots guests), suites/scenarios (each
study scenario end to end with --quick: namespaces, and guests for macvtap-vs-ovs). A test
that cannot run here is skipped with a reason naming what is missing, found by trying it.

With pytest-xdist (`./tb test` runs ``-n 3``) each root-tier module goes whole to one
worker, so root tests run beside each other; the host checks act in the controlling session
(see the host networking section below), and a test marked ``alone`` (it kills daemons, leaves
a dead run's objects for cleanup to find, or needs the host to itself) runs with no other
root test beside it. Without xdist, or with ``-n 0``, one process does all of it.

The suite's tests keep their older fixture names: ``accelerator``, ``guest_pair`` and
``run_writer`` are the public ``testbed_accelerator``, ``testbed_guests`` and ``testbed_run``
(defined here again, so the suite does not get the public plugin's deprecation warning).
"""
from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed.pytest_plugin import INDEX_KEY as _INDEX_KEY
from testbed.pytest_plugin import RUN_KEY as _RUN_KEY
from testbed.pytest_plugin import require_root

__all__ = [
    "accelerator", "guest_pair", "netns_pair", "run_cli", "run_writer", "sshd_privsep_dir",
    "pytest_addoption", "pytest_configure", "pytest_collection_modifyitems", "pytest_collection_finish",
    "pytest_runtest_setup", "pytest_xdist_node_collection_finished", "pytest_runtest_protocol",
    "pytest_configure_node", "pytest_runtest_logreport", "pytest_sessionfinish", "pytest_testnodedown",
    "pytest_xdist_make_scheduler",
]


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("testbed")
    g.addoption("--tb-store-durations", action="store_true", default=False,
                help=f"this project's suite: write each root-tier test's time to {DURATIONS_FILE} at the "
                     "end, for the order in which parallel workers take the root modules (longest first)")


def pytest_configure(config: pytest.Config) -> None:
    for tier in TIERS:
        config.addinivalue_line("markers", f"{tier}: this project's suite: testbed tier {tier}")
    config.addinivalue_line("markers", "alone: this project's suite: a root-tier test that runs with no other "
                                       "root test beside it (it disturbs the host, or needs it to itself)")
    # xdist registers it too; here so the mark is known where xdist is not installed
    config.addinivalue_line("markers", "xdist_group(name): in a root-tier module, the tests of one "
                                       "group go to one worker, apart from the rest of the module")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        tier = _tier_of(Path(str(item.fspath)))
        if tier and not item.get_closest_marker(tier):
            item.add_marker(getattr(pytest.mark, tier))
    # Order for parallel workers: first the root tests that need the host alone, together
    # (one worker runs them while the others take the unit tier, which needs no lock), then
    # the longest root work first, so the workers end together: the scenarios, the guest
    # tier, the store (a minute-long nightly job in two modules), then the namespace tier's
    # many short modules. Stable: modules and tests otherwise keep their order.
    units = {item.nodeid: _unit_of(item) for item in items}
    costs = _unit_costs(config, items, units)
    first: dict[str, int] = {}
    for n, item in enumerate(items):
        first.setdefault(units[item.nodeid], n)
    items.sort(key=lambda i: (_run_order(i), -costs.get(units[i.nodeid], 0.0), first[units[i.nodeid]]))
    path = getattr(config, "workerinput", {}).get("tb_units_file")
    if path:
        # for the controller's scheduler, which sees test ids only
        Path(path).write_text(json.dumps({i.nodeid: u for i in items if (u := _work_unit(i))}))


@pytest.fixture(scope="session")
def accelerator(testbed_accelerator):
    """This project's suite: the public testbed_accelerator under its older name."""
    return testbed_accelerator


@pytest.fixture(scope="session")
def guest_pair(testbed_guests):
    """This project's suite: the public testbed_guests under its older name."""
    return testbed_guests


@pytest.fixture(scope="session")
def run_writer(testbed_run):
    """This project's suite: the public testbed_run under its older name."""
    return testbed_run


TIERS = ("unit", "netns", "store", "vm", "scenarios")


def _tier_of(path: Path) -> str | None:
    """The tier of a test file under this project's suites/<tier>/ folders; None for any other
    file (the plugin is installed for every pytest session, not only this project's)."""
    parts = path.parts
    for i, part in enumerate(parts[:-1]):
        if part == "suites" and parts[i + 1] in TIERS:
            return parts[i + 1]
    return None


_RUN_ORDER = {"unit": 1, "scenarios": 2, "vm": 3, "store": 4, "netns": 5}


#: each root-tier test's seconds in a whole parallel session (``--tb-store-durations``). Within a
#: tier, the work units with the most recorded time go out first, so that what is left for the
#: end is short and the workers end together (longest processing time first). A test with no
#: entry counts as 0: a stale file orders worse, never wrongly.
DURATIONS_FILE = "suites/durations.json"


#: a worker whose last queued test has more than this to run (recorded) is given the cheapest
#: unit left to hold meanwhile (TierScheduling._assign_work_unit)
LONG_LAST_TEST_S = 15.0


def _unit_of(item: pytest.Item) -> str:
    """The parallel work unit a test goes in (the scheduler's _split_scope, from the item)."""
    if _root_tier(item):
        return _work_unit(item) or item.nodeid.split("::", 1)[0]
    return item.nodeid


def _recorded_durations(config: pytest.Config) -> dict[str, float]:
    try:
        recorded = json.loads((config.rootpath / DURATIONS_FILE).read_text())
        return {str(k): float(v) for k, v in recorded.items()}
    except (OSError, ValueError, TypeError, AttributeError):
        return {}


def _unit_costs(config: pytest.Config, items: list[pytest.Item], units: dict[str, str]) -> dict[str, float]:
    """Recorded seconds per root-tier work unit (``units``: each test's unit, _unit_of)."""
    recorded = _recorded_durations(config)
    costs: dict[str, float] = {}
    for item in items:
        if _root_tier(item):
            unit = units[item.nodeid]
            costs[unit] = costs.get(unit, 0.0) + recorded.get(item.nodeid, 0.0)
    return costs


def _alone_test(item: pytest.Item) -> bool:
    return item.get_closest_marker("alone") is not None and _root_tier(item)


def _work_unit(item: pytest.Item) -> str | None:
    """The parallel work unit of a root test that is not its module's: "tb-alone" for the tests
    marked alone (one worker runs them all, one after another), "<module>@<group>" for an
    ``xdist_group`` in a root module (a long module's independent parts, such as one study
    scenario and the tests that read its run, go to different workers)."""
    if _alone_test(item):
        return "tb-alone"
    m = item.get_closest_marker("xdist_group")
    if m is not None and _root_tier(item):
        group = m.kwargs.get("name", m.args[0] if m.args else "")
        return f"{item.nodeid.split('::', 1)[0]}@{group}"
    return None


def _run_order(item: pytest.Item) -> int:
    if _alone_test(item):
        return 0
    return _RUN_ORDER.get(_tier_of(Path(str(item.fspath))) or "", len(_RUN_ORDER) + 1)


# Host networking before and after the whole suite must be identical: every tier that
# creates host objects has to have removed them, and touched nothing else.
#
# With pytest-xdist (`./tb test` runs three workers) the controller collects and runs nothing,
# and each root-tier module goes whole to one worker (TierScheduling below), so root tests of
# different modules run beside each other and beside the unit tier. The host checks (the lock,
# a dead run's leftovers, the snapshot) are the controlling session's: it takes them when the
# first worker has collected root tests, before any test is handed out, and compares at its
# end, after every worker's fixtures are gone; what workers noted comes back through xdist's
# workeroutput, so the one summary at the end says it. Without xdist the session itself takes
# them, before its first root test.
_SNAPSHOT_KEY = pytest.StashKey[object]()


_ALONE_KEY = pytest.StashKey[bool]()


_WANTED_KEY = pytest.StashKey[bool]()


_NOTES_KEY = pytest.StashKey[list]()        # lines for the terminal, from any process


_CHECKED_KEY = pytest.StashKey[bool]()      # some process compared the host before and after


_DIFF_KEY = pytest.StashKey[list]()         # what changed on the host, from any process


_ROOT_TIERS = ("netns", "store", "vm", "scenarios")


def _alone(config: pytest.Config) -> bool:
    """Whether this is the only test session on the host. Tests make tb- objects without
    registering a run for each, so another live session's objects look like a dead run's:
    a session holds a lock for its lifetime, and one that finds the lock taken neither
    removes leftovers nor judges the host by its tb- objects."""
    import fcntl

    from testbed.host import paths
    d = paths.state_dir()
    d.mkdir(parents=True, exist_ok=True)
    fd = os.open(d / "pytest.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return False
    config.add_cleanup(lambda: os.close(fd))   # closing releases the lock
    return True


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def _root_tier(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(t) for t in _ROOT_TIERS)


def _note(config: pytest.Config, line: str) -> None:
    """A warning line for the terminal: written now by a plain session, printed by the
    controller at the end for a worker (whose own terminal output nobody sees)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter and not _is_worker(config):
        reporter.write_line(line, yellow=True)
    else:
        config.stash.setdefault(_NOTES_KEY, []).append(line)


def pytest_collection_finish(session: pytest.Session) -> None:
    """The host-wide checks (dead leftovers removed, networking snapshot, tb- objects at the
    end) belong to sessions that run root tiers as root. A unit-only session, or any other
    project's session that merely has this plugin installed, touches nothing on the host."""
    config = session.config
    config.stash[_WANTED_KEY] = (os.geteuid() == 0 and not config.option.collectonly
                                 and any(_root_tier(item) for item in session.items))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    # Before the first root test's fixtures, in a session without workers (the controller
    # takes them for its workers: pytest_xdist_node_collection_finished).
    config = item.config
    if _root_tier(item) and config.stash.get(_WANTED_KEY, False) and _SNAPSHOT_KEY not in config.stash \
            and not _is_worker(config):
        _start_host_guard(config)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids) -> None:
    """xdist's controller, once a worker has collected and before any test is handed out."""
    config = node.config
    if _SNAPSHOT_KEY in config.stash or os.geteuid() != 0 or config.option.collectonly:
        return
    if any(_tier_of(config.rootpath / i.split("::", 1)[0]) in _ROOT_TIERS for i in ids):
        _start_host_guard(config)


# Root tests beside each other: each holds a shared lock while it runs (setup, call, teardown:
# its fixtures are made and removed inside), and one marked ``alone`` holds it exclusively.
# A gate taken before either gives the exclusive one its turn: once it waits, no new test
# starts. A session started by a test (pytest inside a test) runs under its parent's lock.
_LOCK_HELD_VAR = "TESTBED_PYTEST_TEST_LOCK"


@contextlib.contextmanager
def _test_lock(alone: bool) -> Iterator[None]:
    import fcntl

    from testbed.host import paths
    holder = os.environ.get(_LOCK_HELD_VAR)
    if holder and holder != str(os.getpid()):
        yield
        return
    d = paths.state_dir()
    d.mkdir(parents=True, exist_ok=True)
    gate = os.open(d / "pytest-gate.lock", os.O_RDWR | os.O_CREAT, 0o644)
    main = os.open(d / "pytest-tests.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(main, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            fcntl.flock(gate, fcntl.LOCK_UN)
        os.environ[_LOCK_HELD_VAR] = str(os.getpid())
        yield
    finally:
        os.close(main)          # closing releases the lock
        os.close(gate)


_HELD: list[contextlib.ExitStack] = []     # the exclusive lock kept for the next test (alone too)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    if not (_root_tier(item) and os.geteuid() == 0 and item.config.stash.get(_WANTED_KEY, False)):
        yield
        return
    alone = _alone_test(item)
    held = _HELD.pop() if _HELD else None
    if held is not None and not alone:
        held.close()
        held = None
    stack = held or contextlib.ExitStack()
    if held is None:
        stack.enter_context(_test_lock(alone))
    try:
        yield
    finally:
        # Tests that need the host alone run one after another under one exclusive hold:
        # released between them, the tests beside would start, and the next would wait for them.
        if alone and nextitem is not None and _alone_test(nextitem):
            _HELD.append(stack)
        else:
            stack.close()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """xdist's controller, per worker: where the worker writes the work units of root tests
    that are not their module's (_work_unit)."""
    import tempfile
    config = node.config
    if _UNITS_FILE_KEY not in config.stash:
        fd, path = tempfile.mkstemp(prefix="testbed-pytest-units-", suffix=".json")
        os.close(fd)
        config.stash[_UNITS_FILE_KEY] = path
        config.add_cleanup(lambda: Path(path).unlink(missing_ok=True))
    node.workerinput["tb_units_file"] = config.stash[_UNITS_FILE_KEY]


_UNITS_FILE_KEY = pytest.StashKey[str]()


def _start_host_guard(config: pytest.Config) -> None:
    from testbed.admin import cleanup
    from testbed.host import snapshot
    config.stash[_SNAPSHOT_KEY] = None          # once, even if what follows fails
    alone = config.stash[_ALONE_KEY] = _alone(config)
    # tb- objects whose owning process is dead (a session or run killed with SIGKILL, a
    # machine image taken while one ran) would make every run-level test refuse to
    # start. They are provably the testbed's and provably orphaned, so they go first,
    # and the session says so; a live run's objects are left alone.
    found = cleanup.find() if alone else cleanup.Leftovers()
    if not found.empty():
        _note(config, f"removing a dead run's leftovers before testing: {found.describe()}")
        cleanup.remove(found)
    config.stash[_SNAPSHOT_KEY] = snapshot.take()


_DURATIONS: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # setup, call and teardown: what the test holds its worker for (the controller sees the
    # workers' reports here too)
    _DURATIONS[report.nodeid] = _DURATIONS.get(report.nodeid, 0.0) + report.duration


def _store_durations(config: pytest.Config) -> None:
    """--tb-store-durations: the root-tier tests' times of this session into DURATIONS_FILE,
    merged over what it holds (a session of a few tests updates only theirs)."""
    path = config.rootpath / DURATIONS_FILE
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        old = {}
    new = {k: round(v, 1) for k, v in _DURATIONS.items()
           if _tier_of(config.rootpath / k.split("::", 1)[0]) in _ROOT_TIERS}
    merged = {**(old if isinstance(old, dict) else {}), **new}
    path.write_text(json.dumps(dict(sorted(merged.items())), indent=0) + "\n")


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    import sys
    config = session.config
    if config.getoption("--tb-store-durations", False) and not _is_worker(config):
        _store_durations(config)
    # Tags this process claimed for its tests are released first: objects a test leaked
    # under one are then a dead run's, which the check below reports.
    if "testbed.measure.session" in sys.modules:
        sys.modules["testbed.measure.session"].release_tags()
    before = config.stash.get(_SNAPSHOT_KEY, None)
    if before is not None:
        from testbed.admin import cleanup
        from testbed.host import snapshot
        diff = snapshot.diff(before, snapshot.take())  # type: ignore[arg-type]
        # Session fixtures are gone by now: any tb- object still here (a domain, a state folder,
        # which the networking snapshot does not see) was leaked by a test or a run it started.
        left = cleanup.find() if config.stash.get(_ALONE_KEY, False) else cleanup.Leftovers()
        if not left.empty():
            diff = [*diff, f"tb- objects left behind: {left.describe()}"]
        config.stash[_CHECKED_KEY] = True
        config.stash[_DIFF_KEY] = [*config.stash.get(_DIFF_KEY, []), *diff]
    if _is_worker(config):
        config.workeroutput.update(  # type: ignore[attr-defined]
            tb_notes=config.stash.get(_NOTES_KEY, []), tb_checked=config.stash.get(_CHECKED_KEY, False),
            tb_diff=config.stash.get(_DIFF_KEY, []), tb_index=config.stash.get(_INDEX_KEY, None),
            tb_run=str(config.stash[_RUN_KEY]) if _RUN_KEY in config.stash else None)
        return
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter:
        for line in config.stash.get(_NOTES_KEY, []):
            reporter.write_line(line, yellow=True)
    diff = config.stash.get(_DIFF_KEY, [])
    if diff:
        if reporter:
            reporter.write_line("host networking changed during the test session:", red=True)
            for line in diff:
                reporter.write_line(f"  {line}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    elif reporter and config.stash.get(_CHECKED_KEY, False):
        reporter.write_sep("-", "host networking snapshot: identical before and after the session")


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """xdist's controller: what a worker's host checks and run record said, kept for the
    controller's own end of session (sessionfinish, terminal summary)."""
    out = getattr(node, "workeroutput", None) or {}
    config = node.config
    config.stash[_NOTES_KEY] = [*config.stash.get(_NOTES_KEY, []), *out.get("tb_notes", [])]
    config.stash[_DIFF_KEY] = [*config.stash.get(_DIFF_KEY, []), *out.get("tb_diff", [])]
    if out.get("tb_checked"):
        config.stash[_CHECKED_KEY] = True
    if out.get("tb_run"):
        config.stash[_RUN_KEY] = Path(out["tb_run"])
    if out.get("tb_index"):
        config.stash[_INDEX_KEY] = out["tb_index"]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """Each root-tier module in one work unit, so one worker runs it whole, in order (its
    module fixtures, and the session's guest pair, are that worker's), or one unit per
    ``xdist_group`` in it; the tests marked alone in one more; every other test is a
    unit of its own, handed to whichever worker is free. Units go out in collection order
    (the longest tiers first: pytest_collection_modifyitems), not xdist's by size. Test ids
    stay as they are (xdist's loadgroup would append ``@group`` to each)."""
    if config.getvalue("dist") == "each":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class TierScheduling(LoadScopeScheduling):
        units: dict[str, str] = {}
        costs: dict[str, float] = {}

        def _split_scope(self, nodeid: str) -> str:
            tier = _tier_of(config.rootpath / nodeid.split("::", 1)[0])
            if nodeid in self.units:
                return self.units[nodeid]
            if tier in _ROOT_TIERS:
                return nodeid.split("::", 1)[0]
            # xdist_group marks (--dist loadgroup) are still honoured
            return nodeid.split("@")[-1] if nodeid.rfind("@") > nodeid.rfind("]") else nodeid

        def _assign_work_unit(self, node) -> None:
            # A worker cannot start its last queued test before it knows the next one, so a
            # unit of one long test (a scenario) takes another unit along from its start. That
            # one waits behind it while other workers may run dry: when what the worker still
            # has to run is long by the recorded times, it gets the cheapest unit left rather
            # than the next long one, which the next worker to come free takes.
            left = [n for unit in self.assigned_work.get(node, {}).values() for n, done in unit.items() if not done]
            if sum(self.costs.get(n, 0.0) for n in left) > LONG_LAST_TEST_S and len(self.workqueue) > 1:
                cheapest = min(self.workqueue, key=lambda u: sum(self.costs.get(n, 0.0) for n in self.workqueue[u]))
                self.workqueue.move_to_end(cheapest, last=False)
            super()._assign_work_unit(node)

        def _reschedule(self, node) -> None:
            # xdist hands a worker its next unit while 2 of its tests are still to run; a
            # module of one or two long tests then has the next module promised to its worker
            # from its start, while other workers may run dry. A worker needs one test beyond
            # the one it runs, so the next unit is handed over when one is left.
            if not node.shutting_down and self.workqueue and self._pending_of(self.assigned_work[node]) > 1:
                return
            super()._reschedule(node)

        def schedule(self) -> None:
            config.option.loadscopereorder = False
            path = config.stash.get(_UNITS_FILE_KEY, None)
            with contextlib.suppress(OSError, ValueError):
                self.units = dict(json.loads(Path(path).read_text())) if path else {}
            self.costs = _recorded_durations(config)
            super().schedule()

    return TierScheduling(config, log)


@pytest.fixture(scope="module")
def netns_pair() -> Iterator[tuple[str, str, str]]:
    """(client namespace, server namespace, server address): two tb- namespaces joined by
    one veth pair, for running real tools without VMs."""
    require_root()
    from testbed.admin import cleanup
    from testbed.errors import TestbedError
    from testbed.host.net import netns
    from testbed.records import results
    with contextlib.ExitStack() as stack:
        # Registered like a run, so a concurrent `testbed cleanup` leaves it alone.
        _, tag, _ = stack.enter_context(cleanup.owned_fresh_state(results.new_run_id))
        try:
            conn = stack.enter_context(netns.veth_pair(tag, subnet="198.18.250.0/30"))
        except TestbedError as e:
            pytest.skip(f"cannot create a namespace pair: {e}")
        yield conn.a.netns, conn.b.netns, conn.b.address


SSHD_PRIVSEP = Path("/run/sshd")


@contextlib.contextmanager
def sshd_privsep_dir(path: Path = SSHD_PRIVSEP) -> Iterator[Path]:
    """/run/sshd, the folder sshd refuses to start without ("Missing privilege separation
    directory"), for a test's own sshd. Made if missing (no systemd here to make it) and
    removed by the last test that uses it, only if a test made it; a host's own folder
    stays. Tests on other workers use it at the same time: one removed it under the other's
    restarting sshd. A shared lock on a users file marks each user, and a mutex makes the
    "made" and "last one out" decisions one at a time."""
    import hashlib
    import shutil

    from testbed.host import shareduse
    key = hashlib.sha256(str(path).encode()).hexdigest()[:12]
    with shareduse.held(f"pytest-privsep-{key}", path.is_dir, lambda: path.mkdir(mode=0o755),
                        lambda: shutil.rmtree(path, ignore_errors=True)):
        yield path


def skip_unless_namespace_tracing() -> None:
    """Skip a test that traces netperf between namespaces where it cannot, naming what is
    missing: root, the tools, or hop tracing (bpftrace, tracefs, a probe that attaches)."""
    import shutil

    from testbed.admin import capabilities
    if os.geteuid() != 0:
        pytest.skip("needs root: creates namespaces and loads BPF programs")
    for tool in ("netperf", "netserver"):
        if not shutil.which(tool):
            pytest.skip(f"{tool} missing")
    ok, why = capabilities.hop_tracing()
    if not ok:
        pytest.skip(f"hop tracing unavailable here: {why}")


def leftover_tracers(pattern: str = "tb-(hops|probes)-host.bt") -> list[int]:
    """bpftrace processes of this test left running: children of this process, or orphans
    (a `testbed` child that exited without stopping them). Another worker's live tracer
    (its parent alive and not this process) is not one."""
    import subprocess
    out = []
    for pid in subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split():
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue            # gone meanwhile
        if ppid in (1, os.getpid()):
            out.append(int(pid))
    return out


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
