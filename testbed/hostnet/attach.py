"""Pick the host-side segment for an attachment mode."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

from testbed import capabilities
from testbed.errors import CapabilityError
from testbed.hostnet import bridge, macvtap, ovs, ovsd
from testbed.model import Attachment, MacvtapSpec

SINGLE_HOST = (Attachment.BRIDGE, Attachment.OVS, Attachment.MACVTAP)


def unavailable(attachment: Attachment) -> str | None:
    """Why this host cannot run a mode (None: it can), found by trying."""
    if attachment.is_netns:
        if attachment in (Attachment.NETNS_OVS, Attachment.NETNS_OVS_INTERNAL):
            return unavailable(Attachment.OVS)
        return None
    if attachment is Attachment.BRIDGE_VXLAN:
        ok, why = capabilities.vxlan()
        return None if ok else why
    if attachment is Attachment.OVS_VXLAN:
        # Each emulated host runs its own private switch (userspace tunnelling): OVS must be
        # installed; the host's own switch is not used.
        try:
            ovsd.require_binaries()
        except CapabilityError as e:
            return str(e)
        return None
    if attachment is Attachment.OVS:
        ok, why = capabilities.ovs_running()
        if not ok:
            return why
        # A userspace switch started without userspace TSO drops guests' TCP: refuse up front.
        try:
            ovs.require_userspace_tso(ovsd.Ovs(db=ovsd.default_db(), rundir=str(ovsd.RUNDIR)))
        except CapabilityError as e:
            return str(e)
        return None
    if attachment is Attachment.MACVTAP:
        ok, why = capabilities.macvtap()
        return None if ok else why
    return None


def supported_single_host() -> tuple[Attachment, ...]:
    return tuple(a for a in SINGLE_HOST if unavailable(a) is None)


@contextlib.contextmanager
def segment(attachment: Attachment, run_tag: str, mtu: int,
            macvtap_spec: MacvtapSpec = MacvtapSpec()) -> Iterator[object]:
    if attachment is Attachment.BRIDGE:
        cm = bridge.segment(run_tag, mtu)
    elif attachment is Attachment.OVS:
        cm = ovs.segment(run_tag, mtu)
    elif attachment is Attachment.MACVTAP:
        cm = macvtap.segment(run_tag, mtu, macvtap_spec.mode, macvtap_spec.lower)
    else:
        raise CapabilityError(f"attachment {attachment.value} is not implemented yet")
    with cm as seg:
        yield seg
