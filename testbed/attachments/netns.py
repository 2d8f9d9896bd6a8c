"""The namespace kinds: two network namespaces instead of guests, joined the classic ways.
`netns-veth` (a veth pair) is this module's; each switch's own kind lives with its mode
(`netns-bridge` in bridge.py, `netns-ovs-veth` and `netns-ovs-internal` in ovs/), built by
the connection that mode lists in its ``CONNECTIONS``. Measured with the same tools and
records as guests; no VM, no virtio backend.

The fabric makes its endpoints itself (``own_pairs``): one pair, each namespace addressed
at subnet+1 and +2 like guests are. Their counters are read on the endpoints' own devices,
which count what their namespace sends as tx.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

from testbed.attachments.base import Fabric, Mode, Request
from testbed.errors import TestbedError
from testbed.host.net.netns import veth_pair


class ConnectionFabric(Fabric):
    """Any host.net.netns.Connection as a fabric: the scenarios build connections the matrix
    cannot express (chains, offloads) and measure them through this too."""

    guest_sends_as_rx = False

    def __init__(self, conn) -> None:
        self.conn = conn
        self.datapath = conn.datapath
        self._ends = (conn.a, conn.b)

    def own_pairs(self, out_dir: str):
        from testbed.host import nsagent

        @contextlib.contextmanager
        def pairs():
            with nsagent.hosts(self.conn.a.netns, self.conn.b.netns, out_dir) as (ha, hb):
                yield [(ha, hb)]
        return pairs()

    def endpoint(self, i: int):
        if i > 1:
            raise TestbedError(f"a namespace connection ({self.conn.kind}) joins one pair of endpoints")
        e = self._ends[i]
        return e.ifname, e.address, dict(e.offloads)

    def set_mtu(self, mtu: int, taps: Sequence[str]) -> None:
        from testbed.host.net import links, ops
        # The hops between the endpoints; the endpoints' own devices are set by measure.
        for h in self.conn.hops:
            if h.ifname not in (self.conn.a.ifname, self.conn.b.ifname):
                ops.set_mtu(ops.netns_executor(h.netns), h.ifname, mtu)
        for br in self.conn.bridges:
            if links.exists(br):
                links.set_mtu(br, mtu)

    def counters(self, i: int, tap: str):
        from testbed.host.net import ops
        return ops.on(ops.netns_executor(self._ends[i].netns)).wire(tap)

    def path_devices(self, client: str, server: str) -> tuple[tuple[str, str | None, str], ...]:
        return tuple((h.ifname, h.netns, h.a_to_b) for h in self.conn.hops)

    def leftovers(self) -> tuple[str, ...]:
        # devices inside the namespaces go with them; the ones in the root namespace are listed
        return (self.conn.a.netns, self.conn.b.netns, *self.conn.bridges,
                *(h.ifname for h in self.conn.hops if h.netns is None))


def fabric_for(build: Callable[..., contextlib.AbstractContextManager]):
    """A namespace mode's fabric: the connection ``build`` (a mode module's CONNECTIONS entry)
    between two namespaces on the topology's subnet."""
    @contextlib.contextmanager
    def fabric(req: Request) -> Iterator[Fabric]:
        import ipaddress
        net = ipaddress.ip_network(req.topology.subnet)
        with build(req.tag, subnet=str(net), mtu=req.max_mtu, offloads=req.offloads) as conn:
            yield ConnectionFabric(conn)
    return fabric


def _unresolved(req: Request):
    raise RuntimeError("a namespace mode's fabric is set by the registry (testbed.attachments)")


def netns_mode(name: str, kind: str, unavailable: Callable[[], str | None] = lambda: None) -> Mode:
    """A mode whose two ends are namespaces joined by the namespace connection ``kind``
    (a mode module lists it beside its guest mode, with that mode's own probe). The
    registry gives it its fabric once it knows every module's connections (so this module
    needs no registry: it is one of the modules the registry loads)."""
    return Mode(name, _unresolved, endpoints="netns", placement="none", unavailable=unavailable,
                netns_kind=kind)


CONNECTIONS = {"veth": veth_pair}

MODES = (netns_mode("netns-veth", "veth"),)
