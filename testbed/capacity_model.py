"""Capacity from N guest pairs at once: what the analysis reads from a run, and the fitted model.

The contract with the measuring half (the ``pairs`` matrix axis, paced load, idle readings).
Everything here is read from the results format; nothing is required, old runs still load.

Per sample (``samples.jsonl``):

- ``cell.pairs``: N, the guest pairs run at once in this cell (absent: 1, the runs recorded
  before the axis existed). ``cell.rate``: the profile's target rate text when paced
  (``2gbit``, ``5000tps``), else absent.
- ``metrics``: the aggregate over the N pairs, as today (``throughput_mbps`` or
  ``transactions_per_s``, ``latency_p99_us``).
- ``cpu``: the host totals over the same window, as today (``cpu.host.busy`` cores,
  ``cpu.host.softirq`` cores).
- ``extra.pairs``: one mapping per pair: ``throughput_mbps`` or ``transactions_per_s``,
  ``latency_p99_us``, ``cpu_cores`` (that pair's own QEMU + vhost cores), and when paced
  ``target`` and ``achieved`` in the same unit as the metric. Absent: the aggregate / N.

Per run (``run.json``):

- ``environment.link_gbit``: the uplink's measured capacity, when the run measured it (the
  default for ``--link-gbit``; else 10 Gbit/s).
- ``idle``: a list of idle readings, each of N booted guests with no traffic, averaged over a
  window: ``guests``, ``window_s``, ``host_busy_cores``, ``host_memory_used_mib``,
  ``qemu_rss_mib`` (guest -> MiB), ``memory_mib`` (the guests' configured memory), and
  optionally ``attachment`` (readings without one serve every mode).

A pair more than 5 % short of its target rate marks its cell saturated at that N. The knee is
the first N at which per-pair throughput falls, or p99 latency rises, by more than 10 % against
N = 1.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from testbed.results import RunRecord

SATURATION_SHORTFALL = 0.05
KNEE_DEGRADATION = 0.10
EXTRAPOLATION_LIMIT = 2.0       # x the largest measured N, without --extrapolate
F_TEST_ALPHA = 0.05


@dataclass(frozen=True)
class PairResult:
    rate: float | None              # this pair's traffic: Gbit/s (stream) or tps (rr)
    p99_us: float | None
    cpu_cores: float | None         # its own QEMU + vhost cores
    target: float | None = None     # paced target, same unit as rate
    achieved: float | None = None

    @property
    def short(self) -> bool:
        return (self.target is not None and self.achieved is not None and self.target > 0
                and self.achieved < self.target * (1 - SATURATION_SHORTFALL))


@dataclass(frozen=True)
class PairsPoint:
    """One successful sample of a cell run with N pairs."""

    mode: str                       # attachment/backend
    series: str                     # the cell without N: which profile/MTU/connections
    cell_id: str
    pairs: int
    aggregate: float                # Gbit/s or tps, summed over the pairs
    host_cores: float
    softirq_cores: float | None
    pair_results: tuple[PairResult, ...]
    rate: str | None = None         # the cell's target rate text when paced

    @property
    def per_pair(self) -> float:
        rates = [p.rate for p in self.pair_results if p.rate is not None]
        return sum(rates) / len(rates) if rates else self.aggregate / self.pairs

    @property
    def pair_cores(self) -> float | None:
        """A pair's own QEMU + vhost cores, the mean over the pairs that recorded them."""
        vals = [p.cpu_cores for p in self.pair_results if p.cpu_cores is not None]
        return sum(vals) / len(vals) if vals else None

    @property
    def p99_us(self) -> float | None:
        vals = [p.p99_us for p in self.pair_results if p.p99_us is not None]
        return max(vals) if vals else None

    @property
    def saturated(self) -> bool:
        return any(p.short for p in self.pair_results)


@dataclass(frozen=True)
class IdleReading:
    guests: int
    window_s: float
    host_busy_cores: float
    host_memory_used_mib: float | None
    qemu_rss_mib: tuple[float, ...]
    memory_mib: int | None
    attachment: str | None = None


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) \
        and math.isfinite(v) else None


def _series(cell: Mapping[str, Any]) -> str:
    return (f"mtu{cell.get('mtu')}-conn{cell.get('connections')}-q{cell.get('queues') or 1}"
            f"-{cell.get('profile')}")


def points(rec: RunRecord, kind: str, *, mtu: int | None = None,
           connections: int | None = None) -> tuple[PairsPoint, ...]:
    """Every successful, non-warmup sample of the profile kind, as a point of its mode."""
    from testbed.compare import is_transactional
    metric = "transactions_per_s" if kind == "rr" else "throughput_mbps"
    scale = 1.0 if kind == "rr" else 1e-3          # Mbit/s -> Gbit/s
    out = []
    for s in rec.samples:
        cell = s.get("cell") or {}
        if s.get("warmup") or s.get("status") != "ok":
            continue
        if is_transactional(rec.run, str(cell.get("profile"))) != (kind == "rr"):
            continue
        if (mtu is not None and cell.get("mtu") != mtu) or \
                (connections is not None and cell.get("connections") != connections):
            continue
        agg = _num((s.get("metrics") or {}).get(metric))
        host = (s.get("cpu") or {}).get("host") or {}
        busy = _num(host.get("busy"))
        if agg is None or agg <= 0 or busy is None:
            continue
        n = int(cell.get("pairs") or 1)
        prs = []
        for p in (s.get("extra") or {}).get("pairs") or ():
            r = _num(p.get(metric))
            t, a = _num(p.get("target")), _num(p.get("achieved"))
            prs.append(PairResult(None if r is None else r * scale, _num(p.get("latency_p99_us")),
                                  _num(p.get("cpu_cores")), None if t is None else t * scale,
                                  None if a is None else a * scale))
        if not prs:
            p99 = _num((s.get("metrics") or {}).get("latency_p99_us"))
            prs = [PairResult(agg * scale / n, p99, None)]
        out.append(PairsPoint(f"{cell.get('attachment')}/{cell.get('backend')}", _series(cell),
                              str(cell.get("id")), n, agg * scale, busy, _num(host.get("softirq")),
                              tuple(prs), cell.get("rate")))
    return tuple(out)


def idle_readings(rec: RunRecord) -> tuple[IdleReading, ...]:
    out = []
    for r in rec.run.get("idle") or ():
        busy, g = _num(r.get("host_busy_cores")), r.get("guests")
        if busy is None or not isinstance(g, int) or g < 0:
            continue
        rss = tuple(v for v in map(_num, (r.get("qemu_rss_mib") or {}).values()) if v is not None)
        out.append(IdleReading(g, _num(r.get("window_s")) or 0.0, busy,
                               _num(r.get("host_memory_used_mib")), rss,
                               r.get("memory_mib") if isinstance(r.get("memory_mib"), int) else None,
                               r.get("attachment")))
    return tuple(out)


# --------------------------------------------------------------------------- the cost model

@dataclass(frozen=True)
class Residual:
    source: str                     # "idle" or the cell id
    pairs: int
    guests: int
    traffic: float
    measured: float
    fitted: float

    @property
    def residual(self) -> float:
        return self.measured - self.fitted


@dataclass(frozen=True)
class CostModel:
    """host busy cores = base + idle x guests + unit x traffic [+ contention x traffic x (N-1)].

    ``base`` (the host's own load with no guests) is fitted only where idle readings at two or
    more guest counts can tell it from the per-guest cost; elsewhere it is 0 and the host's own
    load is charged to the guests (conservative)."""

    idle_cores_per_vm: float
    cores_per_unit: float
    contention: float               # 0 unless the F-test kept the term
    contention_p: float | None      # the F-test's p value (None: not testable on this data)
    r2: float | None
    adj_r2: float | None
    residuals: tuple[Residual, ...]
    note: str
    base_cores: float = 0.0

    def cores(self, vms: int, per_vm: float) -> float:
        traffic = vms * per_vm
        return (self.base_cores + self.idle_cores_per_vm * vms + self.cores_per_unit * traffic
                + self.contention * traffic * max(0, vms - 1))


def _lsq(rows: Sequence[Sequence[float]], y: Sequence[float]) -> tuple[list[float], float]:
    """Least squares with every coefficient >= 0 (a cost is never negative)."""
    import numpy as np
    from scipy.optimize import lsq_linear
    a, b = np.asarray(rows, dtype=float), np.asarray(y, dtype=float)
    res = lsq_linear(a, b, bounds=(0.0, np.inf), method="bvls")   # exact on small problems
    return [float(x) for x in res.x], float(np.sum((a @ res.x - b) ** 2))


def fit_model(pts: Sequence[PairsPoint], idle: Sequence[IdleReading]) -> CostModel:
    """Fit one mode's cost from its points and idle readings, choosing the terms by rule."""
    from scipy.stats import f as f_dist
    data = [("idle", 0, r.guests, 0.0, r.host_busy_cores) for r in idle] + \
           [(p.cell_id, p.pairs, 2 * p.pairs, p.aggregate, p.host_cores) for p in pts]
    y = [d[4] for d in data]
    notes = []
    with_base = len({r.guests for r in idle}) >= 2
    if not idle:
        notes.append("no idle reading: the idle cost is fitted from loaded points only")
    elif not with_base:
        notes.append("idle readings at one guest count: host base load charged to the guests")

    def columns(d: tuple, contention: bool) -> list[float]:
        cols = [1.0] if with_base else []
        cols += [d[2], d[3]]
        return cols + ([d[3] * max(0, d[1] - 1)] if contention else [])

    coef, rss = _lsq([columns(d, False) for d in data], y)
    kept, k, p_value = [*coef, 0.0], len(coef), None
    # The contention term is tried only where the data can test it (points at three or more
    # N, a spare degree of freedom) and kept only if an F-test rejects "no contention".
    if len({p.pairs for p in pts}) >= 3 and len(data) > k + 1:
        coef_f, rss_f = _lsq([columns(d, True) for d in data], y)
        dof = len(data) - k - 1
        if rss_f > 0 and rss - rss_f > 1e-12 * max(1.0, rss):
            p_value = float(f_dist.sf((rss - rss_f) / (rss_f / dof), 1, dof))
        else:       # no better, or exact while the simpler model is not
            p_value = 0.0 if rss - rss_f > 1e-12 else 1.0
        if p_value < F_TEST_ALPHA and coef_f[-1] > 0:
            kept, rss, k = coef_f, rss_f, k + 1
            notes.append(f"contention term kept (F-test p={p_value:.3g} < {F_TEST_ALPHA})")
        else:
            notes.append(f"contention term dropped (F-test p={p_value:.3g})")
    else:
        notes.append("contention not testable: needs points at 3 or more N")
    if not with_base:
        kept = [0.0, *kept]
    base, idle_c, unit, cont = kept
    mean = sum(y) / len(y)
    tss = sum((v - mean) ** 2 for v in y)
    r2 = 1 - rss / tss if tss > 0 else None
    adj = (1 - (1 - r2) * (len(y) - 1) / (len(y) - k)
           if r2 is not None and len(y) - k > 0 else None)
    fitted = [base + idle_c * d[2] + unit * d[3] + cont * d[3] * max(0, d[1] - 1) for d in data]
    return CostModel(idle_c, unit, cont, p_value, r2, adj,
                     tuple(Residual(d[0], d[1], d[2], d[3], d[4], f) for d, f in zip(data, fitted)),
                     "; ".join(notes), base)


# --------------------------------------------------------------------------- knee, saturation

def knee(pts: Sequence[PairsPoint]) -> tuple[int | None, str]:
    """The first N whose per-pair rate fell, or p99 rose, more than 10 % against N = 1."""
    by_n: dict[int, list[PairsPoint]] = {}
    for p in pts:
        by_n.setdefault(p.pairs, []).append(p)
    if 1 not in by_n:
        return None, "no N=1 cell to compare against"
    def mean(vals: list[float]) -> float | None:
        return sum(vals) / len(vals) if vals else None
    rate1 = mean([p.per_pair for p in by_n[1]])
    lat1 = mean([v for p in by_n[1] if (v := p.p99_us) is not None])
    for n in sorted(by_n)[1:]:
        rate = mean([p.per_pair for p in by_n[n]])
        lat = mean([v for p in by_n[n] if (v := p.p99_us) is not None])
        if rate1 and rate is not None and rate < rate1 * (1 - KNEE_DEGRADATION):
            return n, f"per-pair rate {rate:.4g} vs {rate1:.4g} at N=1"
        if lat1 and lat is not None and lat > lat1 * (1 + KNEE_DEGRADATION):
            return n, f"p99 {lat:.4g} us vs {lat1:.4g} us at N=1"
    return None, f"none up to N={max(by_n)}"


def saturated_at(pts: Sequence[PairsPoint]) -> tuple[int, ...]:
    """The N at which some pair fell more than 5 % short of its target rate."""
    return tuple(sorted({p.pairs for p in pts if p.saturated}))


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


def choose_series(pts: Sequence[PairsPoint]) -> tuple[str, tuple[PairsPoint, ...]]:
    """A mode's most expensive series (host cores per unit), so a plan never rests on the
    cheapest corner of the matrix."""
    series = max(sorted({p.series for p in pts}),
                 key=lambda s: sum(p.host_cores / p.aggregate for p in pts if p.series == s)
                 / sum(1 for p in pts if p.series == s))
    return series, tuple(p for p in pts if p.series == series)


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


def has_pairs_data(rec: RunRecord) -> bool:
    """A run the fitted model can use: N > 1 somewhere, or idle readings. Else: one pair."""
    return bool(rec.run.get("idle")) or any(
        int((s.get("cell") or {}).get("pairs") or 1) > 1 for s in rec.samples)


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
    header = ("source", "N", "guests", unit, "cores", "fit", "residual", "softirq", "per pair",
              "pair cores", "p99 us", "")
    rows = []
    # Residuals are the idle readings first, then the points in order.
    sources = [None] * (len(m.residuals) - len(mp.points)) + list(mp.points)
    for r, p in zip(m.residuals, sources):
        res = r.residual if abs(r.residual) > 1e-9 * max(1.0, abs(r.measured)) else 0.0
        rows.append((r.source, str(r.pairs), str(r.guests), _g(r.traffic), _g(r.measured),
                     _g(r.fitted), f"{res:+.3g}", _g(p.softirq_cores) if p else "-",
                     _g(p.per_pair) if p else "-", _g(p.pair_cores) if p else "-",
                     _g(p.p99_us) if p else "-", "saturated" if p and p.saturated else ""))
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
    from testbed.capacity import CapacityError, unit_costs
    env = rec.run.get("environment") or {}
    rid = rec.run.get("run_id")
    cores = host_cores if host_cores is not None else env.get("cpus")
    if not isinstance(cores, (int, float)) or cores <= 0:
        raise CapacityError(f"run {rid} records no cpus; pass --host-cores")
    if not 0 <= headroom < 1:
        raise CapacityError(f"--headroom {headroom}: expected a fraction in [0, 1)")
    if memory_mib is not None and memory_mib <= 0:
        raise CapacityError(f"--memory-mib {memory_mib}: expected a positive number of MiB")
    if overcommit <= 0:
        raise CapacityError(f"--overcommit {overcommit}: expected a positive ratio")
    mem = host_memory_mib if host_memory_mib is not None else (
        env["memory_bytes"] / 2**20 if isinstance(env.get("memory_bytes"), int) else None)
    if mem is None:
        raise CapacityError(f"run {rid} records no memory_bytes; pass --host-memory-mib")
    guests = (rec.run.get("topology") or {}).get("guests") or ()
    guest_mem = memory_mib or max((int(g.get("memory_mib") or 1024) for g in guests), default=1024)
    vcpus = max((int(g.get("vcpus") or 1) for g in guests), default=1)
    if link_gbit is None:       # measured and recorded by the run, else a 10 Gbit/s uplink
        link_gbit = _num(env.get("link_gbit")) or 10.0
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
    return PairsPlan(str(rid), env.get("accelerator"), demand.text, demand.kind, demand.per_vm,
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
