"""`bridge`: a Linux bridge with no uplink and no host address; libvirt creates each guest's
tap (interface type='bridge') with a tb- name and enslaves it."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from testbed.attachments.base import Fabric, Mode, Request
from testbed.guests import render
from testbed.host.net import links
from testbed.topology.model import Attachment, Backend


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


MODES = (Mode("bridge", fabric, across_instead="bridge-vxlan", variants=True, classic=True),)
