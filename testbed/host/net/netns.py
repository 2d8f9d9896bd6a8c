"""Two network namespaces joined for runs without VMs: the plumbing every namespace
connection shares, and the plainest one (a veth pair).

A connection makes namespaces ``tb-<tag>-a`` and ``tb-<tag>-b``, one test address each from a
198.18.0.0/15 subnet, and the path between them. The paths through a mode's own switch live
with that mode (attachments/bridge.py, attachments/ovs/namespaces.py,
attachments/macvtap/namespaces.py) and are found by name through the attachment registry
(attachments.connect); this module names no mode.

A connection is a frozen ``Connection``: the two endpoints (namespace, interface, address, the
offloads ethtool reports after the requested ones were applied), the interfaces on the path
with the counter that carries a-to-b traffic on each, and a description. Everything is
tb- named and removed on exit, on error too; root-side veth ends are deleted explicitly
because a deleted namespace frees its devices asynchronously, which would leave the peers
visible for a moment and make a quick re-run with the same names fail with "File exists".
"""
from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from testbed.errors import TestbedError
from testbed.host.net import links, ops
from testbed.topology.model import Offloads, object_name

log = logging.getLogger(__name__)

BENCH_NET = ipaddress.ip_network("198.18.0.0/15")
DEFAULT_SUBNET = "198.18.100.0/24"



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

check_ours = ops.check_ours


def links_in(netns: str | None) -> ops.Netlink:
    return ops.Netlink(netns)


def counters(ifname: str, netns: str | None = None) -> tuple[int, int]:
    """(rx_bytes, tx_bytes) of a link in any namespace."""
    if netns is None:
        return links.counters(ifname)
    w = links_in(netns).wire(ifname)
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


class Builder:
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
        check_ours(right)
        # The peer always names its namespace: created from inside left_ns it would
        # otherwise land there, not in the root one.
        links_in(left_ns).add_veth(left, right, peer_netns=right_ns or os.getpid())
        self.stack.callback(self._del_link, left, left_ns)
        for n, ns in ((left, left_ns), (right, right_ns)):
            if ns is None:
                links.no_ipv6(n)
            links_in(ns).set_mtu(n, self.mtu)
            links_in(ns).set_up(n)

    @staticmethod
    def _del_link(name: str, netns: str | None) -> None:
        links_in(netns).delete(name)

    def path_link(self, name: str, netns: str | None) -> None:
        if self.path_offloads is not None:
            apply_offloads(name, netns, self.path_offloads)

    def endpoint(self, ns: str, ifname: str, host: int, want: Offloads | None) -> Endpoint:
        addr = self.net.network_address + host
        there = links_in(ns)
        there.add_address(ifname, f"{addr}/{self.net.prefixlen}")
        there.set_mtu(ifname, self.mtu)
        there.set_up(ifname)
        applied = apply_offloads(ifname, ns, want)
        return Endpoint(ns, ifname, str(addr), self.net.prefixlen, applied)

    def endpoints(self, a_if: str, b_if: str, offloads) -> tuple[Endpoint, Endpoint]:
        oa, ob = _pair(offloads)
        return self.endpoint(self.ns_a, a_if, 1, oa), self.endpoint(self.ns_b, b_if, 2, ob)


def desc_offloads(offloads) -> str:
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
        b = Builder(stack, tag, subnet, mtu, None)
        b.namespace(b.ns_a)
        b.namespace(b.ns_b)
        a_if, b_if = b.name("a1"), b.name("b1")
        b.veth(a_if, b.ns_a, b_if, b.ns_b)
        ea, eb = b.endpoints(a_if, b_if, offloads)
        yield Connection("veth", ea, eb, (Hop(a_if, b.ns_a, "tx"), Hop(b_if, b.ns_b, "rx")),
                         f"veth pair {a_if} <-> {b_if}, mtu {mtu}, {desc_offloads(offloads)}", "veth")


def veth_to(b: Builder, side: str, middle_ns: str | None) -> tuple[str, str]:
    """A veth pair from namespace a or b to the middle: (endpoint end, middle end)."""
    ns = b.ns_a if side == "a" else b.ns_b
    outer, inner = b.name(side, "0"), b.name(side, "1")
    b.veth(outer, middle_ns, inner, ns)
    b.path_link(outer, middle_ns)
    return inner, outer
