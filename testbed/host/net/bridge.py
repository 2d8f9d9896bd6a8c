"""`bridge` attachment: a Linux bridge with no uplink and no host address; guests' taps
are created by libvirt (interface type='bridge') with tb- names and enslaved to it."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

from testbed.guests import render
from testbed.host.net import links
from testbed.topology.model import Attachment, Backend


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
