"""The ovs mode in namespaces: OVS bridges between two network namespaces, for the
studies that measure a switch without guests (chains of bridges, internal ports).

Without ``userspace-tso-enable`` the OVS userspace datapath drops TCP from senders with tx
checksum offload on (host/net/ovs.py has the measurements). These connections therefore
require it like the ovs attachment does; ``tso=False`` waives that for a switch without it,
and the caller then asks for ``Offloads(tx=False)`` on the endpoints.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from enum import StrEnum

from testbed.errors import CommandError, TestbedError
from testbed.host.net import ovs, ovsd
from testbed.host.net.netns import (
    DEFAULT_SUBNET,
    Builder,
    Connection,
    Hop,
    check_ours,
    desc_offloads,
    links_in,
    veth_to,
)
from testbed.topology.model import Offloads

MAX_CHAIN = 9


class ChainLink(StrEnum):
    PATCH = "patch"
    VETH = "veth"


def ovs_switch(switch: ovsd.Ovs | None, tso: bool) -> ovsd.Ovs:
    switch = switch or ovsd.ensure_running()
    if tso:
        ovs.require_userspace_tso(switch)
    return switch


def ovs_bridge(b: Builder, name: str, switch: ovsd.Ovs) -> str:
    return b.stack.enter_context(ovs.bridge(name, switch, b.mtu))


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
        b = Builder(stack, tag, subnet, mtu, None)
        b.namespace(b.ns_a)
        b.namespace(b.ns_b)
        sw = ovs_switch(switch, tso)
        br = ovs_bridge(b, b.name("ovs"), sw)
        ports = []
        for side, ns in (("a", b.ns_a), ("b", b.ns_b)):
            port = b.name("i", side)
            # No mtu_request: endpoint() sets the MTU inside the namespace. On the userspace
            # datapath a moved internal port still forwards (vswitchd keeps the tap's fd)
            # but vswitchd, which finds devices by name in its own namespace, can no longer
            # configure it and would log a failed MTU change at every reconfiguration.
            sw.vsctl("add-port", br, port, "--", "set", "Interface", port, "type=internal")
            stack.callback(del_port, sw, br, port)
            links_in(sw.netns).move(port, ns)
            ports.append(port)
        ea, eb = b.endpoints(ports[0], ports[1], offloads)
        hops = (Hop(ports[0], b.ns_a, "tx"), Hop(ports[1], b.ns_b, "rx"))
        yield Connection("ovs-internal", ea, eb, hops,
                         f"OVS bridge {br} ({ovs.ovs_datapath(sw)}) with internal ports {ports[0]} "
                         f"and {ports[1]} in the namespaces, mtu {mtu}, {desc_offloads(offloads)}",
                         f"ovs-{ovs.ovs_datapath(sw)}", (br,))


def del_port(switch: ovsd.Ovs, br: str, port: str) -> None:
    del_ports(switch, [(br, port)])


def del_ports(switch: ovsd.Ovs, ports: Sequence[tuple[str, str]]) -> None:
    """Ports leave OVS before their devices go, so vswitchd never polls a vanished device."""
    args: list[str] = []
    for br, port in ports:
        check_ours(port)
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
        b = Builder(stack, tag, subnet, mtu, path_offloads)
        b.namespace(b.ns_a)
        b.namespace(b.ns_b)
        sw = ovs_switch(switch, tso)
        mid = sw.netns
        single = kind == "ovs-veth"
        bridges = [ovs_bridge(b, b.name("ovs") if single else b.name("c", str(i)), sw)
                   for i in range(1, n + 1)]
        a_in, a_out = veth_to(b, "a", mid)
        b_in, b_out = veth_to(b, "b", mid)
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
        stack.callback(del_ports, sw, ports)
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
                         f"{desc}, mtu {mtu}, {desc_offloads(offloads)}", f"ovs-{dp}", tuple(bridges))


@contextlib.contextmanager
def _chain(tag: str, *, chain: int = 1, link: ChainLink | str = ChainLink.PATCH, **kw) -> Iterator[Connection]:
    with ovs_chain(tag, chain, link, **kw) as conn:
        yield conn


#: the namespace connections this mode builds (attachments.connect finds them by name)
CONNECTIONS = {"ovs-veth": ovs_veth, "ovs-internal": ovs_internal, "ovs-chain": _chain}
