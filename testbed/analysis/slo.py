"""`testbed capacity RUN --slo "p99.9<500us@5000tps"`: how many pairs a host carries while
every pair still meets a service level, from a density run (cells measured with N pairs at
a paced load; see testbed.measure.pairs).

An SLO is a figure, a bound and the load per pair it must hold at:
``p99.9<500us@5000tps`` (a latency percentile, or ``mean``, in us, ms or s, at a
transaction rate), ``loss<0.1%@2gbit`` (UDP loss at a bit rate). The answer:

- the largest N measured at which every pair of every sample met it (and every smaller N);
- the first N that broke it, which pair, and its figure;
- the binding resource at that N: the host's CPU (busy within 10 % of its cores), the
  pair's own QEMU threads (a pair near one core per guest), else none saturated (the
  figure rose while CPU was left: queueing in the datapath);
- when every measured N met it, an extrapolation: the worst pair's figure against N fitted
  by least squares, the N where it reaches the bound, and a 95 % prediction interval
  for that N, said to be extrapolated. Fewer than three measured N give no extrapolation.

A pair whose figure is missing (an insufficient percentile is never recorded) or that fell
short of its paced load, or a sample that failed (a sender that could not offer the load),
does not meet the SLO: it cannot be shown to. Each answer says how
its latency was measured (the samples' ``latency_loop``): open-loop (sockperf under-load:
queueing shows) or closed-loop (uperf, netperf: it is under-reported).
"""
from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

from testbed.analysis.capacity import CapacityError
from testbed.records import percentiles
from testbed.records.records import RunRecord
from testbed.tools import pacing

_SLO_RE = re.compile(r"^(?P<fig>p\d{1,2}(?:\.\d{1,3})?|mean|loss)\s*(?P<op><=|<)\s*"
                     r"(?P<num>\d+(?:\.\d+)?)\s*(?P<unit>us|ms|s|%)\s*@\s*(?P<load>\S+)$",
                     re.ASCII)   # ASCII digits: float() would read '٣' as 3
_TIME = {"us": 1.0, "ms": 1e3, "s": 1e6}
#: the host's CPU binds when busy within this share of its cores
CPU_BINDS = 0.9
#: a pair's own threads bind near one core per guest of the pair
PAIR_BINDS = 1.8


@dataclass(frozen=True)
class Slo:
    text: str
    figure: str              # "p99.9", "mean", "loss"
    metric: str              # latency_p99_9_us, latency_mean_us, loss_pct
    bound: float             # in the metric's unit (us, percent)
    inclusive: bool
    rate: pacing.Rate

    def met(self, value: float) -> bool:
        return value <= self.bound if self.inclusive else value < self.bound

    @property
    def unit(self) -> str:
        return "%" if self.metric == "loss_pct" else "us"


def parse(text: str) -> Slo:
    """Bad input raises CapacityError (exit 2), one line naming --slo."""
    t = str(text).strip().lower()
    m = _SLO_RE.match(t)
    if not m:
        raise CapacityError(f"--slo {text!r}: expected <figure><<bound>@<load>, e.g. p99.9<500us@5000tps "
                            f"or loss<0.1%@2gbit (figure p<N>, mean or loss)")
    fig, unit, value = m["fig"], m["unit"], float(m["num"])
    if not math.isfinite(value) or len(m["num"]) > 20:
        raise CapacityError(f"--slo {text!r}: the bound {m['num'][:20]!r}... is not a finite number of at "
                            f"most 20 digits")
    try:
        rate = pacing.parse_rate(m["load"])
    except ValueError as e:
        raise CapacityError(f"--slo {text!r}: load {e}") from None
    if fig == "loss":
        if unit != "%":
            raise CapacityError(f"--slo {text!r}: loss is bounded in percent (e.g. loss<0.1%)")
        if rate.bps is None:
            raise CapacityError(f"--slo {text!r}: loss is measured on a UDP stream at a bit rate (e.g. @2gbit)")
        if not 0 < value < 100:
            raise CapacityError(f"--slo {text!r}: a loss bound lies between 0 and 100 %")
        return Slo(text, fig, "loss_pct", value, m["op"] == "<=", rate)
    if unit == "%":
        raise CapacityError(f"--slo {text!r}: a latency is bounded in us, ms or s")
    if rate.tps is None:
        raise CapacityError(f"--slo {text!r}: latency is measured on request/response at a "
                            f"transaction rate (e.g. @5000tps)")
    if fig == "mean":
        metric = "latency_mean_us"
    else:
        p = float(fig[1:])
        if not 1 <= p < 100:
            raise CapacityError(f"--slo {text!r}: a percentile lies in p1..p99.999")
        metric = percentiles.metric_name(p)
    if value <= 0:
        raise CapacityError(f"--slo {text!r}: the bound must be positive")
    return Slo(text, fig, metric, value * _TIME[unit], m["op"] == "<=", rate)


@dataclass(frozen=True)
class Breach:
    pairs: int               # N
    sample: int              # rep
    pair: int                # 1-based pair index; 0: the whole sample failed
    value: float | None      # None: the figure was not recorded
    why: str


@dataclass(frozen=True)
class Level:
    """One measured N: its worst pair's figure and whether every pair met the SLO."""

    pairs: int
    samples: int
    worst: float | None
    met: bool
    breaches: tuple[Breach, ...]
    host_busy: float | None
    pair_cores: float | None


@dataclass(frozen=True)
class Extrapolation:
    n: float | None
    low: float | None
    high: float | None
    slope: float | None
    note: str


@dataclass(frozen=True)
class Answer:
    slo: Slo
    series: str
    levels: tuple[Level, ...]
    largest_met: int | None
    first_broken: Level | None
    binding: str
    host_cores: float | None
    extrapolation: Extrapolation | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["slo"] = {"text": self.slo.text, "metric": self.slo.metric, "bound": self.slo.bound,
                    "unit": self.slo.unit, "load": self.slo.rate.text}
        return d


def _same_rate(cell_rate: str | None, want: pacing.Rate) -> bool:
    if not cell_rate:
        return False
    try:
        r = pacing.parse_rate(cell_rate)
    except ValueError:
        return False
    return (r.bps, r.tps) == (want.bps, want.tps)


def loops(rec: RunRecord, slo: Slo) -> dict[str, str]:
    """Per series at the SLO's load, how its samples' latency was measured (open- or
    closed-loop, as the samples say); series whose samples say nothing are left out."""
    out: dict[str, set[str]] = defaultdict(set)
    for s in rec.samples:
        if s.measured and _same_rate(s.cell.rate, slo.rate) and s.data.get("latency_loop"):
            out[f"{s.cell.mode} {s.cell.series()}"].add(str(s.data["latency_loop"]))
    return {k: " and ".join(sorted(v)) for k, v in out.items()}


def levels(rec: RunRecord, slo: Slo, *, mtu: int | None = None,
           connections: int | None = None) -> dict[str, list[Level]]:
    """Per series (the cell without N), one Level per measured N at the SLO's load."""
    by: dict[tuple[str, int], list] = defaultdict(list)
    rates: set[str] = set()
    for s in rec.samples:
        c = s.cell
        # a failed sample counts against the SLO (a sender that could not offer the load, a
        # pair that failed): it cannot be shown to meet it; warm-ups and noisy retries do not
        if s.warmup or not (s.ok or s.status == "failed"):
            continue
        if c.rate:
            rates.add(str(c.rate))
        if not _same_rate(c.rate, slo.rate):
            continue
        if (mtu is not None and c.mtu != mtu) or (connections is not None and c.connections != connections):
            continue
        by[(f"{c.mode} {c.series()}", int(c.pairs or 1))].append(s)
    if not by:
        have = ", ".join(sorted(rates)) or "none (no paced cells)"
        raise CapacityError(f"--slo {slo.text!r}: the run measured no cell at {slo.rate.text} per pair "
                            f"(paced loads in it: {have})")
    out: dict[str, list[Level]] = defaultdict(list)
    for (series, n), samples in sorted(by.items()):
        breaches, worst, busy, cores = [], None, [], []
        for s in samples:
            if not s.ok:
                breaches.append(Breach(n, s.rep, 0, None, f"sample failed: {s.reason}"))
                continue
            prs = s.pairs or ()
            figures = ([p.value(slo.metric) for p in prs] if prs
                       else [s.metric(slo.metric)] * n)
            for i, v in enumerate(figures, 1):
                pr = prs[i - 1] if prs else None
                if pr is not None and pr.target and pr.achieved is not None and \
                        pacing.shortfall(pr.target, pr.achieved):
                    breaches.append(Breach(n, s.rep, i, v, f"reached {pr.achieved:g} of its "
                                                           f"{pr.target:g} target"))
                elif v is None:
                    breaches.append(Breach(n, s.rep, i, None, f"no {slo.figure} recorded (too few "
                                                             "transactions, or the tool gives none)"))
                elif not slo.met(v):
                    breaches.append(Breach(n, s.rep, i, v, f"{slo.figure} {v:g} {slo.unit}"))
                if v is not None:
                    worst = v if worst is None else max(worst, v)
            if s.cpu.host_busy is not None:
                busy.append(s.cpu.host_busy)
            pc = [p.cpu_cores for p in prs if p.cpu_cores is not None]
            if pc:
                cores.append(max(pc))
        out[series].append(Level(n, len(samples), worst, not breaches, tuple(breaches),
                                 max(busy) if busy else None, max(cores) if cores else None))
    return out


def _binding(level: Level | None, host_cores: float | None) -> str:
    if level is None:
        return "none reached within the measured N"
    if level.host_busy is not None and host_cores and level.host_busy >= CPU_BINDS * host_cores:
        return f"host CPU ({level.host_busy:.2f} of {host_cores:g} cores busy at N={level.pairs})"
    if level.pair_cores is not None and level.pair_cores >= PAIR_BINDS:
        return f"a pair's own QEMU threads ({level.pair_cores:.2f} cores for one pair at N={level.pairs})"
    busy = "" if level.host_busy is None else f", host CPU {level.host_busy:.2f}" + (
        f" of {host_cores:g} cores" if host_cores else " cores")
    return f"no resource saturated (the figure rose while CPU was left{busy}: queueing in the datapath)"


def extrapolate(lv: list[Level], bound: float) -> Extrapolation:
    """Least squares of the worst figure against N; where it reaches ``bound``, and the N
    range where the 95 % prediction band for a new observation straddles it."""
    pts = [(float(x.pairs), x.worst) for x in lv if x.worst is not None]
    if len({x for x, _ in pts}) < 3:
        return Extrapolation(None, None, None, None,
                             f"not extrapolated: {len({x for x, _ in pts})} measured N with a figure, 3 needed")
    from scipy import stats as sps
    n = len(pts)
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in pts) / sxx
    icpt = my - slope * mx
    if slope <= 0:
        return Extrapolation(None, None, None, slope,
                             f"not extrapolated: the figure does not rise with N (slope {slope:.3g})")
    resid = [y - (icpt + slope * x) for x, y in pts]
    s = math.sqrt(sum(r * r for r in resid) / (n - 2)) if n > 2 else 0.0
    t = float(sps.t.ppf(0.975, n - 2))

    def band(x: float) -> float:
        return t * s * math.sqrt(1 + 1 / n + (x - mx) ** 2 / sxx)

    cross = (bound - icpt) / slope
    top = max(xs) * 1000 + 1000

    def solve(sign: int) -> float | None:
        # smallest x >= max measured where icpt + slope x + sign*band(x) reaches bound
        lo, hi = max(xs), top
        f = lambda x: icpt + slope * x + sign * band(x) - bound  # noqa: E731
        if f(lo) >= 0:
            return lo
        if f(hi) < 0:
            return None
        for _ in range(200):
            mid = (lo + hi) / 2
            lo, hi = (lo, mid) if f(mid) >= 0 else (mid, hi)
        return hi
    low, high = solve(+1), solve(-1)
    return Extrapolation(round(cross, 2), None if low is None else round(low, 2),
                         None if high is None else round(high, 2), slope,
                         f"EXTRAPOLATED beyond the measured N={int(max(xs))}: linear fit of the worst "
                         f"pair's figure over N={', '.join(str(int(x)) for x in sorted(set(xs)))}, "
                         f"95 % prediction interval")


def answer(rec: RunRecord, slo: Slo, *, host_cores: float | None = None, mtu: int | None = None,
           connections: int | None = None) -> list[Answer]:
    cores = host_cores if host_cores is not None else rec.environment.cpus
    out = []
    loop = loops(rec, slo) if slo.metric != "loss_pct" else {}
    for series, lv in levels(rec, slo, mtu=mtu, connections=connections).items():
        largest, first = None, None
        for level in lv:
            if level.met and first is None:
                largest = level.pairs
            elif not level.met and first is None:
                first = level
        ex = None
        if first is None:
            ex = extrapolate(lv, slo.bound)
        binding = _binding(first, cores) if first else _binding(None, cores)
        notes = (f"latency measured {loop[series]}",) if series in loop else ()
        out.append(Answer(slo, series, tuple(lv), largest, first, binding, cores, ex, notes))
    return out


def render_text(answers: list[Answer]) -> str:
    lines = []
    for a in answers:
        lines.append(f"SLO {a.slo.text}: {a.slo.figure} {'<=' if a.slo.inclusive else '<'} "
                     f"{a.slo.bound:g} {a.slo.unit} at {a.slo.rate.text} per pair   [{a.series}]")
        lines.extend(f"  {n}" for n in a.notes)
        for lv in a.levels:
            w = "-" if lv.worst is None else f"{lv.worst:g} {a.slo.unit}"
            lines.append(f"  N={lv.pairs:<3} worst pair {w:>14}  {'met' if lv.met else 'BROKEN'}"
                         f"  ({lv.samples} sample(s))")
        lines.append(f"  largest N meeting it: {'none' if a.largest_met is None else a.largest_met}")
        if a.first_broken is not None:
            b = a.first_broken.breaches[0]
            who = f"pair {b.pair}, " if b.pair else ""      # 0: the whole sample failed
            lines.append(f"  first N breaking it: {a.first_broken.pairs} ({who}sample {b.sample}: {b.why}"
                         + (f"; {len(a.first_broken.breaches) - 1} more" if len(a.first_broken.breaches) > 1 else "")
                         + ")")
        else:
            lines.append("  first N breaking it: none measured")
        lines.append(f"  binding resource: {a.binding}")
        if a.extrapolation is not None:
            e = a.extrapolation
            if e.n is not None:
                rng = (f"{'-' if e.low is None else e.low}..{'beyond the fit' if e.high is None else e.high}")
                lines.append(f"  predicted N at the bound: {e.n} (95 % prediction interval {rng}); {e.note}")
            else:
                lines.append(f"  {e.note}")
    return "\n".join(lines) + "\n"
