"""testbed.host.net.ovsd and ovs on real daemons: the host's switch (started if nothing runs
it, and left running, as the setup script does), private switches in namespaces, the ovs
attachment's bridge, and what the userspace datapath does with checksum offload.

Everything is tb-<random>-...; after each test `ovs-vsctl list-br` has no bridge of its tag
and the switch's global other_config is as it was.
"""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from testbed import errors
from testbed.attachments import ovs as ovs_mode
from testbed.attachments.ovs import namespaces as ovsns
from testbed.guests import render
from testbed.host import proc
from testbed.host.net import links, netns, ovs, ovsd
from testbed.measure import transfer as xfer
from testbed.measure.session import claim_tag
from testbed.topology.model import Attachment, Backend, Profile

pytestmark = [
    pytest.mark.netns,
    pytest.mark.attach("ovs"),
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: starts OVS daemons, creates bridges"),
    *[pytest.mark.skipif(shutil.which(tool) is None, reason=f"`{tool}` not found ({pkg})")
      for tool, pkg in (("ovs-vsctl", "openvswitch-switch"), ("ovs-vswitchd", "openvswitch-switch"),
                        ("ip", "iproute2"), ("ss", "iproute2"), ("ethtool", "ethtool"),
                        ("netperf", "netperf, Debian non-free"),
                        ("netserver", "netperf, Debian non-free"))],
]

STREAM = Profile(name="tcp_stream", duration_s=2)


def new_tag() -> str:
    return claim_tag()          # registered as this process's (testbed.measure.session)


def global_config(sw: ovsd.Ovs) -> str:
    return sw.vsctl("get", "Open_vSwitch", ".", "other_config", wait=False).strip()


def bridges(sw: ovsd.Ovs, tag: str) -> list[str]:
    return [b for b in sw.vsctl("list-br", wait=False).split() if b.startswith(f"tb-{tag}-")]


def links_of(tag: str) -> list[str]:
    return [ln for ln in proc.run(["ip", "-o", "link"]).stdout.splitlines() if f"tb-{tag}-" in ln]


@pytest.fixture(scope="module")
def switch() -> ovsd.Ovs:
    try:
        return ovsd.ensure_running()
    except (errors.CapabilityError, errors.TestbedError) as e:
        pytest.skip(f"ovs-vswitchd not startable: {e}")


@pytest.fixture
def private_switch(tmp_path: Path, request: pytest.FixtureRequest):
    """A private ovsdb-server + ovs-vswitchd in a namespace of its own; ``tso`` by indirect
    parametrization (default on)."""
    tso = getattr(request, "param", True)
    ns = f"tb-{new_tag()}-s"
    proc.run(["ip", "netns", "add", ns])
    try:
        with ovsd.private(ns, tmp_path / "ovs", userspace_tso=tso) as sw:
            yield sw
    except (errors.CapabilityError, errors.TestbedError) as e:
        pytest.skip(f"private ovs-vswitchd not startable: {e}")
    finally:
        proc.run(["ip", "netns", "delete", ns], check=False)


# --------------------------------------------------------------------------- daemons

def test_ensure_running_is_idempotent(switch: ovsd.Ovs):
    start = time.monotonic()
    again = ovsd.ensure_running()
    assert time.monotonic() - start < 5
    assert again.started == () and again.db == switch.db == ovsd.default_db()
    assert ovsd.vswitchd_pids(switch.db), "no ovs-vswitchd serves the default database"
    # the datapath report follows the kernel module, and bridges get it
    expected = "system" if Path("/sys/module/openvswitch").is_dir() else "netdev"
    assert ovsd.datapath() == expected == ovs.ovs_datapath(switch)


def _alive(pid: int) -> bool:
    # a detached daemon that exited may linger as a zombie of PID 1: no cmdline then
    try:
        return bool(Path(f"/proc/{pid}/cmdline").read_bytes())
    except OSError:
        return False


@pytest.mark.alone      # a second ovs-vswitchd, which the host guard of runs beside it would see
def test_ensure_running_starts_a_switch_from_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The cold start the setup script and CI rely on, on paths of its own so the host's
    switch is not stopped for it: database created, both daemons detached, userspace TSO
    configured before ovs-vswitchd starts when there is no kernel datapath."""
    host_switches = ovsd.vswitchd_pids(ovsd.default_db())
    base = tmp_path / "o"
    dirs = {"RUNDIR": base / "run", "DBDIR": base / "etc", "LOGDIR": base / "log"}
    for attr, path in dirs.items():
        monkeypatch.setattr(ovsd, attr, path)
    db = f"unix:{dirs['RUNDIR']}/db.sock"
    pids = {}
    try:
        first = ovsd.ensure_running()
        pids = {d: int((dirs["RUNDIR"] / f"{d}.pid").read_text()) for d in first.started}
        assert first.started == ("ovsdb-server", "ovs-vswitchd") and first.db == db
        assert (dirs["DBDIR"] / "conf.db").is_file()
        assert (dirs["LOGDIR"] / "ovs-vswitchd.log").is_file()
        assert (dirs["RUNDIR"] / f"ovs-vswitchd.{pids['ovs-vswitchd']}.ctl").exists()
        assert ovs.userspace_tso(first) == (ovsd.datapath() == "netdev")
        second = ovsd.ensure_running()
        assert second.started == () and second.db == db
        assert ovsd.vswitchd_pids(db) == [pids["ovs-vswitchd"]]
    finally:
        for daemon, pid in pids.items():
            proc.run(["ovs-appctl", "-t", str(dirs["RUNDIR"] / f"{daemon}.{pid}.ctl"), "exit"],
                     check=False)
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids.values())
    monkeypatch.undo()
    assert ovsd.vswitchd_pids(ovsd.default_db()) == host_switches


def test_a_private_switch_is_separate_and_stops_on_exit(switch: ovsd.Ovs, tmp_path: Path):
    ns = f"tb-{new_tag()}-s"
    work = tmp_path / "ovs"
    proc.run(["ip", "netns", "add", ns])
    try:
        with ovsd.private(ns, work) as priv:
            assert priv.db == f"unix:{work.resolve()}/db.sock" and priv.netns == ns
            pids = ovsd.vswitchd_pids(priv.db)
            assert len(pids) == 1 and pids != ovsd.vswitchd_pids(switch.db)
            # its namespace is where ovs-vswitchd runs
            assert os.readlink(f"/proc/{pids[0]}/ns/net") == proc.run(
                ["readlink", "/proc/self/ns/net"], netns=ns).stdout.strip()
            assert ovs.userspace_tso(priv) and ovs.ovs_datapath(priv) == "netdev"
            with ovs.bridge(f"tb-{ns[3:7]}-pb", priv) as br:
                assert priv.vsctl("list-br", wait=False).split() == [br]
                assert br not in switch.vsctl("list-br", wait=False).split()
                # its internal port is created in the private namespace, not the host's
                assert not links.exists(br)
                proc.run(["ip", "link", "show", br], netns=ns)
        assert ovsd.vswitchd_pids(priv.db) == []
        assert not (work / "db.sock").exists()
        assert not (ovsd.RUNDIR / f"ovs-vswitchd.{pids[0]}.ctl").exists(), \
            "the private daemon used the host's run directory"
    finally:
        proc.run(["ip", "netns", "delete", ns], check=False)


def test_a_private_switch_refuses_foreign_namespaces(tmp_path: Path):
    with pytest.raises(errors.TestbedError, match="not a tb- namespace"):
        with ovsd.private("default", tmp_path):
            pass


# --------------------------------------------------------------------------- ovs attachment

def test_segment_makes_an_isolated_bridge_and_restores_the_switch(switch: ovsd.Ovs):
    tag = new_tag()
    before = global_config(switch)
    with ovs_mode.segment(tag, 1500) as seg:
        assert seg.name == f"tb-{tag}-ovs" and seg.attachment == Attachment("ovs")
        dp = ovs.ovs_datapath(switch)
        assert seg.datapath == f"ovs-{dp}"
        assert switch.vsctl("get", "Bridge", seg.name, "datapath_type", wait=False).strip() == dp
        # no uplink: the bridge's only port is its own internal one, which has no address
        assert switch.vsctl("list-ports", seg.name, wait=False).split() == []
        if links.exists(seg.name):
            assert "inet" not in proc.run(["ip", "-o", "addr", "show", "dev", seg.name]).stdout
        xml = render.interface_xml(seg.nic(f"tb-{tag}-t0", "52:54:00:12:34:56", Backend.QEMU, 1500))
        assert "<interface type='bridge'>" in xml and f"<source bridge='{seg.name}'/>" in xml
        assert "<virtualport type='openvswitch'/>" in xml and f"<target dev='tb-{tag}-t0'/>" in xml
        with pytest.raises(errors.TestbedError):
            seg.nic("vnet0", "52:54:00:12:34:56", Backend.QEMU, 1500)
    assert bridges(switch, tag) == [] and links_of(tag) == []
    assert global_config(switch) == before


def test_set_mtu_reaches_the_taps_through_ovs(switch: ovsd.Ovs):
    """Taps added the way libvirt's openvswitch virtualport adds them."""
    tag = new_tag()
    taps = [f"tb-{tag}-t0", f"tb-{tag}-t1"]
    with ovs_mode.segment(tag, 1500) as seg:
        try:
            for t in taps:
                proc.run(["ip", "tuntap", "add", "dev", t, "mode", "tap"])
                links.no_ipv6(t)
                switch.vsctl("add-port", seg.name, t)
            for mtu in (9000, 1400, 1500):
                seg.set_mtu(mtu, taps)
                for t in taps:
                    assert links.mtu_of(t) == mtu
                    assert switch.vsctl("get", "Interface", t, "mtu_request", wait=False).strip() == str(mtu)
            assert seg.hops(taps) == taps
        finally:
            for t in taps:              # as libvirt detaches: the port first, then the device
                switch.vsctl("--if-exists", "del-port", seg.name, t)
                links.delete(t)
    assert bridges(switch, tag) == [] and links_of(tag) == []


def test_a_bridge_is_removed_when_the_block_fails(switch: ovsd.Ovs):
    tag = new_tag()
    with pytest.raises(RuntimeError):
        with ovs_mode.segment(tag, 1500) as seg:
            assert bridges(switch, tag) == [seg.name]
            raise RuntimeError("boom")
    assert bridges(switch, tag) == [] and links_of(tag) == []


def test_bridge_refuses_names_that_are_not_ours(switch: ovsd.Ovs):
    with pytest.raises(errors.TestbedError, match="not a tb- object"):
        with ovs.bridge("br-int", switch):
            pass


@pytest.mark.parametrize("private_switch", [False], indirect=True, ids=["no_tso"])
def test_segment_refuses_a_userspace_switch_without_tso(private_switch: ovsd.Ovs):
    tag = new_tag()
    with pytest.raises(errors.CapabilityError, match="userspace-tso-enable"):
        with ovs_mode.segment(tag, 1500, switch=private_switch):
            pass
    with ovs_mode.segment(tag, 1500, switch=private_switch, tso=False) as seg:
        assert seg.datapath == "ovs-netdev"
    assert private_switch.vsctl("list-br", wait=False).split() == []


# --------------------------------------------------------------------------- userspace datapath

@pytest.mark.parametrize("private_switch", [False], indirect=True, ids=["no_tso"])
def test_userspace_datapath_without_tso_needs_tx_checksum_off(private_switch: ovsd.Ovs, tmp_path: Path):
    """What DESIGN.md says about this machine, measured: without userspace TSO, TCP through
    the netdev datapath works once the senders stop offloading checksums, and not before."""
    tag = new_tag()
    with ovsns.ovs_veth(tag, switch=private_switch, tso=False, offloads=netns.Offloads(tx=False)) as conn:
        assert all(ep.offload("tx") == "off" for ep in (conn.a, conn.b))
        tr = xfer.netperf(conn, STREAM, out_dir=str(tmp_path))
        assert tr.result.ok, tr.result.reason
        assert tr.result.metrics["throughput_mbps"] > 0
        for hop, moved in zip(conn.hops, tr.hop_bytes):
            assert moved >= tr.result.metrics["bytes"], hop
    tag = new_tag()
    with ovsns.ovs_veth(tag, switch=private_switch, tso=False, offloads=netns.Offloads(tx=True)) as conn:
        assert conn.a.offload("tx") == "on"
        tr = xfer.netperf(conn, STREAM, out_dir=str(tmp_path), timeout_s=12)
        assert not tr.result.ok, f"TCP passed with tx checksum offload on: {tr.result.metrics}"
        assert tr.hop_bytes[0] > 0, "nothing left namespace a"
    assert private_switch.vsctl("list-br", wait=False).split() == []


def test_userspace_datapath_with_tso_passes_tcp_with_offloads_on(private_switch: ovsd.Ovs, tmp_path: Path):
    tag = new_tag()
    with ovsns.ovs_veth(tag, switch=private_switch, offloads=netns.Offloads.all(True)) as conn:
        assert conn.datapath == "ovs-netdev" and conn.a.offload("tx") == "on"
        tr = xfer.netperf(conn, STREAM, out_dir=str(tmp_path))
        assert tr.result.ok, tr.result.reason
        for hop, moved in zip(conn.hops, tr.hop_bytes):
            assert moved >= tr.result.metrics["bytes"], hop
    assert private_switch.vsctl("list-br", wait=False).split() == []


def test_internal_ports_of_a_private_switch_move_into_namespaces(private_switch: ovsd.Ovs, tmp_path: Path):
    tag = new_tag()
    with ovsns.ovs_internal(tag, switch=private_switch) as conn:
        tr = xfer.netperf(conn, STREAM, out_dir=str(tmp_path))
        assert tr.result.ok, tr.result.reason
        assert proc.run(["ip", "-o", "link", "show", f"tb-{tag}-ia"], netns=conn.a.netns).stdout
    assert private_switch.vsctl("list-br", wait=False).split() == []
    assert links_of(tag) == []
    assert f"tb-{tag}-" not in proc.run(["ip", "-o", "link"], netns=private_switch.netns).stdout


@pytest.mark.parametrize("private_switch", [False], indirect=True, ids=["no_tso"])
def test_tso_switched_on_in_a_running_switch_breaks_tcp(private_switch: ovsd.Ovs, tmp_path: Path):
    """Why ovs.py never sets userspace-tso-enable at runtime: once the switch has forwarded
    traffic, turning it on stops TCP on its netdev ports, even with checksum offload off,
    until ovs-vswitchd restarts. If a newer OVS passes this, that rule can be revisited."""
    def transfer(timeout_s: float | None = None) -> xfer.Transfer:
        with ovsns.ovs_veth(new_tag(), switch=private_switch, tso=False,
                            offloads=netns.Offloads(tx=False)) as conn:
            return xfer.netperf(conn, STREAM, out_dir=str(tmp_path), timeout_s=timeout_s)

    assert transfer().result.ok
    private_switch.vsctl("set", "Open_vSwitch", ".", f"other_config:{ovs.TSO_KEY}=true")
    assert not transfer(timeout_s=12).result.ok


@pytest.mark.alone      # a dead run's bridge, which runs beside it would refuse to start by
def test_cleanup_finds_and_removes_a_dead_runs_bridge_on_the_switch(switch: ovsd.Ovs):
    # The ovs mode declares its bridges as a kind of object it leaves (Mode.object_kinds):
    # cleanup finds one whose run is gone and removes it, and leaves a live run's alone.
    from testbed.admin import cleanup
    from testbed.measure.session import claim_tag, release_tag
    dead_tag, live_tag = claim_tag(), claim_tag()
    dead, live = f"tb-{dead_tag}-ovs", f"tb-{live_tag}-ovs"
    try:
        with ovs.bridge(dead, switch, 1500), ovs.bridge(live, switch, 1500):
            release_tag(dead_tag)                      # its owner is gone
            found = cleanup.find()
            assert dead in found.kinds()["ovs_bridges"] and live not in found.kinds()["ovs_bridges"]
            assert dead in found.describe()
            cleanup.remove(cleanup.Leftovers(objects={"ovs_bridges": [dead]}))
            assert dead not in ovs.tb_bridges() and live in ovs.tb_bridges()
    finally:
        release_tag(live_tag)
    assert dead not in ovs.tb_bridges() and live not in ovs.tb_bridges()
