"""`testbed history`: each cell's metric over the runs in the results index, with change points.

A series is one cell (id and definition hash), one metric and one comparable environment
(accelerator class and CPU model), in run order; runs whose environments cannot be compared
split a series instead of joining it, so a TCG night never sits between two KVM nights.
Each point is the mean of the run's ok, non-warmup samples of the cell.

Change points come from ruptures' PELT search (Killick et al. 2012), not from a detector of
our own. Apache Otava (e-divisive) was the first choice, but its 0.8.0 wheel pins
numpy==2.2.0.* and scipy<1.17 (this project pins numpy 2.4.6 and scipy 1.17.1) and pulls in
google-cloud-bigquery and slack-sdk; ruptures needs only numpy and scipy. The penalty is
BIC-like, 4 sigma^2 ln(n) (a mean and a position per change) with sigma the series' noise estimated robustly from the median
absolute successive difference (so a step does not inflate it), and a change point counts
only when the means either side differ by more than ``threshold`` (5 %), the gate's effect
size: a nightly must not alarm on a detectable but irrelevant shift.
"""
from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from testbed.compare import LATENCY_METRICS
from testbed.records import CellRecord, RunRecord
from testbed.store.schema import MAIN_METRICS

#: metrics where lower is better; every other gated metric is higher-is-better
LOWER_IS_BETTER = frozenset((*LATENCY_METRICS, "latency_p50_us", "latency_p90_us"))
MIN_POINTS = 4


@dataclass(frozen=True)
class Point:
    run_id: str
    started: str
    value: float            # mean of the run's ok samples
    n: int                  # ok samples behind it


@dataclass(frozen=True)
class ChangePoint:
    index: int              # first point of the new segment
    run_id: str             # the run where the change happened
    before: float           # mean of the segment before
    after: float            # mean of the segment from here on
    delta_pct: float
    regression: bool


@dataclass(frozen=True)
class Series:
    cell_id: str
    hash: str
    metric: str
    environment: str        # accelerator/comparable class and CPU model
    points: tuple[Point, ...]
    change_points: tuple[ChangePoint, ...]

    @property
    def newest_regresses(self) -> bool:
        """The newest run starts a regression: a change point at the last point."""
        return any(c.regression and c.index == len(self.points) - 1 for c in self.change_points)


def change_points(values: Sequence[float], *, higher_is_better: bool = True,
                  threshold: float = 0.05) -> list[tuple[int, float, float]]:
    """(index, mean before, mean after) of each change in ``values`` (ruptures PELT)."""
    import ruptures
    y = np.asarray(values, dtype=float)
    n = y.size
    if n < MIN_POINTS:
        return []
    # median absolute successive difference / (sqrt 2 * 0.6745): sigma of white noise,
    # robust to the steps being looked for
    sigma = float(np.median(np.abs(np.diff(y)))) / (math.sqrt(2) * 0.6745)
    sigma = max(sigma, 1e-3 * float(np.mean(np.abs(y))) or 1e-9)
    ends = ruptures.Pelt(model="l2", min_size=1, jump=1).fit(y.reshape(-1, 1)).predict(
        pen=4.0 * sigma ** 2 * math.log(n))
    bounds = [0, *ends]
    out = []
    for k in range(1, len(bounds) - 1):
        before = float(np.mean(y[bounds[k - 1]:bounds[k]]))
        after = float(np.mean(y[bounds[k]:bounds[k + 1]]))
        if before != 0 and abs(after - before) / abs(before) > threshold:
            out.append((bounds[k], before, after))
    return out


def _env_key(run: object) -> str:
    r = run  # store RunRow
    return f"{r.comparable_class or r.accelerator}/{r.cpu_model}"  # type: ignore[attr-defined]


def _primary(samples: Sequence[object], rec: RunRecord) -> str:
    return rec.primary_metric(samples[0].profile)  # type: ignore[attr-defined]


def series(store: object, *, cell: str | None = None, metric: str | None = None,
           threshold: float = 0.05) -> list[Series]:
    """Every series in the index ``store`` (testbed.store.Store), with its change points."""
    points: dict[tuple[str, str, str, str], list[Point]] = defaultdict(list)
    for run in store.runs():  # type: ignore[attr-defined]
        # the index keeps the run's topology; read it as the run record would
        rec = RunRecord.from_dict({"run_id": run.run_id, "topology": json.loads(run.topology)})
        env = _env_key(run)
        by_cell: dict[str, list] = defaultdict(list)
        for s in store.samples(run.run_id):  # type: ignore[attr-defined]
            if s.ok and (cell is None or s.cell_id == cell):
                by_cell[s.cell_id].append(s)
        for cid, samples in by_cell.items():
            s0 = samples[0]
            # the definition hash, recomputed from the run's topology as for an upgraded
            # format 1 run (the index keeps no hash column)
            h = rec.cell_hash(CellRecord(attachment=s0.attachment, backend=s0.backend,
                                         mtu=s0.mtu, connections=s0.connections,
                                         profile=s0.profile, tool=s0.tool,
                                         present=frozenset({"attachment", "backend", "mtu",
                                                            "connections", "profile", "tool"})))
            for m in ([metric] if metric else [_primary(samples, rec)]):
                if m in MAIN_METRICS:
                    vals = [getattr(s, m) for s in samples if getattr(s, m) is not None]
                else:
                    vals = [s.metric_dict()[m] for s in samples if m in s.metric_dict()]
                if vals:
                    points[(cid, h, m, env)].append(Point(run.run_id, run.started or "",
                                                          float(np.mean(vals)), len(vals)))
    out = []
    for (cid, h, m, env), pts in sorted(points.items()):
        higher = m not in LOWER_IS_BETTER
        cps = tuple(
            ChangePoint(i, pts[i].run_id, b, a, (a - b) / abs(b) * 100,
                        regression=(a < b) == higher)
            for i, b, a in change_points([p.value for p in pts], higher_is_better=higher,
                                         threshold=threshold))
        out.append(Series(cid, h, m, env, tuple(pts), cps))
    return out


def render_text(all_series: Sequence[Series]) -> str:
    lines = []
    for s in all_series:
        lines.append(f"{s.cell_id} [{s.hash}] {s.metric} on {s.environment}: "
                     f"{len(s.points)} runs, {len(s.change_points)} change point(s)")
        cps = {c.index: c for c in s.change_points}
        for i, p in enumerate(s.points):
            mark = ""
            if i in cps:
                c = cps[i]
                mark = (f"  <- CHANGE {c.delta_pct:+.1f}% ({c.before:.4g} -> {c.after:.4g})"
                        f"{' REGRESSION' if c.regression else ''}")
            lines.append(f"  {p.run_id}  {p.value:12.4g}  n={p.n}{mark}")
    newest = [s for s in all_series if s.newest_regresses]
    if newest:
        lines.append("NEWEST RUN STARTS A REGRESSION: " + ", ".join(
            f"{s.cell_id} {s.metric}" for s in newest))
    if not all_series:
        lines.append("no series (index some runs with `testbed index`)")
    return "\n".join(lines) + "\n"
