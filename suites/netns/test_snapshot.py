"""testbed.host.snapshot on real objects: each change made here must show up in diff(), and only it.

Every object is named tb-<random>, addressed in 198.18.0.0/15, and removed by a finalizer that
runs even when an assertion fails. Root-namespace changes are limited to a veth pair and a
namespace of our own; sysctls, bridges and rulesets are changed inside a namespace we created.
"""
from __future__ import annotations

import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Sequence

import pytest

from testbed import PREFIX, errors
from testbed.errors import CommandError
from testbed.host import proc, snapshot
from testbed.measure.session import claim_tag

pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(os.geteuid() != 0,
                       reason="needs root: creates network namespaces, veth pairs and bridges"),
    pytest.mark.skipif(not proc.ok(["ip", "-V"]), reason="iproute2 `ip` not found"),
]

Undo = Callable[..., None]


def ours(lines: Sequence[str], *names: str) -> list[str]:
    """Lines about our objects and about non-testbed objects; lines about other tb- objects go.

    Other suites may run on this host at the same time, and by house rule everything they
    create is named tb-...; their objects must not fail this suite, anything else must.
    """
    return [line for line in lines
            if (PREFIX not in line and not OVS_DATAPATH.search(line)) or any(n in line for n in names)]


#: the OVS datapath's own device (ovs-netdev for the userspace datapath, ovs-system for the
#: kernel's) and its addresses: ovs-vswitchd adds it with the first bridge of that datapath
#: and removes it with the last, so another worker's tb- bridge coming or going moves it too
OVS_DATAPATH = re.compile(r"\bovs-(netdev|system)\b")


def unique(suffix: str = "") -> str:
    # <= 15 bytes for an ifname; the tag is registered as this process's (testbed.measure.session)
    return f"{PREFIX}{claim_tag()}-s{suffix}"


@pytest.fixture
def undo(request: pytest.FixtureRequest) -> Undo:
    """Register the command that removes what is about to be created; run in reverse at teardown."""
    steps: list[tuple[list[str], str | None]] = []

    def add(argv: list[str], netns: str | None = None) -> None:
        steps.append((argv, netns))

    def run_all() -> None:
        for argv, netns in reversed(steps):
            try:
                proc.run(argv, netns=netns, check=False, timeout=30)   # "already gone" is fine
            except CommandError:
                pass

    request.addfinalizer(run_all)
    return add


@pytest.fixture
def netns(undo: Undo) -> Iterator[str]:
    name = unique()
    undo(["ip", "netns", "del", name])
    proc.run(["ip", "netns", "add", name])
    yield name


# --------------------------------------------------------------------------- stability

def test_two_root_snapshots_in_a_row_are_equal():
    first, second = snapshot.take(), snapshot.take()
    assert ours(snapshot.diff(first, second)) == []


def test_two_namespace_snapshots_in_a_row_are_equal(netns: str):
    proc.run(["ip", "link", "set", "lo", "up"], netns=netns)
    first, second = snapshot.take(netns), snapshot.take(netns)
    assert snapshot.diff(first, second) == []
    assert first == second


def test_json_round_trip_gives_an_equal_snapshot(netns: str):
    proc.run(["ip", "link", "add", "tb-br", "type", "bridge"], netns=netns)
    proc.run(["ip", "addr", "add", "198.18.7.1/24", "dev", "tb-br"], netns=netns)
    for snap in (snapshot.take(), snapshot.take(netns)):
        assert snapshot.Snapshot.from_json(snap.to_json()) == snap


def test_snapshots_take_less_than_two_seconds(netns: str):
    for target in (None, netns):
        start = time.monotonic()
        snapshot.take(target)
        assert time.monotonic() - start < 2.0, f"snapshot of {target or 'root'} too slow"


def test_a_named_snapshot_leaves_host_wide_state_out(netns: str):
    snap = snapshot.take(netns)
    assert snap.netns == netns and snap.netns_names is None and snap.ovs is None


def test_a_missing_namespace_is_an_error_and_is_not_created():
    name = unique()
    with pytest.raises(errors.TestbedError, match="does not exist"):
        snapshot.take(name)
    assert not os.path.exists(f"/run/netns/{name}")


# --------------------------------------------------------------------------- root namespace

def test_veth_pair_in_root_namespace_is_reported_then_gone(undo: Undo):
    base = unique()
    a, b = f"{base}a", f"{base}b"
    before = snapshot.take()
    undo(["ip", "link", "del", a])                 # takes its peer with it
    proc.run(["ip", "link", "add", a, "type", "veth", "peer", "name", b])

    changes = ours(snapshot.diff(before, snapshot.take()), a, b)
    links = sorted(line for line in changes if line.startswith("link "))
    assert [line.split(" mtu ")[0] for line in links] == [f"link added: {a} kind veth",
                                                          f"link added: {b} kind veth"]
    assert f"lower {b}" in links[0] and f"lower {a}" in links[1]
    # The rest is the per-interface sysctl directories the kernel made for each end.
    rest = [line for line in changes if not line.startswith("link ")]
    assert rest and all(line.startswith("sysctl added: ") and (a in line or b in line)
                        for line in rest), rest

    proc.run(["ip", "link", "del", a])
    assert ours(snapshot.diff(before, snapshot.take()), a, b) == []


def test_new_namespace_is_reported_then_gone(undo: Undo):
    name = unique()
    before = snapshot.take()
    undo(["ip", "netns", "del", name])
    proc.run(["ip", "netns", "add", name])
    assert ours(snapshot.diff(before, snapshot.take()), name) == [f"netns added: {name}"]
    proc.run(["ip", "netns", "del", name])
    assert ours(snapshot.diff(before, snapshot.take()), name) == []


# --------------------------------------------------------------------------- inside our namespace

def test_bridge_with_port_and_address_is_reported_then_gone(netns: str):
    br, p0, p1 = "tb-br0", "tb-p0", "tb-p1"
    before = snapshot.take(netns)
    for argv in (["ip", "link", "add", br, "type", "bridge"],
                 ["ip", "link", "add", p0, "type", "veth", "peer", "name", p1],
                 ["ip", "link", "set", p0, "master", br],
                 ["ip", "addr", "add", "198.18.7.1/24", "dev", br],
                 ["ip", "link", "set", p0, "up"],
                 ["ip", "link", "set", br, "up"]):
        proc.run(argv, netns=netns)

    changes = snapshot.diff(before, snapshot.take(netns))
    assert all(br in line or p0 in line or p1 in line for line in changes), changes
    for expected in (f"bridge added: {br} ports {p0}",
                     f"address added: {br} inet 198.18.7.1/24",
                     f"route added: inet table main unicast 198.18.7.0/24 dev {br} proto kernel"
                     " scope link src 198.18.7.1"):
        assert expected in changes
    assert any(line.startswith(f"link added: {br} kind bridge ") for line in changes)
    assert any(line.startswith(f"link added: {p0} kind veth ") and f"master {br}" in line
               for line in changes)

    for dev in (p0, br):
        proc.run(["ip", "link", "del", dev], netns=netns)
    assert snapshot.diff(before, snapshot.take(netns)) == []


def test_sysctl_change_in_our_namespace_is_reported_and_root_is_untouched(netns: str):
    key = "net.ipv4.ip_default_ttl"                 # per namespace, and changes nothing else
    root_before, before = snapshot.take(), snapshot.take(netns)
    value = int(dict(before.sysctls)[key])
    try:
        proc.run(["sysctl", "-q", "-w", f"{key}={value + 1}"], netns=netns)
    except CommandError as e:
        if e.rc == 127 or "exec of" in str(e):
            pytest.skip("procps `sysctl` not found")
        raise
    assert snapshot.diff(before, snapshot.take(netns)) == [f"sysctl {key}: {value} -> {value + 1}"]
    assert ours(snapshot.diff(root_before, snapshot.take()), netns) == []

    proc.run(["sysctl", "-q", "-w", f"{key}={value}"], netns=netns)
    assert snapshot.diff(before, snapshot.take(netns)) == []


_SEND_UDP = ("import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
             "[s.sendto(b'x', ('127.0.0.1', 9)) for _ in range(5)]")


def test_rulesets_are_reported_without_counters_then_gone(netns: str):
    if not (proc.ok(["nft", "--version"]) and proc.ok(["iptables-save", "--version"])):
        pytest.skip("nft or iptables-save not found")
    table = unique()
    proc.run(["ip", "link", "set", "lo", "up"], netns=netns)
    before = snapshot.take(netns)
    for argv in (["nft", "add", "table", "inet", table],
                 ["nft", "add", "chain", "inet", table, "input",
                  "{ type filter hook input priority 0; }"],
                 ["nft", "add", "rule", "inet", table, "input", "ip", "daddr", "127.0.0.1",
                  "counter", "accept"],
                 ["iptables", "-A", "INPUT", "-d", "198.18.7.9/32", "-j", "ACCEPT"]):
        proc.run(argv, netns=netns)

    after = snapshot.take(netns)
    changes = snapshot.diff(before, after)
    assert [line for line in changes if line.startswith("iptables: ")] == [
        "iptables: + *filter", "iptables: + :INPUT ACCEPT", "iptables: + :FORWARD ACCEPT",
        "iptables: + :OUTPUT ACCEPT", "iptables: + -A INPUT -d 198.18.7.9/32 -j ACCEPT",
        "iptables: + COMMIT"]
    assert f"nftables: + table inet {table} {{" in changes
    assert "nftables: + ip daddr 127.0.0.1 counter accept" in changes
    assert all(line.startswith(("iptables: ", "nftables: ")) for line in changes), changes

    # Traffic moves the counters; the snapshot must not see it.
    proc.run([sys.executable, "-c", _SEND_UDP], netns=netns)
    raw = proc.run(["nft", "list", "ruleset"], netns=netns).stdout
    assert re.search(r"counter packets [1-9]", raw), raw
    assert snapshot.diff(after, snapshot.take(netns)) == []

    for argv in (["nft", "delete", "table", "inet", table],
                 ["nft", "delete", "table", "ip", "filter"]):     # what iptables-nft made
        proc.run(argv, netns=netns)
    assert snapshot.diff(before, snapshot.take(netns)) == []


def test_missing_tools_are_recorded_as_unavailable(tmp_path, monkeypatch: pytest.MonkeyPatch):
    present = snapshot.take()
    monkeypatch.setenv("PATH", str(tmp_path))        # no iptables-save, nft or ovs-vsctl here
    missing = snapshot.take()
    assert (missing.iptables, missing.ip6tables, missing.nftables, missing.ovs) == (
        snapshot.UNAVAILABLE,) * 4
    changes = snapshot.diff(present, missing)
    for tool in ("iptables", "ip6tables", "nftables"):
        if getattr(present, tool) != snapshot.UNAVAILABLE:
            assert any(line.startswith(f"{tool}: ") and line.endswith("-> unavailable")
                       for line in changes), changes


# --------------------------------------------------------------------------- Open vSwitch

def test_ovs_without_a_server_is_unavailable(tmp_path):
    snap = snapshot.take(ovs_db=f"unix:{tmp_path}/no-such.sock")
    assert snap.ovs == snapshot.UNAVAILABLE
    assert snapshot.Snapshot.from_json(snap.to_json()).ovs == snapshot.UNAVAILABLE


_SCHEMA = "/usr/share/openvswitch/vswitch.ovsschema"


@pytest.fixture
def ovsdb(tmp_path) -> Iterator[str]:
    """A private ovsdb-server on a socket in tmp_path: real OVSDB, nothing shared with the host."""
    if not (shutil.which("ovsdb-server") and shutil.which("ovs-vsctl") and os.path.exists(_SCHEMA)):
        pytest.skip("ovsdb-server, ovs-vsctl or the vswitch schema not found")
    db, sock = tmp_path / "conf.db", tmp_path / "db.sock"
    proc.run(["ovsdb-tool", "create", db, _SCHEMA])
    argv = ["ovsdb-server", db, f"--remote=punix:{sock}", f"--unixctl={tmp_path}/ctl", "--no-chdir"]
    with proc.background(argv, out_dir=str(tmp_path), name="ovsdb-server") as server:
        deadline = time.monotonic() + 10
        while not proc.ok(["ovs-vsctl", f"--db=unix:{sock}", "--timeout=1", "--no-wait", "init"]):
            if time.monotonic() > deadline or server.popen.poll() is not None:
                pytest.fail(f"private ovsdb-server not answering on {sock} after 10 s: "
                            f"{server.stderr()[-500:]}")
            time.sleep(0.05)
        yield f"unix:{sock}"


def test_ovs_bridge_port_and_options_are_reported_then_gone(ovsdb: str):
    br = unique()
    vx = f"{br}v"
    vsctl = ["ovs-vsctl", f"--db={ovsdb}", "--timeout=5", "--no-wait"]
    before = snapshot.take(ovs_db=ovsdb)
    assert isinstance(before.ovs, tuple)
    proc.run([*vsctl, "add-br", br, "--", "set", "Bridge", br, "datapath_type=netdev",
              "--", "add-port", br, vx, "tag=10",
              "--", "set", "Interface", vx, "type=vxlan", "options:remote_ip=198.18.7.2",
              "options:key=42",
              "--", "set", "Open_vSwitch", ".", "other_config:userspace-tso-enable=true"])

    changes = ours(snapshot.diff(before, snapshot.take(ovs_db=ovsdb)), br, vx)
    assert changes == [
        f"ovs added: Bridge {br} datapath_type=netdev stp_enable=false ports={br},{vx}",
        f"ovs added: Interface {br} type=internal",
        f"ovs added: Interface {vx} type=vxlan options=key=42,remote_ip=198.18.7.2",
        f"ovs added: Port {br} interfaces={br}",
        f"ovs added: Port {vx} tag=10 interfaces={vx}",
        "ovs Open_vSwitch .: other_config - -> userspace-tso-enable=true",
    ]

    proc.run([*vsctl, "del-br", br, "--", "remove", "Open_vSwitch", ".", "other_config",
              "userspace-tso-enable"])
    assert ours(snapshot.diff(before, snapshot.take(ovs_db=ovsdb)), br, vx) == []
