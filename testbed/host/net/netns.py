"""Two network namespaces joined in the ways studies B and D compare, for runs without VMs.

Each context manager creates namespaces ``tb-<tag>-a`` and ``tb-<tag>-b``, one test address
each from a 198.18.0.0/15 subnet, and the connection between them:

* ``veth_pair``: one veth pair, one end in each namespace;
* ``linux_bridge``: a Linux bridge in the root namespace with a veth pair to each side;
* ``ovs_veth``: an OVS bridge with a veth pair to each side;
* ``ovs_internal``: an OVS bridge with two internal ports moved into the namespaces;
* ``ovs_chain``: N OVS bridges in a row joined by patch ports or by veth pairs;
* ``macvlan``: two macvlans on the macvtap attachment's veth lower (bridge, vepa, passthrough).

It yields a frozen ``Connection``: the two endpoints (namespace, interface, address, the
offloads ethtool reports after the requested ones were applied), the interfaces on the path
with the counter that carries a-to-b traffic on each, and a description. Everything is
tb- named and removed on exit, on error too; root-side veth ends are deleted explicitly
because a deleted namespace frees its devices asynchronously, which would leave the peers
visible for a moment and make a quick re-run with the same names fail with "File exists".

Without ``userspace-tso-enable`` the OVS userspace datapath drops TCP from senders with tx
checksum offload on (host/net/ovs.py has the measurements). The OVS connections therefore
require it like the ovs attachment does; ``tso=False`` waives that for a switch without it,
and the caller then asks for ``Offloads(tx=False)`` on the endpoints.
"""
from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from testbed.errors import CommandError, TestbedError
from testbed.host.net import links, macvtap, ops, ovs, ovsd
from testbed.topology.model import Offloads, object_name

log = logging.getLogger(__name__)

BENCH_NET = ipaddress.ip_network("198.18.0.0/15")
DEFAULT_SUBNET = "198.18.100.0/24"
MAX_CHAIN = 9


class ChainLink(StrEnum):
    PATCH = "patch"
    VETH = "veth"


@dataclass(frozen=True)
class Endpoint:
    netns: str
    ifname: str
    address: str                              # without prefix
    prefixlen: int
    #: (ethtool -K name, state as ethtool -k prints it: "on", "off", "off [fixed]", ...)
    offloads: tuple[tuple[str, str], ...] = ()

    def offload(self, name: str) -> str:
        return dict(self.offloads)[name]


@dataclass(frozen=True)
class Hop:
    """An interface on the path and the byte counter that carries traffic from a to b."""

    ifname: str
    netns: str | None                         # None: the root namespace
    a_to_b: str                               # "rx" or "tx"

    def bytes(self) -> int:
        rx, tx = counters(self.ifname, self.netns)
        return rx if self.a_to_b == "rx" else tx


@dataclass(frozen=True)
class Connection:
    #: veth | bridge | ovs-veth | ovs-internal | ovs-chain-patch | ovs-chain-veth | macvlan-<mode>
    kind: str
    a: Endpoint
    b: Endpoint
    hops: tuple[Hop, ...]
    description: str
    #: veth | linux-bridge | ovs-netdev | ovs-system | macvlan-<mode>
    datapath: str
    bridges: tuple[str, ...] = ()             # Linux or OVS bridges created for it

    def counters(self) -> tuple[int, ...]:
        """Bytes so far on each hop's a-to-b counter, in hop order."""
        return tuple(h.bytes() for h in self.hops)


# -- small helpers -------------------------------------------------------------------------

def _check_ours(name: str) -> None:
    ops.check_ours(name)


def _links(netns: str | None) -> ops.Netlink:
    return ops.Netlink(netns)


def counters(ifname: str, netns: str | None = None) -> tuple[int, int]:
    """(rx_bytes, tx_bytes) of a link in any namespace."""
    if netns is None:
        return links.counters(ifname)
    w = _links(netns).wire(ifname)
    return w.rx_bytes, w.tx_bytes


#: offloads: one implementation for hosts, namespaces and guests (testbed.host.net.ops)
parse_ethtool_k = ops.parse_ethtool_k


def read_offloads(ifname: str, netns: str | None) -> tuple[tuple[str, str], ...]:
    return ops.read_offloads(ops.netns_executor(netns), ifname)


def apply_offloads(ifname: str, netns: str | None, want: Offloads | None) -> tuple[tuple[str, str], ...]:
    """Ask ethtool for each feature separately (one fixed feature must not stop the others),
    then return what the device reports."""
    return ops.apply_offloads(ops.netns_executor(netns), ifname, want)


def _subnet(subnet: str) -> ipaddress.IPv4Network:
    net = ipaddress.ip_network(subnet)
    if not isinstance(net, ipaddress.IPv4Network) or not net.subnet_of(BENCH_NET) or net.num_addresses < 4:
        raise TestbedError(f"subnet {subnet} must be an IPv4 subnet of {BENCH_NET} with room for two hosts")
    return net


def _pair(offloads: Offloads | Sequence[Offloads | None] | None) -> tuple[Offloads | None, Offloads | None]:
    if offloads is None or isinstance(offloads, Offloads):
        return offloads, offloads
    a, b = offloads
    return a, b


class _Builder:
    """Creates objects and registers their removal on one ExitStack, in reverse order."""

    def __init__(self, stack: contextlib.ExitStack, tag: str, subnet: str, mtu: int,
                 path_offloads: Offloads | None) -> None:
        self.stack, self.tag, self.mtu = stack, tag, mtu
        self.net = _subnet(subnet)
        self.path_offloads = path_offloads
        self.ns_a, self.ns_b = self.name("a"), self.name("b")

    def name(self, kind: str, *parts: str) -> str:
        return object_name(self.tag, kind, *parts)

    def namespace(self, name: str) -> None:
        # No IPv6 on anything created in it: no router solicitations or DAD frames move the
        # counters (ops.namespace).
        self.stack.enter_context(ops.namespace(name))

    def veth(self, left: str, left_ns: str | None, right: str, right_ns: str | None) -> None:
        """A veth pair created directly in its namespaces; removal deletes the left end."""
        _check_ours(right)
        # The peer always names its namespace: created from inside left_ns it would
        # otherwise land there, not in the root one.
        _links(left_ns).add_veth(left, right, peer_netns=right_ns or os.getpid())
        self.stack.callback(self._del_link, left, left_ns)
        for n, ns in ((left, left_ns), (right, right_ns)):
            if ns is None:
                links.no_ipv6(n)
            _links(ns).set_mtu(n, self.mtu)
            _links(ns).set_up(n)

    @staticmethod
    def _del_link(name: str, netns: str | None) -> None:
        _links(netns).delete(name)

    def path_link(self, name: str, netns: str | None) -> None:
        if self.path_offloads is not None:
            apply_offloads(name, netns, self.path_offloads)

    def endpoint(self, ns: str, ifname: str, host: int, want: Offloads | None) -> Endpoint:
        addr = self.net.network_address + host
        there = _links(ns)
        there.add_address(ifname, f"{addr}/{self.net.prefixlen}")
        there.set_mtu(ifname, self.mtu)
        there.set_up(ifname)
        applied = apply_offloads(ifname, ns, want)
        return Endpoint(ns, ifname, str(addr), self.net.prefixlen, applied)

    def endpoints(self, a_if: str, b_if: str, offloads) -> tuple[Endpoint, Endpoint]:
        oa, ob = _pair(offloads)
        return self.endpoint(self.ns_a, a_if, 1, oa), self.endpoint(self.ns_b, b_if, 2, ob)

    @staticmethod
    def ovs_switch(switch: ovsd.Ovs | None, tso: bool) -> ovsd.Ovs:
        switch = switch or ovsd.ensure_running()
        if tso:
            ovs.require_userspace_tso(switch)
        return switch

    def ovs_bridge(self, name: str, switch: ovsd.Ovs) -> str:
        return self.stack.enter_context(ovs.bridge(name, switch, self.mtu))


def _desc_offloads(offloads) -> str:
    oa, ob = _pair(offloads)
    if oa == ob:
        return f"offloads {oa.label() if oa else 'default'}"
    return f"offloads a {oa.label() if oa else 'default'}, b {ob.label() if ob else 'default'}"


# -- the connections -----------------------------------------------------------------------

@contextlib.contextmanager
def veth_pair(tag: str, *, subnet: str = DEFAULT_SUBNET, mtu: int = 1500,
              offloads: Offloads | Sequence[Offloads | None] | None = None) -> Iterator[Connection]:
    """(a) one veth pair, one end in each namespace."""
    with contextlib.ExitStack() as stack:
        b = _Builder(stack, tag, subnet, mtu, None)
        b.namespace(b.ns_a)
        b.namespace(b.ns_b)
        a_if, b_if = b.name("a1"), b.name("b1")
        b.veth(a_if, b.ns_a, b_if, b.ns_b)
        ea, eb = b.endpoints(a_if, b_if, offloads)
        yield Connection("veth", ea, eb, (Hop(a_if, b.ns_a, "tx"), Hop(b_if, b.ns_b, "rx")),
                         f"veth pair {a_if} <-> {b_if}, mtu {mtu}, {_desc_offloads(offloads)}", "veth")


def _veth_to(b: _Builder, side: str, middle_ns: str | None) -> tuple[str, str]:
    """A veth pair from namespace a or b to the middle: (endpoint end, middle end)."""
    ns = b.ns_a if side == "a" else b.ns_b
    outer, inner = b.name(side, "0"), b.name(side, "1")
    b.veth(outer, middle_ns, inner, ns)
    b.path_link(outer, middle_ns)
    return inner, outer


@contextlib.contextmanager
def linux_bridge(tag: str, *, subnet: str = DEFAULT_SUBNET, mtu: int = 1500,
                 offloads: Offloads | Sequence[Offloads | None] | None = None,
                 path_offloads: Offloads | None = None) -> Iterator[Connection]:
    """(b) a Linux bridge (no address, no uplink) with a veth pair to each namespace."""
    with contextlib.ExitStack() as stack:
        b = _Builder(stack, tag, subnet, mtu, path_offloads)
        b.namespace(b.ns_a)
        b.namespace(b.ns_b)
        br = stack.enter_context(links.bridge(b.name("br"), mtu))
        a_in, a_out = _veth_to(b, "a", None)
        b_in, b_out = _veth_to(b, "b", None)
        for port in (a_out, b_out):
            _links(None).enslave(port, br)
        ea, eb = b.endpoints(a_in, b_in, offloads)
        hops = (Hop(a_in, b.ns_a, "tx"), Hop(a_out, None, "rx"), Hop(b_out, None, "tx"),
                Hop(b_in, b.ns_b, "rx"))
        yield Connection("bridge", ea, eb, hops,
                         f"Linux bridge {br} with veth pairs {a_in}/{a_out} and {b_in}/{b_out}, "
                         f"mtu {mtu}, {_desc_offloads(offloads)}", "linux-bridge", (br,))


@contextlib.contextmanager
def ovs_veth(tag: str, *, subnet: str = DEFAULT_SUBNET, mtu: int = 1500,
             offloads: Offloads | Sequence[Offloads | None] | None = None,
             path_offloads: Offloads | None = None, switch: ovsd.Ovs | None = None,
             tso: bool = True) -> Iterator[Connection]:
    """(c) an OVS bridge with a veth pair to each namespace. ``switch``: the host's switch
    by default (started if needed), or a private one (its ports then live in its namespace)."""
    with _ovs_path(tag, 1, ChainLink.PATCH, "ovs-veth", subnet=subnet, mtu=mtu, offloads=offloads,
                   path_offloads=path_offloads, switch=switch, tso=tso) as conn:
        yield conn


@contextlib.contextmanager
def ovs_internal(tag: str, *, subnet: str = DEFAULT_SUBNET, mtu: int = 1500,
                 offloads: Offloads | Sequence[Offloads | None] | None = None,
                 switch: ovsd.Ovs | None = None, tso: bool = True) -> Iterator[Connection]:
    """(d) an OVS bridge with two internal ports, each moved into its namespace."""
    with contextlib.ExitStack() as stack:
        b = _Builder(stack, tag, subnet, mtu, None)
        b.namespace(b.ns_a)
        b.namespace(b.ns_b)
        sw = b.ovs_switch(switch, tso)
        br = b.ovs_bridge(b.name("ovs"), sw)
        ports = []
        for side, ns in (("a", b.ns_a), ("b", b.ns_b)):
            port = b.name("i", side)
            # No mtu_request: endpoint() sets the MTU inside the namespace. On the userspace
            # datapath a moved internal port still forwards (vswitchd keeps the tap's fd)
            # but vswitchd, which finds devices by name in its own namespace, can no longer
            # configure it and would log a failed MTU change at every reconfiguration.
            sw.vsctl("add-port", br, port, "--", "set", "Interface", port, "type=internal")
            stack.callback(_del_port, sw, br, port)
            _links(sw.netns).move(port, ns)
            ports.append(port)
        ea, eb = b.endpoints(ports[0], ports[1], offloads)
        hops = (Hop(ports[0], b.ns_a, "tx"), Hop(ports[1], b.ns_b, "rx"))
        yield Connection("ovs-internal", ea, eb, hops,
                         f"OVS bridge {br} ({ovs.ovs_datapath(sw)}) with internal ports {ports[0]} "
                         f"and {ports[1]} in the namespaces, mtu {mtu}, {_desc_offloads(offloads)}",
                         f"ovs-{ovs.ovs_datapath(sw)}", (br,))


def _del_port(switch: ovsd.Ovs, br: str, port: str) -> None:
    _del_ports(switch, [(br, port)])


def _del_ports(switch: ovsd.Ovs, ports: Sequence[tuple[str, str]]) -> None:
    """Ports leave OVS before their devices go, so vswitchd never polls a vanished device."""
    args: list[str] = []
    for br, port in ports:
        _check_ours(port)
        args += ["--", "--if-exists", "del-port", br, port]
    with contextlib.suppress(CommandError):
        switch.vsctl(*args)


@contextlib.contextmanager
def ovs_chain(tag: str, n: int, link: ChainLink | str = ChainLink.PATCH, *,
              subnet: str = DEFAULT_SUBNET, mtu: int = 1500,
              offloads: Offloads | Sequence[Offloads | None] | None = None,
              path_offloads: Offloads | None = None, switch: ovsd.Ovs | None = None,
              tso: bool = True) -> Iterator[Connection]:
    """(e) ``n`` OVS bridges in a row (1..9), neighbours joined by patch ports or veth pairs;
    namespace a hangs off the first bridge and b off the last, each by a veth pair."""
    link = ChainLink(link)
    with _ovs_path(tag, n, link, f"ovs-chain-{link.value}", subnet=subnet, mtu=mtu,
                   offloads=offloads, path_offloads=path_offloads, switch=switch, tso=tso) as conn:
        yield conn


@contextlib.contextmanager
def _ovs_path(tag: str, n: int, link: ChainLink, kind: str, *, subnet: str, mtu: int,
              offloads: Offloads | Sequence[Offloads | None] | None,
              path_offloads: Offloads | None, switch: ovsd.Ovs | None,
              tso: bool) -> Iterator[Connection]:
    if not 1 <= n <= MAX_CHAIN:
        raise TestbedError(f"an OVS chain has 1 to {MAX_CHAIN} bridges, not {n}")
    with contextlib.ExitStack() as stack:
        b = _Builder(stack, tag, subnet, mtu, path_offloads)
        b.namespace(b.ns_a)
        b.namespace(b.ns_b)
        sw = b.ovs_switch(switch, tso)
        mid = sw.netns
        single = kind == "ovs-veth"
        bridges = [b.ovs_bridge(b.name("ovs") if single else b.name("c", str(i)), sw)
                   for i in range(1, n + 1)]
        a_in, a_out = _veth_to(b, "a", mid)
        b_in, b_out = _veth_to(b, "b", mid)
        hops = [Hop(a_in, b.ns_a, "tx"), Hop(a_out, mid, "rx")]
        args = ["add-port", bridges[0], a_out, "--", "add-port", bridges[-1], b_out]
        ports = [(bridges[0], a_out), (bridges[-1], b_out)]
        for i in range(1, n):
            left, right = b.name("l", str(i), "p" if link is ChainLink.PATCH else "v"), \
                b.name("r", str(i), "p" if link is ChainLink.PATCH else "v")
            if link is ChainLink.PATCH:
                args += ["--", "add-port", bridges[i - 1], left,
                         "--", "set", "Interface", left, "type=patch", f"options:peer={right}",
                         "--", "add-port", bridges[i], right,
                         "--", "set", "Interface", right, "type=patch", f"options:peer={left}"]
            else:
                b.veth(left, mid, right, mid)
                b.path_link(left, mid)
                b.path_link(right, mid)
                args += ["--", "add-port", bridges[i - 1], left, "--", "add-port", bridges[i], right]
                ports += [(bridges[i - 1], left), (bridges[i], right)]
                hops += [Hop(left, mid, "tx"), Hop(right, mid, "rx")]
        stack.callback(_del_ports, sw, ports)
        sw.vsctl(*args)
        hops += [Hop(b_out, mid, "tx"), Hop(b_in, b.ns_b, "rx")]
        ea, eb = b.endpoints(a_in, b_in, offloads)
        dp = ovs.ovs_datapath(sw)
        where = f" in {mid}" if mid else ""
        if single:
            desc = (f"OVS bridge {bridges[0]} ({dp}{where}) with veth pairs {a_in}/{a_out} and "
                    f"{b_in}/{b_out}")
        else:
            joins = "patch ports" if link is ChainLink.PATCH else "veth pairs"
            desc = (f"chain of {n} OVS bridges {bridges[0]}..{bridges[-1]} ({dp}{where}) joined by "
                    f"{joins}, veth pairs to the namespaces")
        yield Connection(kind, ea, eb, tuple(hops),
                         f"{desc}, mtu {mtu}, {_desc_offloads(offloads)}", f"ovs-{dp}", tuple(bridges))


@contextlib.contextmanager
def macvlan(tag: str, mode: macvtap.MacvtapMode | str = macvtap.MacvtapMode.BRIDGE, *,
            subnet: str = DEFAULT_SUBNET, mtu: int = 1500,
            offloads: Offloads | Sequence[Offloads | None] | None = None) -> Iterator[Connection]:
    """Two macvlans on the macvtap attachment's own segment (a veth lower, plus the hairpin
    bridge for vepa), one in each namespace: the guests' forwarding path without guests,
    since macvtap is macvlan with a character device in front."""
    mode = macvtap.MacvtapMode(mode)
    with contextlib.ExitStack() as stack:
        b = _Builder(stack, tag, subnet, mtu, None)
        b.namespace(b.ns_a)
        b.namespace(b.ns_b)
        seg = stack.enter_context(macvtap.segment(tag, mtu, mode))
        devs = []
        # Both are made before either moves: a moved device leaves its lower's upper_ list,
        # and passthrough picks the next free lower from that list.
        for side in ("a", "b"):
            dev, lower = b.name("m", side), seg.lower_for()
            _links(None).add_macvtap(dev, lower, mode.kernel, kind="macvlan")
            stack.callback(b._del_link, dev, None)
            devs.append((dev, lower))
        for (dev, _), ns in zip(devs, (b.ns_a, b.ns_b)):
            _links(None).move(dev, ns)
            stack.callback(b._del_link, dev, ns)
        ea, eb = b.endpoints(devs[0][0], devs[1][0], offloads)
        hops = [Hop(devs[0][0], b.ns_a, "tx")]
        if mode is not macvtap.MacvtapMode.BRIDGE:
            hops += [Hop(seg.lower, None, "tx"), Hop(seg.peer, None, "rx")]
        hops.append(Hop(devs[1][0], b.ns_b, "rx"))
        via = {macvtap.MacvtapMode.BRIDGE: f"on {seg.lower}, switched inside the macvlan driver",
               macvtap.MacvtapMode.VEPA:
                   f"on {seg.lower}, reflected by hairpin bridge {seg.hairpin} on {seg.peer}",
               macvtap.MacvtapMode.PASSTHROUGH:
                   f"on {devs[0][1]} and {devs[1][1]}, the veth pair as wire"}[mode]
        yield Connection(f"macvlan-{mode.value}", ea, eb, tuple(hops),
                         f"macvlans {devs[0][0]}/{devs[1][0]} mode {mode.value} {via}, mtu {mtu}, "
                         f"{_desc_offloads(offloads)}", seg.datapath.replace("macvtap", "macvlan"),
                         tuple(x for x in (seg.hairpin,) if x))


KINDS: Mapping[str, object] = {"veth": veth_pair, "bridge": linux_bridge, "ovs-veth": ovs_veth,
                               "ovs-internal": ovs_internal, "macvlan": macvlan}


@contextlib.contextmanager
def connect(kind: str, tag: str, *, chain: int = 1, link: ChainLink | str = ChainLink.PATCH,
            **kw) -> Iterator[Connection]:
    """Any connection by name: veth, bridge, ovs-veth, ovs-internal, ovs-chain, macvlan."""
    if kind == "ovs-chain":
        cm = ovs_chain(tag, chain, link, **kw)
    elif kind in KINDS:
        cm = KINDS[kind](tag, **kw)  # type: ignore[operator]
    else:
        raise TestbedError(f"unknown namespace connection {kind!r}; one of "
                           f"{', '.join([*KINDS, 'ovs-chain'])}")
    with cm as conn:
        yield conn
