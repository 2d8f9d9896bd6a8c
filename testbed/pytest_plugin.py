"""The testbed's pytest plugin: a team's per-mode tests in a few lines.

Installed with the package (a ``pytest11`` entry point), nothing to import in a
``conftest.py``. A test names its matrix with a marker, gets one test item per cell, and
measures through a fixture::

    import pytest

    @pytest.mark.testbed(attachments=["bridge", "ovs", "macvtap"], mtus=[1500, 9000],
                         profiles=["tcp_stream", "tcp_rr"], connections=[1, 4])
    @pytest.mark.testbed_floor(tcp_stream=5000, tcp_rr=10000)     # checked on KVM only
    def test_mode(testbed_cell):
        s = testbed_cell.measure()          # a failed sample fails the test with its reason
        assert s.metrics[testbed_cell.metric] > 0

Options (``pytest --help``, group "testbed"): ``--attach`` chooses the modes, ``--results``
where the session's run goes, ``--tb-accelerator`` what guests boot with. Fixtures
(``pytest --fixtures``): ``testbed_cell``, ``testbed_run``, ``testbed_guests``,
``testbed_accelerator``. Markers (``pytest --markers``): ``testbed``, ``testbed_floor``,
``attach``. The session's measurements are an ordinary run folder (``results/<run-id>``)
that `testbed report`, `compare`, `history` and `index` read. docs/tests.md is the guide;
examples/pytest-per-mode/ the worked example.

The project's own suite adds its tiers, parallel scheduling and host checks on top
(testbed._suite_plugin, loaded by suites/conftest.py); a team's session has none of them.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

#: named profiles a ``testbed`` marker may give by name (a mapping gives any other, in the
#: topology file's form); ``duration=`` on the marker sets their length (default 10 s)
PROFILES: Mapping[str, Mapping[str, Any]] = {
    "tcp_stream": {"protocol": "tcp", "pattern": "stream", "message_size": 16384},
    "tcp_maerts": {"protocol": "tcp", "pattern": "maerts", "message_size": 16384},
    "tcp_rr": {"protocol": "tcp", "pattern": "rr", "message_size": 1, "response_size": 1},
    "tcp_crr": {"protocol": "tcp", "pattern": "crr", "message_size": 1, "response_size": 1},
    "udp_stream": {"protocol": "udp", "pattern": "stream", "message_size": 1024},
    "udp_rr": {"protocol": "udp", "pattern": "rr", "message_size": 1, "response_size": 1},
}
#: what the ``testbed`` marker takes besides ``topology``: matrix axes, then profile defaults
MATRIX_KEYS = ("attachments", "backends", "mtus", "connections", "profiles", "pairs", "queues", "repetitions")
PROFILE_KEYS = ("duration", "tool")
#: where a guest cell's NICs and a namespace cell's endpoints are addressed
SUBNET = "198.18.0.0/24"


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("testbed", "testbed (VM-to-VM networking per attachment mode)")
    g.addoption("--attach", default="all", metavar="MODES",
                help="attachment modes to test: a comma list of mode names (bridge, ovs, macvtap, "
                     "netns-veth, ...), netns for every namespace mode, or all (default). Cells of "
                     "other modes are deselected; tests marked attach(mode) for another mode skip")
    g.addoption("--tb-accelerator", default="auto", choices=("auto", "kvm", "tcg"),
                help="accelerator the session's guests boot with: auto (default) probes KVM with a "
                     "test boot and falls back to TCG (figures then functional only, floors not "
                     "checked); kvm refuses to run without it")
    g.addoption("--results", dest="tb_results", metavar="DIR", default=None,
                help="folder of the session's run, results/<run-id> (default: $TESTBED_RESULTS or "
                     "./results)")


_TERM_PID: list[int] = []     # the process the SIGTERM handler was installed in


def _terminate(signum, frame) -> None:
    if os.getpid() not in _TERM_PID:
        # A forked copy of this process (pyroute2's namespace helper) inherits the handler:
        # raised there, the interrupt would run pytest's end in the copy, which tells xdist's
        # controller that the worker was interrupted. It ends as SIGTERM's default would.
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    if _TERM_STATE.get("worker"):
        if _TERM_STATE.get("stopped"):
            # the group's SIGTERM and the controller's forwarded one both reach an xdist
            # worker: the second must not cut its teardown short (testbed.pytest_workers)
            return
        _TERM_STATE["stopped"] = True
    raise KeyboardInterrupt(f"signal {signum}")


#: the handler's view of this session: an xdist worker, and whether it was stopped already
#: (testbed.pytest_workers)
_TERM_STATE: dict = {}


MARKERS = (
    "testbed(attachments=..., mtus=..., profiles=..., connections=..., backends=..., pairs=..., "
    "queues=..., repetitions=..., duration=..., tool=..., topology=FILE): the matrix a test using "
    "the testbed_cell fixture runs over, one test item per cell, with ids naming the cell "
    "([bridge-qemu-mtu1500-conn1-tcp_stream]). profiles: names (tcp_stream, tcp_maerts, tcp_rr, "
    "tcp_crr, udp_stream, udp_rr) or mappings as in a topology file; topology: a topology file "
    "(relative to the test file) whose matrix is used, the other keywords replacing its axes",
    "testbed_floor(PROFILE=MINIMUM, ..., namespaces=False): the least a profile's primary "
    "metric (Mbit/s for streams, transactions/s for request/response) must reach; checked by "
    "testbed_cell.measure() only when the guests run under KVM (TCG figures are functional "
    "checks), and for namespace cells only with namespaces=True",
    "attach(mode): the test belongs to an attachment mode; skipped when --attach leaves it out",
)


def pytest_configure(config: pytest.Config) -> None:
    import threading
    # A CI job's timeout, or `kill`, sends SIGTERM: by default it ends the process at once and
    # leaves every session fixture's tb- objects (guests, links, namespaces) behind. As an
    # interrupt, pytest tears the fixtures down first, as for Ctrl-C. A handler someone else
    # installed is left alone.
    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        _TERM_PID.append(os.getpid())
        signal.signal(signal.SIGTERM, _terminate)
    from testbed import pytest_workers
    pytest_workers.register(config)
    if _TERM_PID and hasattr(config, "workerinput"):
        _TERM_STATE["worker"] = True
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            # Ctrl-C reaches a worker from the terminal and again from the controller's wait
            signal.signal(signal.SIGINT, _terminate)
    for line in MARKERS:
        config.addinivalue_line("markers", line)
    if (config.getoption("--attach", "all") or "all") != "all":
        _wanted(config)     # a typo in --attach is a usage error, before anything is collected


def _wanted(config: pytest.Config) -> set[str]:
    from testbed import attachments
    raw = config.getoption("--attach", "all") or "all"
    wanted = {m.strip() for m in raw.split(",") if m.strip()}
    known = {*attachments.names(), "netns", "all"}
    if not wanted or wanted - known:
        raise pytest.UsageError(f"--attach {raw}: expected a comma list of {', '.join(sorted(known))}")
    return wanted


def mode_selected(config: pytest.Config, mode: str) -> bool:
    """Whether ``--attach`` chooses attachment ``mode`` (``netns`` chooses every namespace mode)."""
    from testbed import attachments
    wanted = _wanted(config)
    netns = mode in attachments.names() and not attachments.get(mode).guests
    return "all" in wanted or mode in wanted or (netns and "netns" in wanted)


#: the skip reason of a test that creates host objects, run by another user than root
NOT_ROOT = "needs root (creates host network objects)"


def require_root() -> None:
    """Skip the calling test unless it runs as root (it creates host network objects)."""
    if os.geteuid() != 0:
        pytest.skip(NOT_ROOT)


# --------------------------------------------------------------------------- the marker

@dataclass(frozen=True)
class _Param:
    """What parametrizes one testbed_cell item: the topology the marker makes, and the cell."""

    topology: Any
    cell: Any

    def __repr__(self) -> str:
        return self.cell.id


def marker_topology(mark: Any, test_file: Path) -> Any:
    """The topology a ``testbed`` marker names: its ``topology`` file (relative to the
    test's folder) with the marker's axes replacing the file's, or the marker's axes alone.
    Validated like any topology file: a bad marker is a collection error naming the field."""
    import yaml

    from testbed import api
    kw = dict(mark.kwargs)
    unknown = sorted(set(kw) - {*MATRIX_KEYS, *PROFILE_KEYS, "topology"})
    if unknown or mark.args:
        raise pytest.UsageError(f"{test_file}: @pytest.mark.testbed: unknown "
                                f"{', '.join(map(repr, unknown or mark.args))}; it takes keywords "
                                f"{', '.join((*MATRIX_KEYS, *PROFILE_KEYS, 'topology'))}")
    # the session's two guests (testbed_guests): g1 the client, g2 the server
    doc: dict[str, Any] = {"name": f"pytest-{test_file.stem}", "guests": [{"name": "g1"}, {"name": "g2"}]}
    base, source = test_file.parent, f"{test_file} (@pytest.mark.testbed)"
    if "topology" in kw:
        path = base / str(kw.pop("topology"))
        if not kw:
            return api.load_topology(path)      # the file as it is: errors name its lines
        t = api.load_topology(path)             # validated first, then its axes replaced
        doc = yaml.safe_load(path.read_text())
        base, source = path.parent, f"{path} (with @pytest.mark.testbed)"
        if not isinstance(doc, dict) or t is None:
            raise pytest.UsageError(f"{source}: not a topology mapping")
    matrix = dict(doc.get("matrix") or {})
    for key in MATRIX_KEYS:
        if key in kw:
            matrix[key] = list(kw[key]) if isinstance(kw[key], (list, tuple)) else kw[key]
    extra = {k: kw[k] for k in PROFILE_KEYS if k in kw}
    profiles = matrix.get("profiles") or ["tcp_stream"]
    if isinstance(profiles, list):
        # the marker's duration and tool replace a file's (its keywords replace the file's
        # axes); a profile mapping given in the marker itself keeps its own
        mine = "profiles" in kw or "topology" not in mark.kwargs
        matrix["profiles"] = [_profile(p, extra, mine, source) for p in profiles]
    matrix.setdefault("attachments", ["bridge"])
    doc["matrix"] = matrix
    return api.parse_topology(yaml.safe_dump(doc, sort_keys=False), source, base)


def _profile(p: Any, extra: Mapping[str, Any], mine: bool, source: str) -> Any:
    if isinstance(p, str) and p in PROFILES:
        return {"name": p, **PROFILES[p], **extra}
    if isinstance(p, str):
        raise pytest.UsageError(f"{source}: profiles: {p[:40]!r} is no built-in profile "
                                f"({', '.join(PROFILES)}); give another as a mapping (docs: topology)")
    if isinstance(p, Mapping):
        return {**extra, **p} if mine else {**p, **extra}
    return p            # refused by validation, naming matrix.profiles[i]


@dataclass(frozen=True)
class MergedMark:
    """A marker's arguments over the levels it is given at (:func:`merged_marker`)."""

    args: tuple
    kwargs: Mapping[str, Any]


def merged_marker(item: Any, name: str) -> MergedMark | None:
    """A marker's keywords over every level it is given at (module, class, function), the
    closest level's winning key by key: a module's ``duration`` stays when a test names only
    its ``attachments``. pytest's own closest-marker rule would drop the module's keywords."""
    marks = list(item.iter_markers(name))
    if not marks:
        return None
    kwargs: dict[str, Any] = {}
    for m in reversed(marks):
        kwargs.update(m.kwargs)
    return MergedMark(tuple(a for m in marks for a in m.args), kwargs)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "testbed_cell" not in metafunc.fixturenames or not _ours(metafunc, "testbed_cell"):
        return
    from testbed import api
    try:
        _generate(metafunc)
        return
    except (pytest.UsageError, api.TestbedError) as e:
        why = str(e)
    # The test file's collection error in one line (the plugin's stack is no help), at the
    # test's line: a marker's topology is text made here, whose own lines mean nothing.
    line = (metafunc.definition.location[1] or 0) + 1
    why = re.sub(r" \(@pytest\.mark\.testbed\)(:\d+)?:", f":{line} (@pytest.mark.testbed):", why, count=1)
    pytest.fail(why, pytrace=False)


def _ours(metafunc: pytest.Metafunc, name: str) -> bool:
    """Whether ``name`` is this plugin's fixture for the test, not a team's fixture of the
    same name (a conftest's own ``testbed_cell`` is theirs to parametrize)."""
    defs = getattr(metafunc, "_arg2fixturedefs", {}).get(name) or ()
    return not defs or getattr(defs[-1].func, "__module__", __name__) == __name__


def _generate(metafunc: pytest.Metafunc) -> None:
    from testbed import api
    mark = merged_marker(metafunc.definition, "testbed")
    where = Path(str(metafunc.definition.fspath))
    if mark is None:
        raise pytest.UsageError(f"{where}::{metafunc.definition.name}: testbed_cell needs "
                                f"@pytest.mark.testbed(...) naming the matrix (pytest --markers)")
    t = marker_topology(mark, where)
    cells = api.plan(t)
    check_floor(merged_marker(metafunc.definition, "testbed_floor"), {c.profile.name for c in cells},
                f"{where}::{metafunc.definition.name}")
    params = [pytest.param(_Param(t, c), id=c.id, marks=pytest.mark.attach(c.attachment.value))
              for c in cells]
    metafunc.parametrize("testbed_cell", params, indirect=True)


def check_floor(mark: MergedMark | None, profiles: set[str], where: str) -> None:
    """A ``testbed_floor`` names ``profiles`` of the test's matrix, each with a positive
    number: a misspelt profile would leave the floor unchecked for ever, and a text would
    fail only after the cell was measured."""
    if mark is None:
        return
    names = sorted(profiles)
    if mark.args:
        raise pytest.UsageError(f"{where}: @pytest.mark.testbed_floor takes PROFILE=MINIMUM keywords, "
                                f"not {mark.args[0]!r}")
    for key, v in mark.kwargs.items():
        if key == "namespaces":
            if not isinstance(v, bool):
                raise pytest.UsageError(f"{where}: @pytest.mark.testbed_floor: namespaces: expected True or False")
        elif key not in names:
            raise pytest.UsageError(f"{where}: @pytest.mark.testbed_floor: {key!r} is no profile of the "
                                    f"test's matrix ({', '.join(names)})")
        elif isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise pytest.UsageError(f"{where}: @pytest.mark.testbed_floor: {key}: expected a positive "
                                    f"number (Mbit/s or transactions/s), not {v!r}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # A cell whose mode --attach did not choose is left out rather than skipped: a skipped
    # guest cell would still make the session probe the accelerator and the guest image.
    keep, drop = [], []
    for item in items:
        param = getattr(getattr(item, "callspec", None), "params", {}).get("testbed_cell")
        chosen = param is None or mode_selected(config, param.cell.attachment.value)
        (keep if chosen else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    from testbed import attachments
    modes = {*attachments.names(), "netns"}         # netns: every namespace mode
    for item in items:
        m = item.get_closest_marker("attach")
        if m and (len(m.args) != 1 or m.args[0] not in modes):
            # a misspelt mode would run under --attach all and be skipped under any other
            raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.attach{m.args!r}: expected one mode of "
                                    f"{', '.join(sorted(modes))}")
        if m and m.args and not mode_selected(config, m.args[0]) and "testbed_cell" not in item.fixturenames:
            item.add_marker(pytest.mark.skip(reason=f"attachment {m.args[0]} not selected (--attach)"))


# --------------------------------------------------------------------------- session fixtures

@pytest.fixture(scope="session")
def testbed_accelerator(request: pytest.FixtureRequest):
    """The accelerator the session's guests boot with (``testbed.api.Accelerator``: KVM or
    TCG), found by a probe boot (``--tb-accelerator``). Skips the test when no guest can
    boot here, with the reason; needs root."""
    require_root()
    from testbed.admin import capabilities
    from testbed.errors import CapabilityError
    from testbed.guests import images
    try:
        img = images.ensure()
        return capabilities.choose_accelerator(request.config.getoption("--tb-accelerator"), img.kernel)
    except CapabilityError as e:
        pytest.skip(f"no accelerator: {e}")


@dataclass
class GuestPair:
    """The session's two guests: ``client`` and ``server`` (booted guests), the ``tag`` their
    host objects are named with (``tb-<tag>-...``), ``accelerator``."""

    client: object
    server: object
    tag: str
    run_id: str
    accelerator: object
    state: Path


@pytest.fixture(scope="session")
def testbed_guests(testbed_accelerator) -> Iterator[GuestPair]:
    """Two guests (g1, the client, and g2) booted once per session from the testbed's
    image, or restored in seconds from its snapshot cache; destroyed, with everything they
    used, when the session ends. The NIC under test is hot-plugged per test
    (testbed_cell does it) and unplugged after."""
    from testbed.admin import cleanup
    from testbed.guests import images, virt
    from testbed.records import results
    from testbed.topology.model import GuestSpec
    with contextlib.ExitStack() as stack:
        run_id, tag, state = stack.enter_context(cleanup.owned_fresh_state(results.new_run_id))
        conn = stack.enter_context(virt.connect("qemu:///system"))
        img = images.ensure()
        gs = virt.enter_parallel(stack, [virt.guest(conn, GuestSpec(n, "local"), img, testbed_accelerator, run_id,
                                                    tag, state) for n in ("g1", "g2")], 2)
        virt.map_parallel(lambda g: g.wait_ready(600), gs, 2)
        yield GuestPair(gs[0], gs[1], tag, run_id, testbed_accelerator, state)


class SessionRunWriter:
    """Mixed into the session's results writer: the cells the tests measured become the
    run's recorded matrix (attachments, MTUs, profiles...), so compare and history read the
    run like one of `testbed run`.

    Tests measure the same cell id under different conditions (macvtap's vepa and
    passthrough modes are both ``macvtap-qemu-mtu1500-conn1-tcp_stream``). A run holds one
    outcome per cell id (the index's key, and what compare pairs), so a cell id measured
    again after its first outcome is recorded as ``<id>-t2``, ``-t3``..., its samples too."""

    def _session_id(self, base: str) -> str:
        measuring = self.__dict__.setdefault("tb_measuring", {})
        if base not in measuring:
            k = self.__dict__.setdefault("tb_recorded", {}).get(base, 0)
            measuring[base] = base if k == 0 else f"{base}-t{k + 1}"
        return measuring[base]

    def add_sample(self, rec):
        import dataclasses
        new = self._session_id(rec.cell.id)
        if new != rec.cell.id:
            rec = dataclasses.replace(rec, cell=dataclasses.replace(rec.cell, id=new))
        return super().add_sample(rec)  # type: ignore[misc]

    def add_cell(self, cell, status, reason, converged, summary, *, extra=None):
        from testbed.records.records import CellOutcome
        self.tb_cells = [*getattr(self, "tb_cells", []), cell]
        new = self._session_id(cell.id)
        self.tb_measuring.pop(cell.id)
        self.tb_recorded[cell.id] = self.tb_recorded.get(cell.id, 0) + 1
        if new == cell.id:
            return super().add_cell(cell, status, reason, converged, summary, extra=extra)  # type: ignore[misc]
        return self.add_outcome(CellOutcome.from_dict(json.loads(json.dumps(  # type: ignore[attr-defined]
            {**cell.as_dict(), **(extra or {}), "id": new, "status": status, "reason": reason, "converged": converged,
             "summary": dict(summary)}, default=str))))


def _measured_topology(name: str, cells: list) -> object:
    """The run's topology, built with the model's constructors from the cells measured."""
    from testbed.topology.model import Backend, GuestSpec, HostSpec, Matrix, Repetitions, Topology

    def axis(values):
        return tuple(dict.fromkeys(values))
    matrix = Matrix(attachments=axis(c.attachment for c in cells),
                    backends=axis(c.backend for c in cells) or (Backend.QEMU,),
                    mtus=axis(c.mtu for c in cells), connections=axis(c.connections for c in cells),
                    profiles=axis(c.profile for c in cells), repetitions=Repetitions(),
                    queues=axis(c.queues for c in cells) or (1,))
    return Topology(name=name, source="<pytest>", hosts=(HostSpec("local"),),
                    guests=(GuestSpec("g1", "local"), GuestSpec("g2", "local")), client="g1", server="g2",
                    matrix=matrix)


RUN_KEY = pytest.StashKey[Path]()
INDEX_KEY = pytest.StashKey[str]()
#: fixtures that boot guests: a session with a test using one probes the accelerator first
GUEST_FIXTURES = ("testbed_guests", "testbed_accelerator", "guest_pair", "accelerator")


def _uses_guests(item: pytest.Item) -> bool:
    if any(f in item.fixturenames for f in GUEST_FIXTURES):
        return True
    param = getattr(getattr(item, "callspec", None), "params", {}).get("testbed_cell")
    if param is None:
        return False
    from testbed import attachments
    return attachments.get(param.cell.attachment).guests


@pytest.fixture(scope="session")
def testbed_run(request: pytest.FixtureRequest) -> Iterator[object]:
    """The session's run record: results/<run-id> (or --results DIR, or $TESTBED_RESULTS)
    with this host's environment, the accelerator the guests boot with (probed, as for
    `testbed run`) and the guest image. Every sample testbed_cell measures goes here; it is
    finished (status, counts) and indexed (results/index.sqlite) when the session ends, and
    the session's summary says where it is. `testbed report`, `compare`, `history` and
    `index` read it like a `testbed run` folder. Needs root."""
    require_root()
    from testbed.measure.session import Session
    from testbed.records import results, store
    config = request.config
    wanted = config.getoption("--attach")
    accel, image = None, None
    if any(_uses_guests(item) for item in request.session.items):
        from testbed.guests import images
        try:
            accel = request.getfixturevalue("testbed_accelerator")
            image = images.ensure()
        except pytest.skip.Exception:
            pass            # no guest can boot: the guest tests skip; the rest still measure
    root = config.getoption("tb_results")
    name = "pytest" + ("" if wanted == "all" else "-" + "-".join(m.strip() for m in wanted.split(",")))
    with Session(_measured_topology(name, []), results_dir=Path(root).absolute() if root else None,  # type: ignore[arg-type]
                 lock=False, check_leftovers=False, keep_logs=False) as ses:
        writer_type = type("PytestRunWriter", (SessionRunWriter, results.RunWriter), {})
        writer = ses.open_run(accel, image=image, writer_type=writer_type)
        writer.update(pytest={"args": list(config.invocation_params.args), "attach": wanted})
        config.stash[RUN_KEY] = writer.dir
        yield writer
        cells = getattr(writer, "tb_cells", [])
        if cells:
            writer.update(topology=results.topology_dict(_measured_topology(name, cells)))  # type: ignore[arg-type]
    try:
        # indexed like `testbed run` indexes its runs, so `testbed history` sees it
        with store.open(writer.dir.parent / "index.sqlite") as st:
            st.index_run(writer.dir)
    except Exception as e:      # the record stands without its index entry; the summary says so
        config.stash[INDEX_KEY] = f"not indexed: {e}"


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    # A session that was not root skips every cell and still exits 0: say so where a CI
    # log's reader looks, not only under -rs.
    not_root = [r for r in terminalreporter.stats.get("skipped", ())
                if isinstance(r.longrepr, tuple) and NOT_ROOT in str(r.longrepr[-1])]
    if not_root:
        terminalreporter.write_sep("-", "testbed: nothing measured", yellow=True)
        terminalreporter.write_line(f"{len(not_root)} test(s) skipped: not run as root, and a cell creates "
                                    f"host network objects. Run pytest as root on the host under test.",
                                    yellow=True)
    run_dir = config.stash.get(RUN_KEY, None)
    if run_dir is not None:
        terminalreporter.write_sep("-", "testbed run record")
        terminalreporter.write_line(f"measurements of this session: {run_dir}")
        terminalreporter.write_line(f"  report: testbed report {run_dir} -o report.html")
        if config.stash.get(INDEX_KEY, None):
            terminalreporter.write_line(f"  {config.stash[INDEX_KEY]}", yellow=True)


# --------------------------------------------------------------------------- the cell fixture

@dataclass
class CellUnderTest:
    """One cell of the test's matrix, ready to measure: what ``testbed_cell`` gives.

    Attributes: ``cell`` (``testbed.api.Cell``: ``attachment``, ``backend``, ``mtu``,
    ``connections``, ``profile``, ``pairs``, ``id``), ``id``, ``metric`` (its profile's
    primary metric: ``throughput_mbps`` or ``transactions_per_s``), ``topology`` (what the
    marker made), ``accelerator`` (``kvm``, ``tcg``, or None for a namespace cell), ``floor``
    (the ``testbed_floor`` minimum that applies to this cell here, or None), ``samples``
    (after measure(): the samples the stopping rule counted)."""

    topology: Any
    cell: Any
    run: Any
    guests: GuestPair | None
    floors: Mapping[str, float]
    floor_namespaces: bool
    workdir: Path
    samples: list = field(default_factory=list)
    _stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    _paths: list | None = None

    @property
    def id(self) -> str:
        return self.cell.id

    @property
    def metric(self) -> str:
        return self.cell.profile.pattern.primary_metric

    @property
    def accelerator(self) -> str | None:
        return None if self.guests is None else self.guests.accelerator.value  # type: ignore[attr-defined]

    @property
    def floor(self) -> float | None:
        minimum = self.floors.get(self.cell.profile.name)
        if minimum is None:
            return None
        checked = self.accelerator == "kvm" or (self.guests is None and self.floor_namespaces)
        return float(minimum) if checked else None

    def _plugged(self) -> list:
        """The cell's mode with its endpoints plugged in (once per test): the session's
        guests with the NIC under test hot-plugged, or namespaces the mode makes itself."""
        if self._paths is None:
            from testbed.measure import testpaths
            from testbed.measure.session import claim_tag
            t, c = self.topology, self.cell
            pairs = [(self.guests.client, self.guests.server)] if self.guests is not None else None
            tag = self.guests.tag if self.guests is not None else claim_tag()
            self._paths = self._stack.enter_context(testpaths.pair_paths(
                c.attachment, c.backend, tag, t, pairs, n=c.pairs if pairs is None else 1, max_mtu=max(t.matrix.mtus),
                workdir=self.workdir, queues=c.queues, offloads=t.offloads))
        return self._paths

    def measure(self, *, check: bool = True) -> Any:
        """Measure the cell into the session's run (testbed_run): its warm-ups, then samples
        until the marker's ``repetitions`` are met (one sample by default), through the
        testbed's one cell loop (the noise guard, the host guard, the placement check and
        the cross-checks of `testbed run`). Returns the last counted sample
        (``testbed.api.SampleRecord``: ``ok``, ``status``, ``reason``, ``metrics``, ``cpu``).

        With ``check`` (the default) a failed sample fails the test with its reason, and so
        does a primary metric below the ``testbed_floor`` that applies here."""
        from testbed.analysis import stats
        from testbed.guests import virt
        from testbed.measure import hooks, sampling, window
        from testbed.measure.context import Arm, Context
        t, c = self.topology, self.cell
        paths = self._plugged()
        pids: dict[str, int] = {}
        placement: dict[str, str] = {}
        if self.guests is not None:
            for g in (self.guests.client, self.guests.server):
                placement[g.spec.name] = "local"  # type: ignore[attr-defined]
                if (pid := virt.qemu_pid(g)):  # type: ignore[arg-type]
                    pids[g.spec.name] = pid  # type: ignore[attr-defined]
        mhz = self.run.run.environment.cpu_mhz
        ctx = Context(self.run, window.Watch(t.noise), pids, placement, mhz / 1000 if mhz else None,
                      stats.StoppingRule(t.matrix.repetitions), t.matrix.repetitions.warmup,
                      hooks=hooks.for_topology(t))
        from testbed.admin import cleanup
        with cleanup.measure_lock():
            self.samples = sampling.measure(ctx, [Arm(c, tuple(paths))])[0]
        s = self.samples[-1]
        if check:
            bad = next((x for x in self.samples if not x.ok), None)
            if bad is not None:
                pytest.fail(f"{c.id}: sample failed: {bad.reason}", pytrace=False)
            value, floor = s.metrics.get(self.metric), self.floor
            if floor is not None and (value is None or value < floor):
                pytest.fail(f"{c.id}: {self.metric} {value} is below the floor {floor:g} "
                            f"(testbed_floor, {self.accelerator or 'namespaces'})", pytrace=False)
        return s

    def close(self) -> None:
        self._stack.close()


@pytest.fixture
def testbed_cell(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[CellUnderTest]:
    """One cell of the matrix the test's ``@pytest.mark.testbed`` names (one test item per
    cell, ids like ``[bridge-qemu-mtu1500-conn1-tcp_stream]``). ``testbed_cell.measure()``
    plugs the cell's mode (into the session's two guests, or namespaces for a netns- mode),
    measures it into the session's run (testbed_run) and returns the sample; a failed sample
    fails the test with its reason. Skips with the reason when this host cannot run the
    mode (found by trying) or when no guest can boot. Needs root. See CellUnderTest."""
    param = getattr(request, "param", None)
    if not isinstance(param, _Param):
        raise pytest.UsageError(f"{request.node.nodeid}: testbed_cell needs @pytest.mark.testbed(...)")
    require_root()
    from testbed import attachments
    cell = param.cell
    why = attachments.unavailable(cell.attachment)
    if why:
        pytest.skip(f"attachment {cell.attachment.value} unavailable: {why}")
    guests = None
    if attachments.get(cell.attachment).guests:
        if cell.pairs > 1:
            pytest.skip(f"{cell.id}: the plugin's session boots one guest pair (pairs {cell.pairs}: use testbed run)")
        guests = request.getfixturevalue("testbed_guests")
    run = request.getfixturevalue("testbed_run")
    fm = merged_marker(request.node, "testbed_floor")
    floors = {k: v for k, v in (fm.kwargs if fm else {}).items() if k != "namespaces"}
    cut = CellUnderTest(param.topology, cell, run, guests, floors, bool(fm and fm.kwargs.get("namespaces")),
                        tmp_path)
    try:
        yield cut
    finally:
        cut.close()


# -- older names, deprecated ------------------------------------------------------------------

def _deprecated(old: str, new: str) -> None:
    import warnings
    warnings.warn(f"the {old} fixture is deprecated: use {new} (docs/tests.md); it goes in a later release",
                  DeprecationWarning, stacklevel=3)


@pytest.fixture(scope="session")
def accelerator(testbed_accelerator):
    """Deprecated: use testbed_accelerator (the same object)."""
    _deprecated("accelerator", "testbed_accelerator")
    return testbed_accelerator


@pytest.fixture(scope="session")
def guest_pair(testbed_guests):
    """Deprecated: use testbed_guests (the same object)."""
    _deprecated("guest_pair", "testbed_guests")
    return testbed_guests


@pytest.fixture(scope="session")
def run_writer(testbed_run):
    """Deprecated: use testbed_run (the same object), or testbed_cell to measure."""
    _deprecated("run_writer", "testbed_run")
    return testbed_run


__all__ = ["CellUnderTest", "GuestPair", "PROFILES", "mode_selected", "require_root"]
