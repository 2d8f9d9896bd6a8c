"""What a run measures and whether this host can: the plan (a topology's matrix as cells, in
order) and the checks made before anything is created (capabilities, huge pages, tools in
the guest image, pacing), each refusal naming the topology's file and field (exit 3)."""
from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator

from testbed import attachments
from testbed.admin import capabilities
from testbed.analysis import stats
from testbed.errors import CapabilityError
from testbed.guests import images, virt
from testbed.host import placement as placement_mod
from testbed.host import proc, remote
from testbed.measure import pairs as pairs_mod
from testbed.measure import variants
from testbed.measure.hops import twins as hop_twins
from testbed.records import results
from testbed.tools import get_tool
from testbed.topology.model import Accelerator, Attachment, Backend, Cell, Topology, context_of


def guests_mode(a: Attachment) -> bool:
    """Does this mode join guests (VM NICs)? The others join namespace endpoints."""
    return attachments.get(a).guests


def nic_group(c: Cell) -> tuple:
    """Cells that share one hot-plugged NIC: same attachment, backend and queues."""
    return c.attachment, c.backend, c.queues


def plan(t: Topology) -> list[Cell]:
    m = t.matrix
    # Namespaces have no virtio NIC: their cells are planned once, labelled with the first
    # backend and queue count.
    ctx = context_of(results.topology_dict(t))     # in each cell's definition hash
    cells = [Cell(a, b, mtu, c, p, q, ctx, n) for a, b, q, mtu, c, p, n in
             itertools.product(m.attachments, m.backends, m.queues, m.mtus, m.connections, m.profiles,
                               m.pairs)
             if guests_mode(a) or (b is m.backends[0] and q == m.queues[0])]
    if m.randomize:
        # Randomise within each NIC group: order effects are averaged out without
        # re-plugging NICs for every cell.
        groups = [list(g) for _, g in itertools.groupby(cells, key=nic_group)]
        cells = [c for i, g in enumerate(groups) for c in stats.randomized_order(g, m.seed + i)]
    if m.variants:
        cells = variants.expand(cells, m.variants)     # A, B adjacent: measured interleaved
    # a profile with hops: each cell and its traced twin adjacent, measured interleaved
    return hop_twins.expand(cells)


@contextlib.contextmanager
def about_field(t: Topology, field: str) -> Iterator[None]:
    """A missing capability that a field of the topology asked for names the file and that
    field, like bad input does (exit 3 instead of 2)."""
    try:
        yield
    except CapabilityError as e:
        raise CapabilityError(f"{t.source}: {field}: {e}") from None


def preflight(t: Topology) -> None:
    """Refuse a matrix this host cannot run, before anything is created."""
    if t.accelerator == "kvm" and any(guests_mode(a) for a in t.matrix.attachments):
        # Without /dev/kvm no probe boot is needed to know: refused before the image is
        # built or a state folder made (a kvm that opens is still probed in execute).
        with about_field(t, "accelerator"):
            capabilities.require(capabilities.kvm_device(), "accelerator kvm")
    if Backend.VHOST in t.matrix.backends and any(guests_mode(a) for a in t.matrix.attachments):
        with about_field(t, f"matrix.backends[{t.matrix.backends.index(Backend.VHOST)}]"):
            capabilities.require(capabilities.vhost_net(), "backend vhost")
    for i, p in enumerate(t.matrix.profiles):
        why = get_tool(p.tool).unsupported_reason(p)
        if why:
            raise CapabilityError(f"{t.source}: matrix.profiles[{i}]: profile {p.name}: {why}")
    for h in {t.host_of(g) for g in (t.client, t.server)}:
        # A remote host: log in once, its key checked, before anything is created.
        with about_field(t, f"hosts[{t.hosts.index(h)}]"):
            remote.shell(h).reachable()
    fields = []
    for i, a in enumerate(t.matrix.attachments):
        # The host first (found by trying), then this topology on it: a finding about the
        # mode itself names the attachment's entry, one about a field of its own names that
        # field (after every mode's own entry was checked).
        mode = attachments.get(a)
        found = mode.unavailable()
        check = None if found else mode.check(t)
        if check and check.field:
            fields.append(check)
        elif check:
            found = check.why
        if found:
            raise CapabilityError(f"{t.source}: matrix.attachments[{i}]: attachment {a.value} requested "
                                  f"but unavailable: {found}")
    if fields:
        raise CapabilityError(f"{t.source}: {fields[0].field}: {fields[0].why}")
    placement_preflight(t)
    if any(not guests_mode(a) for a in t.matrix.attachments) and any(p.paced for p in t.matrix.profiles):
        # Namespaces run this host's binaries: whether they pace is tried here, before anything.
        from testbed.tools import pacing
        pairs_mod.require_pacing(t, [Cell(a, Backend.QEMU, 1500, 1, p) for a in t.matrix.attachments
                                     if not guests_mode(a) for p in t.matrix.profiles],
                                 pacing.Detector(), "this host's namespaces", run_local)


def placement_preflight(t: Topology) -> None:
    """Huge pages: the host must have enough free pages of the size asked for, now; never
    a silent fallback to normal pages (exit 3, naming the field)."""
    if not any(guests_mode(a) for a in t.matrix.attachments):
        return
    free = placement_mod.hugepage_sizes()
    asked: dict[int, int] = {}          # page size -> MiB asked for by the guests so far
    for i, g in enumerate(t.guests):
        size = g.placement.hugepages_kib
        if not size or g.name not in (t.client, t.server) or t.host_of(g.name).remote:
            continue
        asked[size] = asked.get(size, 0) + g.memory_mib * max(t.matrix.pairs)
        why = placement_mod.hugepages_shortfall(asked[size], size, free)
        if why:
            raise CapabilityError(f"{t.source}: guests[{i}].placement.memory.hugepages: {why}")


def placement_accelerator(t: Topology, accel) -> None:
    """A CPU mode the chosen accelerator cannot give (host-passthrough under TCG): exit 3."""
    if accel is not Accelerator.TCG:
        return
    for i, g in enumerate(t.guests):
        mode = g.placement.cpu_mode
        if mode is not None and mode.needs_kvm:
            raise CapabilityError(f"{t.source}: guests[{i}].placement.cpu.mode: {mode.value} needs KVM, and "
                                  f"guests run under TCG on this host (use maximum, or drop cpu.mode)")


def guest_tools_preflight(t: Topology, cells: list[Cell], image: images.Image) -> None:
    """Refuse a profile whose tool the guest image lacks, before anything is measured (it
    would fail every sample with "server did not start"). The image's recorded tool list is
    asked, never this host; a user image records none, and its guests are asked once booted."""
    if any(t.guest(g).image for g in (t.client, t.server)):
        return
    for tool in sorted({c.profile.tool.value for c in cells if guests_mode(c.attachment)}):
        if image.missing(tool):
            names = sorted({c.profile.name for c in cells if c.profile.tool.value == tool})
            i = next(i for i, p in enumerate(t.matrix.profiles) if p.tool.value == tool)
            raise CapabilityError(
                f"{t.source}: matrix.profiles[{i}].tool: "
                f"profile {', '.join(names)}: {tool} is not in guest image {image.name}-{image.digest} "
                f"(it has {', '.join(image.tools or {}) or 'no traffic tools'}); build one with "
                f"source_tools (docs/images.md) and select it with TESTBED_IMAGE")


def guest_tools_check(cells: list[Cell], guests: dict[str, virt.Guest]) -> None:
    """For images that record no tools: ask each booted guest whether the tools are there."""
    for tool in sorted({c.profile.tool.value for c in cells if guests_mode(c.attachment)}):
        for g in guests.values():
            res = g.agent.run(["/bin/sh", "-c", f"command -v {tool}"], check=False, timeout=30)
            if res.rc != 0:
                raise CapabilityError(f"{tool} is not installed in guest {g.spec.name} "
                                      f"(image {g.spec.image or 'testbed'})")


def run_local(argv: list[str]) -> tuple[str, str, int]:
    res = proc.run(argv, check=False, timeout=30)
    return res.stdout, res.stderr, res.rc
