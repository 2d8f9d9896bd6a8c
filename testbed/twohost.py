"""Guests on two hosts: joined by VXLAN (`ovs-vxlan`, `bridge-vxlan`), or directly over
the wire (`macvtap` with the guests placed on different hosts).

Real hosts (this machine plus one reached over ssh, ``transport: ssh``) are joined through
their own underlay interfaces (hostnet/realhost.py); each guest runs in its host's libvirt.

Hosts emulated on this machine (``transport: netns``): each host's datapath lives in its own
namespace (hostnet/vxlan.py) and both guests run in the local libvirt. A guest's NIC under
test is a bare tap (libvirt ``type='ethernet'``) that libvirt creates in the root
namespace; once QEMU holds it, it is moved into its host's
namespace and joins that host's bridge. Unplugging closes QEMU's descriptor, which removes
the tap wherever it is, so nothing is left in either namespace or the root one.
"""
from __future__ import annotations

import contextlib
import ipaddress
from collections.abc import Iterator
from pathlib import Path

from testbed import guestnic, measure, proc, remote, render, virt
from testbed.errors import CapabilityError
from testbed.hostnet import links, macvtap, realhost, vxlan
from testbed.model import Attachment, Backend, Offloads, Topology


def across(t: Topology, attachment: Attachment) -> bool:
    """Whether ``attachment`` joins the client and server across two hosts in ``t``: the
    VXLAN modes always, macvtap when the two guests are placed on different hosts."""
    return attachment.needs_two_hosts or (
        attachment is Attachment.MACVTAP and t.host_of(t.client) != t.host_of(t.server))


def unavailable(t: Topology, attachment: Attachment) -> str | None:
    """Why this topology cannot run ``attachment`` across its hosts (None: it can, or the
    attachment does not cross hosts here)."""
    if not across(t, attachment):
        return None
    used = [t.host_of(g) for g in (t.client, t.server)]
    if all(h.emulated for h in used):
        return None
    if any(h.emulated for h in used):
        return "the client's and server's hosts must both be emulated (transport netns) or both real"
    if not any(h.remote for h in used):
        # Two real hosts that are both this machine would share one root namespace.
        return (f"hosts {used[0].name} and {used[1].name} are both this machine; a mode across real hosts "
                "needs a second machine (transport ssh), or emulated hosts (transport netns)")
    return None


@contextlib.contextmanager
def mode(attachment: Attachment, backend: Backend, tag: str, client: virt.Guest, server: virt.Guest,
         t: Topology, max_mtu: int, workdir: Path, *, queues: int = 1,
         offloads: Offloads | None = None) -> Iterator[measure.TestPath]:
    """Both emulated hosts with their tunnel, and a NIC under test in each guest, plugged
    into the guest's own host."""
    why = unavailable(t, attachment)
    if why:
        raise CapabilityError(why)
    if not t.host_of(client.spec.name).emulated:
        with _real_across(attachment, backend, tag, client, server, t, max_mtu, queues=queues,
                          offloads=offloads) as path:
            yield path
        return
    if attachment is Attachment.MACVTAP:
        with _macvtap_across(backend, tag, client, server, t, max_mtu, queues=queues,
                             offloads=offloads) as path:
            yield path
        return
    # Placement comes from the topology (a guest booted elsewhere may carry another host name).
    names = (t.guest(client.spec.name).host, t.guest(server.spec.name).host)
    net = ipaddress.ip_network(t.subnet)
    applied: dict[str, dict[str, str]] = {}
    with contextlib.ExitStack() as stack:
        fab = stack.enter_context(vxlan.fabric(attachment, tag, names,
                                               t.tunnel, workdir, max_mtu))
        eps, ports = [], []
        for i, g in enumerate((client, server)):
            side = fab.hosts[i]
            target = f"tb-{tag}-t{i}"
            m = guestnic.mac(tag, i, 0)
            # OVS's userspace datapath (3.1) cannot finish a partial checksum or segment a TSO
            # frame it tunnels: TCP stalls while ping works (measured). Its guests therefore
            # get a device without checksum offload. The kernel vxlan device handles both.
            params = render.NicParams(kind="ethernet", source="", target=target, mac=m,
                                      driver=backend.driver_name, mtu=max_mtu, queues=queues,
                                      checksum_offload=side.switch is None)
            ifname = stack.enter_context(virt.plugged_nic(g, render.interface_xml(params), m))
            links.no_ipv6(target)   # not even a link-local address while it is in the root namespace
            stack.enter_context(vxlan.port(fab, side, target))
            ports.append((side, target))
            addr = str(net.network_address + 1 + i)
            applied[g.spec.name] = guestnic.configure(g.agent, ifname, addr, net.prefixlen, queues, offloads)
            eps.append(measure.Endpoint(g, ifname, addr, target))
        netns_of = {target: side.netns for side, target in ports}
        # Registered last, so servers stop before the NICs are unplugged.
        servers = stack.enter_context(measure.Servers())
        yield measure.TestPath(
            eps[0], eps[1], lambda mtu: fab.set_mtu(mtu, ports),
            read_counters=lambda ep: vxlan.counters(ep.tap, netns_of[ep.tap]),
            servers=servers, datapath=fab.datapath, offloads=applied)


@contextlib.contextmanager
def _macvtap_across(backend: Backend, tag: str, client: virt.Guest, server: virt.Guest, t: Topology,
                    max_mtu: int, *, queues: int, offloads: Offloads | None) -> Iterator[measure.TestPath]:
    """macvtap across two emulated hosts: each guest's NIC is a macvtap whose lower device is
    its host's end of the wire (the underlay), so guest frames cross the wire as they are,
    with no tunnel. libvirt's ``type='direct'`` can only make a macvtap on a root-namespace
    device, so the testbed makes it in the host's namespace on the wire end, lends it to the
    root namespace while libvirt opens it (``type='ethernet'``, ``managed='no'``: a macvtap
    keeps its lower across namespaces), and takes it back once QEMU holds /dev/tapN."""
    net = ipaddress.ip_network(t.subnet)
    applied: dict[str, dict[str, str]] = {}
    with contextlib.ExitStack() as stack:
        ns, wires = stack.enter_context(vxlan.hosts_and_wire(tag, max_mtu))
        eps = []
        for i, g in enumerate((client, server)):
            target = f"tb-{tag}-t{i}"
            m = guestnic.mac(tag, i, 0)
            stack.enter_context(macvtap.lent_to_root(target, wires[i], ns[i], t.macvtap.mode, m))
            params = render.NicParams(kind="ethernet", source="", target=target, mac=m,
                                      driver=backend.driver_name, mtu=max_mtu, queues=queues,
                                      managed=False)
            ifname = stack.enter_context(virt.plugged_nic(g, render.interface_xml(params), m))
            macvtap.take_back(target, ns[i])
            addr = str(net.network_address + 1 + i)
            applied[g.spec.name] = guestnic.configure(g.agent, ifname, addr, net.prefixlen, queues, offloads)
            eps.append(measure.Endpoint(g, ifname, addr, target))
        netns_of = {f"tb-{tag}-t{i}": ns[i] for i in (0, 1)}

        def set_mtu(mtu: int) -> None:
            # A macvtap's MTU cannot exceed its lower's: wires first when raising, last when lowering.
            devs = list(zip(wires, ns))
            taps = [(ep.tap, netns_of[ep.tap]) for ep in eps]
            current = vxlan.mtu_of(wires[0], ns[0])
            for dev, n in ([*devs, *taps] if mtu >= current else [*taps, *devs]):
                proc.run(["ip", "link", "set", "dev", dev, "mtu", str(mtu)], netns=n, timeout=30)

        servers = stack.enter_context(measure.Servers())
        yield measure.TestPath(
            eps[0], eps[1], set_mtu, guest_sends_as_rx=False,
            read_counters=lambda ep: vxlan.counters(ep.tap, netns_of[ep.tap]),
            servers=servers, datapath=f"macvtap-{t.macvtap.mode.value}-wire", offloads=applied)


@contextlib.contextmanager
def _real_across(attachment: Attachment, backend: Backend, tag: str, client: virt.Guest, server: virt.Guest,
                 t: Topology, max_mtu: int, *, queues: int,
                 offloads: Offloads | None) -> Iterator[measure.TestPath]:
    """Guests on two real hosts (this machine and one over ssh, or two over ssh), joined
    through the hosts' underlay interfaces (hostnet/realhost.py). libvirt plugs each NIC on
    its guest's own host."""
    specs = (t.host_of(client.spec.name), t.host_of(server.spec.name))
    shells = (remote.shell(specs[0]), remote.shell(specs[1]))
    net = ipaddress.ip_network(t.subnet)
    applied: dict[str, dict[str, str]] = {}
    with contextlib.ExitStack() as stack:
        fab = stack.enter_context(realhost.fabric(attachment, tag, specs, shells, t.tunnel, max_mtu,
                                                  t.macvtap.mode))
        eps = []
        for i, g in enumerate((client, server)):
            target = f"tb-{tag}-t{i}"
            m = guestnic.mac(tag, i, 0)
            params = fab.nic(i, target, m, backend, max_mtu, queues)
            ifname = stack.enter_context(virt.plugged_nic(g, render.interface_xml(params), m))
            addr = str(net.network_address + 1 + i)
            applied[g.spec.name] = guestnic.configure(g.agent, ifname, addr, net.prefixlen, queues, offloads)
            eps.append(measure.Endpoint(g, ifname, addr, target))
        index = {ep.tap: i for i, ep in enumerate(eps)}
        servers = stack.enter_context(measure.Servers())
        yield measure.TestPath(
            eps[0], eps[1], lambda mtu: fab.set_mtu(mtu, [ep.tap for ep in eps]),
            guest_sends_as_rx=attachment is not Attachment.MACVTAP,
            read_counters=lambda ep: fab.counters(index[ep.tap], ep.tap),
            servers=servers, datapath=fab.datapath, offloads=applied)
