"""`bridge`: a Linux bridge with no uplink and no host address; libvirt creates each guest's
tap (interface type='bridge') with a tb- name and enslaves it."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from testbed.attachments.base import Fabric, Mode, Request
from testbed.attachments.netns import netns_mode
from testbed.guests import render
from testbed.host.net import links
from testbed.host.net.netns import DEFAULT_SUBNET, Builder, Connection, Hop, desc_offloads, links_in, veth_to
from testbed.topology.model import Attachment, Backend, Offloads


class SegmentFabric(Fabric):
    """A fabric over a single-host segment (this module's bridge, the ovs mode's bridge, a
    macvtap segment): they already make NICs and set MTUs; only the shape is adapted."""

    def __init__(self, seg, leftovers: tuple[str, ...] = ()) -> None:
        self.seg = seg
        self.datapath = seg.datapath
        self._leftovers = leftovers

    def nic(self, i, n, target, mac, backend, mtu, queues):
        return self.seg.nic(target, mac, backend, mtu, queues=queues)

    def set_mtu(self, mtu: int, taps: Sequence[str]) -> None:
        self.seg.set_mtu(mtu, list(taps))

    def leftovers(self) -> tuple[str, ...]:
        return self._leftovers


@dataclass(frozen=True)
class BridgeSegment:
    name: str
    attachment: Attachment = Attachment("bridge")
    datapath: str = "linux-bridge"

    def nic(self, target: str, mac: str, backend: Backend, mtu: int, queues: int = 1) -> render.NicParams:
        return render.NicParams(kind="bridge", source=self.name, target=target, mac=mac,
                                driver=backend.driver_name, mtu=mtu, queues=queues)

    def set_mtu(self, mtu: int, taps: list[str]) -> None:
        # Ports first: a bridge's MTU cannot exceed its smallest port's.
        for t in taps:
            links.set_mtu(t, mtu)
        links.set_mtu(self.name, mtu)

    def hops(self, taps: list[str]) -> list[str]:
        return [self.name, *taps]


@contextlib.contextmanager
def segment(run_tag: str, mtu: int) -> Iterator[BridgeSegment]:
    with links.bridge(f"tb-{run_tag}-br", mtu) as name:
        yield BridgeSegment(name)


@contextlib.contextmanager
def fabric(req: Request) -> Iterator[Fabric]:
    with segment(req.tag, req.max_mtu) as seg:
        yield SegmentFabric(seg, (seg.name,))


@contextlib.contextmanager
def linux_bridge(tag: str, *, subnet: str = DEFAULT_SUBNET, mtu: int = 1500,
                 offloads: Offloads | Sequence[Offloads | None] | None = None,
                 path_offloads: Offloads | None = None) -> Iterator[Connection]:
    """Namespaces joined by a Linux bridge (no address, no uplink) with a veth pair to each namespace."""
    with contextlib.ExitStack() as stack:
        b = Builder(stack, tag, subnet, mtu, path_offloads)
        b.namespace(b.ns_a)
        b.namespace(b.ns_b)
        br = stack.enter_context(links.bridge(b.name("br"), mtu))
        a_in, a_out = veth_to(b, "a", None)
        b_in, b_out = veth_to(b, "b", None)
        for port in (a_out, b_out):
            links_in(None).enslave(port, br)
        ea, eb = b.endpoints(a_in, b_in, offloads)
        hops = (Hop(a_in, b.ns_a, "tx"), Hop(a_out, None, "rx"), Hop(b_out, None, "tx"),
                Hop(b_in, b.ns_b, "rx"))
        yield Connection("bridge", ea, eb, hops,
                         f"Linux bridge {br} with veth pairs {a_in}/{a_out} and {b_in}/{b_out}, "
                         f"mtu {mtu}, {desc_offloads(offloads)}", "linux-bridge", (br,))


#: the namespace connections this mode builds (attachments.connect finds them by name)
CONNECTIONS = {"bridge": linux_bridge}

MODES = (Mode("bridge", fabric, across_instead="bridge-vxlan", variants=True, classic=True),
         netns_mode("netns-bridge", "bridge"))
