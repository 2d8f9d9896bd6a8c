"""`ovs`: an Open vSwitch bridge with no uplink and no host address on the host's switch
(started if nothing runs it); libvirt creates each guest's tap with a tb- name and adds it
(host/net/ovs.py has the userspace-datapath measurements behind the TSO requirement).
In namespaces (no guests) its bridges join two namespaces: namespaces.py."""
from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass

from testbed.attachments.base import Fabric, Mode, ObjectKind, Request
from testbed.attachments.bridge import SegmentFabric
from testbed.attachments.netns import netns_mode
from testbed.attachments.ovs.namespaces import CONNECTIONS
from testbed.errors import CapabilityError, TestbedError
from testbed.guests import render
from testbed.host.net import links, ovsd
from testbed.host.net.ovs import (
    bridge,
    check_ours,
    delete_bridge,
    ovs_datapath,
    require_userspace_tso,
    tb_bridges,
    userspace_tso,
)
from testbed.topology.model import Attachment, Backend, object_name

log = logging.getLogger(__name__)


def unavailable() -> str | None:
    from testbed.host import probes as capabilities
    ok, why = capabilities.ovs_running()
    if not ok:
        return why
    # A userspace switch started without userspace TSO drops guests' TCP: refuse up front.
    try:
        require_userspace_tso(ovsd.Ovs(db=ovsd.default_db(), rundir=str(ovsd.RUNDIR)))
    except CapabilityError as e:
        return str(e)
    return None


def doctor() -> dict:
    """`testbed doctor`: is a switch running (started if needed), and which datapath it can use."""
    from testbed.host import probes as capabilities
    ok, why = capabilities.ovs_running()
    kdp, kwhy = capabilities.ovs_kernel_datapath()
    return {"ovs": (ok, why if not ok else ("kernel datapath" if kdp else f"userspace (netdev) datapath only: {kwhy}")),
            "ovs_datapath": ("kernel" if kdp else "userspace") if ok else "none"}


@dataclass(frozen=True)
class OvsSegment:
    name: str
    db: str                                  # ovs-vsctl --db of the switch that holds it
    datapath: str = "ovs-netdev"             # ovs-netdev | ovs-system
    attachment: Attachment = Attachment("ovs")

    def nic(self, target: str, mac: str, backend: Backend, mtu: int, queues: int = 1) -> render.NicParams:
        check_ours(target)
        return render.NicParams(kind="ovs", source=self.name, target=target, mac=mac,
                                driver=backend.driver_name, mtu=mtu, queues=queues)

    def set_mtu(self, mtu: int, taps: list[str]) -> None:
        # mtu_request is what OVS keeps applying to the device (it would undo a bare link
        # change on its next reconfiguration); the link MTU is then set and read back as well,
        # so a port OVS could not configure shows up here and not as a failed ping later.
        for t in [*taps, self.name]:
            check_ours(t)
        args: list[str] = []
        for t in [*taps, self.name]:
            args += ["--", "set", "Interface", t, f"mtu_request={mtu}"]
        ovsd.vsctl(*args, db=self.db)
        for t in taps:
            if links.mtu_of(t) != mtu:
                links.set_mtu(t, mtu)
            if links.mtu_of(t) != mtu:
                raise TestbedError(f"{t}: MTU {links.mtu_of(t)} after asking OVS and the kernel for {mtu}")

    def hops(self, taps: list[str]) -> list[str]:
        # Not the bridge's own internal port: it is a port like the taps and carries no
        # guest-to-guest traffic.
        return list(taps)


@contextlib.contextmanager
def segment(run_tag: str, mtu: int, *, switch: ovsd.Ovs | None = None,
            tso: bool = True) -> Iterator[OvsSegment]:
    """An OVS bridge ``tb-<tag>-ovs`` on the host's switch (started if nothing runs it), or
    on ``switch``. On the userspace datapath it needs userspace TSO configured (see module
    notes); ``tso=False`` skips that check, and guests must then turn tx checksumming off."""
    switch = switch or ovsd.ensure_running()
    dp = ovs_datapath(switch)
    if tso:
        require_userspace_tso(switch)
    elif dp == "netdev" and not userspace_tso(switch):
        log.warning("OVS userspace datapath without userspace TSO: guests need tx checksumming off")
    with bridge(object_name(run_tag, "ovs"), switch, mtu) as name:
        yield OvsSegment(name=name, db=switch.db, datapath=f"ovs-{dp}")


@contextlib.contextmanager
def fabric(req: Request) -> Iterator[Fabric]:
    with segment(req.tag, req.max_mtu) as seg:
        yield SegmentFabric(seg, (seg.name,))


MODES = (Mode("ovs", fabric, across_instead="ovs-vxlan", needs_ovs=True, variants=True,
              classic=True, unavailable=unavailable, doctor=doctor,
              object_kinds=(ObjectKind("ovs_bridges", tb_bridges, delete_bridge),)),
         netns_mode("netns-ovs-veth", "ovs-veth", unavailable),
         netns_mode("netns-ovs-internal", "ovs-internal", unavailable))

__all__ = ["CONNECTIONS", "MODES", "OvsSegment", "doctor", "fabric", "segment", "unavailable"]
