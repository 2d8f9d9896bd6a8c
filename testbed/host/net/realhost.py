"""Two real hosts (this machine and one reached over ssh, or two over ssh) joined through
their underlay interfaces: `bridge-vxlan`, `ovs-vxlan`, and `macvtap` across hosts.

Every command goes through the host's remote.Shell, an executor (testbed.host.executor), so the
same code drives a local and a remote host, and the Linux-bridge VXLAN datapath is the one
hostnet/vxlan.py builds for emulated hosts (``vxlan.bridge_vxlan``), on another executor. Link
operations go through testbed.host.net.ops: ``ip`` commands over ssh, netlink locally. The underlay interface belongs to the operator: the testbed reads its IPv4
address and MTU and never changes either; an inner MTU that does not fit is an error naming
the host and the overhead. What the testbed creates on a host is named ``tb-<tag>-...`` with
the host's index (a/b), and removed on exit.

* ``bridge-vxlan``: Linux bridge ``tb-<tag>-br<a|b>`` + kernel vxlan ``tb-<tag>-vx<a|b>``
  (VNI, UDP port, local and peer underlay address, ``dev`` the underlay).
* ``ovs-vxlan``: OVS bridge ``tb-<tag>-ovs<a|b>`` on the host's own ovs-vswitchd with a vxlan
  port (``options:remote_ip/local_ip/key/dst_port``). That needs the kernel datapath: with
  the userspace datapath OVS would need the underlay address moved onto an OVS bridge
  ("userspace tunneling"), which the testbed does not do to an operator's NIC.
* ``macvtap``: nothing is created up front; libvirt makes each guest's macvtap
  (``type='direct'``) on its host's underlay, so guest frames cross the wire as they are.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from testbed.errors import CapabilityError, CommandError, TestbedError
from testbed.guests import render
from testbed.host.net import links, ops
from testbed.host.net.vxlan import VXLAN_OVERHEAD, bridge_vxlan, bridge_vxlan_mtu, df_ping, ovs_vxlan_port
from testbed.host.remote import Shell
from testbed.topology.model import Attachment, Backend, HostSpec, MacvtapMode, TunnelSpec, object_name


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
class RealFabric:
    kind: Attachment
    tunnel: TunnelSpec
    sides: tuple[RealSide, RealSide]
    macvtap_mode: MacvtapMode = MacvtapMode.BRIDGE

    @property
    def overhead(self) -> int:
        return 0 if self.kind == Attachment("macvtap") else VXLAN_OVERHEAD

    @property
    def datapath(self) -> str:
        return {Attachment("ovs-vxlan"): "ovs-system-vxlan", Attachment("bridge-vxlan"): "linux-bridge-vxlan",
                Attachment("macvtap"): f"macvtap-{self.macvtap_mode.value}-underlay"}[self.kind]

    def nic(self, i: int, target: str, mac: str, backend: Backend, mtu: int, queues: int) -> render.NicParams:
        side = self.sides[i]
        if self.kind == Attachment("macvtap"):
            return render.NicParams(kind="direct", source=side.underlay, target=target, mac=mac,
                                    driver=backend.driver_name, mtu=mtu, queues=queues,
                                    macvtap_mode=self.macvtap_mode.value)
        assert side.bridge
        return render.NicParams(kind="ovs" if self.kind == Attachment("ovs-vxlan") else "bridge",
                                source=side.bridge, target=target, mac=mac, driver=backend.driver_name,
                                mtu=mtu, queues=queues)

    def check_fits(self, mtu: int) -> None:
        for s in self.sides:
            if mtu + self.overhead > s.underlay_mtu:
                extra = f" + {VXLAN_OVERHEAD} bytes of VXLAN-over-IPv4 overhead" if self.overhead else ""
                raise CapabilityError(f"host {s.host.name}: inner MTU {mtu}{extra} does not fit underlay "
                                      f"{s.underlay} (MTU {s.underlay_mtu}); the testbed does not change "
                                      "a host's own interface")

    def set_mtu(self, mtu: int, taps: Sequence[str]) -> None:
        self.check_fits(mtu)
        for i, s in enumerate(self.sides):
            if self.kind == Attachment("bridge-vxlan"):
                assert s.vxlan and s.bridge
                bridge_vxlan_mtu(s.shell, [taps[i]], s.vxlan, s.bridge, mtu)
            else:
                ops.set_mtu(s.shell, taps[i], mtu)
            if self.kind == Attachment("ovs-vxlan"):
                s.shell.run(["ovs-vsctl", "--timeout=20", "set", "Interface", s.bridge, f"mtu_request={mtu}"],
                            timeout=30)

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
def fabric(kind: Attachment, tag: str, hosts: tuple[HostSpec, HostSpec], shells: tuple[Shell, Shell],
           tunnel: TunnelSpec, mtu: int, macvtap_mode: MacvtapMode = MacvtapMode.BRIDGE) -> Iterator[RealFabric]:
    if kind not in (Attachment("bridge-vxlan"), Attachment("ovs-vxlan"), Attachment("macvtap")):
        raise TestbedError(f"{kind.value} does not cross hosts")
    info = []
    for h, sh in zip(hosts, shells):
        # ssh itself was proven by the run's preflight; a failure here names the underlay.
        ul = h.underlay or tunnel.underlay
        if not ul:
            raise CapabilityError(f"host {h.name}: no underlay interface (tunnel.underlay or the host's 'underlay')")
        info.append((ul, *underlay_of(sh, ul, need_ipv4=kind != Attachment("macvtap"))))
    with contextlib.ExitStack() as stack:
        sides = []
        for i, (h, sh) in enumerate(zip(hosts, shells)):
            ul, ip, ulmtu = info[i]
            peer_ip = info[1 - i][1]
            ab = "ab"[i]
            br = vx = None
            if kind == Attachment("bridge-vxlan"):
                br, vx = object_name(tag, "br", ab), object_name(tag, "vx", ab)
                bridge_vxlan(stack, sh, br, vx, tunnel, ip, peer_ip, ul, mtu)
            elif kind == Attachment("ovs-vxlan"):
                br, vx = object_name(tag, "ovs", ab), object_name(tag, "vx", ab)
                sh.run(["ovs-vsctl", "--timeout=20", "add-br", br, *ovs_vxlan_port(br, vx, tunnel, ip, peer_ip)],
                       timeout=30)
                stack.callback(sh.run, ["ovs-vsctl", "--timeout=20", "--if-exists", "del-br", br],
                               check=False, timeout=30)
                dp = sh.run(["ovs-vsctl", "--timeout=20", "get", "Bridge", br, "datapath_type"],
                            timeout=30).stdout.strip().strip('"')
                err = sh.run(["ovs-vsctl", "--timeout=20", "get", "Interface", br, "error"],
                             timeout=30, check=False).stdout.strip()
                if dp not in ("", "system") or (err and err != "[]"):
                    raise CapabilityError(f"host {h.name}: OVS kernel datapath unavailable ({err or dp}); "
                                          "ovs-vxlan across real hosts needs it")
                sh.run(["ovs-vsctl", "--timeout=20", "set", "Interface", br, f"mtu_request={mtu}"], timeout=30)
                ops.on(sh).set_up(br)
            sides.append(RealSide(h, sh, ul, ip, ulmtu, br, vx))
        f = RealFabric(kind, tunnel, (sides[0], sides[1]), macvtap_mode)
        f.check_fits(mtu)
        if kind != Attachment("macvtap"):
            why = f.df_check(mtu)
            if why:
                raise TestbedError(why)
        yield f
