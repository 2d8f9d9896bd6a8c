"""The macvtap mode's host plumbing: guests' NICs are macvtap devices (libvirt interface type='direct')
on a lower device the testbed creates, a veth pair ``tb-<tag>-lw0``/``tb-<tag>-lw1``; never
a host NIC. libvirt names macvtaps macvtapN unless <target dev> names them, so nic() always
passes a tb- target (libvirt ignores targets that start with its own prefixes: macvtap,
macvlan, vnet, vif).

How the three modes behave on a veth lower, checked here with macvlan devices in two
namespaces (same kernel forwarding code as macvtap) and netperf TCP_STREAM:

* ``bridge``: two macvtaps on the same lower reach each other inside the macvlan driver;
  the lower's counters do not move. ~8.5 Gbit/s.
* ``vepa``: every frame goes out of the lower and must come back from an adjacent switch
  that reflects it (a "hairpin", 802.1Qbg reflective relay). Without one, no connection;
  so the peer end lw1 is put in a Linux bridge ``tb-<tag>-lhb`` with hairpin mode on its
  port, which sends frames back out the port they came in on. ~6.9 Gbit/s, traffic visible
  on lw0/lw1.
* ``passthrough`` (kernel "passthru"): the macvtap takes the lower over; a second one on the
  same lower fails with EINVAL. Two guests therefore get one veth end each, and the veth
  pair is the wire between them (nic() hands out lw0, then lw1).
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

from testbed import PREFIX
from testbed.errors import CapabilityError, TestbedError
from testbed.guests import render
from testbed.host.net import links, ops
from testbed.topology.model import Attachment, Backend, MacvtapMode, object_name

# Target names libvirt treats as its own and may replace (formatdomain, <target dev>).
_LIBVIRT_PREFIXES = ("macvtap", "macvlan", "vnet", "vif")


@dataclass(frozen=True)
class MacvtapSegment:
    lower: str                       # device the macvtaps sit on
    peer: str | None                 # the other end of the testbed's veth "wire" (passthrough:
                                     # the second guest's lower); None for a user's single lower
    mode: MacvtapMode
    hairpin: str | None = None       # Linux bridge reflecting frames back (vepa only)
    datapath: str = "macvtap-bridge"
    attachment: Attachment = Attachment("macvtap")
    #: False when the lower devices are the user's: their MTU is read, never changed
    owned: bool = True

    def lower_for(self) -> str:
        """The lower device for the next NIC. Passthrough allows one macvtap per lower, so
        the first guest gets lw0 and the second lw1; other modes share lw0."""
        if self.mode is not MacvtapMode.PASSTHROUGH:
            return self.lower
        for dev in (self.lower, self.peer):
            if dev and not uppers(dev):
                return dev
        raise CapabilityError(f"macvtap passthrough: both {self.lower} and {self.peer} already "
                              "carry a guest; passthrough gives each guest a whole lower device")

    def nic(self, target: str, mac: str, backend: Backend, mtu: int, queues: int = 1) -> render.NicParams:
        if not target.startswith(PREFIX) or target.startswith(_LIBVIRT_PREFIXES):
            raise TestbedError(f"macvtap target {target!r} must be a {PREFIX} name, or libvirt "
                               "would pick a macvtapN name the cleanup cannot recognise")
        return render.NicParams(kind="direct", source=self.lower_for(), target=target, mac=mac,
                                driver=backend.driver_name, mtu=mtu, queues=queues,
                                options=(("mode", self.mode.value),))

    def set_mtu(self, mtu: int, taps: list[str]) -> None:
        if not self.owned:
            # A user's lower device is left as it is (it may carry the host's own traffic);
            # it must already allow the cell's MTU, which preflight checked for the matrix.
            for dev in self.lowers():
                if links.mtu_of(dev) < mtu:
                    raise CapabilityError(f"macvtap lower device {dev} has MTU {links.mtu_of(dev)}, "
                                          f"below the cell's {mtu}; raise it on the host first")
            for dev in taps:
                links.set_mtu(dev, mtu)
            return
        # A macvtap's MTU cannot exceed its lower's: raise the wire first, lower it last.
        wire = [self.lower, self.peer]
        if self.hairpin:
            wire.append(self.hairpin)
        current = links.mtu_of(self.lower)
        order = [*wire, *taps] if mtu >= current else [*taps, *wire]
        for dev in order:
            links.set_mtu(dev, mtu)

    def lowers(self) -> list[str]:
        return [d for d in (self.lower, self.peer) if d]

    def hops(self, taps: list[str]) -> list[str]:
        # In bridge mode guest-to-guest frames never touch the lower device.
        if self.mode is MacvtapMode.BRIDGE:
            return list(taps)
        return [*taps, *self.lowers()]


def uppers(dev: str) -> list[str]:
    """Devices stacked on ``dev`` (macvtaps, macvlans, ...), from sysfs."""
    base = f"/sys/class/net/{dev}"
    try:
        return sorted(e.removeprefix("upper_") for e in os.listdir(base) if e.startswith("upper_"))
    except FileNotFoundError:
        return []


def check_lowers(lower: tuple[str, ...], mode: MacvtapMode, max_mtu: int) -> str | None:
    """Why user-named lower devices cannot serve (None: they can). Read-only: run before
    anything is created."""
    if mode is MacvtapMode.PASSTHROUGH and len(lower) != 2:
        return ("macvtap passthrough gives each guest a whole lower device: name two "
                f"(macvtap.lower: [dev1, dev2]), got {len(lower)}")
    if mode is not MacvtapMode.PASSTHROUGH and len(lower) != 1:
        return f"macvtap mode {mode.value} puts both guests on one lower device: name one, got {len(lower)}"
    for dev in lower:
        if not links.exists(dev):
            return f"macvtap lower device {dev} does not exist on this host"
        if dev == "lo" or os.path.exists(f"/sys/class/net/{dev}/bridge"):
            return f"macvtap lower device {dev} is {'the loopback' if dev == 'lo' else 'a bridge'}; name a NIC or veth"
        if links.mtu_of(dev) < max_mtu:
            return (f"macvtap lower device {dev} has MTU {links.mtu_of(dev)}, below the matrix's "
                    f"largest MTU {max_mtu}; the testbed does not change a device it did not create")
    return None


@contextlib.contextmanager
def segment(run_tag: str, mtu: int, mode: MacvtapMode | str = MacvtapMode.BRIDGE,
            lower: tuple[str, ...] = ()) -> Iterator[MacvtapSegment]:
    """The macvtap lower device(s). ``lower`` empty: a tb- veth pair the testbed creates,
    plus a hairpin bridge on its peer for vepa; deleting lw0 on exit also removes any macvtap
    libvirt left on it. ``lower`` named: the user's devices, used as they are (libvirt
    removes the macvtaps it made on them when the NICs are unplugged)."""
    mode = MacvtapMode(mode)
    if lower:
        why = check_lowers(tuple(lower), mode, mtu)
        if why:
            raise CapabilityError(why)
        yield MacvtapSegment(lower=lower[0], peer=lower[1] if len(lower) > 1 else None, mode=mode,
                             datapath=f"macvtap-{mode.value}", owned=False)
        return
    lower, peer = object_name(run_tag, "lw0"), object_name(run_tag, "lw1")
    with contextlib.ExitStack() as stack:
        stack.enter_context(links.veth(lower, peer, mtu))
        hairpin = None
        if mode is MacvtapMode.VEPA:
            hairpin = stack.enter_context(links.bridge(object_name(run_tag, "lhb"), mtu))
            root = ops.on(None)
            root.enslave(peer, hairpin)
            root.hairpin(peer)
        yield MacvtapSegment(lower=lower, peer=peer, mode=mode, hairpin=hairpin,
                             datapath=f"macvtap-{mode.value}")


@contextlib.contextmanager
def macvtap(name: str, lower: str, mode: MacvtapMode | str = MacvtapMode.BRIDGE,
            mac: str | None = None) -> Iterator[str]:
    """A macvtap created by the testbed itself (libvirt makes the guests' own); for checks
    that the lower device takes them. Its character device is /dev/tap<ifindex>."""
    for n in (name, lower):
        if not n.startswith(PREFIX):
            raise TestbedError(f"refusing to touch {n!r}: not a {PREFIX} object")
    ops.on(None).add_macvtap(name, lower, MacvtapMode(mode).kernel, mac=mac)
    try:
        links.no_ipv6(name)
        yield name
    finally:
        links.delete(name)


@contextlib.contextmanager
def lent_to_root(name: str, lower: str, netns: str, mode: MacvtapMode | str, mac: str) -> Iterator[str]:
    """A macvtap on ``lower`` inside ``netns`` (an emulated host's wire end), created with the
    guest's MAC (a macvtap delivers by destination MAC) and moved to the root namespace, where
    libvirt can open it. It keeps its lower across the move. Deleted on exit, in whichever
    namespace it is then."""
    for n in (name, lower, netns):
        if not n.startswith(PREFIX):
            raise TestbedError(f"refusing to touch {n!r}: not a {PREFIX} object")
    there = ops.Netlink(netns)
    there.add_macvtap(name, lower, MacvtapMode(mode).kernel, mac=mac)
    try:
        # A pid: the namespace of that process, here the root one this process runs in.
        there.move(name, os.getpid())
        links.no_ipv6(name)
        links.up(name)
        yield name
    finally:
        links.delete(name)
        there.delete(name)


def take_back(name: str, netns: str) -> None:
    """Return a lent macvtap to its host's namespace once QEMU holds its /dev/tapN (the open
    queue stays with the device), so the root namespace keeps nothing of the datapath."""
    if not name.startswith(PREFIX) or not netns.startswith(PREFIX):
        raise TestbedError(f"refusing to move {name!r} to {netns!r}: not {PREFIX} objects")
    ops.on(None).move(name, netns)
    ops.Netlink(netns).set_up(name)
