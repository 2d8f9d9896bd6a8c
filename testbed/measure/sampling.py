"""Measure one cell: check the MTU path, then warm-up and samples under a stopping rule,
each sample with the tool and the CPU collectors over the same window.

A tool that failed, timed out or printed nothing gives a failed sample with its reason,
never a zero or a guess. So does one that exited 0 with a zero result or measured over less
than 0.9 of the requested duration (tools.base.vet), a wire cross-check that fails
(testbed.measure.crosscheck), and host CPU that does not add up (attributed above busy).
Each sample states its windows: the tool's own interval, the guest collectors' (the
guest's clock) and the host's (the monotonic clock), and how much of the tool's interval
each covered.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from testbed.analysis import stats
from testbed.errors import CommandError, GuestError, TestbedError
from testbed.guests.guest import Agent
from testbed.guests.virt import Guest
from testbed.host import hostwatch
from testbed.host.nsagent import NsHost
from testbed.measure import cpu, crosscheck, window
from testbed.records import results
from testbed.tools import get_tool
from testbed.tools.base import ToolDriver, ToolResult, sizes, vet
from testbed.topology.model import Cell, Pattern, Profile

log = logging.getLogger(__name__)

SAMPLE_MARGIN_S = 60      # beyond the tool's own duration, before a client counts as hung


@dataclass(frozen=True)
class Endpoint:
    guest: Guest | NsHost
    ifname: str               # NIC under test inside the guest
    address: str              # without prefix
    tap: str                  # host-side device of that NIC


class Servers:
    """The tool servers of one test path. A reusable server (ToolDriver.reusable_server) is
    started once, checked before every sample and restarted if it died; it is stopped when
    the path goes (testpaths.mode). Others are started and stopped per sample."""

    def __init__(self, reuse: bool = True) -> None:
        self.reuse = reuse
        self._running: dict[tuple[int, str, int], tuple[Guest | NsHost, int]] = {}

    def start(self, host: Guest | NsHost, driver: ToolDriver, profile: Profile, port: int) -> int:
        key = (id(host), driver.name.value, port)
        if key in self._running:
            _, pid = self._running[key]
            if host.agent.alive(pid):
                return pid
            del self._running[key]
        pid = host.agent.spawn(driver.server_argv(profile, port=port))
        _wait_listening(host, port)
        if self.reuse and driver.reusable_server:
            self._running[key] = (host, pid)
        return pid

    def release(self, host: Guest | NsHost, driver: ToolDriver, pid: int) -> str:
        """Stop a per-sample server; returns what it printed when the driver reads that."""
        if pid in {p for _, p in self._running.values()}:
            return ""
        if driver.reads_server_output:
            return host.agent.stop(pid)
        host.agent.kill(pid)
        return ""

    def stop_all(self) -> None:
        for host, pid in self._running.values():
            host.agent.kill(pid)
        self._running.clear()

    def __enter__(self) -> Servers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()


@dataclass(frozen=True)
class TestPath:
    client: Endpoint
    server: Endpoint
    set_host_mtu: Callable[[int], None]
    #: whether the devices read_counters reads count what the guest sends as rx (a tap:
    #: QEMU writes into it) or as tx: the fabric says (attachments.Fabric.guest_sends_as_rx)
    guest_sends_as_rx: bool = True
    #: byte and packet counters of an endpoint's device under test, read by the fabric
    #: that made it (attachments.Fabric.counters); testpaths.plug sets it
    read_counters: Callable[[Endpoint], crosscheck.Wire] | None = None
    #: servers kept across samples; None: one server per sample, stopped after it
    servers: Servers | None = None
    #: what forwards between the endpoints, as the fabric names it (attachments.Fabric.datapath)
    datapath: str | None = None
    #: per endpoint, the offload states its NIC reports (ethtool -k), after the run's requests
    offloads: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    #: what the host does to the path from outside (daemon restarts, objects removed, wire
    #: gaps), judged per sample: testbed.host.hostwatch; None: not watched
    guard: hostwatch.Guard | None = None

    def counters(self) -> dict[str, crosscheck.Wire]:
        if self.read_counters is None:
            raise TestbedError("test path without device counters (build it with testpaths.plug)")
        return {ep.tap: self.read_counters(ep) for ep in (self.client, self.server)}


def primary_metric(p: Profile) -> str:
    return p.pattern.primary_metric


def set_mtu(path: TestPath, mtu: int) -> None:
    path.set_host_mtu(mtu)
    # Both guests at once: each agent round trip costs tens of milliseconds under TCG,
    # and this runs before every cell.
    started = []
    for ep in (path.client, path.server):
        argv = ["/usr/sbin/ip", "link", "set", "dev", ep.ifname, "mtu", str(mtu)]
        started.append((ep, argv, ep.guest.agent.spawn(argv)))
    for ep, argv, pid in started:
        res = ep.guest.agent.wait(pid, argv, 30)
        if res.rc != 0:
            raise CommandError([f"{ep.guest.name}:", *argv], res.rc, res.stderr or res.stdout)


def check_mtu(path: TestPath, mtu: int) -> str | None:
    """A don't-fragment ping of exactly `mtu` bytes; returns why it failed, or None."""
    size = mtu - 28   # IPv4 + ICMP headers
    # One probe is enough: a don't-fragment datagram of exactly the MTU either crosses every
    # hop or is refused (the kernel holds it while ARP resolves, so it is not lost to that).
    argv = ["/usr/bin/ping", "-n", "-M", "do", "-s", str(size), "-c", "1", "-W", "5",
            path.server.address]
    try:
        res = path.client.guest.agent.run(argv, check=False, timeout=30)
    except (CommandError, GuestError) as e:
        return f"MTU {mtu} check could not run: {e}"
    if res.rc != 0:
        out = (res.stdout + res.stderr).strip().splitlines()
        return f"MTU {mtu} path check failed (ping -M do -s {size}): {' | '.join(out[-2:])}"
    return None


def _wait_listening(g: Guest | NsHost, port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        res = g.agent.run(["/usr/bin/ss", "-Hltn", f"sport = :{port}"], check=False, timeout=10)
        if res.stdout.strip():
            return
        if time.monotonic() > deadline:
            raise TestbedError(f"server in {g.name} not listening on port {port} after {timeout:.0f} s")
        time.sleep(0.05)


def client_plan(driver: ToolDriver, cell: Cell, server_addr: str, port: int,
                client: Agent) -> tuple[list[str], int]:
    """(argv, number of client processes) realising the cell's connection count: the tool
    driver decides how (ToolDriver.client_plan); files it needs go to the client."""
    return driver.client_plan(cell.profile, server_addr, port=port, connections=cell.connections,
                              write_file=client.write_file)


def measure_once(cell: Cell, path: TestPath, writer: results.RunWriter, rep: int, warmup: bool,
                 qemu_pids: Mapping[str, int], placement: Mapping[str, str],
                 clock_ghz: float | None = None, watch: window.Watch | None = None, *,
                 wire_fails: bool = True) -> results.Sample:
    """One sample. ``wire_fails=False``: the receiving device's byte check is recorded but
    does not fail the sample, for a caller that checks the wire its own way (the rate
    search's per-trial loss check on both devices: a one-second UDP trial in a slow guest
    has datagrams arriving after the receiver stopped counting, several percent of it)."""
    watch = watch or window.Watch()
    profile = cell.profile
    driver = get_tool(profile.tool)
    cli, srv = path.client, path.server
    started = results.now()
    raw: list[str] = []
    tag = f"{'warmup' if warmup else 'rep'}{rep}"
    domains = {ep.guest.spec.name: ep.guest.dom for ep in (cli, srv)
               if isinstance(ep.guest, Guest) and ep.guest.spec.name in qemu_pids}

    host: hostwatch.SampleWatch | None = None

    def failed(reason: str, cpu_info: Mapping | None = None, extra: Mapping | None = None,
               check: Mapping | None = None) -> results.Sample:
        # What the host did (a daemon restarted, an object removed) is the cause; the
        # tool's complaint is its symptom.
        if host is not None and host.finish() and host.reason not in reason:
            reason = f"{host.reason} (then: {reason})"
        return results.Sample(writer.run_id, cell.as_dict(), rep, warmup, "failed", reason, {},
                              cpu_info or {}, started, results.now(), tuple(raw), placement,
                              extra or {}, check or {})

    if path.guard is not None and (gone := path.guard.missing()):
        path.guard.fault = "; ".join(gone)
        return failed("; ".join(gone))
    server_pid = None
    server_out = ""
    port = driver.default_port
    servers = path.servers or Servers(reuse=False)
    try:
        server_pid = servers.start(srv.guest, driver, profile, port)
    except (CommandError, GuestError, TestbedError) as e:
        return failed(f"server did not start: {e}")
    runs = driver.runs(profile)
    win = contextlib.ExitStack()
    try:
        argv, nproc = client_plan(driver, cell, srv.address, port, cli.guest.agent)
        g_before = {ep.guest.spec.name: cpu.guest_reading(ep.guest.agent) for ep in (cli, srv)}
        taps_before = path.counters()
        h_before = cpu.host_reading(qemu_pids, domains)
        obs = win.enter_context(watch.window(qemu_pids, cell.id, rep))
        if path.guard is not None:
            # a paced profile idles between bursts by design: no gap check
            host = win.enter_context(path.guard.sample(
                gap_check=not (profile.paced or profile.rate_bps or profile.search is not None)))
        t0 = time.monotonic()
        pids = [cli.guest.agent.spawn(argv) for _ in range(nproc)]
        skew_s = time.monotonic() - t0
        outs, ends = [], []
        for i, pid in enumerate(pids):
            try:
                # The first wait sleeps through the test's own duration: no agent polls
                # inside the guests while they are being measured.
                outs.append(cli.guest.agent.wait(pid, argv, profile.duration_s * runs + SAMPLE_MARGIN_S,
                                                 expected_s=profile.duration_s * runs if i == 0 else 0.0))
                ends.append(time.monotonic())
            except CommandError as e:
                for rest in pids[i + 1:]:
                    cli.guest.agent.kill(rest)
                return failed(f"client {'timed out' if e.timed_out else 'failed'}: {e}")
        span = time.monotonic() - t0
        end_skew = max(ends) - min(ends)
        why = end_skew_reason(ends, profile.duration_s, f"{len(pids)} instances")
        if why:
            return failed(why)
        h_after = cpu.host_reading(qemu_pids, domains)
        win.close()
        taps_after = path.counters()
        g_after = {ep.guest.spec.name: cpu.guest_reading(ep.guest.agent) for ep in (cli, srv)}
    except (CommandError, GuestError) as e:
        return failed(f"measurement could not run: {e}")
    finally:
        win.close()
        if server_pid is not None:
            server_out = servers.release(srv.guest, driver, server_pid)

    parsed: list[ToolResult] = []
    for i, o in enumerate(outs):
        p_out = writer.write_raw(cell.id, f"{tag}-client{i}.out", o.stdout)
        writer.write_raw(cell.id, f"{tag}-client{i}.err", o.stderr)
        raw.append(str(p_out.relative_to(writer.dir)))
        parsed.append(vet(driver.parse_sample(o.stdout, o.stderr, o.rc, profile=profile,
                                              server_output=server_out), profile))
    if server_out:
        p_srv = writer.write_raw(cell.id, f"{tag}-server.out", server_out)
        raw.append(str(p_srv.relative_to(writer.dir)))
    res = parsed[0] if len(parsed) == 1 else driver.aggregate(parsed)
    cpu_info, guest_s = cpu_over_window(g_before, g_after, h_before, h_after)
    tool_s = res.metrics.get("duration_s")
    extra = {"window": window_record(tool_s, profile.duration_s * runs, cpu_info["window_s"], guest_s),
             "kernel": _kernel()}
    deltas = {tap: taps_after[tap] - taps_before[tap] for tap in taps_before}
    wextra, pin_bad, noisy = watch.verdict(obs, cpu_info, qemu_pids, domains)
    extra.update(wextra)
    if not res.ok:
        return failed(res.reason or "tool failed without a reason", cpu_info, extra)
    if host is not None and host.finish():
        return failed(host.reason, cpu_info, extra)     # type: ignore[arg-type]
    if pin_bad:
        return failed(f"placement did not hold: {pin_bad}", cpu_info, extra)
    check = wire_check(cell, path, dict(res.metrics), deltas)
    extra.update({
        "warnings": [*res.warnings, *cpu_warnings(cpu_info)], "datapath": path.datapath,
        "offloads": {k: dict(v) for k, v in path.offloads.items()},
        "instances": len(pids), "start_skew_s": round(skew_s, 4),
        # per device under test: its counter deltas over the window, for checks that need
        # both ends (the rate search's loss check, testbed.measure.ratesearch)
        "counters": {k: dataclasses.asdict(d) for k, d in deltas.items()},
        # seen from the host through the agent's polling, so an upper bound
        "end_skew_s": round(end_skew, 3),
        # per host-side device: Mbit/s the guest sent and received over the window
        "device_mbps": {k: {"from_guest": round(_mbps(d.towards(not path.guest_sends_as_rx)[0], span), 3),
                            "to_guest": round(_mbps(d.towards(path.guest_sends_as_rx)[0], span), 3)}
                        for k, d in deltas.items()}})
    why = invariant_reason(cpu_info)
    if why:
        return failed(why, cpu_info, extra, check.as_dict())
    if check.verdict == "fail" and wire_fails:
        return failed(f"wire cross-check: {check.reason}", cpu_info, extra, check.as_dict())
    metrics = {**res.metrics, **derived(dict(res.metrics), cpu_info, clock_ghz)}
    if profile.pattern.is_transactional:
        metrics = latency_percentiles(profile, driver, [o.stdout for o in outs], metrics, extra)
    status, reason = noise_outcome(watch, noisy, warmup, extra)
    if status == "failed":
        return failed(reason, cpu_info, extra, check.as_dict())   # type: ignore[arg-type]
    return results.Sample(writer.run_id, cell.as_dict(), rep, warmup, status, reason, metrics,
                          cpu_info, started, results.now(), tuple(raw), placement, extra,
                          check.as_dict())


def noise_outcome(watch: window.Watch, noisy: str | None, warmup: bool, extra: dict) -> tuple[str, str | None]:
    """(status, reason) of a sample that measured well, by the noise guard: ok; noisy (to be
    measured again: its figures are recorded, and left out of every statistic); or failed.
    A noisy sample kept is ok, marked in extra.noise. Warm-ups are not judged."""
    action = None if warmup else watch.action_for(noisy)
    if "noise" in extra:
        extra["noise"]["action"] = {"retry": "retried", "keep": "kept", "fail": "failed"}.get(action or "")
    if action == "retry":
        return "noisy", f"noisy: {noisy}"
    if action == "fail":
        return "failed", f"noisy: {noisy}"
    return "ok", None


def latency_percentiles(profile: Profile, driver: ToolDriver, stdouts: Sequence[str],
                        metrics: Mapping[str, float], extra: dict) -> dict[str, float]:
    """The profile's chosen percentiles (testbed.records.percentiles) from the fullest source the
    clients' output has (the tool's histogram, ToolDriver.distribution, all instances' added
    up; else the tool's own figures), each with its transaction count under
    ``extra.percentiles``; the sample's metrics keep only the sufficient ones."""
    from testbed.records import percentiles
    hists = [driver.distribution(t) for t in stdouts]
    hist = percentiles.merge(hists) if hists and all(hists) else None   # type: ignore[arg-type]
    chosen = percentiles.choose(profile.percentiles or percentiles.DEFAULT, metrics, histogram=hist,
                                tool=driver.name.value)
    extra["percentiles"] = [c.as_dict() for c in chosen]
    if profile.paced:
        from testbed.tools import pacing
        extra["latency_loop"] = pacing.loop_label(get_tool(profile.tool))
    if hist:
        extra["histogram"] = [list(b) for b in hist if b[2]]
    if len(stdouts) > 1 and not hist:
        extra.setdefault("warnings", []).append(
            f"percentiles of {len(stdouts)} instances without their distributions: the largest of each")
    return percentiles.apply(metrics, chosen)


def end_skew_reason(ends: Sequence[float], duration_s: int, who: str) -> str | None:
    """Clients that did not run side by side (one stalled in connection set-up, say) report
    rates over different intervals: their sum is no concurrent rate. ``ends``: when each
    client was seen to end; ``who``: what they are ("4 instances", "2 pairs")."""
    if len(ends) > 1 and (skew := max(ends) - min(ends)) > max(1.0, 0.1 * duration_s):
        return (f"{who} out of step: they ended {skew:.1f} s apart in a {duration_s} s test, "
                f"so their sum is not a concurrent rate")
    return None


def cpu_over_window(g_before: Mapping[str, object], g_after: Mapping[str, object],
                    h_before: object, h_after: object) -> tuple[dict, dict[str, float]]:
    """The sample's CPU record (each guest's own busy share, the host's delta) and each
    guest's window by its own clock, from the readings taken around the tool."""
    guest_cpu, guest_s = {}, {}
    for g in g_before:
        delta, guest_s[g] = cpu.guest_delta(g_before[g], g_after[g])  # type: ignore[arg-type]
        guest_cpu[g] = _guest_cpu(delta)
    return {"guest": guest_cpu, **cpu.host_delta(h_before, h_after)}, guest_s  # type: ignore[arg-type]


def invariant_reason(cpu_info: Mapping) -> str | None:
    """Why the host CPU does not add up (attributed above busy), or None."""
    inv = cpu_info["invariant"]
    if inv["holds"]:
        return None
    return (f"host CPU does not add up: attributed {inv['attributed']} cores > busy "
            f"{inv['busy']} cores (limit {inv['limit']})")


def cpu_warnings(cpu_info: Mapping) -> list[str]:
    """A guest whose attributed QEMU CPU disagrees with libvirt's own figure for the domain."""
    return [f"{g}: attributed QEMU CPU {lv['attributed_cores']} cores, libvirt reports "
            f"{lv['libvirt_cores']} for the domain (gap "
            f"{'-' if lv['gap'] is None else format(lv['gap'], '.1%')} > {cpu.LIBVIRT_AGREEMENT:.0%})"
            for g, lv in cpu_info.get("libvirt", {}).items() if lv.get("status") == "disagree"]


def _mbps(nbytes: int, secs: float) -> float:
    return nbytes * 8 / secs / 1e6 if secs > 0 else 0.0


_KERNEL: dict = {}


def _kernel() -> dict:
    # read once per process: the kernel does not change under a run
    if not _KERNEL:
        _KERNEL.update(cpu.kernel())
    return dict(_KERNEL)


def window_record(tool_s: float | None, requested_s: float, host_s: float,
                  guest_s: Mapping[str, float]) -> dict:
    """Pure: the sample's intervals, each collector's own, and how much of the tool's
    interval each covered (1.0: the collector's window encloses it; the readings are taken
    before the client starts and after it ends, so it can only be longer)."""
    def cover(secs: float) -> float | None:
        return round(min(1.0, secs / tool_s), 4) if tool_s else None
    return {"tool_s": tool_s, "requested_s": requested_s, "host_s": round(host_s, 4),
            "guest_s": {g: round(v, 4) for g, v in guest_s.items()},
            "coverage": {"host": cover(host_s), **{g: cover(v) for g, v in guest_s.items()}},
            "excess_s": {"host": round(host_s - tool_s, 4) if tool_s else None,
                         **{g: (round(v - tool_s, 4) if tool_s else None) for g, v in guest_s.items()}}}


def wire_check(cell: Cell, path: TestPath, metrics: Mapping[str, float],
               deltas: Mapping[str, crosscheck.Wire]) -> crosscheck.Check:
    """The cross-check on the receiving endpoint's device (both directions at the client's
    for request/response): see testbed.measure.crosscheck."""
    p = cell.profile
    end = crosscheck.receiving_end(p.pattern)
    ep = path.server if end == "server" else path.client
    d = deltas[ep.tap]
    wire_bytes, packets = d.towards(path.guest_sends_as_rx) if end else d.both()
    return crosscheck.check(p.protocol, p.pattern, metrics, wire_bytes, packets, mtu=cell.mtu,
                            message_size=sizes(p)[0], device=ep.tap,
                            direction="to-endpoint" if end else "both")


def _guest_cpu(delta: Mapping[str, Mapping[str, float]]) -> dict:
    """The guest's whole-machine breakdown, plus each of its CPUs (user, system, softirq,
    irq, steal...): one busy vCPU behind an idle average is what multiqueue is about."""
    return {**delta.get("cpu", {}), "per_cpu": {k: dict(v) for k, v in delta.items() if k != "cpu"}}


def derived(metrics: Mapping[str, float], cpu_info: Mapping, clock_ghz: float | None) -> dict[str, float]:
    """Efficiency from the same window: throughput per core and per CPU GHz, CPU per
    transaction; host and guests counted separately. Missing inputs give no value, never 0."""
    out: dict[str, float] = {}
    host = cpu_info.get("host", {}).get("busy")
    guests = sum(g.get("busy", 0.0) for g in cpu_info.get("guest", {}).values()) or None
    tput, tps = metrics.get("throughput_mbps"), metrics.get("transactions_per_s")
    for scope, cores in (("host", host), ("guest", guests)):
        if cores is None:
            continue
        out[f"{scope}_cores"] = round(cores, 4)
        values = {
            f"{scope}_gbit_per_core": stats.gbit_per_core(tput, cores) if tput is not None else None,
            f"{scope}_gbit_per_ghz": stats.gbit_per_ghz(tput, cores, clock_ghz)
            if tput is not None and clock_ghz else None,
            f"{scope}_cpu_us_per_txn": stats.cpu_us_per_transaction(cores, tps) if tps else None,
        }
        out.update({k: round(v, 6) for k, v in values.items() if v is not None})
    return out


def measure_cell(cell: Cell, path: TestPath, writer: results.RunWriter, rule: stats.StoppingRule,
                 warmup: int, qemu_pids: Mapping[str, int], placement: Mapping[str, str],
                 clock_ghz: float | None = None, watch: window.Watch | None = None) -> list[results.Sample]:
    """All samples of one cell. The MTU is applied and checked first; a failed check fails the cell.
    A noisy sample (testbed.measure.window) is written and measured again once the host settled; the
    samples returned are the ones the stopping rule counted."""
    watch = watch or window.Watch()
    watch.begin_cell()
    try:
        set_mtu(path, cell.mtu)
    except (CommandError, GuestError, TestbedError) as e:
        reason = f"could not set MTU {cell.mtu}: {e}"
        return fail_cell(cell, writer, reason, placement)
    why = check_mtu(path, cell.mtu)
    if why:
        return fail_cell(cell, writer, why, placement)
    for w in range(warmup):
        writer.add_sample(measure_once(cell, path, writer, w, True, qemu_pids, placement, clock_ghz, watch))
    samples: list[results.Sample] = []
    metric = primary_metric(cell.profile)
    decision = None
    while True:
        s = measure_once(cell, path, writer, len(samples), False, qemu_pids, placement, clock_ghz, watch)
        writer.add_sample(s)
        if s.status == "noisy":
            watch.settle(qemu_pids)
            continue
        samples.append(s)
        values = [x.metrics[metric] for x in samples if x.status == "ok" and metric in x.metrics]
        if s.status != "ok" and len(samples) >= rule.repetitions.max_samples:
            break
        decision = rule.decide(values) if values else None
        if decision is not None and not decision.more:
            break
        if len(samples) >= rule.repetitions.max_samples:
            break
    ok = [x for x in samples if x.status == "ok"]
    summary = _summaries(ok)
    status = "ok" if ok and len(ok) == len(samples) else ("partial" if ok else "failed")
    reason = None if status == "ok" else "; ".join(sorted({x.reason or "" for x in samples if x.status != "ok"}))
    writer.add_cell(cell, status, reason, decision.converged if decision else None, summary)
    return samples


def _summaries(samples: Sequence[results.Sample]) -> dict:
    out = {}
    keys = sorted({k for s in samples for k in s.metrics})
    for k in keys:
        vals = [s.metrics[k] for s in samples if k in s.metrics]
        sm = stats.summarize(vals)
        out[k] = {"n": sm.n, "mean": sm.mean, "median": sm.median, "stddev": sm.stddev,
                  "ci95": [sm.ci_low, sm.ci_high]}
    return out


def fail_cell(cell: Cell, writer: results.RunWriter, reason: str,
               placement: Mapping[str, str]) -> list[results.Sample]:
    s = results.Sample(writer.run_id, cell.as_dict(), 0, False, "failed", reason, {}, {},
                       results.now(), results.now(), (), placement)
    writer.add_sample(s)
    writer.add_cell(cell, "failed", reason, None, {})
    return [s]


__all__ = ["Endpoint", "TestPath", "measure_cell", "primary_metric", "Pattern"]
