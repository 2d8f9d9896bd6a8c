"""`bridge-vxlan`: guests on two hosts, each host a Linux bridge with a kernel vxlan port.

On hosts emulated on this machine (host/net/vxlan.py) each host's datapath lives in its
own namespace. A guest's NIC under test is a bare tap (libvirt ``type='ethernet'``) that
libvirt creates in the root namespace; once QEMU holds it, it is moved into its host's
namespace and joins that host's bridge. Unplugging closes QEMU's descriptor, which removes
the tap wherever it is, so nothing is left in either namespace or the root one. On real
hosts: attachments/_across.py.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

from testbed.attachments import _across
from testbed.attachments.base import Fabric, Mode, Request

VXLAN_OVERHEAD = 50     # outer Ethernet 14 + IPv4 20 + UDP 8 + VXLAN 8 (host/net/vxlan.py)


class EmulatedVxlanFabric(Fabric):
    """Both emulated hosts with their tunnel (host/net/vxlan.Fabric)."""

    def __init__(self, fab) -> None:
        self.fab = fab
        self.datapath = fab.datapath

    def nic(self, i, n, target, mac, backend, mtu, queues):
        from testbed.guests import render
        # OVS's userspace datapath (3.1) cannot finish a partial checksum or segment a TSO
        # frame it tunnels: TCP stalls while ping works (measured). Its guests therefore
        # get a device without checksum offload. The kernel vxlan device handles both.
        return render.NicParams(kind="ethernet", source="", target=target, mac=mac,
                                driver=backend.driver_name, mtu=mtu, queues=queues,
                                checksum_offload=self.fab.hosts[_across.side(i)].switch is None)

    @contextlib.contextmanager
    def attach(self, i, target):
        from testbed.host.net import links, vxlan
        links.no_ipv6(target)   # not even a link-local address while it is in the root namespace
        with vxlan.port(self.fab, self.fab.hosts[_across.side(i)], target):
            yield

    def set_mtu(self, mtu: int, taps: Sequence[str]) -> None:
        self.fab.set_mtu(mtu, [(self.fab.hosts[_across.side(i)], tap) for i, tap in enumerate(taps)])

    def counters(self, i: int, tap: str):
        from testbed.host.net import vxlan
        return vxlan.counters(tap, self.fab.hosts[_across.side(i)].netns)

    def leftovers(self) -> tuple[str, ...]:
        return tuple(x for h in self.fab.hosts for x in (h.netns, h.wire, h.bridge, h.vxlan))


def real_segment():
    """On each real host: a Linux bridge with a kernel vxlan device on the underlay."""
    from testbed.guests import render
    from testbed.attachments import _realhost as realhost
    from testbed.host.net import vxlan
    from testbed.topology.model import object_name

    def build(stack, side):
        br, vx = object_name(side.tag, "br", side.ab), object_name(side.tag, "vx", side.ab)
        vxlan.bridge_vxlan(stack, side.shell, br, vx, side.tunnel, side.ip, side.peer_ip, side.underlay, side.mtu)
        return br, vx

    def nic(side, target, mac, backend, mtu, queues):
        return render.NicParams(kind="bridge", source=side.bridge, target=target, mac=mac,
                                driver=backend.driver_name, mtu=mtu, queues=queues)

    def set_mtu(side, tap, mtu):
        vxlan.bridge_vxlan_mtu(side.shell, [tap], side.vxlan, side.bridge, mtu)

    return realhost.Segment("linux-bridge-vxlan", VXLAN_OVERHEAD, build, nic, set_mtu)


def vxlan_fabric(real_segment, private_switch: bool):
    """The fabric of a VXLAN mode: emulated hosts each with a Linux bridge or a private OVS
    switch (host/net/vxlan.py), or real hosts each with the mode's ``real_segment``."""
    @contextlib.contextmanager
    def fabric(req: Request) -> Iterator[Fabric]:
        t = req.topology
        if not _across.emulated(t):
            with _across.real_fabric(req, real_segment()) as fab:
                yield fab
            return
        from testbed.host.net import vxlan
        # Placement comes from the topology (a guest booted elsewhere may carry another host name).
        names = (t.guest(t.client).host, t.guest(t.server).host)
        with vxlan.fabric(private_switch, req.tag, names, t.tunnel, req.workdir, req.max_mtu) as fab:
            yield EmulatedVxlanFabric(fab)
    return fabric


def _vxlan_probe() -> tuple[bool, str]:
    from testbed.host import probes as capabilities
    return capabilities.vxlan()


def unavailable() -> str | None:
    ok, why = _vxlan_probe()
    return None if ok else why


MODES = (Mode("bridge-vxlan", vxlan_fabric(real_segment, private_switch=False), placement="two",
              overhead=VXLAN_OVERHEAD, overhead_label="VXLAN-over-IPv4 overhead", unavailable=unavailable,
              check=_across.check, doctor=lambda: {"vxlan": _vxlan_probe()}),)
