"""One run of a topology's matrix, in explicit phases: :class:`Run`.

    run = Run(topology, progress=print)
    run.prepare()                  # plan, preflight, disk, quiet start: nothing created yet
    with Session(topology) as ses:
        run.open(ses)              # image, accelerator, run directory, noise guard record
        run.boot()                 # guests (N pairs, or one pair per variant), placement, context
        for group in run.groups(): # per NIC group: its fabric, then its schedule
            run.measure_group(group)
        run.finish()

``Run`` owns what the phases share: the writer, the guests, the watch (noise guard and
pins), the QEMU pids, the placement and the clock, gathered in the cell loop's
:class:`~testbed.measure.context.Context`. Every schedule of a NIC group, sequential
cells, interleaved variants, N pairs at once, a rate search and the gate's re-measured
cells, goes through the one cell loop (testbed.measure.sampling.measure), and after each
step the host guard's findings (testbed.host.hostwatch) rebuild the segment the same way.

Provisioning is a stack of context managers (the session's ExitStack): every object
created is torn down in reverse order on success, error, Ctrl-C or SIGTERM. Guests boot once
per run; NICs under test are hot-plugged per NIC group, so the number of boots does not grow
with the number of modes or cells.
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from testbed.admin import capabilities
from testbed.analysis import stats
from testbed.errors import GuestError, HostNotQuiet, ReadinessError, TestbedError
from testbed.guests import images, virt
from testbed.host import diskspace, hostwatch, paths, remote, remotewatch
from testbed.host import placement as placement_mod
from testbed.measure import cpu, hooks, ratesearch_cell, testpaths, variants, window
from testbed.measure import pairs as pairs_mod
from testbed.measure import plan as plan_mod
from testbed.measure import sampling as measure
from testbed.measure.context import Arm, Context
from testbed.measure.hops import interleave as hop_schedule
from testbed.measure.hops import twins as hop_twins
from testbed.measure.provision import apply_placement, harness_cpus, host_fingerprints, idle
from testbed.measure.session import Session
from testbed.records import results, runparts
from testbed.records.runparts import Outcome
from testbed.topology.model import Cell, GuestSpec, Topology

#: segment rebuilds after faults from outside, per NIC group, before its cells are given up
MAX_REBUILDS = 3


@dataclass(frozen=True)
class Group:
    """The cells of one NIC group (same attachment, backend and queues: one hot-plugged NIC)."""

    attachment: object
    backend: object
    queues: int
    cells: tuple[Cell, ...]


class Run:
    """The phases of one run and the context they share (see the module's doc).

    ``remeasure`` (with ``resume``, a finished run): the second stage of the sequential gate
    (testbed.measure.decide): only those cells (by definition hash) are measured again,
    each for exactly its given count of further samples. ``hooks``: per-sample hooks
    (testbed.measure.hooks) beside those the registry makes for the topology."""

    def __init__(self, t: Topology, *, progress: Callable[[str], None] = lambda s: None,
                 resume: Path | None = None, remeasure: Mapping[str, int] | None = None,
                 hooks: Sequence[hooks.SampleHook] = ()) -> None:
        if remeasure is not None and resume is None:
            raise ValueError("remeasure needs the run to add to (resume)")
        self.t, self.progress, self.resume, self.remeasure = t, progress, resume, remeasure
        self.extra_hooks = tuple(hooks)
        self.cells: list[Cell] = []
        self.done_before: set[str] = set()
        self.quiet: dict | None = None
        self.guests: dict[str, virt.Guest] = {}
        self.conns: dict[str, object] = {}
        self.guest_pairs: list[tuple[GuestSpec, GuestSpec]] = []
        self.variant_of = variants.by_guest(t) if t.matrix.variants else {}
        self.losses: list[runparts.GuestLoss] = []
        self.placement: dict[str, str] = {}
        self.qemu_pids: dict[str, int] = {}
        self.done = 0
        self.started = time.monotonic()

    # -- phase 1: before anything is created ---------------------------------------------

    def prepare(self) -> None:
        """Refuse what this host cannot run, plan the cells, check the results disk and
        wait for a quiet host if asked; nothing is created yet."""
        t = self.t
        plan_mod.preflight(t)
        self.cells = plan_mod.plan(t)
        if self.resume is not None:
            # read (and refused when bad or of another topology) before anything is created
            self.done_before = {c.cell.hash for c in results.read_run(self.resume).cells}
            if self.remeasure is not None:
                self.done_before = {c.hash for c in self.cells if c.hash not in self.remeasure}
        # the results disk must hold what the matrix will write (a stated estimate); a disk
        # that fills anyway stops the run (DiskFull)
        left = [c for c in self.cells if c.hash not in self.done_before]
        diskspace.require(Path(self.resume) if self.resume is not None else paths.results_dir(),
                          diskspace.estimate(left, t.matrix.repetitions.warmup, t.matrix.repetitions.max_samples))
        if t.noise.quiet_start is not None:
            q = t.noise.quiet_start
            self.progress(f"waiting for a quiet host: under {q.bound_cores:g} cores used by others for "
                          f"{q.for_s:g} s (at most {q.timeout_s:g} s)")
            self.quiet = window.wait_quiet(q, progress=self.progress)
            if not self.quiet["quiet"]:
                raise HostNotQuiet(f"{t.source}: noise.quiet_start: the host was not quiet within {q.timeout_s:g} s "
                                   f"(last: {self.quiet['last_other_cores']:.2f} cores used by others, bound "
                                   f"{q.bound_cores:g})")

    # -- phase 2: the run directory ---------------------------------------------------------

    @property
    def needs_vms(self) -> bool:
        return any(plan_mod.guests_mode(c.attachment) for c in self.cells)

    def open(self, ses: Session) -> None:
        """The guest image and accelerator, the run directory (or the resumed one) and the
        run-level facts known before the guests: the noise guard, the hosts, the variants."""
        t = self.t
        self.ses = ses
        self.image = images.ensure() if self.needs_vms else None
        if self.image is not None:
            plan_mod.guest_tools_preflight(t, self.cells, self.image)
        with plan_mod.about_field(t, "accelerator"):
            self.accel = capabilities.choose_accelerator(t.accelerator, self.image.kernel) \
                if self.image else None  # type: ignore[arg-type]
        plan_mod.placement_accelerator(t, self.accel)
        self.writer = ses.open_run(self.accel, image=self.image)
        if self.resume is not None:
            self.cells = [c for c in self.cells if c.hash not in self.done_before]
            self.writer.note_resume([c.id for c in self.cells])
            if self.remeasure is not None:
                again = {c.id for c in self.cells}
                self.writer.measure_again(again, second_stage={"cells": sorted(again), "at": results.now()})
            self.progress(f"resuming {self.writer.run_id}: {len(self.done_before)} cells finished before, "
                          f"{len(self.cells)} left")
        harness = ses.stack.enter_context(harness_cpus(t.harness_cpus, daemon_cpus=t.switch_cpus))
        self.writer.put(runparts.NoiseGuard(t.noise.threshold_cores, t.noise.run_queue,
                                            window.for_host(t.noise).action.value, t.noise.max_retries,
                                            self.quiet, harness or None))
        if len(t.hosts) > 1:
            self.writer.put(runparts.Hosts(host_fingerprints(t, ses.env)))
        if t.matrix.variants:
            self.writer.put(runparts.Variants(variants.describe(t.matrix.variants)))
        self.progress(f"run {self.writer.run_id}: {len(self.cells)} cells, accelerator "
                      f"{self.accel.value if self.accel else 'none (namespaces)'}")

    # -- phase 3: guests and the shared context ------------------------------------------------

    def boot(self) -> None:
        """Boot the guests (N pairs, or one pair per variant), wait until ready, take the
        idle readings, check their tools and pacing, apply the pins; then the context every
        cell shares. A guest that never gets ready fails every guest cell with the reason."""
        t = self.t
        n_pairs = max((c.pairs for c in self.cells), default=1)
        self.guest_pairs = variants.guest_pairs(t) if t.matrix.variants else pairs_mod.guest_pairs(t, n_pairs)
        if self.needs_vms:
            self._boot([g for p in (self.guest_pairs if t.matrix.variants else self.guest_pairs[:1]) for g in p])
        self._locate()
        try:
            self._ready()
            if self.needs_vms and n_pairs > 1 and not t.matrix.variants:
                self._clones()
            if self.image is None or self.image.tools is None or any(g.spec.image for g in self.guests.values()):
                plan_mod.guest_tools_check(self.cells, self.guests)
            self._pacing()
        except (ReadinessError, GuestError) as e:
            # No VM cell can run without its guests: each is recorded as failed with the
            # reason (and the console tail), so the run says what happened.
            self.progress(f"guests not ready: {e}")
            for cell in self.cells:
                if plan_mod.guests_mode(cell.attachment):
                    measure.fail_cell(cell, self.writer, f"guest not ready: {e}", self.placement)
            self.cells = [c for c in self.cells if not plan_mod.guests_mode(c.attachment)]
        self.writer.put(runparts.Guests(self._guest_records()))
        pins = {n: g.spec.placement for n, g in self.guests.items()}
        if any(p.pinned for p in pins.values()):
            self.writer.put(runparts.PlacementApplied(apply_placement(t, self.guests)))
        self.ctx = self._context(pins)

    def _boot(self, specs: Sequence[GuestSpec], slot_of: Callable[[GuestSpec], str | None] = lambda s: None) -> None:
        # Each guest boots on its own host: that host's libvirt, and for a real remote host
        # its shell (overlay, seed and console live there). Guests are booted or restored in
        # parallel, up to the host's cores (a pair's clones restore in seconds each; one
        # after the other, N pairs cost N times that).
        t, stack, cms = self.t, self.ses.stack, []
        for spec in specs:
            h = next(x for x in t.hosts if x.name == spec.host)
            if h.uri not in self.conns:
                self.conns[h.uri] = stack.enter_context(virt.connect(h.uri))
            v = self.variant_of.get(spec.name)
            image = v.image if v is not None and v.image else spec.image
            img = images.user_image(image) if image else self.image
            cms.append(virt.guest(self.conns[h.uri], spec, img, self.accel, self.writer.run_id,  # type: ignore[arg-type]
                                  self.ses.tag, self.ses.state, shell=remote.shell(h) if h.remote else None,
                                  emulator=v.emulator if v else None, machine=v.machine if v else None,
                                  slot=slot_of(spec)))
        for spec, g in zip(specs, virt.enter_parallel(stack, cms, os.cpu_count() or 1)):
            self.guests[spec.name] = g
            self.writer.count("boots")
            if g.boot == "restored":
                self.writer.count("restores")

    def _locate(self) -> None:
        self.placement = {g.spec.name: g.spec.host for g in self.guests.values()}

    def _ready(self) -> None:
        def wait(g: virt.Guest) -> None:
            g.wait_ready(self.t.ready_timeout_s)
            self.progress(f"guest {g.name} ready in {g.ready_s:.1f} s ({g.boot}"
                          + (f": {g.boot_reason})" if g.boot_reason else ")"))
        virt.map_parallel(wait, [g for g in self.guests.values() if g.ready_s is None], os.cpu_count() or 1)

    def _clones(self) -> None:
        """Idle cost: one pair idle, then every pair; the clones restore from the first
        pair's snapshots (one slot per role), so they cost seconds."""
        one_pair = idle(self.guests, self.t, self.progress)
        base = {s.name: b.name for p in self.guest_pairs for s, b in zip(p, self.guest_pairs[0])}
        self._boot([s for p in self.guest_pairs[1:] for s in p], lambda s: base[s.name])
        self._locate()
        self._ready()
        self.writer.put(runparts.Idle(one_pair + idle(self.guests, self.t, self.progress)))

    def _pacing(self) -> None:
        guest_cells = [c for c in self.cells if plan_mod.guests_mode(c.attachment)]
        if not (self.needs_vms and any(c.profile.paced for c in guest_cells)):
            return
        from testbed.tools import pacing
        cg = self.guests[next(iter(self.guest_pairs[0])).name]
        pairs_mod.require_pacing(
            self.t, guest_cells, pacing.Detector(), f"guest {cg.spec.name}",
            lambda argv: (lambda r: (r.stdout, r.stderr, r.rc))(cg.agent.run(argv, check=False, timeout=30)),
            write=cg.agent.write_file)

    def _guest_records(self) -> dict[str, dict]:
        return {n: {**g.record(), **({"variant": self.variant_of[n].name} if n in self.variant_of else {})}
                for n, g in self.guests.items()}

    def _context(self, pins: Mapping) -> Context:
        t, writer = self.t, self.writer
        # Host-side CPU is read from this machine's /proc: a guest on a remote host has its
        # guest-side CPU only, and the run says so.
        self._pids()
        far = [f"{n} on {g.spec.host}" for n, g in self.guests.items() if g.shell is not None]
        if far:
            writer.put(runparts.HostCpuNotMeasured([f"{x}: a remote host (guest-side CPU only)" for x in far]))
        # what the host-side collector costs, so its share of a window can be judged
        writer.put(runparts.Collector.of(cpu.collector_cost(self.qemu_pids)))
        reps = t.matrix.repetitions
        rules = {h: stats.StoppingRule(dataclasses.replace(reps, min_samples=n, max_samples=n, rsd_target=0.0))
                 for h, n in (self.remeasure or {}).items()}
        # the remote hosts' noise is judged with this host's (testbed.host.remotewatch)
        far_hosts = {t.host_of(g) for g in (t.client, t.server)}
        watch = window.Watch(t.noise, pins, remote=[remotewatch.Probe(remote.shell(h)) for h in far_hosts if h.remote])
        return Context(writer, watch, self.qemu_pids, self.placement, self.ses.clock_ghz,
                       stats.StoppingRule(reps), reps.warmup, rules, hooks.for_topology(t, self.extra_hooks),
                       self.progress)

    def _pids(self) -> None:
        pids = {name: virt.qemu_pid(g) for name, g in self.guests.items() if g.shell is None}
        self.qemu_pids.clear()
        self.qemu_pids.update({k: v for k, v in pids.items() if v})

    # -- phase 4: per NIC group, its fabric and its schedule ------------------------------------

    def groups(self) -> Iterator[Group]:
        for (a, b, q), cells in itertools.groupby(self.cells, key=plan_mod.nic_group):
            yield Group(a, b, q, tuple(cells))

    def steps(self, group: Group) -> list[list[Cell]]:
        """The group's schedule: one cell per step, or a cell's variants together (measured
        interleaved). A fraction of a maximum comes after the maximum it is a fraction of."""
        cells = sorted(group.cells, key=lambda c: c.profile.rate_fraction is not None)
        k = len(self.t.matrix.variants)
        if not k:
            # a cell and its traced twin (testbed.measure.hops), adjacent: one step
            return [list(g) for _, g in itertools.groupby(cells, key=hop_twins.untraced)]
        return [cells[i:i + k] for i in range(0, len(cells), k)]

    def measure_group(self, group: Group) -> None:
        """Build the group's fabric with its pairs plugged in and measure its steps; a fault
        from outside rebuilds the segment (at most MAX_REBUILDS times), a mode that cannot
        be set up fails its remaining cells with the reason, and the other groups still run."""
        lost: hostwatch.DaemonLost | None = None
        try:
            steps, rebuilds = self.steps(group), 0
            while steps:
                back: dict[str, str] = {}
                with self._paths(group) as tpaths:
                    while steps:
                        self._step(steps.pop(0), tpaths)
                        try:
                            fault = self._host_fault(tpaths, back)
                        except hostwatch.DaemonLost as e:
                            # raised once the segment is torn down, whatever its teardown (on a
                            # dead daemon) says
                            lost, steps = e, []
                            break
                        if fault:
                            rebuilds += 1
                            if rebuilds > MAX_REBUILDS:
                                raise TestbedError(f"the segment was rebuilt {MAX_REBUILDS} times after "
                                                   f"faults from outside; its other cells are not measured")
                            break   # the segment is torn down (what is left of it) and built again
                if back:
                    self._bring_back(back)
            if lost is not None:
                raise lost
        except (diskspace.DiskFull, hostwatch.DaemonLost, hostwatch.GuestsLost):
            raise               # nothing more can be recorded or measured: the run stops
        except (TestbedError, GuestError) as e:
            if lost is not None:
                raise lost from None
            recorded = {c.id for c in self.writer.cells}
            for cell in group.cells:
                if cell.id not in recorded:
                    measure.fail_cell(cell, self.writer, f"{group.attachment.value}/{group.backend.value}: {e}",  # type: ignore[attr-defined]
                                      self.placement)
                    self.done += 1

    @contextlib.contextmanager
    def _paths(self, group: Group) -> Iterator[list[measure.TestPath]]:
        """The group's fabric with its pairs plugged in: the first N guest pairs (N: the
        group's largest ``pairs``), every variant's pair (each with its NIC options), or a
        fabric's own namespace endpoints."""
        t = self.t
        on_guests = plan_mod.guests_mode(group.attachment)     # type: ignore[arg-type]
        n = len(self.guest_pairs) if t.matrix.variants else max(c.pairs for c in group.cells)
        # taken again each time: a guest brought back is a new Guest
        pairs = [(self.guests[c.name], self.guests[s.name]) for c, s in self.guest_pairs[:n]] if on_guests else None
        opts = [dict(v.nic) for v in t.matrix.variants] if t.matrix.variants else None
        with testpaths.pair_paths(group.attachment, group.backend, self.ses.tag, t, pairs,  # type: ignore[arg-type]
                                  n=n, max_mtu=max(t.matrix.mtus), workdir=self.ses.state,  # type: ignore[arg-type]
                                  queues=group.queues, offloads=t.offloads, nic_options=opts) as tpaths:
            for name, g in self.guests.items():
                # vhost workers start with their NIC: pinned once it is plugged
                if g.spec.placement.vhost is not None and self.qemu_pids.get(name):
                    placement_mod.pin_vhost(self.qemu_pids[name], g.spec.placement.vhost)
            yield tpaths

    def _step(self, step: list[Cell], tpaths: list[measure.TestPath]) -> None:
        """One step of a group's schedule through the one cell loop."""
        from testbed.tools import pacing
        cell = step[0]
        eta = ((time.monotonic() - self.started) / self.done * (len(self.cells) - self.done)) if self.done else None
        more = "" if len(step) == 1 else " ... interleaved with its traced twin" if not self.t.matrix.variants \
            else f" ... interleaved over {len(step)} variants"
        self.progress(f"[{self.done + 1}/{len(self.cells)}] {cell.id}{more}"
                      + (f" (eta {eta:.0f} s)" if eta is not None else ""))
        self.done += len(step)
        if self.t.matrix.variants:
            names = [v.name for v in self.t.matrix.variants]
            arms = [Arm(c, (tpaths[names.index(variants.variant_of(c))],), self._variant_pids(c), by_pair=False)
                    for c in step]
            measure.measure(self.ctx, arms)
            return
        resolved = [pacing.resolve_fraction(c, self.t.matrix.profiles, self.writer.cells) for c in step]
        cell, why = resolved[0]
        if why:
            for c, _ in resolved:
                measure.fail(self.ctx, c, why)
        elif len(step) > 1 or hop_twins.traced(cell):
            # a cell and its traced twin, interleaved on one path
            hop_schedule.measure(self.ctx, [c for c, _ in resolved], tpaths)
        elif cell.profile.search is not None:
            ratesearch_cell.search(self.ctx, Arm(cell, tuple(tpaths)))
        else:
            # one path, or the first cell.pairs of them at once
            measure.measure(self.ctx, [Arm(cell, tuple(tpaths))])

    def _variant_pids(self, cell: Cell) -> dict[str, int]:
        v = variants.variant_of(cell)
        return {n: p for n, p in self.qemu_pids.items() if n in self.variant_of and self.variant_of[n].name == v}

    # -- faults from outside ----------------------------------------------------------------------

    def _host_fault(self, tpaths: Sequence[measure.TestPath], back: dict[str, str]) -> bool:
        """After a step: did the host break the segment from outside (a daemon restarted, an
        object removed, a guest crashed or destroyed; testbed.host.hostwatch)? Then wait for
        the daemons (bounded; DaemonLost when they do not come back), take the libvirt
        connection again if its daemon restarted, note it in run.json, put the lost guests
        into ``back`` (brought back once the segment is down) and say the segment is to be
        rebuilt."""
        guard = next((p.guard for p in tpaths if p.guard is not None and p.guard.fault), None)
        if guard is None:
            return False
        fault = guard.fault
        for p in tpaths:
            if p.guard is not None:
                back.update(p.guard.lost)
                p.guard.lost.clear()
        for name in back:
            # Now, before the segment goes: a crashed guest still runs, hung, and would hold
            # every NIC unplug of the teardown to its timeout (bring_back destroys it anyway).
            with contextlib.suppress(Exception):
                self.guests[name].dom.destroy()
        uri = self.t.hosts[0].uri
        seen = guard.wait_back(hostwatch.COMEBACK_S, self.progress, hostwatch.answers(guard.daemons, uri))
        if self.guests and any(f"{n} " in (fault or "") for n in hostwatch.LIBVIRT_PIDFILES):
            hostwatch.reconnect(list(self.guests.values()), uri)
        for p in tpaths:
            if p.guard is not None:
                p.guard.fault = None
        self.writer.append(runparts.HostFault(
            results.now(), fault, "segment rebuilt" + (f", {', '.join(sorted(back))} brought back" if back else ""),
            {s.name: s.pid for s in seen}))
        self.progress(f"host fault: {fault}; rebuilding the segment")
        return True

    def _bring_back(self, lost: dict[str, str]) -> None:
        """Lost guests (crashed, destroyed from outside) destroyed if still running and
        booted again (restored from their snapshot where one exists); more losses than
        hostwatch.MAX_GUEST_LOSSES stop the run."""
        if len(self.losses) + len(lost) > hostwatch.MAX_GUEST_LOSSES:
            raise hostwatch.GuestsLost(
                f"{len(self.losses) + len(lost)} guest losses, more than the {hostwatch.MAX_GUEST_LOSSES} a run "
                f"brings back (last: {'; '.join(lost.values())[:400]}); the run stopped, its finished "
                f"cells kept: go on with `testbed run TOPOLOGY --resume {self.writer.dir}`")
        for name, why in lost.items():
            with contextlib.suppress(Exception):
                self.guests[name].dom.destroy()          # a panicked guest still runs, hung
            loss = runparts.GuestLoss(name, results.now(), why)
            self.losses.append(loss)
            self.writer.append(loss)
            self.progress(f"bringing guest {name} back: {why.split(';')[0]}")
        self._boot([self.guests[n].spec for n in lost])
        self._ready()
        self._pids()          # the context's pids: the same mapping, updated in place
        self.writer.put(runparts.Guests(self._guest_records()))

    # -- phase 5 ------------------------------------------------------------------------------------

    def finish(self) -> None:
        windows = sum(x.cpu.window_s or 0.0 for x in results.read_run(self.writer.dir).samples)
        self.writer.put(runparts.Timing(round(time.monotonic() - self.started, 2), round(windows, 2)))

    def outcome(self) -> Outcome:
        """Once the session is closed: how the run ended, as run.json says."""
        final = results.read_run(self.writer.dir)
        return Outcome(self.writer.dir, final.status, final.counts.samples, final.counts.failed)


__all__ = ["Group", "MAX_REBUILDS", "Outcome", "Run"]
