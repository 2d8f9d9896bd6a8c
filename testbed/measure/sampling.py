"""Measure one cell: check the MTU path, then warm-up and samples under a stopping rule,
each sample with the tool and the CPU collectors over the same window.

One loop for one path and for N guest pairs measured at once (:func:`measure_paths`, one
sample: :func:`sample_paths`; one path is N = 1, :func:`measure_cell`). What only N pairs
record, each pair's result and the aggregate over them, is pure and lives in
testbed.measure.pairs; the stopping rule's bookkeeping is :class:`CellSamples`. A sample is
built as the typed record it is written as (records.SampleRecord), from the tool's result on.

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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from pyroute2 import NetlinkError

from testbed.analysis import stats
from testbed.errors import CommandError, GuestError, StoppedError, TestbedError
from testbed.guests.guest import Agent
from testbed.guests.virt import Guest
from testbed.host import hostwatch
from testbed.host.nsagent import NsHost
from testbed.measure import cpu, crosscheck, pairs, window
from testbed.records import results
from testbed.records.records import Cpu, SampleRecord
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
                 wire_fails: bool = True) -> SampleRecord:
    """One sample on one path: :func:`sample_paths` with N = 1, recorded as one path's sample
    even for a paced profile (the rate search's trials, variants: they read its counters)."""
    return sample_paths(cell, [path], writer, rep, warmup, qemu_pids, placement, clock_ghz, watch,
                        wire_fails=wire_fails, by_pair=False)


def sample_paths(cell: Cell, paths: Sequence[TestPath], writer: results.RunWriter, rep: int, warmup: bool,
                 qemu_pids: Mapping[str, int], placement: Mapping[str, str],
                 clock_ghz: float | None = None, watch: window.Watch | None = None, *,
                 wire_fails: bool = True, by_pair: bool | None = None) -> SampleRecord:
    """One sample over ``paths`` at once (one path, or one per guest pair of an N-pair cell),
    as the typed record it is written as. A cell recorded by pair (pairs.by_pair: N pairs, or
    paced) keeps each pair's result in ``extra.pairs`` (testbed.measure.pairs) and names the
    pair in a failure's reason.

    ``wire_fails=False``: the receiving device's byte check is recorded but does not fail
    the sample, for a caller that checks the wire its own way (the rate search's per-trial
    loss check on both devices: a one-second UDP trial in a slow guest has datagrams
    arriving after the receiver stopped counting, several percent of it).

    ``by_pair``: how the sample is recorded; by default as the cell says (pairs.by_pair)."""
    watch = watch or window.Watch()
    profile = cell.profile
    driver = get_tool(profile.tool)
    by_pair = pairs.by_pair(cell) if by_pair is None else by_pair
    started = results.now()
    raw: list[str] = []
    tag = f"{'warmup' if warmup else 'rep'}{rep}"
    eps = [ep for p in paths for ep in (p.client, p.server)]
    # A cell recorded by pair counts its own guests' QEMUs only; one path's CPU record has
    # always named every QEMU it was given.
    pids_q = dict(qemu_pids) if not by_pair else \
        {ep.guest.spec.name: qemu_pids[ep.guest.spec.name] for ep in eps if ep.guest.spec.name in qemu_pids}
    domains = {ep.guest.spec.name: ep.guest.dom for ep in eps
               if isinstance(ep.guest, Guest) and ep.guest.spec.name in pids_q}
    # The host guard (daemons, objects, wire gaps: hostwatch) judges the samples of one
    # path; a cell recorded by pair is not watched by it.
    guard = paths[0].guard if len(paths) == 1 and not by_pair else None

    host: hostwatch.SampleWatch | None = None

    def failed(reason: str, cpu_info: Mapping | None = None, extra: Mapping | None = None,
               check: Mapping | None = None) -> SampleRecord:
        # What the host did (a daemon restarted, an object removed) is the cause; the
        # tool's complaint is its symptom.
        if host is not None and host.finish() and host.reason not in reason:
            reason = f"{host.reason} (then: {reason})"
        elif host is None and guard is not None and (gone := guard.missing()):
            # failed before its window opened (a guest's reading, a server's start): an object
            # gone meanwhile is still the cause, and the segment is to be rebuilt for it
            guard.fault = "; ".join(gone)
            if guard.fault not in reason:
                reason = f"{guard.fault} (then: {reason})"
        return SampleRecord.new(writer.run_id, cell.as_dict(), rep, warmup, "failed", reason, {}, cpu_info or {},
                                started, results.now(), raw, placement, extra, check)

    if guard is not None and (gone := guard.missing()):
        guard.fault = "; ".join(gone)
        return failed("; ".join(gone))
    port = driver.default_port
    servers = [p.servers or Servers(reuse=False) for p in paths]
    server_pids: list[int | None] = [None] * len(paths)
    server_out = [""] * len(paths)
    runs = driver.runs(profile)
    limit_s, expected_s = profile.duration_s * runs + SAMPLE_MARGIN_S, profile.duration_s * runs
    win = contextlib.ExitStack()
    try:
        for i, p in enumerate(paths):
            try:
                server_pids[i] = servers[i].start(p.server.guest, driver, profile, port)
            except (CommandError, GuestError, TestbedError) as e:
                return failed(f"{pairs.label(by_pair, i)}server did not start: {e}")
        plans = [client_plan(driver, cell, p.server.address, port, p.client.guest.agent) for p in paths]
        g_before = {ep.guest.spec.name: cpu.guest_reading(ep.guest.agent) for ep in eps}
        counters_before = [p.counters() for p in paths]
        h_before = cpu.host_reading(pids_q, domains)
        obs = win.enter_context(watch.window(pids_q, cell.id, rep))
        if guard is not None:
            # a paced profile idles between bursts by design: no gap check
            host = win.enter_context(guard.sample(
                gap_check=not (profile.paced or profile.rate_bps or profile.search is not None)))
        t0 = time.monotonic()
        if guard is not None:
            host.tools_from = t0
        # Every path's clients at once, each path from its own thread (its own guest agent):
        # spawned path after path, the last would start one agent round trip per path later
        # (about 0.5 s each under TCG), and the pairs would not overlap for the whole test.
        spawned = _each(len(paths), lambda i: [paths[i].client.guest.agent.spawn(plans[i][0])
                                               for _ in range(plans[i][1])])
        skew_s = time.monotonic() - t0
        outs: list[list] = [[] for _ in paths]

        def wait_path(i: int) -> list[float]:
            # Each path's clients are waited for by its own thread: waiting path after path
            # would see a later pair end one agent round trip late for every pair before it
            # (seconds under TCG), a skew no client had. The first wait sleeps through the
            # test's own duration: no agent polls inside the guests while they are measured.
            seen = []
            for j, pid in enumerate(spawned[i]):
                outs[i].append(paths[i].client.guest.agent.wait(pid, plans[i][0], limit_s,
                                                                expected_s=expected_s if j == 0 else 0.0,
                                                                stop=host.stop if host is not None else None))
                seen.append(time.monotonic())
            return seen
        ends: list[float] = []
        errors: list[tuple[int, CommandError]] = []
        for i, got in enumerate(_each(len(paths), wait_path, catch=CommandError)):
            if isinstance(got, CommandError):
                errors.append((i, got))
            else:
                ends.extend(got)
        if errors:
            # the clients not yet waited for: a path's waits stop at its failed one, which
            # its wait stopped; a path without a failure was waited for to the end
            failed_paths = {i for i, _ in errors}
            for i, p in enumerate(paths):
                for rest in spawned[i][len(outs[i]) + (i in failed_paths):]:
                    p.client.guest.agent.kill(rest)
            i, e = errors[0]
            what = "timed out" if e.timed_out else "stopped" if isinstance(e, StoppedError) else "failed"
            return failed(f"{pairs.label(by_pair, i)}client {what}: {e}")
        span = time.monotonic() - t0
        instances = sum(len(x) for x in spawned)
        why = end_skew_reason(ends, profile.duration_s,
                              f"{len(paths)} pairs" if by_pair else f"{instances} instances")
        if why:
            return failed(why)
        h_after = cpu.host_reading(pids_q, domains)
        win.close()
        counters_after = [p.counters() for p in paths]
        g_after = {ep.guest.spec.name: cpu.guest_reading(ep.guest.agent) for ep in eps}
    except (CommandError, GuestError, NetlinkError, FileNotFoundError) as e:
        # NetlinkError, FileNotFoundError: a device read by netlink or in /sys/class/net was
        # removed from outside meanwhile (a guest destroyed takes its tap); the guard names
        # the cause in the reason and the segment is rebuilt
        return failed(f"measurement could not run: {e}")
    finally:
        win.close()
        for i, p in enumerate(paths):
            if server_pids[i] is not None:
                server_out[i] = servers[i].release(p.server.guest, driver, server_pids[i])  # type: ignore[arg-type]

    per_path: list[ToolResult] = []
    for i, o_list in enumerate(outs):
        who = f"{tag}-pair{i + 1}" if by_pair else tag
        parsed = []
        for j, o in enumerate(o_list):
            p_out = writer.write_raw(cell.id, f"{who}-client{j}.out", o.stdout)
            writer.write_raw(cell.id, f"{who}-client{j}.err", o.stderr)
            raw.append(str(p_out.relative_to(writer.dir)))
            parsed.append(vet(driver.parse_sample(o.stdout, o.stderr, o.rc, profile=profile,
                                                  server_output=server_out[i]), profile))
        if server_out[i] and not by_pair:
            p_srv = writer.write_raw(cell.id, f"{who}-server.out", server_out[i])
            raw.append(str(p_srv.relative_to(writer.dir)))
        per_path.append(parsed[0] if len(parsed) == 1 else driver.aggregate(parsed))
    res = pairs.combine(profile, per_path, driver)[0] if by_pair else per_path[0]
    cpu_info, guest_s = cpu_over_window(g_before, g_after, h_before, h_after)
    cpu_rec = Cpu.from_dict(cpu_info)
    extra = {"window": window_record(res.metrics.get("duration_s"), expected_s, cpu_info["window_s"], guest_s),
             "kernel": _kernel(), "instances": instances, "start_skew_s": round(skew_s, 4),
             # seen from the host through the agent's polling, so an upper bound
             "end_skew_s": round(max(ends) - min(ends), 3), "datapath": paths[0].datapath}
    deltas = [{tap: after[tap] - before[tap] for tap in before}
              for before, after in zip(counters_before, counters_after)]
    wextra, pin_bad, noisy = watch.verdict(obs, cpu_info, pids_q, domains)
    extra.update(wextra)
    if not res.ok:
        return failed(res.reason or "tool failed without a reason", cpu_info, extra)
    if host is not None and host.finish():
        return failed(host.reason, cpu_info, extra)     # type: ignore[arg-type]
    if pin_bad:
        return failed(f"placement did not hold: {pin_bad}", cpu_info, extra)
    checks = [wire_check(cell, p, dict(r.metrics), d) for p, r, d in zip(paths, per_path, deltas)]
    extra["warnings"] = [*res.warnings, *cpu_warnings(cpu_info)]
    if by_pair:
        extra.update(pairs.pairs_extra(profile, per_path, cpu_rec.per_guest,
                                       [[ep.guest.spec.name for ep in (p.client, p.server)] for p in paths]))
        check = pairs.wire_record(checks)
    else:
        extra.update(path_extra(paths[0], deltas[0], span))
        check = checks[0].as_dict()
    why = invariant_reason(cpu_info)
    if why:
        return failed(why, cpu_info, extra, check)
    bad = next(((i, c) for i, c in enumerate(checks) if c.verdict == "fail"), None)
    if bad is not None and wire_fails:
        return failed(f"{pairs.label(by_pair, bad[0])}wire cross-check: {bad[1].reason}", cpu_info, extra, check)
    metrics = {**res.metrics, **derived(dict(res.metrics), cpu_info, clock_ghz)}
    if profile.pattern.is_transactional and not by_pair:
        metrics = latency_percentiles(profile, driver, [o.stdout for o in outs[0]], metrics, extra)
    status, reason = noise_outcome(watch, noisy, warmup, extra)
    if status == "failed":
        return failed(reason, cpu_info, extra, check)   # type: ignore[arg-type]
    return SampleRecord.new(writer.run_id, cell.as_dict(), rep, warmup, status, reason, metrics, cpu_rec,
                            started, results.now(), raw, placement, extra, check)


def _each(n: int, fn: Callable[[int], Any], catch: type[BaseException] | None = None) -> list[Any]:
    """``fn(i)`` for i in 0..n-1, each in its own thread when there are several (each path's
    guests have their own agents); with ``catch``, such an exception is returned in its
    place after every call has ended."""
    def call(i: int) -> Any:
        try:
            return fn(i)
        except BaseException as e:
            if catch is not None and isinstance(e, catch):
                return e
            raise
    if n == 1:
        return [call(0)]
    with ThreadPoolExecutor(max_workers=n) as pool:
        return list(pool.map(call, range(n)))


def path_extra(path: TestPath, deltas: Mapping[str, crosscheck.Wire], span: float) -> dict:
    """One path's devices in its sample: the offloads its NICs report, and per device under
    test its counter deltas over the window and the rates they make."""
    return {
        "offloads": {k: dict(v) for k, v in path.offloads.items()},
        # per device under test: its counter deltas over the window, for checks that need
        # both ends (the rate search's loss check, testbed.measure.ratesearch)
        "counters": {k: dataclasses.asdict(d) for k, d in deltas.items()},
        # per host-side device: Mbit/s the guest sent and received over the window
        "device_mbps": {k: {"from_guest": round(_mbps(d.towards(not path.guest_sends_as_rx)[0], span), 3),
                            "to_guest": round(_mbps(d.towards(path.guest_sends_as_rx)[0], span), 3)}
                        for k, d in deltas.items()}}


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


class CellSamples:
    """The samples of one cell that its stopping rule counts, and the rule's bookkeeping: the
    one place that decides whether a cell needs another sample and what its outcome is."""

    def __init__(self, cell: Cell, rule: stats.StoppingRule) -> None:
        self.cell, self.rule = cell, rule
        self.metric = primary_metric(cell.profile)
        self.samples: list[SampleRecord] = []
        self.decision: stats.Decision | None = None

    def add(self, s: SampleRecord) -> bool:
        """Count a measured sample (not a noisy one: it is measured again); False once the
        rule is met or max_samples is reached."""
        self.samples.append(s)
        values = [v for x in self.samples if x.ok and (v := x.metrics.get(self.metric)) is not None]
        # the rule's decision over every sample so far: what the cell's ``converged`` reports
        self.decision = self.rule.decide(values) if values else None
        if self.decision is not None and not self.decision.more:
            return False
        return len(self.samples) < self.rule.repetitions.max_samples

    def finish(self, writer: results.RunWriter) -> list[SampleRecord]:
        """The cell's outcome into run.json (ok, partial or failed, with the failures'
        reasons and a summary of the ok samples); returns the counted samples."""
        ok = [x for x in self.samples if x.ok]
        status = "ok" if ok and len(ok) == len(self.samples) else ("partial" if ok else "failed")
        reason = None if status == "ok" else \
            "; ".join(sorted({x.reason or "" for x in self.samples if not x.ok}))
        writer.add_cell(self.cell, status, reason, self.decision.converged if self.decision else None,
                        summaries(ok))
        return self.samples


def measure_cell(cell: Cell, path: TestPath, writer: results.RunWriter, rule: stats.StoppingRule,
                 warmup: int, qemu_pids: Mapping[str, int], placement: Mapping[str, str],
                 clock_ghz: float | None = None, watch: window.Watch | None = None) -> list[SampleRecord]:
    """All samples of one cell on one path: :func:`measure_paths` with N = 1, recorded as one
    path's samples even for a paced profile."""
    return measure_paths(cell, [path], writer, rule, warmup, qemu_pids, placement, clock_ghz, watch,
                         by_pair=False)


def measure_paths(cell: Cell, paths: Sequence[TestPath], writer: results.RunWriter, rule: stats.StoppingRule,
                  warmup: int, qemu_pids: Mapping[str, int], placement: Mapping[str, str],
                  clock_ghz: float | None = None, watch: window.Watch | None = None, *,
                  by_pair: bool | None = None) -> list[SampleRecord]:
    """All samples of one cell over the first ``cell.pairs`` of ``paths`` (one path, or one
    per guest pair, measured at once). The MTU is applied and checked on every path first; a
    failed check fails the cell. A noisy sample (testbed.measure.window) is written and
    measured again once the host settled; the samples returned are the ones the stopping
    rule counted."""
    watch = watch or window.Watch()
    watch.begin_cell()
    by_pair = pairs.by_pair(cell) if by_pair is None else by_pair
    paths = list(paths)[:cell.pairs]
    if len(paths) < cell.pairs:
        return fail_cell(cell, writer, f"{cell.pairs} pairs asked, {len(paths)} plugged", placement)
    for i, p in enumerate(paths):
        try:
            set_mtu(p, cell.mtu)
        except (CommandError, GuestError, TestbedError) as e:
            return fail_cell(cell, writer, f"{pairs.label(by_pair, i)}could not set MTU {cell.mtu}: {e}", placement)
        why = check_mtu(p, cell.mtu)
        if why:
            return fail_cell(cell, writer, f"{pairs.label(by_pair, i)}{why}", placement)
    for w in range(warmup):
        writer.add_sample(sample_paths(cell, paths, writer, w, True, qemu_pids, placement, clock_ghz, watch,
                                       by_pair=by_pair))
    counted = CellSamples(cell, rule)
    while True:
        s = sample_paths(cell, paths, writer, len(counted.samples), False, qemu_pids, placement, clock_ghz, watch,
                         by_pair=by_pair)
        writer.add_sample(s)
        if s.status == "noisy":
            watch.settle(qemu_pids)
            continue
        if not counted.add(s):
            break
    return counted.finish(writer)


def summaries(samples: Sequence[SampleRecord]) -> dict:
    """Per metric over ``samples``: n, mean, median, stddev and the 95 % interval."""
    out = {}
    keys = sorted({k for s in samples for k in s.metrics})
    for k in keys:
        vals = [s.metrics[k] for s in samples if k in s.metrics]
        sm = stats.summarize(vals)
        out[k] = {"n": sm.n, "mean": sm.mean, "median": sm.median, "stddev": sm.stddev,
                  "ci95": [sm.ci_low, sm.ci_high]}
    return out


def fail_cell(cell: Cell, writer: results.RunWriter, reason: str,
              placement: Mapping[str, str]) -> list[SampleRecord]:
    s = SampleRecord.new(writer.run_id, cell.as_dict(), 0, False, "failed", reason, {}, {},
                         results.now(), results.now(), (), placement)
    writer.add_sample(s)
    writer.add_cell(cell, "failed", reason, None, {})
    return [s]


__all__ = ["CellSamples", "Endpoint", "TestPath", "measure_cell", "measure_paths", "primary_metric", "Pattern"]
