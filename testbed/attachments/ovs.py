"""`ovs`: an Open vSwitch bridge with no uplink and no host address on the host's switch
(started if nothing runs it); libvirt creates each guest's tap with a tb- name and adds it
(hostnet/ovs.py has the userspace-datapath measurements behind the TSO requirement)."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

from testbed.attachments.base import Fabric, Mode, Request
from testbed.attachments.bridge import SegmentFabric
from testbed.errors import CapabilityError


def unavailable() -> str | None:
    from testbed.admin import capabilities
    from testbed.host.net import ovs, ovsd
    ok, why = capabilities.ovs_running()
    if not ok:
        return why
    # A userspace switch started without userspace TSO drops guests' TCP: refuse up front.
    try:
        ovs.require_userspace_tso(ovsd.Ovs(db=ovsd.default_db(), rundir=str(ovsd.RUNDIR)))
    except CapabilityError as e:
        return str(e)
    return None


@contextlib.contextmanager
def fabric(req: Request) -> Iterator[Fabric]:
    from testbed.host.net import ovs
    with ovs.segment(req.tag, req.max_mtu) as seg:
        yield SegmentFabric(seg, (seg.name,))


MODES = (Mode("ovs", fabric, across_instead="ovs-vxlan", needs_ovs=True, variants=True,
              classic=True, unavailable=unavailable),)
