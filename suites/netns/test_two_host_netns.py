"""Two hosts emulated on one machine, joined by VXLAN (testbed.host.net.vxlan), with namespace
endpoints standing in for guests: each endpoint's host-side veth end is created in the root
namespace and moved into its host's namespace, as a guest's tap is.

Measured facts: netperf TCP_STREAM crosses the tunnel, a don't-fragment ping of the full
inner MTU passes, the wire carried only UDP/4789 frames, an inner MTU that does not fit the
underlay is refused before anything exists, and the root namespace is as it was.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Iterator

import pytest

from testbed import errors
from testbed.admin import capabilities, cleanup
from testbed.host import proc
from testbed.host.net import vxlan
from testbed.measure.session import claim_tag
from testbed.tools.netperf import NetperfDriver
from testbed.topology.model import Profile, TunnelSpec, object_name

pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: creates namespaces and links"),
    *[pytest.mark.skipif(shutil.which(tool) is None, reason=f"`{tool}` not found ({pkg})")
      for tool, pkg in (("ip", "iproute2"), ("tcpdump", "tcpdump"), ("ethtool", "ethtool"),
                        ("netperf", "netperf, Debian non-free"), ("netserver", "netperf, Debian non-free"))],
]

# each host a Linux bridge (bridge-vxlan's emulated hosts) or a private OVS switch (ovs-vxlan's)
SWITCHES = [pytest.param(False, marks=pytest.mark.attach("bridge-vxlan"), id="bridge-vxlan"),
            pytest.param(True, marks=pytest.mark.attach("ovs-vxlan"), id="ovs-vxlan")]


def _ip(*args: str, netns: str | None = None, check: bool = True) -> proc.Completed:
    return proc.run(["ip", *args], netns=netns, timeout=30, check=check)


def ours(tag: str) -> list[str]:
    found = [ln for ln in _ip("-o", "link").stdout.splitlines() if f"tb-{tag}-" in ln]
    return found + [n for n in _ip("netns", "list").stdout.split() if n.startswith(f"tb-{tag}-")]


@contextlib.contextmanager
def endpoint(f: vxlan.Fabric, side: vxlan.HostSide, tag: str, i: int, addr: str) -> Iterator[str]:
    """A namespace hung off ``side`` by a veth pair whose host end is moved into the host."""
    ns, inner, outer = object_name(tag, "e", str(i)), object_name(tag, "q", str(i)), object_name(tag, "p", str(i))
    with contextlib.ExitStack() as stack:
        _ip("netns", "add", ns)
        stack.callback(_ip, "netns", "delete", ns, check=False)
        proc.run(["sysctl", "-q", "-w", "net.ipv6.conf.default.disable_ipv6=1"], netns=ns, timeout=10)
        _ip("link", "add", outer, "type", "veth", "peer", "name", inner, "netns", ns)
        stack.callback(_ip, "link", "del", inner, netns=ns, check=False)
        stack.enter_context(vxlan.port(f, side, outer))
        if side.switch is not None:
            # Like the guests' devices on ovs-vxlan: complete checksums, no TSO frames.
            proc.run(["ethtool", "-K", inner, "tx", "off", "tso", "off"], netns=ns, timeout=10)
        _ip("addr", "add", f"{addr}/24", "dev", inner, netns=ns)
        _ip("link", "set", "dev", inner, "mtu", "1500", "up", netns=ns)
        yield ns


@pytest.mark.parametrize("private_switch", [False, True], ids=["linux-bridge", "private-ovs"])
def test_tunnel_carries_tcp_and_only_vxlan_crosses_the_wire(private_switch, tmp_path):
    ok, why = (capabilities.vxlan() if not private_switch else (True, ""))
    if not ok:
        pytest.skip(f"vxlan unavailable: {why}")
    tag = claim_tag()
    before = cleanup.Baseline.take()      # other tests' runs beside this one are left out
    tunnel = TunnelSpec(vni=4242, underlay_mtu=1550)
    with vxlan.fabric(private_switch, tag, ("ha", "hb"), tunnel, tmp_path / "ovs", 1500) as f, \
            endpoint(f, f.hosts[0], tag, 0, "198.18.77.1") as ns_a, \
            endpoint(f, f.hosts[1], tag, 1, "198.18.77.2") as ns_b:
        # The datapath lives in the host namespaces: the root namespace has none of it.
        assert not [ln for ln in _ip("-o", "link").stdout.splitlines() if f"tb-{tag}-" in ln]
        with vxlan.capture(f.hosts[0].netns, f.hosts[0].wire, tmp_path / "wire.pcap") as pcap:
            # The full inner MTU crosses unfragmented, in both directions.
            res = proc.run(["ping", "-n", "-M", "do", "-s", "1472", "-c", "2", "-i", "0.2", "-W", "3",
                            "198.18.77.2"], netns=ns_a, timeout=20, check=False)
            assert res.rc == 0, res.stdout + res.stderr
            drv = NetperfDriver()
            with proc.background(["netserver", "-D", "-p", "12865"], out_dir=str(tmp_path), name="netserver",
                                 netns=ns_b):
                for _ in range(50):
                    if proc.run(["ss", "-Hltn", "sport = :12865"], netns=ns_b, timeout=10).stdout.strip():
                        break
                    time.sleep(0.1)
                p = Profile(name="tcp_stream", message_size=16384, duration_s=2)
                out = proc.run(drv.client_argv(p, "198.18.77.2", port=12865), netns=ns_a, timeout=30, check=False)
            r = drv.parse(out.stdout, out.stderr, out.rc)
            assert r.ok, r.reason
            assert r.metrics["throughput_mbps"] > 1
        total, other = vxlan.read_capture(pcap, tunnel.udp_port)
        # Every TCP segment netperf sent crossed as a VXLAN frame, and nothing else did.
        assert total > 100
        assert other == [], other[:5]
        # VNI and port are the topology's.
        shown = proc.run(["tcpdump", "-n", "-c", "1", "-r", str(pcap), "udp dst port 4789"],
                         timeout=30).stdout
        assert "vni 4242" in shown, shown
    assert ours(tag) == []
    assert before.changes() == []


def test_inner_mtu_that_does_not_fit_is_refused_before_anything_exists(tmp_path):
    tag = claim_tag()
    with pytest.raises(errors.TestbedError, match=r"1500 \+ 50 bytes of VXLAN-over-IPv4 overhead"):
        with vxlan.fabric(False, tag, ("ha", "hb"), TunnelSpec(underlay_mtu=1500),
                          tmp_path, 1500):
            pass
    assert ours(tag) == []


def test_underlay_df_check_fails_when_the_wire_is_too_small(tmp_path):
    """The don't-fragment check across the underlay sees a wire narrower than promised."""
    tag = claim_tag()
    with vxlan.fabric(False, tag, ("ha", "hb"), TunnelSpec(underlay_mtu=1550),
                      tmp_path, 1500) as f:
        assert f.df_check(1500) is None
        _ip("link", "set", "dev", f.hosts[1].wire, "mtu", "1500", netns=f.hosts[1].netns)
        why = f.df_check(1500)
        assert why and "underlay DF check" in why
    assert ours(tag) == []


@pytest.mark.alone      # a dead run's namespace, which runs beside it would refuse to start by
def test_cleanup_stops_a_dead_runs_private_switches(tmp_path):
    """After a SIGKILL the private OVS daemons of an emulated host keep running in their
    namespace; `testbed cleanup` stops them before it deletes the namespace."""
    from testbed.admin import cleanup
    from testbed.host.net import ovsd
    if shutil.which("ovs-vswitchd") is None:
        pytest.skip("`ovs-vswitchd` not found (openvswitch-switch)")
    tag = claim_tag()
    ns = object_name(tag, "h", "a")
    _ip("netns", "add", ns)
    stack = contextlib.ExitStack()
    try:
        sw = stack.enter_context(ovsd.private(ns, tmp_path / "ovs"))
        pids = [int(p) for p in _ip("netns", "pids", ns).stdout.split()]
        assert len(pids) >= 2 and ovsd.vswitchd_pids(sw.db)
        # As a dead run leaves it: nobody will exit the context; cleanup gets the namespace.
        cleanup.remove(cleanup.Leftovers(netns=[ns]))
        assert not any(proc.running(p) for p in pids)
        assert ns not in _ip("netns", "list").stdout.split()
    finally:
        with contextlib.suppress(Exception):
            stack.close()
        _ip("netns", "delete", ns, check=False)
    assert ours(tag) == []
