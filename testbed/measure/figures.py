"""The pure parts of a sample's record: the figures and checks ``sampling.sample`` puts
together from its readings (windows, CPU, wire, percentiles, efficiency, the noise
outcome) and the summary of a cell's samples. No I/O here but the kernel's identity,
read once per process."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from testbed.analysis import stats
from testbed.measure import cpu, crosscheck, window
from testbed.records.records import SampleRecord
from testbed.tools import get_tool
from testbed.tools.base import ToolDriver, sizes
from testbed.topology.model import Cell, Profile

if TYPE_CHECKING:
    from testbed.measure.endpoints import TestPath

_KERNEL: dict = {}


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
                                tool=driver.name.value, duration_s=profile.duration_s)
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


def end_skew_reason(ends: Sequence[float | tuple[float, float]], duration_s: int, who: str) -> str | None:
    """Clients that did not run side by side (one stalled in connection set-up, say) report
    rates over different intervals: their sum is no concurrent rate. ``ends``: when each
    client ended, a time or the (earliest, latest) it can have been, for a waiter that polls
    (a guest's agent, whose round trips take a second or more on a busy host); ``who``: what
    they are ("4 instances", "2 pairs"). Only a skew the observations prove fails: the
    latest earliest end after the earliest latest end."""
    if len(ends) > 1 and (skew := proven_skew(ends)) > max(1.0, 0.1 * duration_s):
        return (f"{who} out of step: they ended at least {skew:.1f} s apart in a {duration_s} s test, "
                f"so their sum is not a concurrent rate")
    return None


def proven_skew(ends: Sequence[float | tuple[float, float]]) -> float:
    """The least time between the clients' ends that the observations prove (0 when their
    spans overlap): the latest earliest end less the earliest latest end."""
    spans = [e if isinstance(e, tuple) else (e, e) for e in ends]
    return max(0.0, max(lo for lo, _ in spans) - min(hi for _, hi in spans))


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


def kernel_once() -> dict:
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
    c = crosscheck.check(p.protocol, p.pattern, metrics, wire_bytes, packets, mtu=cell.mtu,
                         message_size=sizes(p)[0], device=ep.tap,
                         direction="to-endpoint" if end else "both")
    if end is None:     # request/response: the messages the tool counted, each way (sockperf)
        c = crosscheck.with_messages(c, crosscheck.messages(
            p.protocol, metrics, d.towards(not path.guest_sends_as_rx)[1], d.towards(path.guest_sends_as_rx)[1],
            message_size=sizes(p)[0], mtu=cell.mtu, device=ep.tap))
    return c


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
