"""Two hosts joined by VXLAN, emulated on one machine: `ovs-vxlan` and `bridge-vxlan`.

Each emulated host is a network namespace ``tb-<tag>-ha`` / ``tb-<tag>-hb`` that holds its
whole datapath: the bridge guests' taps join and the VXLAN endpoint. A veth "wire"
(``tb-<tag>-wa`` <-> ``tb-<tag>-wb``, one end in each namespace, underlay addresses in
198.19.0.0/30) joins them and carries only the encapsulated traffic. The root namespace
keeps nothing of the datapath: a guest's tap is created there by libvirt and moved into its
host's namespace once QEMU has opened it (a tap can change namespace while in use; QEMU
keeps its file descriptor).

* ``bridge-vxlan``: a Linux bridge ``tb-<tag>-br`` plus a kernel vxlan device
  ``tb-<tag>-vx`` (VNI, UDP port, local/remote underlay address, on the wire) as its port.
* ``ovs-vxlan``: a private ovsdb-server + ovs-vswitchd per namespace (own database and run
  directory, ovsd.private). The userspace datapath tunnels by itself ("userspace
  tunneling" in the OVS docs): the VXLAN port on the integration bridge ``tb-<tag>-ovs``
  finds its way out through OVS's own route table, so the underlay address sits on the
  internal port of a second bridge ``tb-<tag>-ul`` whose uplink is the wire.

Each emulated host is reached through its namespace's executor (testbed.host.executor.Netns) and
its links are made through testbed.host.net.ops (pyroute2). The Linux-bridge datapath
(``bridge_vxlan``, ``bridge_vxlan_mtu``), the OVS VXLAN port (``ovs_vxlan_port``) and the
underlay check (``df_ping``) are the same code real hosts use (attachments/_realhost.py), on their ssh
executor.

VXLAN over IPv4 adds 50 bytes (outer Ethernet 14, IPv4 20, UDP 8, VXLAN 8): an inner MTU
must leave that much room below the underlay MTU. config.py refuses a topology that does
not fit before anything is created; ``df_check`` proves the underlay carries full-size
encapsulated frames unfragmented before anything is measured.
"""
from __future__ import annotations

import contextlib
import ipaddress
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from testbed.errors import CommandError, TestbedError
from testbed.host import proc
from testbed.host.executor import Executor, Netns
from testbed.host.net import links, ops, ovsd
from testbed.topology.model import TunnelSpec, object_name

log = logging.getLogger(__name__)

#: outer Ethernet (14) + IPv4 (20) + UDP (8) + VXLAN (8) header bytes
VXLAN_OVERHEAD = 50
UNDERLAY_NET = ipaddress.ip_network("198.19.0.0/30")


@dataclass(frozen=True)
class HostSide:
    """One emulated host's datapath."""

    name: str                      # topology host name
    netns: str
    wire: str                      # this host's end of the veth wire
    underlay_dev: str              # the device holding the underlay address
    underlay_ip: str
    bridge: str                    # where guest ports join
    vxlan: str                     # kernel vxlan device or OVS vxlan port
    switch: ovsd.Ovs | None = None  # ovs-vxlan: the host's private switch

    @property
    def ex(self) -> Netns:
        """Where this host's commands run: its namespace."""
        return Netns(self.netns)


@dataclass(frozen=True)
class Fabric:
    #: each host a private OVS switch with userspace tunnelling (else a Linux bridge + kernel vxlan)
    private_switch: bool
    tunnel: TunnelSpec
    hosts: tuple[HostSide, HostSide]

    @property
    def datapath(self) -> str:
        return "ovs-netdev-vxlan" if self.private_switch else "linux-bridge-vxlan"

    def attach(self, host: HostSide, ifname: str) -> None:
        """Move a root-namespace device (a guest's tap, a veth end) into ``host`` and make it
        a port of its bridge. The device leaves the root namespace for good: deleting it (or
        QEMU closing a tap) removes it from the host namespace."""
        ops.on(None).move(ifname, host.netns)
        there = ops.on(host.ex)
        if host.switch is not None:
            host.switch.vsctl("add-port", host.bridge, ifname)
        else:
            there.enslave(ifname, host.bridge)
        there.set_up(ifname)

    def detach(self, host: HostSide, ifname: str) -> None:
        """Take a port out of OVS before its device goes, so vswitchd never polls a vanished
        device; Linux bridge ports leave by themselves."""
        if host.switch is not None:
            with contextlib.suppress(CommandError):
                host.switch.vsctl("--if-exists", "del-port", host.bridge, ifname)

    def set_mtu(self, mtu: int, ports: Sequence[tuple[HostSide, str]]) -> None:
        """The inner MTU on every hop of both hosts: guest ports, bridges, vxlan devices."""
        if mtu + VXLAN_OVERHEAD > self.tunnel.underlay_mtu:
            raise TestbedError(f"inner MTU {mtu} + {VXLAN_OVERHEAD} bytes of VXLAN-over-IPv4 overhead "
                               f"exceeds the underlay MTU {self.tunnel.underlay_mtu}")
        for h in self.hosts:
            mine = [p for hh, p in ports if hh is h]
            if h.switch is not None:
                args: list[str] = []
                for dev in [*mine, h.bridge]:
                    args += ["--", "set", "Interface", dev, f"mtu_request={mtu}"]
                h.switch.vsctl(*args)
                ops.set_mtus(h.ex, [d for d in mine if mtu_of(d, h.netns) != mtu], mtu)
            else:
                bridge_vxlan_mtu(h.ex, mine, h.vxlan, h.bridge, mtu)
            for dev in mine:
                if mtu_of(dev, h.netns) != mtu:
                    raise TestbedError(f"{dev} in {h.netns}: MTU {mtu_of(dev, h.netns)}, asked for {mtu}")

    def df_check(self, inner_mtu: int) -> str | None:
        """A don't-fragment ping across the underlay the size of a full encapsulated frame
        (inner MTU + 50) each way; returns why it failed, or None."""
        for src, dst in ((self.hosts[0], self.hosts[1]), (self.hosts[1], self.hosts[0])):
            why = df_ping(src.ex, f"{src.name} -> {dst.name}", dst.underlay_ip, inner_mtu, VXLAN_OVERHEAD)
            if why:
                return why
        return None


def df_ping(ex: Executor, label: str, dst_ip: str, inner_mtu: int, overhead: int) -> str | None:
    """One don't-fragment ping to ``dst_ip`` the size of a full frame on the underlay (inner
    MTU + encapsulation overhead), sent from the sending side's executor; returns why it
    failed, or None."""
    size = inner_mtu + overhead - 28   # IPv4 + ICMP headers
    res = ex.run(["ping", "-n", "-M", "do", "-s", str(size), "-c", "2", "-i", "0.2", "-W", "3", dst_ip],
                 timeout=30, check=False)
    if res.rc == 0:
        return None
    tail = " | ".join((res.stdout + res.stderr).strip().splitlines()[-2:])
    return f"underlay DF check {label} failed for inner MTU {inner_mtu} (ping -M do -s {size}): {tail}"


def _check_ours(name: str) -> None:
    ops.check_ours(name)


def mtu_of(dev: str, netns: str) -> int:
    return ops.on(Netns(netns)).mtu_of(dev)


def counters(dev: str, netns: str) -> links.Wire:
    return ops.on(Netns(netns)).wire(dev)


# -- the datapath pieces shared by emulated hosts (here) and real ones (attachments/_realhost.py) --------

def bridge_vxlan(stack: contextlib.ExitStack, ex: Executor, br: str, vx: str, tunnel: TunnelSpec,
                 local_ip: str, peer_ip: str, underlay: str, mtu: int) -> None:
    """A Linux bridge ``br`` with the kernel vxlan device ``vx`` (VNI, UDP port, local and
    peer underlay address, on ``underlay``) as its port, both up at ``mtu``, on the host
    ``ex`` runs on; removed in reverse by ``stack``."""
    links_ = ops.on(ex)
    links_.add_bridge(br)
    stack.callback(links_.delete, br)
    links_.add_vxlan(vx, vni=tunnel.vni, local=local_ip, remote=peer_ip, port=tunnel.udp_port,
                     dev=underlay, mtu=mtu)
    stack.callback(links_.delete, vx)
    links_.enslave(vx, br)
    for dev in (br, vx):
        links_.set_mtu(dev, mtu)
        links_.set_up(dev)


def bridge_vxlan_mtu(ex: Executor, ports: Sequence[str], vx: str, br: str, mtu: int) -> None:
    """The inner MTU on one host's bridge-vxlan hops. Ports first: a bridge's MTU cannot
    exceed its smallest port's."""
    ops.set_mtus(ex, [*ports, vx, br], mtu)


def ovs_vxlan_port(br: str, vx: str, tunnel: TunnelSpec, local_ip: str, peer_ip: str) -> list[str]:
    """ovs-vsctl arguments adding the VXLAN port ``vx`` to ``br`` (the same on either switch)."""
    return ["--", "add-port", br, vx, "--", "set", "Interface", vx, "type=vxlan",
            f"options:remote_ip={peer_ip}", f"options:local_ip={local_ip}",
            f"options:key={tunnel.vni}", f"options:dst_port={tunnel.udp_port}"]


def emulated_host(tag: str, index: int) -> tuple[str, str]:
    """(namespace, wire end) of a run's emulated host 0 or 1."""
    side = "ab"[index]
    return object_name(tag, "h", side), object_name(tag, "w", side)


def _wire(stack: contextlib.ExitStack, a: str, ns_a: str, b: str, ns_b: str, mtu: int) -> None:
    """The veth wire, created directly inside the two namespaces (never in the root one)."""
    here = ops.on(Netns(ns_a))
    here.add_veth(a, b, mtu=mtu, peer_netns=ns_b)
    # Deleted explicitly: a deleted namespace frees its devices asynchronously.
    stack.callback(here.delete, a)
    here.set_up(a)
    ops.on(Netns(ns_b)).set_up(b)


@contextlib.contextmanager
def hosts_and_wire(tag: str, mtu: int) -> Iterator[tuple[tuple[str, str], tuple[str, str]]]:
    """Two emulated hosts (namespaces) joined by the veth wire, nothing else:
    ((namespace a, namespace b), (wire end a, wire end b)). Removed in reverse on exit."""
    with contextlib.ExitStack() as stack:
        ns, wires = zip(*(emulated_host(tag, i) for i in (0, 1)))
        for n in ns:
            stack.enter_context(ops.namespace(n))
        _wire(stack, wires[0], ns[0], wires[1], ns[1], mtu)
        yield (ns[0], ns[1]), (wires[0], wires[1])


@contextlib.contextmanager
def fabric(private_switch: bool, tag: str, host_names: tuple[str, str], tunnel: TunnelSpec, workdir: Path,
           mtu: int) -> Iterator[Fabric]:
    """Both emulated hosts, the wire and the tunnel, torn down in reverse order on exit: each
    host a Linux bridge with a kernel vxlan device, or (``private_switch``) a private OVS
    switch with userspace tunnelling. ``mtu`` is the inner MTU the bridges start with (the
    largest of the matrix)."""
    if mtu + VXLAN_OVERHEAD > tunnel.underlay_mtu:
        raise TestbedError(f"inner MTU {mtu} + {VXLAN_OVERHEAD} bytes of VXLAN-over-IPv4 overhead "
                           f"exceeds the underlay MTU {tunnel.underlay_mtu}")
    ips = [str(UNDERLAY_NET.network_address + 1), str(UNDERLAY_NET.network_address + 2)]
    plen = UNDERLAY_NET.prefixlen
    with contextlib.ExitStack() as stack:
        ns, wires = stack.enter_context(hosts_and_wire(tag, tunnel.underlay_mtu))
        sides = []
        for i in (0, 1):
            peer = ips[1 - i]
            br, vx = object_name(tag, "ovs" if private_switch else "br"), object_name(tag, "vx")
            ex = Netns(ns[i])
            if not private_switch:
                ops.on(ex).add_address(wires[i], f"{ips[i]}/{plen}")
                bridge_vxlan(stack, ex, br, vx, tunnel, ips[i], peer, wires[i], mtu)
                sides.append(HostSide(host_names[i], ns[i], wires[i], wires[i], ips[i], br, vx))
            else:
                sw = stack.enter_context(ovsd.private(ns[i], workdir / f"ovs-{'ab'[i]}"))
                ul = object_name(tag, "ul")
                # Integration bridge with the VXLAN port; underlay bridge whose internal port
                # holds the underlay address and whose uplink is the wire.
                sw.vsctl("add-br", br, "--", "set", "Bridge", br, "datapath_type=netdev",
                         "--", "set", "Interface", br, f"mtu_request={mtu}",
                         *ovs_vxlan_port(br, vx, tunnel, ips[i], peer),
                         "--", "add-br", ul, "--", "set", "Bridge", ul, "datapath_type=netdev",
                         "--", "set", "Interface", ul, f"mtu_request={tunnel.underlay_mtu}",
                         "--", "add-port", ul, wires[i])
                # The daemons stop on exit (which removes the bridges with their datapath);
                # deleting the bridges first keeps their logs free of vanished-device noise.
                stack.callback(_del_brs, sw, [br, ul])
                ops.on(ex).add_address(ul, f"{ips[i]}/{plen}")
                for dev in (ul, br):
                    ops.on(ex).set_up(dev)
                sides.append(HostSide(host_names[i], ns[i], wires[i], ul, ips[i], br, vx, sw))
        f = Fabric(private_switch, tunnel, (sides[0], sides[1]))
        _static_neighbours(f)
        why = f.df_check(mtu)
        if why:
            raise TestbedError(why)
        yield f


def _static_neighbours(f: Fabric) -> None:
    """Each host knows its peer's underlay MAC up front, in the kernel and (ovs-vxlan) in
    OVS's tunnel neighbour cache, so the wire carries no ARP: only encapsulated frames."""
    for me, peer in ((f.hosts[0], f.hosts[1]), (f.hosts[1], f.hosts[0])):
        lladdr = ops.on(peer.ex).mac_of(peer.underlay_dev)
        ops.on(me.ex).neigh_permanent(peer.underlay_ip, lladdr, me.underlay_dev)
        if me.switch is not None:
            proc.run(["ovs-appctl", "-t", f"{me.switch.rundir}/ovs-vswitchd.ctl", "tnl/neigh/set",
                      me.underlay_dev, peer.underlay_ip, lladdr], timeout=20)


def _del_brs(sw: ovsd.Ovs, brs: list[str]) -> None:
    args: list[str] = []
    for br in brs:
        _check_ours(br)
        args += ["--", "--if-exists", "del-br", br]
    with contextlib.suppress(CommandError):
        sw.vsctl(*args)


@contextlib.contextmanager
def port(f: Fabric, host: HostSide, ifname: str) -> Iterator[str]:
    """``ifname`` attached to ``host``'s bridge for the duration; taken out of OVS on exit."""
    f.attach(host, ifname)
    try:
        yield ifname
    finally:
        f.detach(host, ifname)


@contextlib.contextmanager
def capture(netns: str, wire: str, pcap: Path, timeout_s: float = 10) -> Iterator[Path]:
    """tcpdump on one end of the wire for the duration (headers only). The capture has
    started when this yields: tcpdump says "listening on" once its socket is bound."""
    with proc.background(["tcpdump", "-n", "-U", "-s", "128", "-i", wire, "-w", str(pcap)],
                         out_dir=str(pcap.parent), name=pcap.stem, netns=netns) as bg:
        deadline = time.monotonic() + timeout_s
        while "listening on" not in bg.stderr():
            if bg.popen.poll() is not None or time.monotonic() > deadline:
                raise TestbedError(f"tcpdump on {wire} in {netns} did not start: {bg.stderr()[-300:]}")
            time.sleep(0.05)
        yield pcap
        # tcpdump -U writes each packet as it comes; give the last ones a moment to be read.
        time.sleep(0.3)


def read_capture(pcap: Path, udp_port: int) -> tuple[int, list[str]]:
    """(frames captured, the ones that are not IPv4 UDP to or from ``udp_port``, as tcpdump prints them)."""
    total = proc.run(["tcpdump", "-n", "-r", str(pcap)], timeout=60).stdout.splitlines()
    other = proc.run(["tcpdump", "-n", "-r", str(pcap), f"not (ip and udp port {udp_port})"],
                     timeout=60).stdout.splitlines()
    return len(total), other
