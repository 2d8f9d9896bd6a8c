"""One traced cell's tracing: its plan, where its devices are in each kernel, the probes each
kernel offers, and per sample the tracers around the window (:meth:`HopSession.window`).

A kernel that cannot trace (no bpftrace, no tracefs, no probe that attaches, a guest image
without bpftrace) gives its hops as not observed, with the reason; it never fails the
sample or the run.
"""
from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from testbed.errors import CommandError, GuestError
from testbed.host import bpftrace, proc, tracefs
from testbed.measure.hops import bpfstats, closure, parse, program, tracer
from testbed.measure.hops.plan import HOST, Device, Plan, guest_plan, namespace_plan
from testbed.topology.model import Cell, HopSpec

log = logging.getLogger(__name__)


@dataclass
class Kernel:
    """One tracer's kernel: how to run a command there, the flavour that attaches, and
    where the plan's devices are; ``why`` when it cannot trace."""

    name: str
    flavour: bpftrace.Flavour | None = None
    version: str | None = None
    where: program.Where | None = None
    why: str | None = None
    detail: str = ""


def plan_for(path) -> Plan:  # noqa: ANN001 (a measure.TestPath)
    """The plan of a test path: namespaces (the host sees every hop) or guests."""
    from testbed.host.net import ovs
    devices = [Device(*d) for d in path.devices]
    if not devices:
        raise ValueError("the path lists no devices (attachments.Fabric.path_devices)")
    # OVS's userspace datapath hands on a copy of each packet: matched by headers there
    copies = ovs.switches(path.datapath)
    guest = getattr(path.client.guest, "dom", None) is not None
    if not guest:
        return namespace_plan(devices, path.datapath or "", copies)
    return guest_plan(devices, path.datapath or "", path.client.guest.spec.name, path.client.ifname,
                      path.server.guest.spec.name, path.server.ifname, copies)


def _host_ifindex(name: str, netns: str | None) -> int:
    out = proc.run(["ip", "-o", "link", "show", "dev", name], netns=netns, timeout=10).stdout
    return int(out.split(":", 1)[0])


def _host_netns(netns: str | None) -> int:
    return os.stat(f"/run/netns/{netns}" if netns else "/proc/self/ns/net").st_ino


@dataclass
class HopSession:
    """One traced cell on one path: its plan, each kernel as found at its first traced
    sample (kept for the rest), and per sample the tracers around the window."""

    cell: Cell
    path: object                               # measure.TestPath
    spec: HopSpec
    plan: Plan = field(init=False)
    kernels: dict[str, Kernel] = field(default_factory=dict)
    samples: int = 0

    def __post_init__(self) -> None:
        self.plan = plan_for(self.path)

    # -- once per cell ---------------------------------------------------------------------

    def _agent(self, name: str):  # noqa: ANN202
        for ep in (self.path.client, self.path.server):  # type: ignore[attr-defined]
            if ep.guest.spec.name == name:
                return ep.guest.agent
        raise KeyError(name)

    def _prepare(self, name: str) -> Kernel:
        tp = self.plan.tracer(name)
        if name == HOST:
            run = bpftrace.run_local
            k = Kernel(name)
            flavour, k.detail = bpftrace.host_flavour()
        else:
            agent = self._agent(name)

            def run(argv: list[str]) -> tuple[int, str]:
                try:
                    res = agent.run(argv, check=False, timeout=120)
                except (CommandError, GuestError) as e:
                    return 127, str(e)
                return res.rc, res.stdout + res.stderr
            k = Kernel(name)
            rc, out = run(tracefs.GUEST_MOUNT)
            flavour, k.detail = bpftrace.probe(run) if rc == 0 else \
                (None, f"tracefs could not be mounted: {bpftrace.last_error(out)}")
        if flavour is None:
            k.why = f"{name} cannot trace: {k.detail}"
            return k
        k.flavour, k.version = flavour, bpftrace.version(run)
        try:
            if name == HOST:
                ifindex = {(d.device.name, d.device.netns): _host_ifindex(d.device.name, d.device.netns)
                           for d in tp.devices}
                netns = {n: _host_netns(n) for n in {d.device.netns for d in tp.devices}
                         | {s.netns for s in tp.sides}}
            else:
                ifindex = {}
                for d in tp.devices:
                    rc, out = run(["cat", f"/sys/class/net/{d.device.name}/ifindex"])
                    ifindex[(d.device.name, None)] = int(out.strip()) if rc == 0 else -1
                rc, out = run(["stat", "-L", "-c", "%i", "/proc/self/ns/net"])
                netns = {None: int(out.strip())}
        except (CommandError, ValueError, OSError) as e:
            k.why = f"{name}: the path's devices were not found there: {e}"
            return k
        k.where = program.Where(ifindex, netns)
        return k

    def prepare(self, tracefs_why: str | None) -> None:
        """Each kernel probed once (``tracefs_why``: why this host has no tracefs, or None).
        A guest that could not be reached is asked again at the next sample."""
        for t in self.plan.tracers:
            if t.name in self.kernels and not (t.name != HOST and self.kernels[t.name].why):
                continue
            if t.name == HOST and tracefs_why:
                self.kernels[t.name] = Kernel(t.name, why=f"host cannot trace: {tracefs_why}")
            else:
                self.kernels[t.name] = self._prepare(t.name)

    def describe(self) -> dict:
        """What run.json says of the cell's tracers."""
        return {name: {"tracer": f"bpftrace {k.version}" if k.version else None,
                       "probes": k.flavour.name if k.flavour else None,
                       "found": k.detail, **({"not_tracing": k.why} if k.why else {})}
                for name, k in self.kernels.items()}

    # -- per sample ------------------------------------------------------------------------

    @contextlib.contextmanager
    def window(self, out_dir: str, count_bpf: bool = True) -> Iterator[SampleHops]:
        """The tracers started (attached before the block) and, when the block ends, stopped
        and read; killed on any other way out. ``count_bpf``: BPF's run-time statistics
        counted over the window. Counting costs as much as a probe's own work (two clock
        reads per program run: on a 5 us namespace transaction it took about 6 % of
        transactions/s by itself, `testbed bench tracing`), so a cell counts them in one
        sample, not in every one whose cost and hops it measures."""
        self.samples += 1
        running: dict[str, tracer.HostTracer | tracer.GuestTracer] = {}
        results: dict[str, closure.TracerResult] = {}
        for name, k in self.kernels.items():
            if k.why or k.flavour is None or k.where is None:
                results[name] = closure.TracerResult(name, None, k.why or f"{name} cannot trace")
                continue
            text = program.render(self.plan.tracer(name), k.where, self._subnet(), k.flavour,
                                  program.sample_for(self.plan))
            running[name] = tracer.HostTracer(text, out_dir) if name == HOST else \
                tracer.GuestTracer(self._agent(name), text, name, count_bpf=count_bpf)

        def start(name: str) -> None:
            try:
                running[name].start()
            except tracer.TracerError as e:
                results[name] = closure.TracerResult(name, None, str(e))
        with contextlib.ExitStack() as stack:
            for t in running.values():
                stack.callback(t.kill)
            with ThreadPoolExecutor(max_workers=max(1, len(running))) as pool:
                list(pool.map(start, list(running)))
            live = {n: t for n, t in running.items() if n not in results}
            stats_why = stack.enter_context(bpfstats.enabled()) if HOST in live and count_bpf else None
            hops = SampleHops(self, results, live, stats_why, counted=count_bpf)
            hops.t0 = time.monotonic()
            yield hops
            hops.t1 = time.monotonic()

            def stop(name: str) -> None:
                try:
                    text = live[name].stop()
                    hops.texts[name] = text
                    out = parse.parse(text)
                    k = self.kernels[name]
                    no_stack = None if k.flavour is not None and k.flavour.send_probe else \
                        f"{name} has no socket probes (found: {k.detail})"
                    results[name] = closure.TracerResult(name, out, None if out.ended else
                                                         "the tracer did not end its output", no_stack)
                except (tracer.TracerError, parse.TracerOutputError) as e:
                    results[name] = closure.TracerResult(name, None, str(e))
            with ThreadPoolExecutor(max_workers=max(1, len(live))) as pool:
                list(pool.map(stop, list(live)))

    def _subnet(self) -> str:
        import ipaddress
        a = ipaddress.ip_address(self.path.client.address)  # type: ignore[attr-defined]
        b = ipaddress.ip_address(self.path.server.address)  # type: ignore[attr-defined]
        # the smallest network holding both endpoints: only their packets are traced
        for prefix in range(32, 0, -1):
            net = ipaddress.ip_network(f"{a}/{prefix}", strict=False)
            if b in net:
                return str(net)
        return "0.0.0.0/0"


#: why a traced sample has no BPF run-time figures (HopSession.window's count_bpf)
NOT_COUNTED = ("counted in the cell's first traced sample only (its warm-up when it has one): counting "
               "BPF's run time costs a clock read "
               "at each program's start and end, which would be in every traced sample's figures")


@dataclass
class SampleHops:
    """A traced sample's tracers; once its tool's figures are known, :meth:`record` gives
    what the sample keeps of its hops."""

    session: HopSession
    results: dict[str, closure.TracerResult]
    live: Mapping[str, object]
    stats_why: str | None
    #: whether BPF's run time was counted in this sample (HopSession.window)
    counted: bool = True
    t0: float = 0.0
    t1: float = 0.0
    #: each tracer's own output (kept beside the tool's raw output)
    texts: dict[str, str] = field(default_factory=dict)

    def tracers(self) -> dict:
        out = {}
        span = max(self.t1 - self.t0, 1e-9)
        for name, k in self.session.kernels.items():
            t = self.live.get(name)
            rec: dict = {"tracer": f"bpftrace {k.version}" if k.version else None,
                         "probes": k.flavour.name if k.flavour else None,
                         "follows_one_in": program.sample_for(self.session.plan)}
            if t is not None:
                rec["attach_s"] = t.attach_s  # type: ignore[attr-defined]
                if getattr(t, "stop_s", None) is not None:
                    rec["stop_s"] = t.stop_s  # type: ignore[attr-defined]
                st = t.stats  # type: ignore[attr-defined]
                if not self.counted:
                    rec["bpf"] = {"not_counted": NOT_COUNTED}
                elif name == HOST and self.stats_why:
                    rec["bpf"] = {"not_measured": self.stats_why}
                elif st is not None and st.programs:
                    rec["bpf"] = {"programs": st.programs, "run_time_ns": st.run_time_ns, "run_cnt": st.run_cnt,
                                  "ns_per_run": round(st.ns_per_run, 1) if st.ns_per_run else None,
                                  "cores": round(st.run_time_ns / 1e9 / span, 5),
                                  **({"per_probe": st.per_probe} if st.per_probe else {})}
            if name in self.results and self.results[name].reason:
                rec["reason"] = self.results[name].reason
            out[name] = rec
        return out

    def record(self, metrics: Mapping[str, float]) -> dict:
        """The sample's ``extra.hops``: its hops, the closure, its tracers and their cost."""
        record = closure.hops_record(self.session.plan, self.results, metrics, self.session.spec.closure_tolerance)
        record["tracers"] = self.tracers()
        record["window_s"] = round(self.t1 - self.t0, 3)
        return record


__all__ = ["HopSession", "SampleHops", "plan_for"]
