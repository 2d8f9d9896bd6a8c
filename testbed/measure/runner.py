"""Execute a topology's matrix: plan -> provision -> per cell measure -> results.

Provisioning is a stack of context managers (contextlib.ExitStack): every object created
is torn down in reverse order on success, error, Ctrl-C or SIGTERM. Guests boot once per
run; NICs under test are hot-plugged per attachment mode, so the number of boots does not
grow with the number of modes or cells.
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from testbed import attachments
from testbed.admin import capabilities
from testbed.analysis import stats
from testbed.errors import CapabilityError, GuestError, ReadinessError, TestbedError
from testbed.guests import images, virt
from testbed.host import diskspace, environment, hostwatch, proc, remote
from testbed.host import placement as placement_mod
from testbed.measure import cpu, ratesearch_cell, testpaths, window
from testbed.measure import pairs as pairs_mod
from testbed.measure import sampling as measure
from testbed.measure.session import Session, keep_logs
from testbed.records import results
from testbed.tools import get_tool
from testbed.topology.model import Attachment, Backend, Cell, Topology, context_of

log = logging.getLogger(__name__)


def _guests(a: Attachment) -> bool:
    """Does this mode join guests (VM NICs)? The others join namespace endpoints."""
    return attachments.get(a).guests


def _nic_group(c: Cell) -> tuple:
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
             if _guests(a) or (b is m.backends[0] and q == m.queues[0])]
    if m.randomize:
        # Randomise within each NIC group: order effects are averaged out without
        # re-plugging NICs for every cell.
        groups = [list(g) for _, g in itertools.groupby(cells, key=_nic_group)]
        cells = [c for i, g in enumerate(groups) for c in stats.randomized_order(g, m.seed + i)]
    if m.variants:
        from testbed.measure import variants
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
    if t.accelerator == "kvm" and any(_guests(a) for a in t.matrix.attachments):
        # Without /dev/kvm no probe boot is needed to know: refused before the image is
        # built or a state folder made (a kvm that opens is still probed in execute).
        with _field(t, "accelerator"):
            capabilities.require(capabilities.kvm_device(), "accelerator kvm")
    if Backend.VHOST in t.matrix.backends and any(_guests(a) for a in t.matrix.attachments):
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
    if any(not _guests(a) for a in t.matrix.attachments) and any(p.paced for p in t.matrix.profiles):
        # Namespaces run this host's binaries: whether they pace is tried here, before anything.
        from testbed.tools import pacing
        pairs_mod.require_pacing(t, [Cell(a, Backend.QEMU, 1500, 1, p) for a in t.matrix.attachments
                                     if not _guests(a) for p in t.matrix.profiles],
                                 pacing.Detector(), "this host's namespaces", _run_local)


def placement_preflight(t: Topology) -> None:
    """Huge pages: the host must have enough free pages of the size asked for, now; never
    a silent fallback to normal pages (exit 3, naming the field)."""
    if not any(_guests(a) for a in t.matrix.attachments):
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
    from testbed.topology.model import Accelerator
    if accel is not Accelerator.TCG:
        return
    for i, g in enumerate(t.guests):
        mode = g.placement.cpu_mode
        if mode is not None and mode.needs_kvm:
            raise CapabilityError(f"{t.source}: guests[{i}].placement.cpu.mode: {mode.value} needs KVM, and "
                                  f"guests run under TCG on this host (use maximum, or drop cpu.mode)")


def apply_placement(t: Topology, guests: Mapping[str, virt.Guest]) -> dict:
    """Every local guest's pins set on the running domain (placement.apply_live: a guest
    restored from a snapshot gets this run's pins, not its saved ones); a per-vCPU pin QEMU
    cannot hold (all vCPUs in one thread: single-threaded TCG) is exit 3, naming the field."""
    out = {}
    for name, g in guests.items():
        if g.shell is not None:
            continue
        p = g.spec.placement
        pid = virt.qemu_pid(g)
        i = next((k for k, x in enumerate(t.guests) if x.name == name), None)
        where = f"guests[{i}]" if i is not None else f"guest {name}"
        if pid and p.vcpus is not None and len(set(p.vcpus)) > 1:
            one = placement_mod.single_threaded_vcpus(pid)
            if one:
                raise CapabilityError(f"{t.source}: {where}.placement.vcpus.pin: the vCPUs get different CPUs, "
                                      f"but QEMU runs them all in one thread ({one}: single-threaded TCG)")
        try:
            out[name] = placement_mod.apply_live(g.dom, pid, p)
        except Exception as e:     # libvirt.libvirtError, OSError from sched_setaffinity
            raise TestbedError(f"{where}: placement could not be applied: {e}") from None
    return out


@contextlib.contextmanager
def harness_cpus(cpus: Sequence[int], daemons: Sequence[str] = ("ovs-vswitchd",)) -> Iterator[dict]:
    """This process (and so every thread and child it starts from now on: agents, namespace
    tools, collectors) and the ``daemons``' threads kept on ``cpus``; their affinity is put
    back on the way out."""
    if not cpus:
        yield {}
        return
    import os

    import psutil
    saved: dict[int, set[int]] = {0: os.sched_getaffinity(0)}
    tids = []
    for p in psutil.process_iter(["name"]):
        if p.info["name"] in daemons:
            with contextlib.suppress(psutil.Error):
                tids += [th.id for th in p.threads()]
    try:
        os.sched_setaffinity(0, set(cpus))
        for tid in tids:
            with contextlib.suppress(OSError):
                saved[tid] = os.sched_getaffinity(tid)
                os.sched_setaffinity(tid, set(cpus))
        yield {"cpus": list(cpus), "daemons": list(daemons), "daemon_threads": len(tids)}
    finally:
        for tid, old in saved.items():
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, old)


def guest_tools_preflight(t: Topology, cells: list[Cell], image: images.Image) -> None:
    """Refuse a profile whose tool the guest image lacks, before anything is measured (it
    would fail every sample with "server did not start"). The image's recorded tool list is
    asked, never this host; a user image records none, and its guests are asked once booted."""
    if any(t.guest(g).image for g in (t.client, t.server)):
        return
    for tool in sorted({c.profile.tool.value for c in cells if _guests(c.attachment)}):
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
    for tool in sorted({c.profile.tool.value for c in cells if _guests(c.attachment)}):
        for g in guests.values():
            res = g.agent.run(["/bin/sh", "-c", f"command -v {tool}"], check=False, timeout=30)
            if res.rc != 0:
                raise CapabilityError(f"{tool} is not installed in guest {g.spec.name} "
                                      f"(image {g.spec.image or 'testbed'})")


def remeasure_rules(t: Topology, remeasure: Mapping[str, int] | None) -> dict[str, stats.StoppingRule]:
    """Per cell hash, the second stage's rule: exactly its count, no stopping rule."""
    return {h: stats.StoppingRule(dataclasses.replace(t.matrix.repetitions, min_samples=n, max_samples=n,
                                                      rsd_target=0.0))
            for h, n in (remeasure or {}).items()}


@dataclass(frozen=True)
class Outcome:
    run_dir: Path
    status: str
    samples: int
    failed: int


def execute(t: Topology, *, progress: Callable[[str], None] = lambda s: None,
            resume: Path | None = None, remeasure: Mapping[str, int] | None = None) -> Outcome:
    """Measure ``t``'s matrix into a new run directory, or, with ``resume``, go on with an
    interrupted run: its finished cells (those with an outcome in run.json, matched by their
    definition hash) are skipped and the rest measured into the same directory.

    ``remeasure`` (with ``resume``, a finished run): the second stage of the sequential gate
    (testbed.measure.decide). Only those cells (by definition hash) are measured again, each
    for exactly its given count of further samples (after the topology's warm-ups; no
    stopping rule, so the count cannot depend on the spread the gate judges), appended to
    the run; their outcome in run.json is replaced by the new one."""
    preflight(t)
    cells = plan(t)
    if remeasure is not None and resume is None:
        raise ValueError("remeasure needs the run to add to (resume)")
    if resume is not None:
        # Read (and refused when bad or of another topology) before anything is created.
        done_before = {c.cell.hash for c in results.read_run(resume).cells}
        if remeasure is not None:
            done_before = {c.hash for c in cells if c.hash not in remeasure}
    # The results disk must hold what the matrix will write (a stated estimate), checked
    # before anything is created; a disk that fills anyway stops the run (DiskFull).
    from testbed.host import paths
    left = [c for c in cells if resume is None or c.hash not in done_before]
    diskspace.require(Path(resume) if resume is not None else paths.results_dir(),
                      diskspace.estimate(left, t.matrix.repetitions.warmup,
                                         t.matrix.repetitions.max_samples))
    quiet = None
    if t.noise.quiet_start is not None:
        q = t.noise.quiet_start
        progress(f"waiting for a quiet host: under {q.bound_cores:g} cores used by others for {q.for_s:g} s "
                 f"(at most {q.timeout_s:g} s)")
        quiet = window.wait_quiet(q, progress=progress)
        if not quiet["quiet"]:
            from testbed.errors import HostNotQuiet
            raise HostNotQuiet(f"{t.source}: noise.quiet_start: the host was not quiet within {q.timeout_s:g} s "
                               f"(last: {quiet['last_other_cores']:.2f} cores used by others, bound "
                               f"{q.bound_cores:g})")
    # The session: host lock, leftovers check, owned state folder, then environment and writer.
    with Session(t, resume=resume) as ses:
        stack, run_id, tag, state, host = ses.stack, ses.run_id, ses.tag, ses.state, t.hosts[0]
        needs_vms = any(_guests(c.attachment) for c in cells)
        recipe_image = images.ensure() if needs_vms else None
        if recipe_image is not None:
            guest_tools_preflight(t, cells, recipe_image)
        with _field(t, "accelerator"):
            accel = capabilities.choose_accelerator(t.accelerator, recipe_image.kernel) if recipe_image else None  # type: ignore[arg-type]
        placement_accelerator(t, accel)
        writer = ses.open_run(accel, image=recipe_image)
        env = ses.env
        if resume is not None:
            cells = [c for c in cells if c.hash not in done_before]
            writer.note_resume([c.id for c in cells])
            if remeasure is not None:
                again = {c.id for c in cells}
                writer.measure_again(again, second_stage={"cells": sorted(again), "at": results.now()})
            progress(f"resuming {writer.run_id}: {len(done_before)} cells finished before, "
                     f"{len(cells)} left")
        harness = stack.enter_context(harness_cpus(t.harness_cpus))
        writer.update(noise_guard={"threshold_cores": t.noise.threshold_cores, "run_queue": t.noise.run_queue,
                                   "action": window.for_host(t.noise).action.value, "max_retries": t.noise.max_retries,
                                   "quiet_start": quiet, "harness_cpus": harness or None})
        if len(t.hosts) > 1:
            writer.update(hosts=host_fingerprints(t, env))
        progress(f"run {run_id}: {len(cells)} cells, accelerator {accel.value if accel else 'none (namespaces)'}")
        if t.matrix.variants:
            from testbed.measure import variants
            variants.run(t, cells, stack, writer, stack.enter_context(virt.connect(host.uri)),
                         recipe_image, accel, run_id, tag, state,  # type: ignore[arg-type]
                         env["cpu_mhz"] / 1000 if env.get("cpu_mhz") else None, progress,
                         rules=remeasure_rules(t, remeasure))
            stack.close()       # tears everything down and finishes run.json
            final = results.read_run(writer.dir)
            return Outcome(writer.dir, final.status, final.counts.samples, final.counts.failed)
        guests: dict[str, virt.Guest] = {}
        conns: dict[str, object] = {}
        n_pairs = max(c.pairs for c in cells) if cells else 1
        guest_pairs = pairs_mod.guest_pairs(t, n_pairs)

        def boot(specs, slot_of=lambda s: None) -> None:
            # Each guest boots on its own host: that host's libvirt, and for a real remote
            # host its shell (overlay, seed and console live there).
            # Guests are booted or restored in parallel, up to the host's cores (a pair's
            # clones restore in seconds each; one after the other, N pairs cost N times that).
            cms = []
            for spec in specs:
                h = next(x for x in t.hosts if x.name == spec.host)
                if h.uri not in conns:
                    conns[h.uri] = stack.enter_context(virt.connect(h.uri))
                img = images.user_image(spec.image) if spec.image else recipe_image
                cms.append(virt.guest(conns[h.uri], spec, img, accel, run_id, tag, state,  # type: ignore[arg-type]
                                      shell=remote.shell(h) if h.remote else None, slot=slot_of(spec)))
            for spec, g in zip(specs, virt.enter_parallel(stack, cms, os.cpu_count() or 1)):
                guests[spec.name] = g
                writer.count("boots")
                if g.boot == "restored":
                    writer.count("restores")

        def ready() -> None:
            def wait(g: virt.Guest) -> None:
                g.wait_ready(t.ready_timeout_s)
                progress(f"guest {g.name} ready in {g.ready_s:.1f} s ({g.boot}"
                         + (f": {g.boot_reason})" if g.boot_reason else ")"))
            virt.map_parallel(wait, [g for g in guests.values() if g.ready_s is None], os.cpu_count() or 1)

        losses: list[dict] = []

        def bring_back(lost: dict[str, str]) -> None:
            """Lost guests (crashed, destroyed from outside) destroyed if still running and
            booted again (restored from their snapshot where one exists); more losses than
            hostwatch.MAX_GUEST_LOSSES stop the run."""
            if len(losses) + len(lost) > hostwatch.MAX_GUEST_LOSSES:
                raise hostwatch.GuestsLost(
                    f"{len(losses) + len(lost)} guest losses, more than the {hostwatch.MAX_GUEST_LOSSES} a run "
                    f"brings back (last: {'; '.join(lost.values())[:400]}); the run stopped, its finished "
                    f"cells kept: go on with `testbed run TOPOLOGY --resume {writer.dir}`")
            for name, why in lost.items():
                with contextlib.suppress(Exception):
                    guests[name].dom.destroy()          # a panicked guest still runs, hung
                losses.append({"guest": name, "at": results.now(), "reason": why})
                progress(f"bringing guest {name} back: {why.split(';')[0]}")
            boot([guests[n].spec for n in lost])
            ready()
            for n in lost:
                if guests[n].shell is None and (pid := virt.qemu_pid(guests[n])):
                    qemu_pids[n] = pid
            writer.update(guest_losses=losses, guests={g.spec.name: g.record() for g in guests.values()})

        if needs_vms:
            boot(guest_pairs[0])
        placement = {g.spec.name: g.spec.host for g in guests.values()}
        try:
            ready()
            if needs_vms and n_pairs > 1:
                # Idle cost: one pair idle, then every pair; the clones restore from
                # the first pair's snapshots (one slot per role), so they cost seconds.
                idle = _idle(guests, t, progress)
                base = {s.name: b.name for p in guest_pairs for s, b in zip(p, guest_pairs[0])}
                boot([s for p in guest_pairs[1:] for s in p], lambda s: base[s.name])
                placement = {g.spec.name: g.spec.host for g in guests.values()}
                ready()
                idle += _idle(guests, t, progress)
                writer.update(idle=idle)
            if recipe_image is None or recipe_image.tools is None or any(g.spec.image for g in guests.values()):
                guest_tools_check(cells, guests)
            if needs_vms and any(c.profile.paced for c in cells if _guests(c.attachment)):
                from testbed.tools import pacing
                cg = guests[t.client]
                pairs_mod.require_pacing(
                    t, [c for c in cells if _guests(c.attachment)], pacing.Detector(),
                    f"guest {cg.spec.name}",
                    lambda argv: (lambda r: (r.stdout, r.stderr, r.rc))(cg.agent.run(argv, check=False, timeout=30)),
                    cg.agent.write_file)
        except (ReadinessError, GuestError) as e:
            # No VM cell can run without its guests: each is recorded as failed with the
            # reason (and the console tail), so the run says what happened.
            progress(f"guests not ready: {e}")
            for cell in cells:
                if _guests(cell.attachment):
                    measure.fail_cell(cell, writer, f"guest not ready: {e}", placement)
            cells = [c for c in cells if not _guests(c.attachment)]
        writer.update(guests={g.spec.name: g.record() for g in guests.values()})
        pins = {n: g.spec.placement for n, g in guests.items()}
        if any(p.pinned for p in pins.values()):
            writer.update(placement_applied=apply_placement(t, guests))
        watch = window.Watch(t.noise, pins)
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
        rules = remeasure_rules(t, remeasure)
        done = 0
        started = time.monotonic()
        for (attachment, backend, queues), group in itertools.groupby(cells, key=_nic_group):
            group, lost = list(group), None
            try:
                n_group = max(c.pairs for c in group)
                # a fraction of a maximum comes after the maximum it is a fraction of
                from testbed.tools import pacing
                group.sort(key=lambda c: c.profile.rate_fraction is not None)
                left, rebuilds, lost = list(group), 0, None
                while left:
                    # taken again each time: a guest brought back is a new Guest
                    pairs = ([(guests[c.name], guests[s.name]) for c, s in guest_pairs[:n_group]]
                             if _guests(attachment) else None)
                    back: dict[str, str] = {}
                    with testpaths.pair_paths(attachment, backend, tag, t, pairs, n_group, max(t.matrix.mtus), state,
                                     queues=queues, offloads=t.offloads) as tpaths:
                        for name, p in pins.items():
                            # vhost workers start with their NIC: pinned once it is plugged
                            if p.vhost is not None and qemu_pids.get(name):
                                placement_mod.pin_vhost(qemu_pids[name], p.vhost)
                        while left:
                            cell = left.pop(0)
                            cell, why = pacing.resolve_fraction(cell, t.matrix.profiles, writer.cells)
                            if why:
                                measure.fail_cell(cell, writer, why, placement)
                                done += 1
                                continue
                            eta = ((time.monotonic() - started) / done * (len(cells) - done)) if done else None
                            progress(f"[{done + 1}/{len(cells)}] {cell.id}"
                                     + (f" (eta {eta:.0f} s)" if eta is not None else ""))
                            if cell.profile.search is not None:
                                ratesearch_cell.measure_cell(cell, tpaths[0], writer, qemu_pids, placement, clock_ghz)
                            else:
                                # one path, or the first cell.pairs of them at once
                                measure.measure_paths(cell, tpaths, writer, rules.get(cell.hash, rule),
                                                      t.matrix.repetitions.warmup, qemu_pids, placement, clock_ghz,
                                                      watch)
                            done += 1
                            try:
                                fault = _host_fault(tpaths, host.uri, guests, writer, progress, back)
                            except hostwatch.DaemonLost as e:
                                # raised once the segment is torn down, whatever its teardown
                                # (on a dead daemon) says
                                lost, left = e, []
                                break
                            if fault:
                                rebuilds += 1
                                if rebuilds > MAX_REBUILDS:
                                    raise TestbedError(f"the segment was rebuilt {MAX_REBUILDS} times after "
                                                       f"faults from outside; its other cells are not measured")
                                break       # the segment is torn down (what is left of it) and built again
                    if back:
                        bring_back(back)
                if lost is not None:
                    raise lost
            except (diskspace.DiskFull, hostwatch.DaemonLost, hostwatch.GuestsLost):
                raise               # nothing more can be recorded or measured: the run stops
            except (TestbedError, GuestError) as e:
                if lost is not None:
                    raise lost from None
                # The mode could not be set up (or torn down): its remaining cells fail with
                # the reason and the other modes still run.
                recorded = {c.id for c in writer.cells}
                for cell in group:
                    if cell.id not in recorded:
                        measure.fail_cell(cell, writer, f"{attachment.value}/{backend.value}: {e}", placement)
                        done += 1
        windows = sum(x.cpu.window_s or 0.0 for x in _samples_of(writer))
        writer.update(timing={"measure_wall_s": round(time.monotonic() - started, 2),
                              "sum_of_windows_s": round(windows, 2)})
        counts = writer.counts
    return Outcome(writer.dir, results.read_run(writer.dir).status, counts.samples, counts.failed)


#: segment rebuilds after faults from outside, per NIC group, before its cells are given up
MAX_REBUILDS = 3


def _host_fault(tpaths: Sequence[measure.TestPath], uri: str, guests: Mapping[str, virt.Guest],
                writer: results.RunWriter, progress: Callable[[str], None], back: dict[str, str]) -> bool:
    """After a cell: did the host break the segment from outside (a daemon restarted, an
    object removed, a guest crashed or destroyed; testbed.host.hostwatch)? Then wait for the
    daemons (bounded; DaemonLost when they do not come back), take the libvirt connection
    again if its daemon restarted, note it in run.json, put the lost guests into ``back``
    (brought back once the segment is down) and say the segment is to be rebuilt."""
    guard = next((p.guard for p in tpaths if p.guard is not None and p.guard.fault), None)
    if guard is None:
        return False
    fault = guard.fault
    for p in tpaths:
        if p.guard is not None:
            back.update(p.guard.lost)
            p.guard.lost.clear()
    for name in back:
        # Now, before the segment goes: a crashed guest still runs, hung, and would hold every
        # NIC unplug of the teardown to its timeout (bring_back destroys it anyway).
        with contextlib.suppress(Exception):
            guests[name].dom.destroy()
    seen = guard.wait_back(hostwatch.COMEBACK_S, progress, hostwatch.answers(guard.daemons, uri))
    if guests and any(f"{n} " in (fault or "") for n in hostwatch.LIBVIRT_PIDFILES):
        hostwatch.reconnect(list(guests.values()), uri)
    for p in tpaths:
        if p.guard is not None:
            p.guard.fault = None
    writer.update(host_faults=[*writer.record.get("host_faults", []),
                               {"at": results.now(), "fault": fault,
                                "action": "segment rebuilt" + (f", {', '.join(sorted(back))} brought back"
                                                               if back else ""),
                                "daemons": {s.name: s.pid for s in seen}}])
    progress(f"host fault: {fault}; rebuilding the segment")
    return True


def _run_local(argv: list[str]) -> tuple[str, str, int]:
    res = proc.run(argv, check=False, timeout=30)
    return res.stdout, res.stderr, res.rc


def _idle(guests: dict[str, virt.Guest], t: Topology, progress: Callable[[str], None]) -> list[dict]:
    """An idle reading of the guests booted so far (local QEMUs only)."""
    window = pairs_mod.idle_window_s()
    pids = {n: p for n, g in guests.items() if g.shell is None and (p := virt.qemu_pid(g))}
    if window <= 0 or not pids:
        return []
    rec = pairs_mod.idle_reading(pids, window, t.guest(t.client).memory_mib)
    progress(f"idle: {rec['guests']} guests, host {rec['host_busy_cores']} cores busy over {rec['window_s']} s, "
             f"QEMU RSS {sum(rec['qemu_rss_mib'].values()):.0f} MiB")
    return [rec]


def host_fingerprints(t: Topology, env: dict) -> dict[str, dict]:
    """Each host's environment. A host emulated on this machine shares its kernel, QEMU and
    CPU, so its fingerprint is this machine's, marked as emulated; a remote host's is read
    there."""
    out = {}
    for h in t.hosts:
        if h.remote:
            from testbed.host import tuning
            nics = [n for n in (h.underlay or t.tunnel.underlay,) if n]
            out[h.name] = {**environment.remote_fingerprint(remote.shell(h), h.uri),
                           "tuning": tuning.remote(remote.shell(h), nics),
                           # its guests boot with the run's accelerator
                           "accelerator": env["accelerator"], "comparable_class": env["comparable_class"],
                           "uri": h.uri, "transport": h.transport, "emulated": None}
            continue
        out[h.name] = {**env, "uri": h.uri, "transport": h.transport,
                       "emulated": "netns" if h.emulated else None}
    return out


def _samples_of(writer: results.RunWriter) -> list[results.SampleRecord]:
    return list(results.read_run(writer.dir).samples)


#: kept for callers of the old name (testbed.measure.session.keep_logs is the one implementation)
_keep_logs = keep_logs
