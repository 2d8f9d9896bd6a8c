"""Two real hosts (this machine and one reached over ssh, or two over ssh) joined through
their underlay interfaces: `bridge-vxlan`, `ovs-vxlan`, and `macvtap` across hosts.

Every command goes through the host's remote.Shell, an executor (testbed.host.executor), so the
same code drives a local and a remote host, and the Linux-bridge VXLAN datapath is the one
host/net/vxlan.py builds for emulated hosts (``vxlan.bridge_vxlan``), on another executor. Link
operations go through testbed.host.net.ops: ``ip`` commands over ssh, netlink locally. The underlay interface belongs to the operator: the testbed reads its IPv4
address and MTU and never changes either; an inner MTU that does not fit is an error naming
the host and the overhead. What the testbed creates on a host is named ``tb-<tag>-...`` with
the host's index (a/b), and removed on exit.

What each host gets is the mode's own (``Segment``, defined in the mode's module under
testbed/attachments): a Linux bridge with a kernel vxlan, an OVS bridge with a vxlan port, or
nothing (libvirt makes each guest's macvtap on the underlay). This module joins the two
sides and names no mode.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from testbed.errors import CapabilityError, CommandError, TestbedError
from testbed.guests import render
from testbed.host.net import links, ops
from testbed.host.net.vxlan import df_ping
from testbed.host.remote import Shell
from testbed.topology.model import Backend, HostSpec, TunnelSpec


@dataclass(frozen=True)
class RealSide:
    host: HostSpec
    shell: Shell
    underlay: str
    underlay_ip: str
    underlay_mtu: int
    bridge: str | None          # where guest taps join (None: macvtap)
    vxlan: str | None


@dataclass(frozen=True)
class Side:
    """What ``Segment.build`` is given for one host: its shell, the tag, its letter (a/b),
    the tunnel, the underlay device and both underlay addresses, and the inner MTU."""

    host: HostSpec
    shell: Shell
    tag: str
    ab: str
    tunnel: TunnelSpec
    underlay: str
    ip: str
    peer_ip: str
    mtu: int


@dataclass(frozen=True)
class Segment:
    """What a two-host mode builds on each real host, and how its NICs and MTUs are set."""

    datapath: str
    #: bytes the mode adds on the underlay (0: frames cross it as they are)
    overhead: int
    #: (exit stack, side) -> (bridge where guest taps join, tunnel device), both None if none
    build: Callable[[contextlib.ExitStack, Side], tuple[str | None, str | None]]
    #: (side, target, mac, backend, mtu, queues) -> the guest's libvirt interface
    nic: Callable[[RealSide, str, str, Backend, int, int], render.NicParams]
    #: (side, the guest's tap there, inner mtu): every hop of that host
    set_mtu: Callable[[RealSide, str, int], None]


@dataclass(frozen=True)
class RealFabric:
    segment: Segment
    tunnel: TunnelSpec
    sides: tuple[RealSide, RealSide]

    @property
    def overhead(self) -> int:
        return self.segment.overhead

    @property
    def datapath(self) -> str:
        return self.segment.datapath

    def nic(self, i: int, target: str, mac: str, backend: Backend, mtu: int, queues: int) -> render.NicParams:
        return self.segment.nic(self.sides[i], target, mac, backend, mtu, queues)

    def check_fits(self, mtu: int) -> None:
        for s in self.sides:
            if mtu + self.overhead > s.underlay_mtu:
                extra = f" + {self.overhead} bytes of VXLAN-over-IPv4 overhead" if self.overhead else ""
                raise CapabilityError(f"host {s.host.name}: inner MTU {mtu}{extra} does not fit underlay "
                                      f"{s.underlay} (MTU {s.underlay_mtu}); the testbed does not change "
                                      "a host's own interface")

    def set_mtu(self, mtu: int, taps: Sequence[str]) -> None:
        self.check_fits(mtu)
        for i, s in enumerate(self.sides):
            self.segment.set_mtu(s, taps[i], mtu)

    def counters(self, i: int, dev: str) -> links.Wire:
        return ops.on(self.sides[i].shell).wire(dev)

    def df_check(self, inner_mtu: int) -> str | None:
        """A don't-fragment ping between the underlay addresses, the size of a full
        encapsulated frame, each way; returns why it failed, or None."""
        for src, dst in ((self.sides[0], self.sides[1]), (self.sides[1], self.sides[0])):
            why = df_ping(src.shell, f"{src.host.name} -> {dst.host.name}", dst.underlay_ip, inner_mtu, self.overhead)
            if why:
                return why
        return None


def underlay_of(shell: Shell, dev: str, *, need_ipv4: bool = True) -> tuple[str, int]:
    """(IPv4 address or "", MTU) of a host's underlay interface, read there. A tunnel needs
    the address; macvtap only needs the device."""
    on_host = ops.on(shell)
    try:
        if not on_host.exists(dev):
            raise CapabilityError(f"host {shell.host.name}: underlay {dev} not found")
        addrs, mtu = on_host.ipv4_of(dev), on_host.mtu_of(dev)
    except CommandError as e:
        raise CapabilityError(f"host {shell.host.name}: underlay {dev}: {e.stderr_tail or e}") from None
    if need_ipv4 and not addrs:
        raise CapabilityError(f"host {shell.host.name}: underlay {dev} has no IPv4 address for the tunnel")
    return (addrs[0] if addrs else ""), mtu


@contextlib.contextmanager
def fabric(segment: Segment, tag: str, hosts: tuple[HostSpec, HostSpec], shells: tuple[Shell, Shell],
           tunnel: TunnelSpec, mtu: int) -> Iterator[RealFabric]:
    """Both hosts' sides of ``segment``, checked end to end (a tunnel's full frame crosses
    the underlay unfragmented), torn down in reverse order on exit."""
    tunnelled = segment.overhead > 0
    info = []
    for h, sh in zip(hosts, shells):
        # ssh itself was proven by the run's preflight; a failure here names the underlay.
        ul = h.underlay or tunnel.underlay
        if not ul:
            raise CapabilityError(f"host {h.name}: no underlay interface (tunnel.underlay or the host's 'underlay')")
        info.append((ul, *underlay_of(sh, ul, need_ipv4=tunnelled)))
    with contextlib.ExitStack() as stack:
        sides = []
        for i, (h, sh) in enumerate(zip(hosts, shells)):
            ul, ip, ulmtu = info[i]
            br, vx = segment.build(stack, Side(h, sh, tag, "ab"[i], tunnel, ul, ip, info[1 - i][1], mtu))
            sides.append(RealSide(h, sh, ul, ip, ulmtu, br, vx))
        f = RealFabric(segment, tunnel, (sides[0], sides[1]))
        f.check_fits(mtu)
        if tunnelled:
            why = f.df_check(mtu)
            if why:
                raise TestbedError(why)
        yield f
