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

from collections.abc import Sequence
from dataclasses import dataclass

from testbed.analysis.sample_cost import ROLES
from testbed.records.records import RunRecord, num

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
    #: the sample's cost (testbed.analysis.sample_cost): the path's cores (its roles added up) and
    #: its dominant role; None for a sample recorded without one
    path_cores: float | None = None
    role: str | None = None

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


_num = num


def points(rec: RunRecord, kind: str, *, mtu: int | None = None,
           connections: int | None = None) -> tuple[PairsPoint, ...]:
    """Every successful, non-warmup sample of the profile kind, as a point of its mode."""
    scale = 1.0 if kind == "rr" else 1e-3          # Mbit/s -> Gbit/s
    out = []
    for s in rec.samples:
        cell = s.cell
        if not s.measured:
            continue
        if rec.is_transactional(str(cell.profile)) != (kind == "rr"):
            continue
        if (mtu is not None and cell.mtu != mtu) or \
                (connections is not None and cell.connections != connections):
            continue
        metric = rec.primary_metric(str(cell.profile))
        agg = s.metric(metric)
        busy = s.cpu.host_busy
        if agg is None or agg <= 0 or busy is None:
            continue
        n = int(cell.pairs or 1)
        prs = []
        for p in s.pairs:
            r, t, a = p.value(metric), num(p.target), num(p.achieved)
            prs.append(PairResult(None if r is None else r * scale, num(p.latency_p99_us),
                                  num(p.cpu_cores), None if t is None else t * scale,
                                  None if a is None else a * scale))
        if not prs:
            prs = [PairResult(agg * scale / n, s.metric("latency_p99_us"), None)]
        path = {r: v for r, v in s.cost.cores.items() if r in ROLES}
        out.append(PairsPoint(cell.mode, cell.series(), str(cell.id), n, agg * scale, busy,
                              s.cpu.host_softirq, tuple(prs), cell.rate,
                              round(sum(path.values()), 6) if path else None,
                              max(path, key=lambda r: path[r]) if path else None))
    return tuple(out)


def idle_readings(rec: RunRecord) -> tuple[IdleReading, ...]:
    out = []
    for r in rec.idle:
        busy, g = num(r.host_busy_cores), r.guests
        if busy is None or not isinstance(g, int) or g < 0:
            continue
        rss = tuple(v for v in map(num, (r.qemu_rss_mib or {}).values()) if v is not None)
        out.append(IdleReading(g, num(r.window_s) or 0.0, busy, num(r.host_memory_used_mib), rss,
                               r.memory_mib if isinstance(r.memory_mib, int) else None,
                               r.attachment))
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


def choose_series(pts: Sequence[PairsPoint]) -> tuple[str, tuple[PairsPoint, ...]]:
    """A mode's most expensive series (host cores per unit), so a plan never rests on the
    cheapest corner of the matrix."""
    series = max(sorted({p.series for p in pts}),
                 key=lambda s: sum(p.host_cores / p.aggregate for p in pts if p.series == s)
                 / sum(1 for p in pts if p.series == s))
    return series, tuple(p for p in pts if p.series == series)


def has_pairs_data(rec: RunRecord) -> bool:
    """A run the fitted model can use: N > 1 somewhere, or idle readings. Else: one pair."""
    return bool(rec.idle) or any(int(s.cell.pairs or 1) > 1 for s in rec.samples)
