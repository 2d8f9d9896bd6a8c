"""A sample's host CPU cost per packet, per Gbit/s and per 1,000 transactions, by role.

Pure: a sample record (its CPU readings, the wire counters of the device under test, the
tool's figures) plus what :mod:`testbed.measure.costprobe` read over the same window
(:class:`Inputs`: the CPU's frequency at both ends, the host's device counters, performance
counters where they work) in; a typed :class:`testbed.records.records.Cost` (kept in the
sample's ``extra.cost``) and the metrics the statistics use out. Nothing is read here, so
every figure can be recomputed from a recorded sample.

Roles, in host cores over the sample's window:

- ``vcpu``: the guests' vCPU threads;
- ``emulator``: the rest of QEMU (main loop, workers, IO threads): with the userspace virtio
  backend, the packets' copies between the guest and the tap;
- ``vhost``: the vhost-net workers (threads in QEMU's group since Linux 6.4, or kernel
  threads before);
- ``switch``: ovs-vswitchd's threads on an OVS path; where the kernel forwards (a Linux
  bridge, macvtap, OVS's kernel datapath), in softirq, also the path's share of the host's
  softirq time: the packets its devices counted over all the packets of the host's devices
  in the window (not told apart when the devices are in namespaces of their own);
- ``softirq``: the host's softirq and hardirq time (/proc/stat) and ksoftirqd's threads,
  less what the switch took;
- ``rest``: every other process of the host (libvirtd, the testbed itself, kernel workers,
  anyone else's work), measured, not left over;
- ``gap``: the host's busy time less all of the above, shown as a role of its own when it
  is beyond :data:`CLOSURE_TOLERANCE`.

The path's cost is the first five added up; ``rest`` and ``gap`` are not the path's. The
host's side of it, ``host``, is all of them but the guests' vCPUs. Only
a sample whose guests' QEMU threads were attributed carries the cost as metrics (what
compare and history judge): with namespace endpoints, or guests on another host, the
endpoints' own work is in no role of the path.

Closure: the roles are measured separately (thread run times, /proc/stat columns, other
processes' times), so their sum is a second figure for the host's busy time (idle time,
exact on tickless kernels). On a kernel that accounts irq time (CONFIG_IRQ_TIME_ACCOUNTING)
the softirq column is time no thread was charged; without it the column is sampled at the
tick and its share inside the guests' threads is counted twice, which a negative gap shows.

Packets are those of the wire cross-check's counter (testbed.measure.crosscheck): the
receiving endpoint's device in the data's direction for a stream, both directions of the
client's for request/response. With segmentation offloads one packet carries up to 64 KiB.
The cost's cross-check fails a sample whose packets cannot carry the payload the tool
counted (more than a 64 KiB segment a packet) or, for request/response, whose packets are
fewer than two per transaction, with both figures.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from testbed.host.net import ovs
from testbed.records.records import Cost, SampleRecord, num

#: the path's roles, in the order they are stacked
ROLES = ("vcpu", "emulator", "vhost", "switch", "softirq")
#: roles shown beside the path's: the host's other work, and what no reading accounts for
OTHER_ROLES = ("rest", "gap")
#: the path's cost per packet (lower is better): what a capacity plan pays, and a metric
#: the gate decides on
METRIC = "cost_ns_per_packet"
#: the host's side of it: every role but the guests' vCPUs (emulator, vhost, switch,
#: softirq), the cost of the hypervisor's network path itself. The gate decides on it too:
#: a change there is a larger share of it than of the path, whose emulated or guest-kernel
#: vCPU time carries most of the path's noise
HOST_METRIC = "cost_host_ns_per_packet"
HOST_ROLES = tuple(r for r in ROLES if r != "vcpu")
#: the metrics a sample carries: the path's cost, the host's side, per role, per unit of
#: traffic, in cycles
ROLE_METRICS = tuple(f"cost_{r}_ns_per_packet" for r in ROLES)
UNIT_METRICS = ("cost_cores_per_gbit", "cost_cores_per_ktps", "cost_cycles_per_packet")
METRICS = (METRIC, HOST_METRIC, *ROLE_METRICS, *UNIT_METRICS)

#: the roles add up to the host's busy time within this share of it (plus two clock ticks
#: a CPU over the window, the resolution of the /proc/stat columns and process times)
CLOSURE_TOLERANCE = 0.05
TICKS_SLACK = 2
#: the largest payload one packet can carry: a 64 KiB GSO segment (TSO/GRO on taps)
MAX_PACKET_PAYLOAD = 65536
#: request/response: at least a request and a response packet per transaction, less this
PACKETS_TOLERANCE = 0.03
#: a frequency is steady when every CPU's reading at the end of the window is within this
#: share of its reading at the start
FREQ_STEADY = 0.01


def role_metric(role: str) -> str:
    return f"cost_{role}_ns_per_packet"


def role_of(metric: str) -> str | None:
    """The role a per-role metric is of (``cost_vhost_ns_per_packet`` -> vhost)."""
    return next((r for r in ROLES if metric == role_metric(r)), None)


@dataclass(frozen=True)
class Inputs:
    """What a sample's cost needs beyond its record, read over the same window
    (testbed.measure.costprobe). Empty: no frequency, no host counters, no perf."""

    #: every CPU's clock, MHz, at the start and at the end of the window (/proc/cpuinfo)
    mhz_before: tuple[float, ...] = ()
    mhz_after: tuple[float, ...] = ()
    #: packets (rx + tx) of every device in the host's namespace over the window
    host_packets: Mapping[str, int] = field(default_factory=dict)
    #: the whole host's cycles over the window (perf stat -a -e cycles), or why not
    perf_cycles: float | None = None
    perf_note: str = ""
    #: the path's host-side devices as the run's hook saw them (every pair's taps): what
    #: :func:`path_devices` falls back to where the sample's record names none (N pairs)
    devices: tuple[str, ...] = ()

    def recorded(self, devices: Sequence[str]) -> dict[str, Any]:
        """What the sample keeps of them (its cost's ``inputs``), enough to compute the cost
        again: the host's packets as the path's devices' and the total ("*")."""
        counted = {d: v for d, v in self.host_packets.items() if d != "lo" and d != "*"}
        total = self.host_packets.get("*", sum(counted.values()))
        return {"mhz_before": list(self.mhz_before), "mhz_after": list(self.mhz_after),
                "host_packets": {**{d: counted[d] for d in devices if d in counted}, "*": total}
                if self.host_packets else {},
                "perf_cycles": self.perf_cycles, "perf_note": self.perf_note,
                **({"devices": list(self.devices)} if self.devices else {})}

    @classmethod
    def of(cls, recorded: Mapping[str, Any]) -> Inputs:
        """The inputs a recorded cost kept (:meth:`recorded`)."""
        return cls(tuple(recorded.get("mhz_before") or ()), tuple(recorded.get("mhz_after") or ()),
                   dict(recorded.get("host_packets") or {}), num(recorded.get("perf_cycles")),
                   str(recorded.get("perf_note") or ""), tuple(recorded.get("devices") or ()))


@dataclass(frozen=True)
class Outcome:
    cost: Cost
    metrics: Mapping[str, float]
    #: why the sample fails (the cost's inputs disagree), with both figures; None: it holds
    reason: str | None = None


# --------------------------------------------------------------------------- pieces

def frequency(before: Sequence[float], after: Sequence[float]) -> tuple[float | None, str]:
    """(GHz, how it was known) when every CPU's clock is known at both ends of the window
    and steady within :data:`FREQ_STEADY`; (None, why not) otherwise."""
    if not before or len(before) != len(after):
        return None, "the CPU's frequency was not read at both ends of the window"
    worst = max(abs(a - b) / b for b, a in zip(before, after) if b > 0) if all(b > 0 for b in before) else None
    if worst is None or any(a <= 0 for a in after):
        return None, "a CPU reported no frequency"
    mean = sum((*before, *after)) / (2 * len(before))
    spread = (max((*before, *after)) - min((*before, *after))) / mean
    if worst > FREQ_STEADY or spread > FREQ_STEADY:
        return None, (f"the CPU's frequency was not steady over the window (moved {worst:.1%}, "
                      f"CPUs {spread:.1%} apart; at most {FREQ_STEADY:.0%}): no cycles from time")
    return mean / 1000, (f"time x frequency: {mean:.0f} MHz, every CPU at both ends of the window "
                         f"within {max(worst, spread):.2%} (/proc/cpuinfo)")


def packet_share(path_devices: Sequence[str], host_packets: Mapping[str, int]) -> float | None:
    """The path's devices' packets over all of the host's devices' (loopback left out; "*",
    when given, is that total), or None when they are not among the host's (a path in
    namespaces of its own) or none moved."""
    counted = {d: v for d, v in host_packets.items() if d not in ("lo", "*")}
    mine = [counted[d] for d in path_devices if d in counted]
    total = host_packets.get("*", sum(counted.values()))
    if not mine or total <= 0:
        return None
    return min(1.0, sum(mine) / total)


def path_devices(sample: SampleRecord, inputs: Inputs | None = None) -> list[str]:
    """The host-side devices of the path: those whose counters the sample recorded (one
    pair), else those the run's hook saw (``inputs.devices``: the taps of N pairs)."""
    counters = sample.data.get("counters")
    if isinstance(counters, Mapping) and counters:
        return list(counters)
    return list(inputs.devices) if inputs is not None else []


def _softirq_cores(cpu: Any) -> float:
    host = cpu.host
    named = cpu.named
    return sum(v for v in (num(host.get("softirq")), num(host.get("irq")), num(named.get("ksoftirqd")))
               if v is not None)


def roles(sample: SampleRecord, inputs: Inputs) -> tuple[dict[str, float], str, list[str]]:
    """(role -> cores, what the switch counts, notes) from the sample's CPU record."""
    cpu = sample.cpu
    notes: list[str] = []
    out = dict.fromkeys(ROLES, 0.0)
    for g in cpu.per_guest.values():
        if not isinstance(g, Mapping):
            continue
        out["vcpu"] += num(g.get("vcpu")) or 0.0
        out["emulator"] += (num(g.get("emulator")) or 0.0) + (num(g.get("iothread")) or 0.0)
        out["vhost"] += num(g.get("vhost")) or 0.0
    softirq = _softirq_cores(cpu)
    vswitchd = num(cpu.named.get("ovs-vswitchd")) or 0.0
    rest = num(cpu.others.get("cores"))
    rest_note = ("the host's other processes were not measured (a sample recorded before the rest "
                 "was): the gap holds them")
    if rest is not None and rest < 0:
        # processes that ended in the window, reaped by nobody whose reading holds their time
        # (a busy host starting and ending many): a negative role would be a made-up figure
        rest_note = (f"the host's other processes read {rest:+.3g} cores (processes that ended in the "
                     f"window left time no reading holds): not a role, the gap holds them")
        rest = None
    datapath = str(sample.data.get("datapath") or "")
    devices = path_devices(sample, inputs)
    parts = []
    if ovs.switches(datapath):
        out["switch"] = vswitchd
        parts.append("ovs-vswitchd's threads")
    elif vswitchd and rest is not None:
        # running beside the path, not on it (with the rest unknown, the gap holds it too)
        rest += vswitchd
    if not ovs.userspace(datapath):
        # the kernel forwards this path (a bridge, macvtap, OVS's kernel datapath) in softirq
        share = packet_share(devices, inputs.host_packets)
        if share is None:
            notes.append(f"the path's share of the host's packets is not known (its devices are not in "
                         f"the host's namespace, or no counters were read): the {datapath or 'path'}'s "
                         f"softirq time is not told apart from the rest of softirq")
        else:
            out["switch"] += softirq * share
            softirq -= softirq * share
            parts.append(f"the share of the host's softirq time of the {datapath or 'path'}'s devices "
                         f"({share:.1%} of the host's packets)")
    switch = (" + ".join(parts) + f" ({datapath or 'datapath not recorded'})") if parts else \
        f"none told apart ({datapath or 'datapath not recorded'})"
    out["softirq"] = softirq
    if rest is None:
        notes.append(rest_note)
    else:
        out["rest"] = rest
    return {k: round(v, 6) for k, v in out.items()}, switch, notes


def closure(busy: float | None, cores: Mapping[str, float], ncpus: int, window_s: float,
            accounting: bool | None, *, tolerance: float = CLOSURE_TOLERANCE,
            tick_s: float = 0.01) -> dict[str, Any]:
    """The roles against the host's busy time: their sum, the gap, the tolerance, whether
    it holds, and how the kernel accounts softirq time (what a negative gap means)."""
    total = round(sum(cores.values()), 6)
    acc = ("exclusive (CONFIG_IRQ_TIME_ACCOUNTING)" if accounting else
           "tick-sampled: softirq inside threads is counted twice" if accounting is False else "unknown")
    if busy is None:
        return {"busy": None, "sum": total, "gap": None, "within": None, "accounting": acc}
    gap = round(busy - total, 6)
    tol = round(tolerance * busy + TICKS_SLACK * ncpus * tick_s / window_s if window_s > 0 else tolerance * busy, 6)
    return {"busy": busy, "sum": total, "gap": gap, "tolerance": tol, "within": abs(gap) <= tol,
            "accounting": acc}


def check(sample: SampleRecord, packets: int, payload: int) -> dict[str, Any]:
    """The cost's own cross-check: the packets counted can carry the payload the tool
    counted; request/response has at least two packets a transaction."""
    fig = {"packets": packets, "tool_bytes": payload}
    dev = sample.crosscheck.device or "the device under test"
    if packets <= 0:
        return {**fig, "verdict": "fail",
                "reason": f"the wire ({dev}) counted {packets} packets while the "
                          f"tool counted {payload} payload bytes"}
    per = payload / packets
    if per > MAX_PACKET_PAYLOAD:
        return {**fig, "verdict": "fail",
                "reason": f"tool {payload} payload bytes in {packets} wire packets "
                          f"({dev}) is {per:.0f} bytes a packet, more than one packet carries "
                          f"({MAX_PACKET_PAYLOAD} with segmentation offloads)"}
    tps, secs = sample.metric("transactions_per_s"), sample.metric("duration_s")
    if tps is not None and secs is not None:
        transactions = tps * secs
        fig["transactions"] = round(transactions)
        least = 2 * transactions * (1 - PACKETS_TOLERANCE)
        if packets < least:
            return {**fig, "verdict": "fail",
                    "reason": f"{round(transactions)} transactions ({tps:.6g}/s over "
                              f"{secs:g} s) need at least {2 * round(transactions)} packets, the wire "
                              f"({dev}) counted {packets}"}
    return {**fig, "verdict": "ok"}


def _per(cores: Mapping[str, float], cpu_s: float, units: float, scale: float) -> dict[str, float]:
    """role -> its CPU seconds over the window divided by ``units`` (x ``scale``)."""
    return {r: round(c * cpu_s / units * scale, 6) for r, c in cores.items()}


# --------------------------------------------------------------------------- the sample's cost

def compute(sample: SampleRecord, inputs: Inputs = Inputs()) -> Outcome | None:
    """The sample's cost, or None when it has no CPU window or no wire counter to divide by
    (a failed sample, a tool that counted nothing: nothing to cost)."""
    window_s = num(sample.cpu.window_s)
    got = sample.crosscheck.packets_and_bytes()
    if window_s is None or window_s <= 0 or got is None:
        return None
    packets, payload = got
    verdict = check(sample, packets, payload)
    source = (f"{sample.crosscheck.device or '?'} {sample.crosscheck.direction or ''}".strip()
              if not sample.crosscheck.pairs else f"the devices under test of {len(sample.crosscheck.pairs)} pairs")
    kept = inputs.recorded(path_devices(sample, inputs))
    if verdict["verdict"] == "fail":
        return Outcome(Cost(packets=packets, packets_source=source, check=verdict, inputs=kept), {},
                       verdict["reason"])
    cores, switch, notes = roles(sample, inputs)
    path_cores = {r: cores[r] for r in ROLES}
    if negative := {r: v for r, v in path_cores.items() if v < 0}:
        # a process's thread times read as the threads alive at each end of the window: a
        # worker thread that ended inside it takes its time along, and the role reads less
        # than nothing. No cost per packet is made of such a role; the sample stands.
        why = ("a role's CPU time read negative (" + ", ".join(f"{r} {v:+.4g} cores" for r, v in negative.items())
               + "; a thread that ended in the window took its time along): no cost per packet")
        return Outcome(Cost(packets=packets, packets_source=source, cores=cores, switch=switch, check=verdict,
                            notes=(*notes, why), inputs=kept), {})
    kernel = sample.data.get("kernel")
    accounting = kernel.get("irq_time_accounting") if isinstance(kernel, Mapping) else None
    ncpus = len(sample.cpu.extra.get("host_per_cpu") or {}) or 1
    close = closure(sample.cpu.host_busy, cores, ncpus, window_s, accounting)
    if close["within"] is False:
        cores["gap"] = close["gap"]
    path = round(sum(path_cores.values()), 6)
    host = round(sum(path_cores[r] for r in HOST_ROLES), 6)
    ns = {**_per(cores, window_s, packets, 1e9), "path": path * window_s / packets * 1e9,
          "host": host * window_s / packets * 1e9}
    ns = {k: round(v, 3) for k, v in ns.items()}
    metrics: dict[str, float] = {METRIC: ns["path"], HOST_METRIC: ns["host"],
                                 **{role_metric(r): ns[r] for r in ROLES}}
    per_gbit: dict[str, float] = {}
    per_ktps: dict[str, float] = {}
    tps, secs = sample.metric("transactions_per_s"), sample.metric("duration_s")
    if tps and secs:
        # CPU seconds over the window per 1,000 transactions = cores per 1,000 transactions/s
        per_ktps = {**_per(path_cores, window_s, tps * secs, 1e3), "path": round(path * window_s / (tps * secs) * 1e3, 6)}
        metrics["cost_cores_per_ktps"] = per_ktps["path"]
    elif payload > 0:
        gbit = payload * 8 / 1e9
        per_gbit = {**_per(path_cores, window_s, gbit, 1.0), "path": round(path * window_s / gbit, 6)}
        metrics["cost_cores_per_gbit"] = per_gbit["path"]
    if not any(isinstance(g, Mapping) for g in sample.cpu.per_guest.values()):
        # namespace endpoints, or guests whose QEMU this host does not run: the endpoints'
        # own work is in no role of the path, so its cost is shown, never judged
        notes.append("the endpoints' CPU is not attributed (namespace endpoints, or guests whose "
                     "QEMU runs elsewhere): the path's roles miss them, so this cost is recorded "
                     "but is no metric the gate judges")
        metrics = {}
    ghz, how = frequency(inputs.mhz_before, inputs.mhz_after)
    cycles: dict[str, float] = {}
    if ghz is not None:
        cycles = {r: round(v * ghz, 1) for r, v in ns.items()}
        if metrics:
            metrics["cost_cycles_per_packet"] = cycles["path"]
    if inputs.perf_cycles is not None:
        cycles["host_perf"] = round(inputs.perf_cycles / packets, 1)
        how = f"{how}; host_perf: perf stat -a -e cycles, the whole host's cycles per packet"
    elif inputs.perf_note:
        notes.append(f"performance counters: {inputs.perf_note}")
    return Outcome(Cost(packets=packets, packets_source=source, cores=cores, ns_per_packet=ns,
                        cores_per_gbit=per_gbit, cores_per_ktps=per_ktps, cycles_per_packet=cycles,
                        cycles_source=how, switch=switch, closure=close, check=verdict,
                        notes=tuple(notes), inputs=kept), metrics)


def attach(sample: SampleRecord, inputs: Inputs = Inputs()) -> SampleRecord:
    """The sample with its cost: ``extra.cost`` (the typed record: ``sample.cost``) and the
    metrics; a sample whose cost inputs disagree fails, with both figures in its reason (as
    the wire cross-check's). A failed sample, or one with nothing to divide by, is returned
    as it is."""
    if sample.status == "failed":
        return sample
    out = compute(sample, inputs)
    if out is None:
        return sample
    data = {**sample.data, "cost": out.cost.to_dict()}
    present = sample.present | {"data"}
    if out.reason is not None:
        # worded as the run's cost hook fails a sample (testbed.measure.costprobe.CostHook)
        return replace(sample, status="failed", reason=f"cost: {out.reason}", metrics={}, data=data,
                       present=present)
    return replace(sample, metrics={**sample.metrics, **out.metrics}, data=data, present=present)
