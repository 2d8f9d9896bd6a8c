"""Guests on two hosts joined by VXLAN (`ovs-vxlan`, `bridge-vxlan`).

Today the two hosts are emulated on this machine (hosts with ``transport: netns``): each
host's datapath lives in its own namespace (hostnet/vxlan.py) and both guests run in the
local libvirt. A guest's NIC under test is a bare tap (libvirt ``type='ethernet'``) that
libvirt creates in the root namespace; once QEMU holds it, it is moved into its host's
namespace and joins that host's bridge. Unplugging closes QEMU's descriptor, which removes
the tap wherever it is, so nothing is left in either namespace or the root one.
"""
from __future__ import annotations

import contextlib
import ipaddress
from collections.abc import Iterator
from pathlib import Path

from testbed import guestnic, measure, render, virt
from testbed.errors import CapabilityError
from testbed.hostnet import links, vxlan
from testbed.model import Attachment, Backend, Offloads, Topology


def unavailable(t: Topology, attachment: Attachment) -> str | None:
    """Why this topology cannot run ``attachment`` across its hosts (None: it can, or the
    attachment does not cross hosts here)."""
    hosts = {h.name: h for h in t.hosts}
    used = [hosts[t.guest(g).host] for g in (t.client, t.server)]
    if attachment is Attachment.MACVTAP:
        if used[0].name != used[1].name:
            return "macvtap across two hosts (the underlay as lower device) is not implemented yet"
        return None
    if not attachment.needs_two_hosts:
        return None
    real = [h.name for h in used if not h.emulated]
    if real:
        return (f"host(s) {', '.join(real)}: two-host modes run on hosts emulated on this machine "
                "(transport: netns); driving a real second host over qemu+ssh:// is not implemented yet")
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
