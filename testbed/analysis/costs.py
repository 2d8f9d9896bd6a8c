"""Cost across samples: per cell, per mode, and between two sets of samples.

Pure: run records in, frozen records out. A sample's own cost (host CPU per packet by role)
is computed when it is measured (testbed.analysis.sample_cost); here it is summarised:

- per cell: the path's cost per packet and per unit of traffic with their 95 % intervals
  over the ok samples, each role's share, the dominant role, how many samples closed;
- per mode, for `testbed capacity`: cores per Gbit/s (stream cells) and per 1,000
  transactions/s (request/response cells) of the mode's most expensive cell, with its
  interval, the dominant role, and how the cost per packet moves with MTU, connections and
  the number of pairs (cells that differ in that axis alone);
- between BASE and NEW (`testbed compare`, `history`): which role's cost per packet moved.
"""
from __future__ import annotations

import dataclasses
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from testbed.analysis import stats
from testbed.analysis.sample_cost import HOST_METRIC, METRIC, METRICS, OTHER_ROLES, ROLE_METRICS, ROLES, role_metric
from testbed.records.records import RunRecord, SampleRecord

#: (metric, higher is better, decides) for `testbed compare`: the path's cost per packet and
#: its host side decide beside throughput and latency; each role's is shown, so the role that
#: moved is seen
COMPARED = ((METRIC, False, True), (HOST_METRIC, False, True), *((m, False, False) for m in ROLE_METRICS))
#: the cost metrics a gate decides on
DECIDING = (METRIC, HOST_METRIC)
#: every cost metric, lower is better (history, the report)
LOWER_IS_BETTER = frozenset(METRICS)


def _summary(values: Sequence[float]) -> stats.Summary | None:
    return stats.summarize(values) if values else None


def interval(s: stats.Summary | None, scale: float = 1.0, digits: int = 4) -> str:
    """``mean [low, high]`` (the 95 % interval), or the mean alone below two samples."""
    if s is None:
        return "-"
    m = f"{s.mean * scale:.{digits}g}"
    if s.ci_low is None or s.ci_high is None:
        return f"{m} (n={s.n})"
    return f"{m} [{s.ci_low * scale:.{digits}g}, {s.ci_high * scale:.{digits}g}]"


# --------------------------------------------------------------------------- per cell

@dataclass(frozen=True)
class CellCost:
    run_id: str
    cell_id: str
    mode: str
    mtu: int
    connections: int
    pairs: int
    profile: str
    transactional: bool
    n: int                                  # ok samples with a cost
    per_packet: stats.Summary               # ns per packet, the path
    #: cores per Gbit/s (stream) or per 1,000 transactions/s (rr), the path
    per_unit: stats.Summary | None
    #: role -> mean ns per packet (the path's roles, then rest and gap when present)
    roles: tuple[tuple[str, float], ...]
    #: samples whose roles closed against the host's busy time within the tolerance
    closed: int
    #: the mean throughput (Gbit/s) or transactions/s the cost bought
    traffic: float | None = None

    @property
    def dominant(self) -> tuple[str, float]:
        """The path's most expensive role and its share of the path's cost per packet."""
        path = [(r, v) for r, v in self.roles if r in ROLES]
        total = sum(v for _, v in path) or 1.0
        r, v = max(path, key=lambda x: x[1])
        return r, v / total

    def series(self) -> str:
        return f"{self.mode} mtu{self.mtu} conn{self.connections} pairs{self.pairs} {self.profile}"


def costed(samples: Iterable[SampleRecord]) -> list[SampleRecord]:
    """The ok samples that carry a cost per packet."""
    return [s for s in samples if s.ok and s.metric(METRIC) is not None]


def cell_costs(rec: RunRecord) -> tuple[CellCost, ...]:
    """Every cell of a run with ok samples that carry a cost."""
    by_cell: dict[str, list[SampleRecord]] = defaultdict(list)
    for s in rec.samples:
        if not s.warmup:
            by_cell[s.cell.id].append(s)
    out = []
    for cid, samples in sorted(by_cell.items()):
        ok = costed(samples)
        if not ok:
            continue
        cell = ok[0].cell
        rr = rec.is_transactional(str(cell.profile))
        unit = "cost_cores_per_ktps" if rr else "cost_cores_per_gbit"
        roles = [*ROLES, *(r for r in OTHER_ROLES if any(r in s.cost.ns_per_packet for s in ok))]
        means = tuple((r, sum(s.cost.ns_per_packet.get(r, 0.0) for s in ok) / len(ok)) for r in roles)
        metric = rec.primary_metric(str(cell.profile))
        traffic = [v for s in ok if (v := s.metric(metric)) is not None]
        out.append(CellCost(
            run_id=rec.run_id, cell_id=cid, mode=cell.mode, mtu=int(cell.mtu or 0),
            connections=int(cell.connections or 0), pairs=int(cell.pairs or 1), profile=str(cell.profile),
            transactional=rr, n=len(ok), per_packet=stats.summarize([s.metrics[METRIC] for s in ok]),
            per_unit=_summary([v for s in ok if (v := s.metric(unit)) is not None]), roles=means,
            closed=sum(1 for s in ok if s.cost.closure.get("within")),
            traffic=(sum(traffic) / len(traffic) / (1 if rr else 1000)) if traffic else None))
    return tuple(out)


# --------------------------------------------------------------------------- the role that moved

def role_means(metrics: Sequence[Mapping[str, Any]]) -> tuple[tuple[str, float], ...]:
    """(role, mean ns per packet) over samples' metrics that carry the cost; the path as
    "path". Empty when none does."""
    have = [m for m in metrics if isinstance(m.get(METRIC), (int, float))]
    if not have:
        return ()
    keys = [("path", METRIC), *((r, role_metric(r)) for r in ROLES)]
    return tuple((r, sum(float(m.get(k) or 0.0) for m in have) / len(have)) for r, k in keys)


def moved(before: Mapping[str, float], after: Mapping[str, float],
          clearness: Mapping[str, float] | None = None) -> str:
    """The role whose cost per packet moved most in the path's direction, in words
    ("vhost +12.0 % per packet (+340 ns of the path's +360 ns)"); empty without costs.
    ``clearness``: per role, its change over its standard error (from the samples), so that
    the role named is the one that moved most clearly, not a noisy one that moved by chance
    (the guests' vCPUs' spread dwarfs a host role's change); without it, the largest change."""
    if "path" not in before or "path" not in after:
        return ""
    path = after["path"] - before["path"]
    sign = 1.0 if path >= 0 else -1.0
    by = clearness if clearness else {x: after.get(x, 0.0) - before.get(x, 0.0) for x in ROLES}
    r = max(ROLES, key=lambda x: sign * by.get(x, 0.0))
    vb, vn = before.get(r, 0.0), after.get(r, 0.0)
    rel = f"{(vn - vb) / vb * 100:+.1f} %" if vb > 0 else "from 0"
    return f"{r} {rel} per packet ({vn - vb:+.0f} ns of the path's {path:+.0f} ns)"


def role_change(base: Sequence[SampleRecord], new: Sequence[SampleRecord]) -> str:
    """:func:`moved` between two sets of samples (BASE and NEW of one cell), the role chosen
    by how clearly it moved (Welch's t of its cost per packet)."""
    b, n = costed(base), costed(new)
    clear: dict[str, float] = {}
    for r in ROLES:
        vb = [s.metric(role_metric(r)) or 0.0 for s in b]
        vn = [s.metric(role_metric(r)) or 0.0 for s in n]
        if len(vb) > 1 and len(vn) > 1:
            se = (statistics.variance(vb) / len(vb) + statistics.variance(vn) / len(vn)) ** 0.5
            d = statistics.fmean(vn) - statistics.fmean(vb)
            clear[r] = d / se if se > 0 else (0.0 if d == 0 else float("inf") if d > 0 else float("-inf"))
    return moved(dict(role_means([s.metrics for s in b])), dict(role_means([s.metrics for s in n])),
                 clear if len(clear) == len(ROLES) else None)


def segment_role(before: Sequence[Sequence[tuple[str, float]]],
                 after: Sequence[Sequence[tuple[str, float]]]) -> str:
    """:func:`moved` between two segments of a history series (each point's role means)."""
    def mean(points: Sequence[Sequence[tuple[str, float]]]) -> dict[str, float]:
        have = [dict(p) for p in points if p]
        return {k: sum(p[k] for p in have) / len(have) for k in have[0]} if have else {}
    return moved(mean(before), mean(after))


# --------------------------------------------------------------------------- capacity in cost

AXES = ("mtu", "connections", "pairs")


@dataclass(frozen=True)
class AxisEffect:
    axis: str
    #: (value, mean ns per packet) along the axis, other axes held
    points: tuple[tuple[int, float], ...]
    held: str                               # what the other axes were

    def describe(self) -> str:
        (x0, y0), (x1, y1) = self.points[0], self.points[-1]
        steps = " -> ".join(f"{y:.4g}" for _, y in self.points)
        ratio = f"x{y1 / y0:.2f}" if y0 > 0 else "no ratio to a cost of 0"
        return (f"{self.axis} {' -> '.join(str(x) for x, _ in self.points)}: {steps} ns per packet "
                f"({ratio} from {self.axis} {x0} to {x1}; {self.held})")


def axis_effects(cells: Sequence[CellCost]) -> tuple[AxisEffect, ...]:
    """How the path's cost per packet moves along each axis, from cells that differ in that
    axis alone (same mode, profile and the other axes): one line per such group."""
    out = []
    for axis in AXES:
        groups: dict[tuple, list[CellCost]] = defaultdict(list)
        for c in cells:
            key = (c.mode, c.profile, *(getattr(c, a) for a in AXES if a != axis))
            groups[key].append(c)
        for key, cs in sorted(groups.items()):
            vals = sorted({getattr(c, axis) for c in cs})
            if len(vals) < 2:
                continue
            pts = tuple((v, sum(c.per_packet.mean for c in cs if getattr(c, axis) == v)
                         / sum(1 for c in cs if getattr(c, axis) == v)) for v in vals)
            held = ", ".join(f"{a} {k}" for a, k in zip([a for a in AXES if a != axis], key[2:]))
            out.append(AxisEffect(axis, pts, f"{key[1]}, {held}"))
    return tuple(out)


@dataclass(frozen=True)
class ModeCost:
    mode: str
    kind: str                               # stream | rr
    cell: CellCost                          # the mode's most expensive cell of that kind
    per_unit: stats.Summary                 # cores per Gbit/s or per 1,000 transactions/s
    dominant: str
    share: float
    effects: tuple[AxisEffect, ...]

    @property
    def unit(self) -> str:
        return "Gbit/s" if self.kind == "stream" else "1,000 transactions/s"


@dataclass(frozen=True)
class CostPlan:
    run_id: str
    modes: tuple[ModeCost, ...]
    #: ok samples whose roles closed within the tolerance, of those with a cost
    closed: int
    costed: int


def plan(rec: RunRecord, *, kind: str | None = None, mtu: int | None = None,
         connections: int | None = None) -> CostPlan:
    """Per mode (and per kind of traffic, or only ``kind``), cores per unit of traffic of
    its most expensive cell, with the interval over that cell's samples."""
    cells = [c for c in cell_costs(rec)
             if (mtu is None or c.mtu == mtu) and (connections is None or c.connections == connections)]
    modes = []
    for mode in sorted({c.mode for c in cells}):
        for k in ("stream", "rr"):
            if kind is not None and k != kind:
                continue
            mine = [c for c in cells if c.mode == mode and c.transactional == (k == "rr")
                    and c.per_unit is not None]
            if not mine:
                continue
            worst = max(mine, key=lambda c: c.per_unit.mean)    # type: ignore[union-attr]
            dom, share = worst.dominant
            modes.append(ModeCost(mode, k, worst, worst.per_unit, dom, share,  # type: ignore[arg-type]
                                  axis_effects([c for c in cells if c.mode == mode])))
    return CostPlan(rec.run_id, tuple(modes), sum(c.closed for c in cells), sum(c.n for c in cells))


def render_plan(p: CostPlan) -> str:
    if not p.modes:
        return ("cost: no ok sample of this run carries a cost per packet (measured before costs "
                "were recorded, or every sample failed)\n")
    lines = [f"cost (host cores per unit of traffic, the path's roles; mean [95 % interval] over the "
             f"samples of each mode's most expensive cell); {p.closed} of {p.costed} samples closed "
             f"against the host's busy time"]
    header = ("mode", "traffic", "cores per unit", "unit", "ns per packet", "dominant role", "cell")
    rows = [(m.mode, m.kind, interval(m.per_unit), m.unit, interval(m.cell.per_packet),
             f"{m.dominant} {m.share:.0%}", f"{m.cell.cell_id} (n={m.cell.n})") for m in p.modes]
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in (header, *rows)]
    seen: set[str] = set()
    for m in p.modes:
        for e in m.effects:
            text = f"  {m.mode}: {e.describe()}"
            if text not in seen:
                seen.add(text)
                lines.append(text)
    return "\n".join(lines) + "\n"


def plan_dict(p: CostPlan) -> dict[str, Any]:
    d = dataclasses.asdict(p)
    for m, md in zip(p.modes, d["modes"]):
        md["unit"] = m.unit
        md["cell"]["dominant"] = list(m.cell.dominant)
    return d


def roles_of(samples: Iterable[SampleRecord]) -> Mapping[str, float]:
    """Mean cores per role over samples with a cost (the density fit's points)."""
    ok = costed(samples)
    if not ok:
        return {}
    keys = {k for s in ok for k in s.cost.cores}
    return {k: sum(s.cost.cores.get(k, 0.0) for s in ok) / len(ok) for k in keys}
