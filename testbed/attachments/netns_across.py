"""`netns-ovs-vxlan` and `netns-bridge-vxlan`: one namespace endpoint on each of two real
hosts (this machine and one over ssh, or two over ssh), joined across them as the guest
modes ovs-vxlan and bridge-vxlan join guests: each host's segment (attachments/_realhost.py: an
OVS bridge with a VXLAN port, or a Linux bridge with a kernel vxlan device, on the host's
underlay) with a veth from the endpoint's namespace as its port. No VM: they measure the
hosts' datapath and tunnel where guests cannot run (no KVM, no image yet), and they are
what a fleet's pairs run in the test suite, where every target is a namespace of one
machine whose libvirt the targets share.

OVS on a real host: with the kernel datapath, the ovs-vxlan mode's own segment; with only
the userspace datapath, the tunnel goes through the host's underlay when that is itself an
OVS bridge of the userspace datapath holding the tunnel address (as OVS-DPDK hosts have
it): the testbed never moves an address onto OVS itself. Namespace ends under OVS's
userspace datapath get tx checksum offload and TSO off (it cannot finish a partial
checksum or segment a frame it tunnels: TCP stalls while ping works, measured).
"""
from __future__ import annotations

import contextlib
import ipaddress
from collections.abc import Iterator, Sequence

from testbed.attachments import _across
from testbed.attachments.base import Check, Fabric, Mode, Request
from testbed.attachments.bridge_vxlan import VXLAN_OVERHEAD
from testbed.errors import CapabilityError, CommandError


def _vsctl(shell, *args: str, check: bool = True):
    return shell.run(["ovs-vsctl", "--timeout=20", *args], timeout=30, check=check)


def userspace_segment():
    """OVS's userspace datapath on a real host whose underlay is an OVS bridge of that
    datapath holding the tunnel address: a bridge with a VXLAN port, tunnelled through it."""
    from testbed.attachments import _realhost as realhost
    from testbed.host.net import ops, vxlan
    from testbed.topology.model import object_name

    def build(stack, side):
        br, vx = object_name(side.tag, "ovs", side.ab), object_name(side.tag, "vx", side.ab)
        sh = side.shell
        _vsctl(sh, "add-br", br, "--", "set", "Bridge", br, "datapath_type=netdev",
               *vxlan.ovs_vxlan_port(br, vx, side.tunnel, side.ip, side.peer_ip))
        stack.callback(_vsctl, sh, "--if-exists", "del-br", br, check=False)
        err = _vsctl(sh, "get", "Interface", vx, "error", check=False).stdout.strip()
        if err and err != "[]":
            raise CapabilityError(f"host {side.host.name}: OVS refused the VXLAN port: {err}")
        _vsctl(sh, "set", "Interface", br, f"mtu_request={side.mtu}")
        ops.on(sh).set_up(br)
        return br, vx

    def nic(*_a):
        raise CapabilityError("netns-ovs-vxlan joins namespaces, not guests")

    def set_mtu(side, dev, mtu):
        ops.set_mtu(side.shell, dev, mtu)
        _vsctl(side.shell, "set", "Interface", side.bridge, f"mtu_request={mtu}")
    return realhost.Segment("ovs-netdev-vxlan", VXLAN_OVERHEAD, build, nic, set_mtu)


def _underlay_is_userspace_ovs(shell, underlay: str) -> bool:
    try:
        if _vsctl(shell, "br-exists", underlay, check=False).rc != 0:
            return False
        dp = _vsctl(shell, "get", "Bridge", underlay, "datapath_type").stdout.strip().strip('"')
    except CommandError:
        return False
    return dp == "netdev"


def _segment(kind: str, shells, specs, tunnel):
    if kind == "bridge":
        from testbed.attachments.bridge_vxlan import real_segment
        return real_segment()
    unders = [h.underlay or tunnel.underlay or "" for h in specs]
    if all(u and _underlay_is_userspace_ovs(sh, u) for sh, u in zip(shells, unders)):
        return userspace_segment()
    from testbed.attachments.ovs_vxlan import real_segment
    return real_segment()


class NetnsAcrossFabric(Fabric):
    """The two hosts' segments with a namespace endpoint on each."""

    guest_sends_as_rx = False        # counted on the endpoint's own device: it sends as tx

    def __init__(self, fab, ends: list[tuple], offloads: dict[str, str]) -> None:
        self.fab, self.ends, self.offloads = fab, ends, offloads
        self.datapath = fab.datapath

    def _agent(self, i: int):
        from testbed.host import nsagent
        from testbed.host.executor import Netns
        side, ns = self.fab.sides[i], self.ends[i][0]
        return nsagent.RemoteNsAgent(side.shell, ns) if side.shell.remote else Netns(ns)

    def own_pairs(self, out_dir: str):
        from testbed.host import nsagent

        @contextlib.contextmanager
        def pairs():
            hosts = []
            for i, side in enumerate(self.fab.sides):
                ns = self.ends[i][0]
                label = ("ns-a", "ns-b")[i]
                hosts.append(nsagent.remote_host(label, side.host.name, side.shell, ns) if side.shell.remote
                             else nsagent.NsHost(ns, nsagent.NsAgent(ns, out_dir),
                                                 nsagent.GuestSpec(name=label, host=side.host.name)))
            try:
                yield [(hosts[0], hosts[1])]
            finally:
                for h in hosts:
                    h.agent.stop_all()
        return pairs()

    def endpoint(self, i: int):
        if i > 1:
            raise CapabilityError("a namespace endpoint per host: one pair")
        ns, outer, inner, addr = self.ends[i]
        return inner, addr, dict(self.offloads)

    def set_mtu(self, mtu: int, taps: Sequence[str]) -> None:
        self.fab.set_mtu(mtu, [e[1] for e in self.ends])

    def counters(self, i: int, tap: str):
        from testbed.host.net import ops
        return ops.on(self._agent(i)).wire(tap)

    def leftovers(self) -> tuple[str, ...]:
        return tuple(x for s, e in zip(self.fab.sides, self.ends) if not s.shell.remote
                     for x in (e[0], e[1], s.bridge, s.vxlan) if x)

    def remote_objects(self) -> list[tuple[object, tuple[str, ...]]]:
        return [(s.shell, tuple(x for x in (e[0], e[1], s.bridge, s.vxlan) if x))
                for s, e in zip(self.fab.sides, self.ends) if s.shell.remote]


def _fabric(kind: str):
    @contextlib.contextmanager
    def fabric(req: Request) -> Iterator[Fabric]:
        from testbed.host import remote
        from testbed.attachments import _realhost as realhost
        from testbed.host.net import ops
        from testbed.topology.model import object_name
        t = req.topology
        specs = (t.host_of(t.client), t.host_of(t.server))
        shells = (remote.shell(specs[0]), remote.shell(specs[1]))
        net = ipaddress.ip_network(t.subnet)
        segment = _segment(kind, shells, specs, t.tunnel)
        userspace = segment.datapath.startswith("ovs-netdev")
        offloads = {"tx-checksumming": "off", "tcp-segmentation-offload": "off"} if userspace else {}
        with realhost.fabric(segment, req.tag, specs, shells, t.tunnel, req.max_mtu) as fab, \
                contextlib.ExitStack() as stack:
            ends = []
            for i, side in enumerate(fab.sides):
                sh = side.shell
                ns, outer, inner = (object_name(req.tag, k, str(i)) for k in ("e", "p", "q"))
                addr = str(net.network_address + 1 + i)
                sh.run(["ip", "netns", "add", ns], timeout=30)
                stack.callback(sh.run, ["ip", "netns", "delete", ns], timeout=30, check=False)
                sh.run(["ip", "link", "add", outer, "mtu", str(req.max_mtu), "type", "veth", "peer", "name", inner,
                        "mtu", str(req.max_mtu), "netns", ns], timeout=30)
                stack.callback(sh.run, ["ip", "link", "delete", outer], timeout=30, check=False)
                if kind == "ovs":
                    _vsctl(sh, "add-port", side.bridge, outer)
                    stack.callback(_vsctl, sh, "--if-exists", "del-port", side.bridge, outer, check=False)
                else:
                    ops.on(sh).enslave(outer, side.bridge)
                ops.on(sh).set_up(outer)
                inside = ["ip", "netns", "exec", ns]
                sh.run([*inside, "sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1"], timeout=30, check=False)
                sh.run([*inside, "ip", "addr", "add", f"{addr}/{net.prefixlen}", "dev", inner], timeout=30)
                for dev in ("lo", inner):
                    sh.run([*inside, "ip", "link", "set", dev, "up"], timeout=30)
                if userspace:
                    sh.run([*inside, "ethtool", "-K", inner, "tx", "off", "tso", "off"], timeout=30)
                ends.append((ns, outer, inner, addr))
            yield NetnsAcrossFabric(fab, ends, offloads)
    return fabric


def check(t) -> Check | None:
    if _across.emulated(t):
        return Check("", "it joins namespaces on two real hosts (transport ssh); on hosts emulated here, "
                         "use ovs-vxlan or bridge-vxlan")
    return _across.check(t)


def _ovs_unavailable() -> str | None:
    from testbed.attachments.ovs_vxlan import unavailable
    return unavailable()


MODES = (Mode("netns-ovs-vxlan", _fabric("ovs"), endpoints="netns", placement="two", needs_ovs=True,
              overhead=VXLAN_OVERHEAD, overhead_label="VXLAN-over-IPv4 overhead", unavailable=_ovs_unavailable,
              check=check),
         Mode("netns-bridge-vxlan", _fabric("bridge"), endpoints="netns", placement="two",
              overhead=VXLAN_OVERHEAD, overhead_label="VXLAN-over-IPv4 overhead", check=check))
