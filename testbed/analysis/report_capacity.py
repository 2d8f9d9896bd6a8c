"""The report's capacity section: per mode, per-pair rate and host CPU against N with the fitted
model, and (given a per-VM profile) the capacity table. Pure: builds figures and rows only.

Kept apart from report.py so the report's own plots can change without touching this.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from testbed.analysis import capacity_model as cm
from testbed.analysis import capacity_plan
from testbed.analysis import figures
from testbed.analysis.figures import Panel, figure
from testbed.records.records import RunRecord


@dataclass(frozen=True)
class CapacityRow:
    run_id: str
    mode: str
    model: str
    vms: int
    limit: str
    by: tuple[str, ...]             # cpu, memory, vcpu, link
    knee: str
    saturated: str
    warnings: tuple[str, ...]


def _mean(vals: Sequence[float]) -> float:
    return sum(vals) / len(vals)


def _mode_plot(run_id: str, mode: str, kind: str, pts: Sequence[cm.PairsPoint],
               idle: Sequence[cm.IdleReading]) -> Any:
    series, mine = cm.choose_series(pts)
    model = cm.fit_model(mine, idle)
    ns = sorted({p.pairs for p in mine})
    unit = "Gbit/s" if kind == "stream" else "transactions/s"
    per_pair = {n: _mean([p.per_pair for p in mine if p.pairs == n]) for n in ns}
    agg = {n: _mean([p.aggregate for p in mine if p.pairs == n]) for n in ns}

    import plotly.graph_objects as go
    c = figures.colour
    n_at = {n: sum(1 for p in mine if p.pairs == n) for n in ns}
    rate = [go.Scatter(x=[p.pairs for p in mine], y=[p.per_pair for p in mine], mode="markers",
                       name="samples", marker={"color": c(0), "opacity": 0.5},
                       hovertemplate="N=%{x}: %{y:.4g} " + unit + " per pair<extra>sample</extra>"),
            go.Scatter(x=ns, y=[per_pair[n] for n in ns], mode="lines", name="mean", line={"color": c(0)},
                       customdata=[n_at[n] for n in ns],
                       hovertemplate="N=%{x}: mean %{y:.4g} " + unit + " per pair, n=%{customdata}<extra></extra>")]
    sat = [p for p in mine if p.saturated]
    if sat:
        rate.append(go.Scatter(x=[p.pairs for p in sat], y=[p.per_pair for p in sat], mode="markers",
                               name="saturated", marker={"color": c(3), "symbol": "x", "size": 11},
                               hovertemplate="N=%{x}: saturated<extra></extra>"))
    knee = (figures.Rule("y", per_pair[1] * (1 - cm.KNEE_DEGRADATION), "knee threshold (-10 % vs N=1)",
                         dash="dot"),) if 1 in per_pair else ()
    fit = [model.base_cores + model.idle_cores_per_vm * 2 * n + model.cores_per_unit * agg[n]
           + model.contention * agg[n] * (n - 1) for n in ns]
    cpu = [go.Scatter(x=[p.pairs for p in mine], y=[p.host_cores for p in mine], mode="markers",
                      name="measured", marker={"color": c(1), "opacity": 0.5},
                      hovertemplate="N=%{x}: %{y:.3g} host cores<extra>measured</extra>"),
           go.Scatter(x=ns, y=fit, mode="lines", line={"color": c(2)},
                      name=f"fit: {model.idle_cores_per_vm:.3g}/guest + {model.cores_per_unit:.3g}"
                           f"/{'Gbit/s' if kind == 'stream' else 'tps'}",
                      hovertemplate="N=%{x}: model %{y:.3g} host cores<extra></extra>")]
    return figure([Panel(f"{mode}: per-pair {unit}", "pairs (N)", f"{unit} per pair", tuple(rate), rules=knee),
                   Panel(f"{mode}: host CPU", "pairs (N)", "host cores busy", tuple(cpu))],
                  f"Capacity, {mode} ({series}), run {run_id}",
                  "Per-pair rate and host busy cores against the number of guest pairs run at "
                  "once; the line on the CPU panel is the fitted cost model at each measured N.")


def plots(records: Sequence[RunRecord]) -> tuple[Any, ...]:
    out = []
    for rec in records:
        if not cm.has_pairs_data(rec):
            continue
        idle = cm.idle_readings(rec)
        for kind in ("stream", "rr"):
            pts = cm.points(rec, kind)
            for mode in sorted({p.mode for p in pts}):
                att = mode.split("/")[0]
                out.append(_mode_plot(rec.run_id, mode, kind,
                                      [p for p in pts if p.mode == mode],
                                      [r for r in idle if r.attachment in (None, att)]))
    return tuple(out)


def table(records: Sequence[RunRecord], profile: str | None) -> tuple[CapacityRow, ...]:
    """The capacity table at ``profile`` (e.g. stream:2gbit) with default host options."""
    if not profile:
        return ()
    from testbed.analysis.capacity import CapacityError, parse_demand
    try:
        demand = parse_demand(profile)
    except CapacityError as e:      # the report's option has its own name
        raise CapacityError(str(e).replace("--profile", "--capacity-profile", 1)) from None
    rows = []
    for rec in records:
        if not cm.has_pairs_data(rec) or not cm.points(rec, demand.kind):
            continue
        p = capacity_plan.plan(rec, demand)
        for mp in p.modes:
            m = mp.model
            rows.append(CapacityRow(
                p.run_id, mp.mode,
                f"{m.idle_cores_per_vm:.3g}/guest + {m.cores_per_unit:.3g}/unit"
                + (f" + {m.contention:.3g}/unit/(N-1)" if m.contention else ""),
                mp.vms, mp.limit, tuple("-" if mp.by[k] is None else str(mp.by[k])
                                        for k in capacity_plan.LIMITS),
                f"N={mp.knee}" if mp.knee else "-",
                ",".join(f"N={n}" for n in mp.saturated) or "-", mp.warnings))
    return tuple(rows)
