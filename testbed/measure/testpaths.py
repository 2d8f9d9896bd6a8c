"""Test paths: a mode's fabric joined to its endpoints.

A fabric (testbed/attachments) joins endpoints; here it meets them: guest NICs hot-plugged
and addressed (``plug``), or the namespace endpoints the fabric made itself
(``own_endpoints_path``). Each is a context manager whose exit unplugs and tears down in
reverse order. The runner, variants, benchmarks, scenarios and users' pytest fixtures all
build their paths here, so there is one way to join two endpoints.
"""
from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import logging
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from testbed import attachments
from testbed.admin import cleanup
from testbed.attachments.netns import ConnectionFabric
from testbed.errors import CapabilityError, TestbedError
from testbed.guests import guestnic, render, virt
from testbed.host import hostwatch, remotewatch
from testbed.measure import sampling as measure
from testbed.topology.model import Accelerator, Attachment, Backend, EndpointPins, Offloads, Topology, object_name

log = logging.getLogger(__name__)


@contextlib.contextmanager
def fabric(attachment: Attachment, tag: str, t: Topology, max_mtu: int, workdir: Path,
           offloads: Offloads | None = None) -> Iterator[attachments.Fabric]:
    """The fabric of a registered mode for topology ``t`` (its own fields, its hosts)."""
    req = attachments.Request(Attachment(attachment).value, tag, t, max_mtu, Path(workdir), offloads)
    made: tuple[str, ...] = ()
    try:
        with attachments.get(attachment).fabric(req) as fab:
            made = fab.leftovers()
            yield fab
    finally:
        # What the fabric says it made must be gone once it is torn down; `testbed cleanup`
        # removes whatever a failed teardown left.
        stale = attachments.still_here(made)
        if stale:
            log.error("%s fabric left %s behind (testbed cleanup removes them)", req.attachment,
                      ", ".join(stale))


@contextlib.contextmanager
def plug(fab: attachments.Fabric, pairs: Sequence[tuple[object, object]], *, tag: str, subnet: str,
         backend: Backend = Backend.QEMU, max_mtu: int, queues: int = 1,
         offloads: Offloads | None = None,
         nic_options: Sequence[Mapping[str, str]] | None = None) -> Iterator[list[measure.TestPath]]:
    """Plug N pairs of endpoints into one fabric; yields one measure.TestPath per pair.

    ``pairs`` is a list of (client, server): booted guests (virt.Guest), or for a namespace
    fabric the NsHosts its ``own_pairs`` yields. With N pairs, pass all of them at once
    (``plug(fab, [(c0, s0), (c1, s1), ...], ...)``): endpoint i = 2k (client) and 2k + 1
    (server) of pair k gets address subnet+1+i, a NIC whose host-side device is
    ``tb-<tag>-t<i>`` and MAC guestnic.mac(tag, i, 0); the fabric puts each endpoint on its
    side (across two hosts: clients on the first host). Each path has its own tool servers;
    the MTU of a path is set on the whole fabric (all pairs share its hops).
    ``nic_options``, one mapping per pair, adds virtio-net driver options (``queues`` among
    them overrides ``queues``) to that pair's NICs. The NICs advertise ``max_mtu``, so later
    cells can change the MTU live."""
    net = ipaddress.ip_network(subnet, strict=False)
    hosts = [h for p in pairs for h in p]
    n = len(hosts)
    if n + 2 > net.num_addresses:
        raise TestbedError(f"subnet {subnet} has no room for {len(pairs)} pairs of endpoints")
    with contextlib.ExitStack() as stack:
        eps: list[measure.Endpoint] = []
        applied: dict[str, Mapping[str, str]] = {}
        for i, host in enumerate(hosts):
            own = fab.endpoint(i)
            if own is not None:
                ifname, addr, applied[host.spec.name] = own  # type: ignore[attr-defined]
                eps.append(measure.Endpoint(host, ifname, addr, ifname))  # type: ignore[arg-type]
                continue
            opts = dict((nic_options or [{}] * len(pairs))[i // 2])
            if getattr(host, "accelerator", "") == Accelerator.TCG.value:
                # QEMU 7.2's userspace virtio-net under TCG stalled a NIC's transmit queue
                # now and then with notification suppression by event index: the guest
                # stopped kicking and QEMU stopped taking packets, until the test's timeout
                # (4 of 10 ten-second streams on a 2-core AMD EPYC host; 0 of 14 with it
                # off). TCG figures are functional checks; a variant's event_idx wins.
                opts.setdefault("event_idx", "off")
            q = int(opts.pop("queues", queues))
            target = object_name(tag, "t", str(i))      # within IFNAMSIZ, or ValueError
            mac = guestnic.mac(tag, i, 0)
            addr = str(net.network_address + 1 + i)
            stack.enter_context(fab.port(i, target, mac))
            params = fab.nic(i, n, target, mac, backend, max_mtu, q)
            if opts:
                params = dataclasses.replace(params, driver_options=tuple(sorted(opts.items())))
            ifname = stack.enter_context(virt.plugged_nic(host, render.interface_xml(params), mac))  # type: ignore[arg-type]
            stack.enter_context(fab.attach(i, target))
            applied[host.spec.name] = guestnic.configure(host.agent, ifname, addr, net.prefixlen, q,  # type: ignore[attr-defined]
                                                         offloads)
            eps.append(measure.Endpoint(host, ifname, addr, target))  # type: ignore[arg-type]
        index = {ep.tap: i for i, ep in enumerate(eps)}
        taps = [ep.tap for ep in eps]
        paths = []
        for k in range(len(pairs)):
            c, s = eps[2 * k], eps[2 * k + 1]
            # Entered last, so servers stop before the NICs are unplugged.
            servers = stack.enter_context(measure.Servers())
            paths.append(measure.TestPath(
                c, s, lambda mtu: fab.set_mtu(mtu, taps), guest_sends_as_rx=fab.guest_sends_as_rx,
                read_counters=lambda ep: fab.counters(index[ep.tap], ep.tap), servers=servers,
                datapath=fab.datapath,
                offloads={ep.guest.spec.name: applied[ep.guest.spec.name] for ep in (c, s)},
                guard=guard_for(fab, [(2 * k, c), (2 * k + 1, s)],
                                guests=isinstance(c.guest, virt.Guest)),
                devices=fab.path_devices(c.tap, s.tap)))
        yield paths


def guard_for(fabric, endpoints: Sequence[tuple[int, object]], *, guests: bool,
             ovs_rundir: str | None = None) -> hostwatch.Guard:
    """The guard of a path plugged into ``fabric`` (attachments.Fabric) between
    ``endpoints``: (the fabric's endpoint number, measure.Endpoint), client then server.
    Only objects that exist here now are watched (a fabric across two hosts names some on
    the other host)."""
    from testbed.host.net import ovs
    daemons: tuple[hostwatch.Daemon, ...] = ()
    if ovs.switches(fabric.datapath):
        daemons += hostwatch.ovs_daemons(ovs_rundir)
    if guests:
        daemons += hostwatch.libvirt_daemons()
    # only those running now: a host without them (another OVS manager) is not judged by them
    daemons = tuple(d for d in daemons if d.seen().pid)
    objects: list[tuple[str, Callable[[], bool]]] = []
    for name in attachments.still_here(tuple(fabric.leftovers())):
        objects.append((name, lambda n=name: bool(attachments.still_here((n,)))))
    for i, ep in endpoints:
        def dev_ok(i=i, ep=ep) -> bool:
            fabric.counters(i, ep.tap)
            return True
        where = getattr(ep.guest, "name", "")
        objects.append((f"device {ep.tap} of {where}" if where else f"device {ep.tap}", dev_ok))
    watched = tuple((ep.guest.spec.name, hostwatch.guest_check(ep.guest)) for _, ep in endpoints
                    if guests and getattr(ep.guest, "shell", None) is None)
    # the hosts the path crosses are watched too: their daemons, objects and guests
    far_daemons, far_objects, far_guests = remotewatch.for_path(fabric, endpoints, guests=guests)

    def read_bytes() -> int:
        return sum(w.rx_bytes + w.tx_bytes
                   for w in (fabric.counters(i, ep.tap) for i, ep in endpoints))
    return hostwatch.Guard(daemons + far_daemons, tuple(objects) + far_objects, read_bytes,
                           tuple(ep.tap for _, ep in endpoints),
                           min_gap_s=hostwatch.MIN_GAP_GUEST_S if guests else hostwatch.MIN_GAP_S,
                           guests=watched + far_guests)


def pin_endpoints(eps: Sequence[tuple[object, object]], pins: EndpointPins) -> None:
    """Namespace endpoints' tools kept on the CPUs placement.endpoints gives: clients on the
    client's, servers on the server's (N pairs share them). Only this host's namespaces:
    the window that verifies the pins reads this host's /proc."""
    from testbed.host.nsagent import NsAgent
    for pair in eps:
        for role, ep in zip(("client", "server"), pair):
            agent = getattr(ep, "agent", None)
            if not isinstance(agent, NsAgent):
                raise CapabilityError(f"placement.endpoints pins namespace endpoints on this host; the "
                                      f"{role} {getattr(ep, 'name', ep)} is not one (a remote host's "
                                      f"namespace, or a guest)")
            agent.pin(pins.of(role))


@contextlib.contextmanager
def pair_paths(attachment: Attachment, backend: Backend, tag: str, t: Topology,
                pairs: Sequence[tuple[object, object]] | None, *, n: int, max_mtu: int, workdir: Path,
                queues: int = 1, offloads: Offloads | None = None,
                nic_options: Sequence[Mapping[str, str]] | None = None) -> Iterator[list[measure.TestPath]]:
    """A mode's fabric with ``n`` pairs plugged in, one TestPath each: ``pairs`` (booted
    guests, all in one fabric: one shared datapath), or for a fabric that makes its own
    endpoints (one pair each: namespaces) ``n`` such fabrics, the extra ones under tags of
    their own registered as this process's (cleanup.owned_state), so that no other run's
    leftovers check takes their objects for a dead run's. ``nic_options``: one mapping per
    guest pair (a variant's virtio-net options), as for :func:`plug`."""
    import secrets
    with contextlib.ExitStack() as stack:
        out: list[measure.TestPath] = []
        tags = [tag]
        while len(out) < n:
            t_k = tags[-1]
            wd = Path(workdir) / f"p{len(tags)}" if len(tags) > 1 else Path(workdir)
            wd.mkdir(parents=True, exist_ok=True)
            fab = stack.enter_context(fabric(attachment, t_k, t, max_mtu, wd, offloads))
            own = fab.own_pairs(str(wd / "endpoints"))
            eps = stack.enter_context(own) if own is not None else list(pairs or ())[:n]
            if own is not None and t.endpoint_pins is not None:
                pin_endpoints(eps, t.endpoint_pins)
            out += stack.enter_context(plug(fab, eps, tag=t_k, subnet=t.subnet, backend=backend,
                                            max_mtu=max_mtu, queues=queues, offloads=offloads,
                                            nic_options=nic_options if own is None else None))
            if len(out) < n:
                if own is None:
                    raise TestbedError(f"{n} pairs asked, {len(out)} endpoints pairs given")
                label = f"{tag}-pair{len(tags) + 1}"

                def draw() -> tuple[str, str]:
                    new = tag
                    while new in tags:
                        new = secrets.token_hex(2)
                    return label, new
                _, new, _ = stack.enter_context(cleanup.owned_fresh_state(draw))
                tags.append(new)
        yield out[:n]


@contextlib.contextmanager
def _one_path(attachment: Attachment, backend: Backend, tag: str, t: Topology,
              pair: tuple[object, object] | None, max_mtu: int, workdir: Path, *, queues: int = 1,
              offloads: Offloads | None = None) -> Iterator[measure.TestPath]:
    """A mode's fabric with one pair plugged in: ``pair`` (guests), or the fabric's own
    endpoints when it makes them (namespaces)."""
    with pair_paths(attachment, backend, tag, t, [pair] if pair else None, n=1, max_mtu=max_mtu, workdir=workdir,
                     queues=queues, offloads=offloads) as paths:
        yield paths[0]


@contextlib.contextmanager
def mode(attachment: Attachment, backend: Backend, tag: str, client: virt.Guest, server: virt.Guest,
         subnet: str, max_mtu: int, *, queues: int = 1, topology: Topology | None = None,
         workdir: Path | None = None, offloads: Offloads | None = None) -> Iterator[measure.TestPath]:
    """One mode's fabric with a NIC hot-plugged into each of two booted guests (the form the
    tests and tools use): ``topology`` carries the mode's own fields and the guests'
    placement (default: both guests on this host, the mode's defaults); ``workdir`` holds
    private daemons of emulated hosts."""
    from testbed.topology import config
    t = topology or config.default()
    t = dataclasses.replace(t, subnet=subnet)
    with contextlib.ExitStack() as stack:
        wd = Path(workdir) if workdir else Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tb-")))
        path = stack.enter_context(_one_path(attachment, backend, tag, t, (client, server), max_mtu, wd,
                                             queues=queues, offloads=offloads))
        yield path


@contextlib.contextmanager
def own_endpoints_path(attachment: Attachment, tag: str, subnet: str, max_mtu: int,
               out_dir: str, offloads: Offloads | None = None) -> Iterator[measure.TestPath]:
    """One pair of endpoints that the mode's fabric makes itself (namespaces joined the
    classic way), measured with the same tools and records as guests."""
    from testbed.topology import config
    t = dataclasses.replace(config.default(), subnet=str(ipaddress.ip_network(subnet)))
    with _one_path(attachment, Backend.QEMU, tag, t, None, max_mtu, Path(out_dir).parent,
                   offloads=offloads) as path:
        yield path


@contextlib.contextmanager
def connection_path(conn, out_dir: str) -> Iterator[measure.TestPath]:
    """A TestPath over a connection built outside the matrix (chains, offloads: the
    scenarios build those), for measure.measure_cell."""
    fab = ConnectionFabric(conn)
    with fab.own_pairs(out_dir) as pairs, \
            plug(fab, pairs, tag="", subnet=f"{conn.a.address}/{conn.a.prefixlen}", max_mtu=0) as [path]:
        yield path
