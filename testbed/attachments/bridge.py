"""`bridge`: a Linux bridge with no uplink and no host address; libvirt creates each guest's
tap (interface type='bridge') with a tb- name and enslaves it (hostnet/bridge.py)."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

from testbed.attachments.base import Fabric, Mode, Request


class SegmentFabric(Fabric):
    """A fabric over one of hostnet's single-host segments (bridge, ovs, macvtap): they
    already make NICs and set MTUs; only the shape is adapted."""

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


@contextlib.contextmanager
def fabric(req: Request) -> Iterator[Fabric]:
    from testbed.host.net import bridge
    with bridge.segment(req.tag, req.max_mtu) as seg:
        yield SegmentFabric(seg, (seg.name,))


MODES = (Mode("bridge", fabric, across_instead="bridge-vxlan", variants=True, classic=True),)
