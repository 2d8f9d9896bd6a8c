"""testbed.host.executor and testbed.host.net.ops on real namespaces and links: one executor per
place a command runs, and link operations that go through pyroute2 locally and in a
namespace. Every fact is read back a second way (pyroute2 directly, `ip -j`, /proc), and
each test checks nothing with its tag is left behind.
"""
from __future__ import annotations

import json
import os
import shutil
import time

import pytest

from testbed import errors
from testbed.errors import CommandError
from testbed.guests.guest import Agent
from testbed.host import nsagent, proc, remote
from testbed.host.executor import Executor, Local, Netns
from testbed.host.net import ops
from testbed.measure.session import claim_tag
from testbed.topology.model import HostSpec, Offloads

pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: creates namespaces and veths"),
    *[pytest.mark.skipif(shutil.which(tool) is None, reason=f"`{tool}` not found ({pkg})")
      for tool, pkg in (("ip", "iproute2"), ("ethtool", "ethtool"))],
]


def new_tag() -> str:
    return claim_tag()          # registered as this process's: runs beside the test leave its objects alone


def leftovers(tag: str) -> list[str]:
    mark = f"tb-{tag}-"
    links = [ln for ln in proc.run(["ip", "-o", "link"]).stdout.splitlines() if mark in ln]
    spaces = [n for n in proc.run(["ip", "netns", "list"]).stdout.split() if n.startswith(mark)]
    return links + spaces


def ip_j(netns: str | None, dev: str) -> dict:
    return json.loads(proc.run(["ip", "-j", "link", "show", "dev", dev], netns=netns).stdout)[0]


def test_every_runner_is_an_executor(tmp_path):
    assert isinstance(Local(), Executor)
    assert isinstance(Netns("tb-none"), Executor)
    assert isinstance(nsagent.NsAgent("tb-none", str(tmp_path)), Executor)
    assert isinstance(remote.Shell(HostSpec(name="h")), Executor)
    assert isinstance(Agent(None, "g"), Executor)   # type: ignore[arg-type]


def test_a_namespace_executor_makes_a_veth_and_sets_its_mtu():
    tag = new_tag()
    a, b = f"tb-{tag}-a", f"tb-{tag}-b"
    va, vb = f"tb-{tag}-va", f"tb-{tag}-vb"
    with ops.namespace(a) as ns_a, ops.namespace(b) as ns_b:
        links = ops.on(ns_a)
        assert isinstance(links, ops.Netlink)        # pyroute2, not `ip`
        links.add_veth(va, vb, mtu=1400, peer_netns=b)
        ops.set_mtu(ns_a, va, 1280)
        ops.on(ns_b).set_up(vb)
        # pyroute2 in the namespace, and `ip -j` run there, agree with what was asked.
        with ops.iproute(a) as ipr:
            got = ipr.get_links(ipr.link_lookup(ifname=va)[0])[0]
            assert got.get("IFLA_MTU") == 1280
        assert ip_j(a, va)["mtu"] == 1280
        assert ip_j(b, vb)["mtu"] == 1400
        assert "UP" in ip_j(b, vb)["flags"]
        assert ops.on(ns_b).mtu_of(vb) == 1400
        # The root namespace holds none of it.
        assert not [ln for ln in proc.run(["ip", "-o", "link"]).stdout.splitlines() if f"tb-{tag}-v" in ln]
        # Namespace defaults: loopback up, IPv6 off (read through the namespace's own /proc).
        assert "UP" in ip_j(a, "lo")["flags"]
        assert ns_a.read_file("/proc/sys/net/ipv6/conf/all/disable_ipv6").strip() == "1"
        # A packet moves the counters that ops.wire reads; /sys in the namespace agrees.
        ops.on(ns_a).add_address(va, "198.18.99.1/30")
        ops.on(ns_a).set_up(va)
        ops.on(ns_b).add_address(vb, "198.18.99.2/30")
        ns_a.run(["ping", "-n", "-c", "3", "-i", "0.2", "-W", "2", "198.18.99.2"], timeout=20)
        w = ops.on(ns_b).wire(vb)
        assert w.rx_packets >= 3
        assert int(ns_b.read_file(f"/sys/class/net/{vb}/statistics/rx_packets")) >= w.rx_packets
    assert leftovers(tag) == []


def test_namespace_files_are_the_namespaces_own():
    tag = new_tag()
    dev = f"tb-{tag}-d0"
    with ops.namespace(f"tb-{tag}-a") as ns:
        ops.on(ns).add_veth(dev, f"tb-{tag}-d1")
        path = f"/proc/sys/net/ipv6/conf/{dev}/disable_ipv6"
        ns.write_file(path, "1")
        assert ns.read_file(path).strip() == "1"
        assert not os.path.exists(path)              # the root namespace has no such link
        ops.no_ipv6(ns, f"tb-{tag}-d1")
        assert ns.run(["sysctl", "-n", f"net.ipv6.conf.tb-{tag}-d1.disable_ipv6"]).stdout.strip() == "1"
    assert leftovers(tag) == []


def test_processes_in_a_namespace_are_waited_for_and_killed(tmp_path):
    tag = new_tag()
    with ops.namespace(f"tb-{tag}-a") as ns:
        pid = ns.spawn(["sh", "-c", "cat /proc/net/dev; echo done >&2"])
        res = ns.wait(pid, ["sh"], timeout=10)
        assert res.rc == 0 and "lo:" in res.stdout and res.stderr.strip() == "done"
        assert f"tb-{tag}" not in res.stdout
        pid = ns.spawn(["sleep", "60"])
        assert ns.alive(pid)
        start = time.monotonic()
        ns.kill(pid)
        assert not ns.alive(pid)
        assert time.monotonic() - start < 5
        with pytest.raises(CommandError) as e:
            ns.wait(ns.spawn(["sleep", "5"]), ["sleep", "5"], timeout=0.3)
        assert e.value.timed_out
        with pytest.raises(CommandError, match=f"tb-{tag}-a"):
            ns.run(["false"])
        ns.stop_all()
    assert leftovers(tag) == []


def test_local_executor_runs_and_spawns(tmp_path):
    loc = Local()
    assert loc.run(["echo", "a b"]).stdout == "a b\n"
    pid = loc.spawn(["sh", "-c", "echo out; echo err >&2; exit 3"])
    res = loc.wait(pid, ["sh"], timeout=10)
    assert (res.rc, res.stdout, res.stderr) == (3, "out\n", "err\n")
    f = tmp_path / "x"
    loc.write_file(str(f), "hello")
    assert loc.read_file(str(f)) == "hello"
    loc.stop_all()


def test_link_operations_refuse_what_the_testbed_did_not_create():
    for links in (ops.on(Local()), ops.IpCommands(Local())):
        with pytest.raises(errors.TestbedError, match="not a tb- object"):
            links.set_mtu("lo", 1500)
        with pytest.raises(errors.TestbedError, match="not a tb- object"):
            links.delete("eth0")


def test_a_missing_link_is_an_error_naming_where(tmp_path):
    tag = new_tag()
    with ops.namespace(f"tb-{tag}-a") as ns:
        with pytest.raises(CommandError, match=f"tb-{tag}-zz.*namespace tb-{tag}-a"):
            ops.set_mtu(ns, f"tb-{tag}-zz", 1400)
        ops.on(ns).delete(f"tb-{tag}-zz")            # already gone is fine
    assert leftovers(tag) == []


def test_the_ip_command_backend_does_what_netlink_does():
    """ops.IpCommands is what a real host over ssh gets; run locally here, the kernel (read
    through pyroute2) must see the same links and MTUs the netlink backend makes."""
    tag = new_tag()
    with ops.namespace(f"tb-{tag}-a") as ns:
        cmd = ops.IpCommands(ns)
        cmd.add_bridge(f"tb-{tag}-br", mtu=1450)
        cmd.add_veth(f"tb-{tag}-p0", f"tb-{tag}-p1", mtu=1450)
        cmd.enslave(f"tb-{tag}-p0", f"tb-{tag}-br")
        cmd.set_mtu(f"tb-{tag}-p1", 1300)
        cmd.set_up(f"tb-{tag}-br")
        nl = ops.on(ns)
        assert nl.mtu_of(f"tb-{tag}-br") == cmd.mtu_of(f"tb-{tag}-br") == 1450
        assert nl.mtu_of(f"tb-{tag}-p1") == cmd.mtu_of(f"tb-{tag}-p1") == 1300
        assert nl.mac_of(f"tb-{tag}-p0") == cmd.mac_of(f"tb-{tag}-p0")
        assert ip_j(f"tb-{tag}-a", f"tb-{tag}-p0")["master"] == f"tb-{tag}-br"
        assert nl.wire(f"tb-{tag}-p0") == cmd.wire(f"tb-{tag}-p0")
        cmd.delete(f"tb-{tag}-br")
        assert not nl.exists(f"tb-{tag}-br") and not cmd.exists(f"tb-{tag}-br")
    assert leftovers(tag) == []


def test_offloads_are_switched_and_read_back_through_an_executor():
    tag = new_tag()
    with ops.namespace(f"tb-{tag}-a") as ns:
        ops.on(ns).add_veth(f"tb-{tag}-o0", f"tb-{tag}-o1")
        got = dict(ops.apply_offloads(ns, f"tb-{tag}-o0", Offloads(tx=False, gso=False)))
        assert got["tx"].startswith("off") and got["gso"].startswith("off")
        shown = ns.run(["ethtool", "-k", f"tb-{tag}-o0"]).stdout
        assert "tx-checksumming: off" in shown and "generic-segmentation-offload: off" in shown
        # The peer was not asked: it keeps its own defaults.
        assert dict(ops.read_offloads(ns, f"tb-{tag}-o1"))["tx"].startswith("on")
    assert leftovers(tag) == []


def test_namespace_operations_never_fork_this_process(monkeypatch):
    """A forked copy of the runner inherits its signal handlers (SIGTERM -> teardown) and
    could run on in the caller's stack; namespace links, files and creation use a thread
    that joins the namespace instead (executor.in_thread_netns)."""
    def no_fork():
        raise AssertionError("os.fork called")
    tag = new_tag()
    monkeypatch.setattr(os, "fork", no_fork)
    with ops.namespace(f"tb-{tag}-a") as ns:
        links = ops.on(ns)
        links.add_veth(f"tb-{tag}-f0", f"tb-{tag}-f1", mtu=1400)
        links.set_mtu(f"tb-{tag}-f0", 1300)
        assert links.mtu_of(f"tb-{tag}-f0") == 1300
        ops.no_ipv6(ns, f"tb-{tag}-f0")
        assert ns.read_file(f"/proc/sys/net/ipv6/conf/tb-{tag}-f0/disable_ipv6").strip() == "1"
    monkeypatch.undo()
    assert ip_j(None, "lo")["ifname"] == "lo"
    assert leftovers(tag) == []


def test_output_of_a_process_without_an_output_folder_is_not_left_behind():
    loc = Local()
    pid = loc.spawn(["echo", "x"])
    folder = loc._own_dir
    assert folder and os.path.isdir(folder)
    assert loc.wait(pid, ["echo"], timeout=10).stdout == "x\n"
    assert not os.path.exists(folder)
