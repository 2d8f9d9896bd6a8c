"""Execute a topology's matrix: plan -> provision -> per cell measure -> results.

Provisioning is a stack of context managers (contextlib.ExitStack): every object created
is torn down in reverse order on success, error, Ctrl-C or SIGTERM. Guests boot once per
run; NICs under test are hot-plugged per attachment mode, so the number of boots does not
grow with the number of modes or cells.
"""
from __future__ import annotations

import contextlib
import ipaddress
import itertools
import logging
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from testbed import (capabilities, cleanup, cpu, environment, guestnic, images, measure, paths, proc, remote,
                     render, results, stats, twohost, virt)
from testbed.errors import CapabilityError, GuestError, ReadinessError, TestbedError
from testbed.hostnet import attach, links, macvtap
from testbed.model import Attachment, Backend, Cell, MacvtapSpec, Offloads, Topology, context_of
from testbed.session import Session, keep_logs
from testbed.tools import get_tool

log = logging.getLogger(__name__)

def _nic_group(c: Cell) -> tuple:
    """Cells that share one hot-plugged NIC: same attachment, backend and queues."""
    return c.attachment, c.backend, c.queues


def plan(t: Topology) -> list[Cell]:
    m = t.matrix
    # Namespaces have no virtio NIC: their cells are planned once, labelled with the first
    # backend and queue count.
    ctx = context_of(results.topology_dict(t))     # in each cell's definition hash
    cells = [Cell(a, b, mtu, c, p, q, ctx) for a, b, q, mtu, c, p in
             itertools.product(m.attachments, m.backends, m.queues, m.mtus, m.connections, m.profiles)
             if not (a.is_netns and (b is not m.backends[0] or q != m.queues[0]))]
    if m.randomize:
        # Randomise within each NIC group: order effects are averaged out without
        # re-plugging NICs for every cell.
        groups = [list(g) for _, g in itertools.groupby(cells, key=_nic_group)]
        cells = [c for i, g in enumerate(groups) for c in stats.randomized_order(g, m.seed + i)]
    if m.variants:
        from testbed import variants
        cells = variants.expand(cells, m.variants)     # A, B adjacent: measured interleaved
    return cells


@contextlib.contextmanager
def _field(t: Topology, field: str) -> Iterator[None]:
    """A missing capability that a field of the topology asked for names the file and that
    field, like bad input does (exit 3 instead of 2)."""
    try:
        yield
    except CapabilityError as e:
        raise CapabilityError(f"{t.source}: {field}: {e}") from None


def preflight(t: Topology) -> None:
    """Refuse a matrix this host cannot run, before anything is created."""
    if t.accelerator == "kvm" and any(not a.is_netns for a in t.matrix.attachments):
        # Without /dev/kvm no probe boot is needed to know: refused before the image is
        # built or a state folder made (a kvm that opens is still probed in execute).
        with _field(t, "accelerator"):
            capabilities.require(capabilities.kvm_device(), "accelerator kvm")
    if Backend.VHOST in t.matrix.backends and any(not a.is_netns for a in t.matrix.attachments):
        with _field(t, f"matrix.backends[{t.matrix.backends.index(Backend.VHOST)}]"):
            capabilities.require(capabilities.vhost_net(), "backend vhost")
    for i, p in enumerate(t.matrix.profiles):
        why = get_tool(p.tool).unsupported_reason(p)
        if why:
            raise CapabilityError(f"{t.source}: matrix.profiles[{i}]: profile {p.name}: {why}")
    for h in {t.host_of(g) for g in (t.client, t.server)}:
        # A remote host: log in once, its key checked, before anything is created.
        with _field(t, f"hosts[{t.hosts.index(h)}]"):
            remote.shell(h).reachable()
    for i, a in enumerate(t.matrix.attachments):
        why = attach.unavailable(a) or twohost.unavailable(t, a)
        if why:
            raise CapabilityError(f"{t.source}: matrix.attachments[{i}]: attachment {a.value} requested "
                                  f"but unavailable: {why}")
    if Attachment.MACVTAP in t.matrix.attachments and t.macvtap.lower:
        why = macvtap.check_lowers(t.macvtap.lower, t.macvtap.mode, max(t.matrix.mtus))
        if why:
            raise CapabilityError(f"{t.source}: macvtap.lower: {why}")


def guest_tools_preflight(t: Topology, cells: list[Cell], image: images.Image) -> None:
    """Refuse a profile whose tool the guest image lacks, before anything is measured (it
    would fail every sample with "server did not start"). The image's recorded tool list is
    asked, never this host; a user image records none, and its guests are asked once booted."""
    if any(t.guest(g).image for g in (t.client, t.server)):
        return
    for tool in sorted({c.profile.tool.value for c in cells if not c.attachment.is_netns}):
        if image.missing(tool):
            names = sorted({c.profile.name for c in cells if c.profile.tool.value == tool})
            i = next(i for i, p in enumerate(t.matrix.profiles) if p.tool.value == tool)
            raise CapabilityError(
                f"{t.source}: matrix.profiles[{i}].tool: "
                f"profile {', '.join(names)}: {tool} is not in guest image {image.name}-{image.digest} "
                f"(it has {', '.join(image.tools or {}) or 'no traffic tools'}); build one with "
                f"source_tools (README: Guest image) and select it with TESTBED_IMAGE")


def guest_tools_check(cells: list[Cell], guests: dict[str, virt.Guest]) -> None:
    """For images that record no tools: ask each booted guest whether the tools are there."""
    for tool in sorted({c.profile.tool.value for c in cells if not c.attachment.is_netns}):
        for g in guests.values():
            res = g.agent.run(["/bin/sh", "-c", f"command -v {tool}"], check=False, timeout=30)
            if res.rc != 0:
                raise CapabilityError(f"{tool} is not installed in guest {g.spec.name} "
                                      f"(image {g.spec.image or 'testbed'})")


@dataclass(frozen=True)
class Outcome:
    run_dir: Path
    status: str
    samples: int
    failed: int


def execute(t: Topology, *, progress: Callable[[str], None] = lambda s: None) -> Outcome:
    preflight(t)
    cells = plan(t)
    # The session: host lock, leftovers check, owned state folder, then environment and writer.
    with Session(t) as ses:
        stack, run_id, tag, state, host = ses.stack, ses.run_id, ses.tag, ses.state, t.hosts[0]
        needs_vms = any(not c.attachment.is_netns for c in cells)
        recipe_image = images.ensure() if needs_vms else None
        if recipe_image is not None:
            guest_tools_preflight(t, cells, recipe_image)
        with _field(t, "accelerator"):
            accel = capabilities.choose_accelerator(t.accelerator, recipe_image.kernel) if recipe_image else None  # type: ignore[arg-type]
        writer = ses.open_run(accel, image=recipe_image)
        env = ses.env
        if len(t.hosts) > 1:
            writer.update(hosts=host_fingerprints(t, env))
        progress(f"run {run_id}: {len(cells)} cells, accelerator {accel.value if accel else 'none (namespaces)'}")
        if t.matrix.variants:
            from testbed import variants
            variants.run(t, cells, stack, writer, stack.enter_context(virt.connect(host.uri)),
                         recipe_image, accel, run_id, tag, state,  # type: ignore[arg-type]
                         env["cpu_mhz"] / 1000 if env.get("cpu_mhz") else None, progress)
            stack.close()       # tears everything down and finishes run.json
            final = results.read_run(writer.dir).run
            return Outcome(writer.dir, final["status"], final["counts"]["samples"],
                           final["counts"]["failed"])
        guests: dict[str, virt.Guest] = {}
        if needs_vms:
            # Each guest boots on its own host: that host's libvirt, and for a real remote
            # host its shell (overlay, seed and console live there).
            conns: dict[str, object] = {}
            for spec in (t.guest(t.client), t.guest(t.server)):
                h = t.host_of(spec.name)
                if h.uri not in conns:
                    conns[h.uri] = stack.enter_context(virt.connect(h.uri))
                img = images.user_image(spec.image) if spec.image else recipe_image
                guests[spec.name] = stack.enter_context(
                    virt.guest(conns[h.uri], spec, img, accel, run_id, tag, state,  # type: ignore[arg-type]
                               shell=remote.shell(h) if h.remote else None))
                writer.count("boots")
                if guests[spec.name].boot == "restored":
                    writer.count("restores")
        placement = {g.spec.name: g.spec.host for g in guests.values()}
        try:
            for g in guests.values():
                g.wait_ready(t.ready_timeout_s)
                progress(f"guest {g.name} ready in {g.ready_s:.1f} s ({g.boot}"
                         + (f": {g.boot_reason})" if g.boot_reason else ")"))
            if recipe_image is None or recipe_image.tools is None or any(g.spec.image for g in guests.values()):
                guest_tools_check(cells, guests)
        except (ReadinessError, GuestError) as e:
            # No VM cell can run without its guests: each is recorded as failed with the
            # reason (and the console tail), so the run says what happened.
            progress(f"guests not ready: {e}")
            for cell in cells:
                if not cell.attachment.is_netns:
                    measure.fail_cell(cell, writer, f"guest not ready: {e}", placement)
            cells = [c for c in cells if c.attachment.is_netns]
        writer.update(guests={g.spec.name: g.record() for g in guests.values()})
        # Host-side CPU is read from this machine's /proc: a guest on a remote host has its
        # guest-side CPU only, and the run says so.
        pids = {name: virt.qemu_pid(g) for name, g in guests.items() if g.shell is None}
        qemu_pids = {k: v for k, v in pids.items() if v}
        far = [f"{name} on {g.spec.host}" for name, g in guests.items() if g.shell is not None]
        if far:
            writer.update(host_cpu_not_measured=[f"{x}: a remote host (guest-side CPU only)" for x in far])
        clock_ghz = env["cpu_mhz"] / 1000 if env.get("cpu_mhz") else None
        # What the host-side collector costs, so its share of a window can be judged: two
        # readings per sample.
        cost = cpu.collector_cost(qemu_pids)
        writer.update(collector={"cpu_seconds_per_reading": round(cost, 6),
                                 "readings_per_sample": 2,
                                 "fraction_of_one_core_per_10s_window": round(2 * cost / 10, 6)})
        rule = stats.StoppingRule(t.matrix.repetitions)
        done = 0
        started = time.monotonic()
        for (attachment, backend, queues), group in itertools.groupby(cells, key=_nic_group):
            group = list(group)
            try:
                cm = (netns_mode(attachment, tag, t.subnet, max(t.matrix.mtus), str(state / "netns"),
                                 offloads=t.offloads)
                      if attachment.is_netns else
                      twohost.mode(attachment, backend, tag, guests[t.client], guests[t.server], t,
                                   max(t.matrix.mtus), state, queues=queues, offloads=t.offloads)
                      if twohost.across(t, attachment) else
                      mode(attachment, backend, tag, guests[t.client], guests[t.server], t.subnet,
                           max(t.matrix.mtus), queues=queues, macvtap_spec=t.macvtap, offloads=t.offloads))
                with cm as path:
                    for cell in group:
                        eta = ((time.monotonic() - started) / done * (len(cells) - done)) if done else None
                        progress(f"[{done + 1}/{len(cells)}] {cell.id}"
                                 + (f" (eta {eta:.0f} s)" if eta is not None else ""))
                        measure.measure_cell(cell, path, writer, rule, t.matrix.repetitions.warmup,
                                             qemu_pids, placement, clock_ghz)
                        done += 1
            except (TestbedError, GuestError) as e:
                # The mode could not be set up (or torn down): its remaining cells fail with
                # the reason and the other modes still run.
                recorded = {c["id"] for c in writer.record["cells"]}
                for cell in group:
                    if cell.id not in recorded:
                        measure.fail_cell(cell, writer, f"{attachment.value}/{backend.value}: {e}", placement)
                        done += 1
        windows = sum(x.get("cpu", {}).get("window_s", 0.0) for x in _samples_of(writer))
        writer.update(timing={"measure_wall_s": round(time.monotonic() - started, 2),
                              "sum_of_windows_s": round(windows, 2)})
        counts = dict(writer.record["counts"])
    final = results.read_run(writer.dir).run
    return Outcome(writer.dir, final["status"], counts["samples"], counts["failed"])


@contextlib.contextmanager
def mode(attachment: Attachment, backend: Backend, tag: str, client: virt.Guest, server: virt.Guest,
         subnet: str, max_mtu: int, *, queues: int = 1,
         macvtap_spec: MacvtapSpec = MacvtapSpec(),
         offloads: Offloads | None = None) -> Iterator[measure.TestPath]:
    """Host segment for one attachment mode, with a NIC hot-plugged into each guest.
    The NIC advertises the largest MTU of the matrix, so later cells can change MTU live."""
    net = ipaddress.ip_network(subnet)
    with contextlib.ExitStack() as stack:
        seg = stack.enter_context(attach.segment(attachment, tag, max_mtu, macvtap_spec))
        eps = []
        applied: dict[str, dict[str, str]] = {}
        for i, g in enumerate((client, server)):
            target = f"tb-{tag}-t{i}"
            mac = guestnic.mac(tag, i, 0)
            xml = render.interface_xml(seg.nic(target, mac, backend, max_mtu, queues=queues))
            ifname = stack.enter_context(virt.plugged_nic(g, xml, mac))
            links.no_ipv6(target)
            addr = str(net.network_address + 1 + i)
            applied[g.spec.name] = guestnic.configure(g.agent, ifname, addr, net.prefixlen, queues, offloads)
            eps.append(measure.Endpoint(g, ifname, addr, target))
        taps = [e.tap for e in eps]
        # Entered last, so servers stop before the NICs are unplugged.
        servers = stack.enter_context(measure.Servers())
        yield measure.TestPath(eps[0], eps[1], lambda mtu: seg.set_mtu(mtu, taps),
                               guest_sends_as_rx=attachment is not Attachment.MACVTAP, servers=servers,
                               datapath=seg.datapath, offloads=applied)


@contextlib.contextmanager
def netns_mode(attachment: Attachment, tag: str, subnet: str, max_mtu: int,
               out_dir: str, offloads: Offloads | None = None) -> Iterator[measure.TestPath]:
    """Two namespaces joined the classic way, measured with the same tools and records as guests."""
    from testbed.hostnet import netns
    net = ipaddress.ip_network(subnet)
    with netns.connect(attachment.netns_kind, tag, subnet=str(net), mtu=max_mtu, offloads=offloads) as conn, \
            netns_path(conn, out_dir) as path:
        yield path


@contextlib.contextmanager
def netns_path(conn, out_dir: str) -> Iterator[measure.TestPath]:
    """A TestPath over any namespace Connection (hostnet.netns), for measure.measure_cell:
    the scenarios build connections the matrix cannot express (chains, offloads)."""
    from testbed import nsagent
    with nsagent.hosts(conn.a.netns, conn.b.netns, out_dir) as (ha, hb):
        eps = [measure.Endpoint(h, e.ifname, e.address, e.ifname) for h, e in ((ha, conn.a), (hb, conn.b))]

        def set_mtu(mtu: int) -> None:
            # The hops between the endpoints; the endpoints' own devices are set by measure.
            for h in conn.hops:
                if h.ifname not in (conn.a.ifname, conn.b.ifname):
                    proc.run(["ip", "link", "set", "dev", h.ifname, "mtu", str(mtu)], netns=h.netns)
            for br in conn.bridges:
                if links.exists(br):
                    links.set_mtu(br, mtu)

        def read(ep: measure.Endpoint) -> links.Wire:
            ns = ep.guest.agent.netns  # type: ignore[union-attr]
            return links.wire_via(ep.ifname, lambda argv: proc.run(argv, netns=ns))

        with measure.Servers() as servers:
            yield measure.TestPath(eps[0], eps[1], set_mtu, guest_sends_as_rx=False, read_counters=read,
                                   servers=servers, datapath=conn.datapath,
                                   offloads={h.spec.name: dict(e.offloads) for h, e in ((ha, conn.a), (hb, conn.b))})


def host_fingerprints(t: Topology, env: dict) -> dict[str, dict]:
    """Each host's environment. A host emulated on this machine shares its kernel, QEMU and
    CPU, so its fingerprint is this machine's, marked as emulated; a remote host's is read
    there."""
    out = {}
    for h in t.hosts:
        if h.remote:
            out[h.name] = {**environment.remote_fingerprint(remote.shell(h), h.uri),
                           # its guests boot with the run's accelerator
                           "accelerator": env["accelerator"], "comparable_class": env["comparable_class"],
                           "uri": h.uri, "transport": h.transport, "emulated": None}
            continue
        out[h.name] = {**env, "uri": h.uri, "transport": h.transport,
                       "emulated": "netns" if h.emulated else None}
    return out


def _samples_of(writer: results.RunWriter) -> list[dict]:
    return list(results.read_run(writer.dir).samples)


#: kept for callers of the old name (testbed.session.keep_logs is the one implementation)
_keep_logs = keep_logs
