"""`ovs-vxlan`: guests on two hosts, each host an OVS bridge with a vxlan port. Emulated
hosts each run a private switch with userspace tunnelling (hostnet/vxlan.py); real hosts
need the kernel datapath (hostnet/realhost.py). The fabric is bridge-vxlan's."""
from __future__ import annotations

from testbed.attachments import _across
from testbed.attachments.base import Mode
from testbed.attachments.bridge_vxlan import VXLAN_OVERHEAD, fabric
from testbed.errors import CapabilityError


def unavailable() -> str | None:
    # Each emulated host runs its own private switch (userspace tunnelling): OVS must be
    # installed; the host's own switch is not used.
    from testbed.host.net import ovsd
    try:
        ovsd.require_binaries()
    except CapabilityError as e:
        return str(e)
    return None


MODES = (Mode("ovs-vxlan", fabric, placement="two", needs_ovs=True, overhead=VXLAN_OVERHEAD,
              overhead_label="VXLAN-over-IPv4 overhead", unavailable=unavailable, check=_across.check),)
