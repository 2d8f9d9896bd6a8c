"""`testbed capacity` on runs with N pairs or idle readings: the limits and the answer.

Reads what ``testbed.analysis.capacity_model`` defines and fits; names the resource that runs out first
(CPU with headroom, memory with a reserve, vCPU overcommit, the link), and refuses answers more
than 2x beyond the largest measured N unless told to extrapolate.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from testbed.analysis.capacity_model import (
    EXTRAPOLATION_LIMIT,
    SATURATION_SHORTFALL,
    CostModel,
    IdleReading,
    PairsPoint,
    _num,
    choose_series,
    fit_model,
    idle_readings,
    knee,
    points,
    saturated_at,
)
from testbed.analysis import costs, stats
from testbed.records.records import RunRecord

# --------------------------------------------------------------------------- limits

LIMITS = ("cpu", "memory", "vcpu", "link")


@dataclass(frozen=True)
class Host:
    cores: float
    threads: int
    memory_mib: float
    headroom: float = 0.2
    memory_reserve_mib: float = 2048.0
    overcommit: float = 1.0          # vCPUs per host thread
    link_gbit: float = 10.0


@dataclass(frozen=True)
class ModePlan:
    mode: str
    series: str
    model: CostModel
    points: tuple[PairsPoint, ...]
    max_n: int
    knee: int | None
    knee_why: str
    saturated: tuple[int, ...]
    by: Mapping[str, int | None]     # limit -> VMs it allows (None: does not bind)
    memory_per_vm_mib: float
    vms: int
    limit: str
    warnings: tuple[str, ...]


def _largest(fits: Any, cap: int = 1_000_000) -> int | None:
    """Largest M in [0, cap] with fits(M) (monotone); None when even cap fits (no limit)."""
    if fits(cap):
        return None
    lo, hi = 0, cap
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def plan_mode(mode: str, pts: Sequence[PairsPoint], idle: Sequence[IdleReading], per_vm: float,
              host: Host, *, memory_mib: int, vcpus: int, link_per_unit: float,
              extrapolate: bool = False) -> ModePlan:
    """How many VMs of ``per_vm`` fit. Each planned VM is charged one guest's idle cost and
    memory and one measured pair's traffic cost (both ends of its path: conservative), and the
    contention of as many pairs as VMs."""
    series, mine = choose_series(pts)
    model = fit_model(mine, idle)
    usable = host.cores * (1 - host.headroom)
    rss = [r for i in idle for r in i.qemu_rss_mib]
    overhead = max(0.0, sum(rss) / len(rss) - memory_mib) if rss else 0.0
    mem_per_vm = memory_mib + overhead
    warnings = []
    if not rss:
        warnings.append("no idle RSS reading: memory counts guest memory only, no QEMU overhead")
    by: dict[str, int | None] = {
        "cpu": _largest(lambda m: model.cores(m, per_vm) <= usable + 1e-9),
        "memory": max(0, math.floor((host.memory_mib - host.memory_reserve_mib) / mem_per_vm)),
        "vcpu": math.floor(host.threads * host.overcommit / vcpus + 1e-9),
        "link": math.floor(host.link_gbit * (1 - host.headroom) / (link_per_unit * per_vm) + 1e-9)
        if link_per_unit * per_vm > 0 else None}
    bound = {k: v for k, v in by.items() if v is not None}
    vms = min(bound.values()) if bound else 0
    limit = "+".join(k for k in LIMITS if bound.get(k) == vms) if bound else "none"
    max_n = max(p.pairs for p in mine)
    reach = math.floor(EXTRAPOLATION_LIMIT * max_n)
    if vms > reach:
        if extrapolate:
            warnings.append(f"extrapolated to {vms} VMs, {vms / max_n:.3g}x the largest measured "
                            f"N={max_n}")
        else:
            warnings.append(f"refused to extrapolate beyond {EXTRAPOLATION_LIMIT:g}x the largest "
                            f"measured N={max_n} ({limit} would allow {vms}); measure more "
                            f"pairs or pass --extrapolate")
            vms, limit = reach, "evidence"
    top = max(p.per_pair for p in mine)
    if per_vm > top:
        warnings.append(f"per-VM demand {per_vm:g} is above the {top:.4g} per pair measured: "
                        f"traffic cost extrapolated")
    kn, why = knee(mine)
    sat = saturated_at(mine)
    if sat:
        warnings.append(f"saturated at N={','.join(map(str, sat))}: a pair fell more than "
                        f"{SATURATION_SHORTFALL:.0%} short of its target rate")
    return ModePlan(mode, series, model, mine, max_n, kn, why, sat, by, mem_per_vm, vms, limit,
                    tuple(warnings))


# --------------------------------------------------------------------------- output

def _g(v: float | None, digits: int = 4) -> str:
    return "-" if v is None else f"{v:.{digits}g}"


def render_mode(mp: ModePlan, unit: str) -> list[str]:
    m = mp.model
    lines = [f"{mp.mode} ({mp.series}): cores = "
             + (f"{m.base_cores:.4g} + " if m.base_cores else "") + f"{m.idle_cores_per_vm:.4g} x guests + "
             f"{m.cores_per_unit:.4g} x {unit}"
             + (f" + {m.contention:.4g} x {unit} x (N-1)" if m.contention else "")
             + f"; R^2 {_g(m.r2)}, adjusted {_g(m.adj_r2)}",
             f"  {m.note}",
             f"  knee: {'N=' + str(mp.knee) if mp.knee else 'none'} ({mp.knee_why})"]
    costed = [p.path_cores / p.aggregate for p in mp.points if p.path_cores is not None and p.aggregate > 0]
    if costed:
        # the same samples' cost (testbed.analysis.sample_cost): what the path's roles took per unit
        # at the points the fit was made on, beside the fit's marginal traffic term
        s = stats.summarize(costed)
        lines.append(f"  cost at these points: the path's roles {costs.interval(s)} cores per {unit} "
                     f"(mean [95 % interval] over {s.n} samples; the fit's traffic term "
                     f"{m.cores_per_unit:.4g} is the marginal cost, above the guests' idle cost)")
    header = ("source", "N", "guests", unit, "cores", "fit", "residual", "softirq", "per pair",
              "pair cores", "p99 us", "path cores", "role", "")
    rows = []
    # Residuals are the idle readings first, then the points in order.
    sources = [None] * (len(m.residuals) - len(mp.points)) + list(mp.points)
    for r, p in zip(m.residuals, sources):
        res = r.residual if abs(r.residual) > 1e-9 * max(1.0, abs(r.measured)) else 0.0
        rows.append((r.source, str(r.pairs), str(r.guests), _g(r.traffic), _g(r.measured),
                     _g(r.fitted), f"{res:+.3g}", _g(p.softirq_cores) if p else "-",
                     _g(p.per_pair) if p else "-", _g(p.pair_cores) if p else "-",
                     _g(p.p99_us) if p else "-", _g(p.path_cores) if p else "-",
                     (p.role or "-") if p else "-", "saturated" if p and p.saturated else ""))
    widths = [max(len(x[i]) for x in (header, *rows)) for i in range(len(header))]
    lines += ["  " + "  ".join(v.ljust(w) for v, w in zip(x, widths)).rstrip()
              for x in (header, *rows)]
    return lines


@dataclass(frozen=True)
class PairsPlan:
    run_id: str
    accelerator: str | None
    demand_text: str
    kind: str
    per_vm: float
    host: Host
    memory_mib: int
    vcpus: int
    modes: tuple[ModePlan, ...]

    @property
    def tcg(self) -> bool:
        return self.accelerator == "tcg"


def plan(rec: RunRecord, demand: Any, *, host_cores: float | None = None,
         headroom: float = 0.2, link_gbit: float | None = None, memory_reserve_mib: float = 2048.0,
         host_memory_mib: float | None = None, overcommit: float = 1.0,
         memory_mib: int | None = None, extrapolate: bool = False, mtu: int | None = None,
         connections: int | None = None) -> PairsPlan:
    """Plan a run that has N-pair cells or idle readings (see ``has_pairs_data``)."""
    from testbed.analysis.capacity import CapacityError, unit_costs
    env = rec.environment
    rid = rec.run_id
    cores = host_cores if host_cores is not None else env.cpus
    if not isinstance(cores, (int, float)) or cores <= 0:
        raise CapacityError(f"run {rid} records no cpus; pass --host-cores")
    if not 0 <= headroom < 1:
        raise CapacityError(f"--headroom {headroom}: expected a fraction in [0, 1)")
    if memory_mib is not None and memory_mib <= 0:
        raise CapacityError(f"--memory-mib {memory_mib}: expected a positive number of MiB")
    if overcommit <= 0:
        raise CapacityError(f"--overcommit {overcommit}: expected a positive ratio")
    mem = host_memory_mib if host_memory_mib is not None else (
        env.memory_bytes / 2**20 if isinstance(env.memory_bytes, int) else None)
    if mem is None:
        raise CapacityError(f"run {rid} records no memory_bytes; pass --host-memory-mib")
    guests = rec.guests
    guest_mem = memory_mib or max((int(g.memory_mib or 1024) for g in guests), default=1024)
    vcpus = max((int(g.vcpus or 1) for g in guests), default=1)
    if link_gbit is None:       # measured and recorded by the run, else a 10 Gbit/s uplink
        link_gbit = _num(env.link_gbit) or 10.0
    # Recorded cpus are logical threads; a planned host given in cores is taken as that many.
    host = Host(float(cores), int(cores), float(mem), headroom,
                memory_reserve_mib, overcommit, link_gbit)
    pts = points(rec, demand.kind, mtu=mtu, connections=connections)
    if not pts:
        raise CapacityError(f"run {rid} has no successful "
                            f"{'rr/crr' if demand.kind == 'rr' else 'stream'} samples with host "
                            f"CPU figures" + (f" at MTU {mtu}" if mtu else "")
                            + (f" with {connections} connections" if connections else ""))
    link = {c.cell_id: c.link_gbit_per_unit
            for c in unit_costs(rec, demand.kind, mtu=mtu, connections=connections)}
    idle = idle_readings(rec)
    modes = []
    for mode in sorted({p.mode for p in pts}):
        mine = [p for p in pts if p.mode == mode]
        att = mode.split("/")[0]
        mode_idle = [r for r in idle if r.attachment in (None, att)]
        lpu = max((link.get(p.cell_id, 0.0) for p in mine), default=0.0)
        modes.append(plan_mode(mode, mine, mode_idle, demand.per_vm, host, memory_mib=guest_mem,
                               vcpus=vcpus, link_per_unit=lpu, extrapolate=extrapolate))
    return PairsPlan(str(rid), env.accelerator, demand.text, demand.kind, demand.per_vm,
                     host, guest_mem, vcpus, tuple(modes))


def render_text(p: PairsPlan, banner: str) -> str:
    h = p.host
    unit = "Gbit/s" if p.kind == "stream" else "tps"
    lines = [f"run {p.run_id} ({p.accelerator}); per VM: {p.kind} {p.per_vm:g} {unit}, "
             f"{p.memory_mib} MiB, {p.vcpus} vCPU",
             f"cores: {h.cores:g} less {h.headroom:.0%} headroom = {h.cores * (1 - h.headroom):.3g}"
             f"; memory: {h.memory_mib:.0f} MiB less {h.memory_reserve_mib:.0f} reserve; vCPUs: "
             f"{h.threads} threads x {h.overcommit:g}; link: {h.link_gbit:g} Gbit/s less "
             f"{h.headroom:.0%}"]
    if p.tcg:
        lines.append(banner)
    for mp in p.modes:
        lines += render_mode(mp, unit)
    header = ("mode", "VMs", "limit", "by cpu", "by memory", "by vcpu", "by link", "MiB/VM",
              "knee", "saturated")
    rows = [(mp.mode, str(mp.vms), mp.limit, *("-" if mp.by[k] is None else str(mp.by[k])
                                               for k in LIMITS),
             f"{mp.memory_per_vm_mib:.0f}", f"N={mp.knee}" if mp.knee else "-",
             ",".join(f"N={n}" for n in mp.saturated) or "-") for mp in p.modes]
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in (header, *rows)]
    lines += [f"  {mp.mode}: {w}" for mp in p.modes for w in mp.warnings]
    return "\n".join(lines) + "\n"


def to_dict(p: PairsPlan, banner: str) -> dict[str, Any]:
    import dataclasses
    d = dataclasses.asdict(p)
    for mp, md in zip(p.modes, d["modes"]):
        md["model"]["residuals"] = [{**dataclasses.asdict(r), "residual": r.residual}
                                    for r in mp.model.residuals]
    return {**d, "banner": banner if p.tcg else None}


ONE_PAIR_NOTE = ("note: this run measured one pair at a time and no idle guests: the answer is a "
                 "zero-intercept extrapolation from one pair (no idle cost, memory or contention)")
