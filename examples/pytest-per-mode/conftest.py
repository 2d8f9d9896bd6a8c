"""Per-attachment-mode network tests for a team's own repository: copy this file and
test_attachments.py into its tests folder and edit the matrix below.

The testbed's pytest plugin comes with the testbed package (a pytest11 entry point, so
installing the package is enough) and provides:
  --attach MODES   which modes to test: bridge, ovs, macvtap, netns, or all (comma list)
  guest_pair       two guests booted once per session (later sessions restore them from
                   snapshots in seconds); each test hot-plugs the NIC under test
  run_writer       the session's run record, results/<run-id> (or --results DIR), which
                   `testbed report`, `compare` and `history` read like a `testbed run`
This file turns --attach and the matrix into test ids such as
``test_guests[bridge-qemu-mtu1500-conn1-tcp_stream]`` and plugs each cell's path.

    pytest tests/ --attach bridge           # one mode
    pytest tests/ --attach bridge,ovs       # two
    pytest tests/ --attach netns            # no VMs: the host's namespace datapath only
"""
from __future__ import annotations

from collections.abc import Iterator

import pytest

from testbed import attachments
from testbed.measure import testpaths
from testbed.measure.session import claim_tag
from testbed.pytest_plugin import require_root
from testbed.topology.model import Attachment, Backend, Cell, Pattern, Profile

# ---------------------------------------------------------------- the team's matrix
GUEST_MODES = ("bridge", "ovs", "macvtap")       # guest NIC on the host's datapath
NAMESPACE_MODES = ("netns-veth",)                # --attach netns: no VMs, a reference
MTUS = (1500,)
PROFILES = (
    Profile("tcp_stream", pattern=Pattern.STREAM, message_size=16384, duration_s=5),
    Profile("tcp_rr", pattern=Pattern.RR, message_size=1, response_size=1, duration_s=5),
)
GUEST_SUBNET = "198.18.0.0/24"        # the range set aside for benchmarking; isolated segments only
NAMESPACE_SUBNET = "198.18.252.0/30"


def _option_name(mode: str) -> str:
    """What --attach calls a mode: namespace modes are selected together as `netns`."""
    return "netns" if mode.startswith("netns-") else mode


def _wanted(config: pytest.Config) -> set[str]:
    return {m.strip() for m in config.getoption("--attach").split(",") if m.strip()}


def pytest_configure(config: pytest.Config) -> None:
    # a typo in --attach is bad input, refused before anything is collected or created
    known = {_option_name(m) for m in GUEST_MODES + NAMESPACE_MODES} | {"all"}
    wanted = _wanted(config)
    if not wanted or wanted - known:
        raise pytest.UsageError(f"--attach {config.getoption('--attach')}: expected a comma list of "
                                f"{', '.join(sorted(known))}")


def _selected(config: pytest.Config, modes: tuple[str, ...]) -> list[str]:
    wanted = _wanted(config)
    return [m for m in modes if "all" in wanted or _option_name(m) in wanted]


def _cells(modes: list[str]) -> list:
    cells = [Cell(Attachment(m), Backend.QEMU, mtu, 1, p) for m in modes for mtu in MTUS for p in PROFILES]
    return [pytest.param(c, id=c.id, marks=pytest.mark.attach(_option_name(c.attachment.value)))
            for c in cells]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    for name, modes in (("guest_cell", GUEST_MODES), ("ns_cell", NAMESPACE_MODES)):
        if name in metafunc.fixturenames:
            chosen = _selected(metafunc.config, modes)
            if chosen:
                metafunc.parametrize(name, _cells(chosen))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # A test whose modes --attach did not select is left out rather than skipped: a skipped
    # guest test would still make the session probe the accelerator and the guest image.
    keep, drop = [], []
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        unselected = any(n in item.fixturenames and n not in params for n in ("guest_cell", "ns_cell"))
        (drop if unselected else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def _require(mode: Attachment) -> None:
    why = attachments.unavailable(mode)         # found by trying, on this host
    if why:
        pytest.skip(f"attachment {mode.value} unavailable: {why}")


@pytest.fixture
def guest_path(guest_pair, guest_cell: Cell) -> Iterator[object]:
    """The cell's mode with a NIC hot-plugged into each booted guest; unplugged after."""
    _require(guest_cell.attachment)
    gp = guest_pair
    with testpaths.mode(guest_cell.attachment, guest_cell.backend, gp.tag, gp.client, gp.server, GUEST_SUBNET,
                     max(MTUS)) as path:
        yield path


@pytest.fixture
def ns_path(ns_cell: Cell, tmp_path) -> Iterator[object]:
    """Two tb- namespaces joined the mode's way, removed after the test."""
    require_root()
    _require(ns_cell.attachment)
    with testpaths.own_endpoints_path(ns_cell.attachment, claim_tag(), NAMESPACE_SUBNET, max(MTUS),
                                   str(tmp_path)) as path:
        yield path
