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

    def rate(ax: Any) -> None:
        ax.plot([p.pairs for p in mine], [p.per_pair for p in mine], "o", color="C0",
                alpha=0.5, label="samples")
        ax.plot(ns, [per_pair[n] for n in ns], "-", color="C0", label="mean")
        if 1 in per_pair:
            ax.axhline(per_pair[1] * (1 - cm.KNEE_DEGRADATION), color="C3", linestyle=":",
                       label="knee threshold (-10 % vs N=1)")
        sat = [p for p in mine if p.saturated]
        if sat:
            ax.plot([p.pairs for p in sat], [p.per_pair for p in sat], "x", color="C3",
                    markersize=9, label="saturated")

    def cpu(ax: Any) -> None:
        ax.plot([p.pairs for p in mine], [p.host_cores for p in mine], "o", color="C1",
                alpha=0.5, label="measured")
        ax.plot(ns, [model.base_cores + model.idle_cores_per_vm * 2 * n + model.cores_per_unit * agg[n]
                     + model.contention * agg[n] * (n - 1) for n in ns], "-", color="C2",
                label=f"fit: {model.idle_cores_per_vm:.3g}/guest + {model.cores_per_unit:.3g}"
                      f"/{'Gbit/s' if kind == 'stream' else 'tps'}")

    return figure([Panel(f"{mode}: per-pair {unit}", "pairs (N)", f"{unit} per pair", rate),
                    Panel(f"{mode}: host CPU", "pairs (N)", "host cores busy", cpu)],
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
