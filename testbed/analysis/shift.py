"""The night's shared shift: what every cell of a comparison moved by together.

A hypervisor's nights differ by a percent or two in every cell at once (thermal state,
firmware, neighbours, the host's clock). Judged cell by cell against BASE, such a shift
makes a hundred cells look a little worse together, and a gate that counts them fails on
the host, not the build. So, per deciding metric (the metrics of different units and
directions drift apart), with at least MIN_CELLS comparable cells:

- the **shift** is the location that the majority of the cells' log ratios log(NEW / BASE)
  share: from MIN_TAU_CELLS cells on, Tukey's biweight with each cell on its own standard
  error (majority_location), which a group of cells that really changed together (a build
  that slows one attachment mode) does not move; with fewer cells, the Hodges-Lehmann
  estimate (the median of the pairwise means, robust to a few changed cells) with the
  distribution-free interval of the Wilcoxon signed-rank test over the cells;
- each cell is judged on its change **after the shift**, its standard error widened by the
  shift's (the shift is estimated, not known; below MIN_TAU_CELLS, as the *other* cells
  give it, so that a cell's own change does not widen its yardstick) and by the
  **between-run noise** the cells show beyond their samples' spread (a random effect tau,
  found so that the cells' standardised residuals have the robust spread the t
  distribution gives them: a cell whose level moves from run to run is not a change of
  the build);
- the shift itself is judged against the threshold like a cell (a one-sided test against
  the threshold, in the same Benjamini-Hochberg family): beyond it, credibly, it is a
  finding of its own, "every cell 6 % slower: the host, or the whole build?", which fails
  the night; otherwise it is printed in one line and taken out. A shift whose estimate is
  near the threshold but not credibly beyond it does not hold the night undecided: its
  uncertainty is the host's night-to-night drift, which measuring the cells again cannot
  shrink, so the night passes with the shift on a line of its own ("watch") and `testbed
  history` judges it over the nights, where a lasting step of the whole build shows.

A uniform real regression of the whole build moves the shift, so it still fails the night;
what the shift cannot do is tell a slower host from a slower build. A/B variants in one run
(`--decide-against` with `matrix.variants`) take the host's drift out by design.

Pure: comparisons in, comparisons and a Shift out.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from testbed.analysis import stats

#: fewer comparable cells than this in a metric: no shift is estimated (with three, one
#: changed cell would move it)
MIN_CELLS = 4
#: fewer cells than this: the between-run noise is not estimated (a robust spread of fewer
#: points says little)
MIN_TAU_CELLS = 12
#: the biweight's cut-off in scales (a point's standard error with the between-run noise):
#: 4.685 is the usual 95 % efficiency at the normal for one common scale; 3.5 keeps that
#: efficiency here (each cell on its own scale, 0.27 % against the Hodges-Lehmann's 0.28 % at
#: 100 cells) and gives no weight to a group at -10 % whose cells' scales are about 2.7 %
BIWEIGHT_C = 3.5


@dataclass(frozen=True)
class Shift:
    """The shared shift of one deciding metric, judged as a comparison of its own."""

    metric: str
    cells: int
    #: the shift as NEW over BASE (a Comparison of one "cell", the night): its evidence is
    #: the Hodges-Lehmann log shift, its verdict the shift's against the threshold
    comparison: stats.Comparison
    #: the between-run noise added to each cell (log scale, a standard deviation)
    tau: float
    #: the cells that share the shift (the biweight kept them): fewer than ``cells`` when a
    #: group of cells moved apart from the rest, which the shift does not follow
    shared: int = 0
    #: the cells that moved apart from the shift (their ids as given to take_out), and in
    #: words what they have in common (filled by the caller, which knows the cells: "ovs 28,
    #: bridge 2")
    apart: tuple[str, ...] = ()
    apart_by: str = ""
    #: what estimated the shift: "biweight" (majority_location), or "hodges-lehmann" (below
    #: MIN_TAU_CELLS cells, or where the biweight kept too few of them)
    estimator: str = "hodges-lehmann"

    @property
    def undecided(self) -> bool:
        """Inconclusive with its estimate beyond the threshold on the worse side."""
        c = self.comparison
        if c.verdict is not stats.Verdict.INCONCLUSIVE or c.evidence is None:
            return False
        sign = 1.0 if c.higher_is_better else -1.0
        return sign * c.evidence.d < sign * stats.limits(c)[0]

    @property
    def change(self) -> float:
        return math.expm1(self.comparison.evidence.d) if self.comparison.evidence else 0.0

    def describe(self) -> str:
        c = self.comparison
        lo, hi = c.change_ci or (0.0, 0.0)
        what = {stats.Verdict.REGRESSED: "credibly worse than the threshold: every cell moved; the host, "
                                         "not the build? (A/B variants in one run take the host out)",
                stats.Verdict.IMPROVED: "credibly better than the threshold in every cell",
                stats.Verdict.UNCHANGED: "within the threshold: taken out of each cell's verdict",
                }.get(c.verdict, "beyond the threshold, not credibly: one night cannot tell the host's "
                                 "drift from the build's; taken out of each cell's verdict, and `testbed "
                                 "history` follows it over the nights" if self.undecided
                      else "not credibly beyond the threshold: taken out of each cell's verdict")
        tau = f"; between-run noise {self.tau:.1%} a cell added" if self.tau > 0 else ""
        how = (f"Hodges-Lehmann over {self.cells} cells" if self.estimator != "biweight"
               else f"biweight over {self.cells} cells, {self.shared} sharing it"
               + (f"; apart: {self.apart_by}" if self.apart_by and self.shared < self.cells else ""))
        return (f"night shift {self.metric}: every cell {self.change:+.1%} "
                f"[{lo:+.1%}, {hi:+.1%}] ({how}{tau}): {what}")


def walsh_interval(x: Sequence[float], alpha: float) -> tuple[float, float, float]:
    """(estimate, low, high): the Hodges-Lehmann location of ``x`` and its (1 - 2 alpha)
    interval from the signed-rank statistic's distribution (normal approximation, the
    outermost pairwise means when there are too few for it)."""
    a = np.sort(np.asarray(x, dtype=float))
    n = a.size
    i, j = np.triu_indices(n)
    w = np.sort((a[i] + a[j]) / 2.0)
    m = w.size
    est = float(np.median(w))
    sd = math.sqrt(n * (n + 1) * (2 * n + 1) / 24.0)
    k = int(math.floor(m / 2.0 - stats.norm_ppf(1.0 - alpha) * sd))
    k = min(max(k, 0), (m - 1) // 2)
    return est, float(w[k]), float(w[m - 1 - k])


def walsh_location(x: Sequence[float] | np.ndarray, alpha: float) -> tuple[float, float]:
    """(estimate, standard error): the Hodges-Lehmann location of ``x``, and its (1 - 2
    alpha) signed-rank interval read as Student's t at len(x) - 1 degrees of freedom."""
    est, lo, hi = walsh_interval(x, alpha)
    z = stats.t_ppf(1.0 - alpha, max(len(x) - 1, 1))
    return est, ((hi - lo) / (2.0 * z) if hi > lo else 0.0)


def majority_location(x: Sequence[float], scale: Sequence[float], start: float | None = None,
                      c: float = BIWEIGHT_C) -> tuple[float, float, np.ndarray]:
    """(estimate, its standard error, which points it kept): Tukey's biweight M-estimate of
    the location most of ``x`` share, each point on its own ``scale``, iterated from
    ``start`` (the median by default), with its sandwich standard error (Huber 1981).

    Why not the Hodges-Lehmann location: it is robust to a few changed cells, not to a group.
    When a build slows one attachment mode, a fifth to a third of a night's cells move
    together, and the Hodges-Lehmann shift follows them about a third of the way (at 30 % of
    the cells at -10 %: -2.7 %, so each of them looked 7.3 % worse, and the gate could not
    call it). The biweight gives a point beyond BIWEIGHT_C of its scales no weight at all: at
    30 % of the cells at -10 % it moves by -0.3 %, and with no group it is as precise as the
    Hodges-Lehmann (a standard error of 0.27 % against 0.28 % at 100 cells)."""
    a = np.asarray(x, dtype=float)
    s = np.maximum(np.asarray(scale, dtype=float), 1e-12)
    m = float(np.median(a)) if start is None else float(start)
    for _ in range(100):
        u = (a - m) / (c * s)
        w = np.where(np.abs(u) < 1.0, (1.0 - u ** 2) ** 2, 0.0) / s ** 2
        if not np.any(w > 0):
            break
        nxt = float(np.sum(w * a) / np.sum(w))
        done, m = abs(nxt - m) < 1e-10, nxt
        if done:
            break
    u = (a - m) / (c * s)
    kept = np.abs(u) < 1.0
    r = a - m
    psi = np.where(kept, r * (1.0 - u ** 2) ** 2, 0.0) / s ** 2
    dpsi = np.where(kept, (1.0 - u ** 2) * (1.0 - 5.0 * u ** 2), 0.0) / s ** 2
    den = float(np.sum(dpsi))
    n = int(np.sum(kept))
    se = math.sqrt(float(np.sum(psi ** 2)) * n / max(n - 1, 1)) / den if den > 0 and n > 1 else math.nan
    return m, se, kept


def between_run_tau(resid: np.ndarray, se: np.ndarray, df: float) -> float:
    """tau >= 0 such that the residuals over sqrt(se^2 + tau^2) have the robust spread
    (1.4826 MAD) of Student's t at ``df``: 0 when the samples' own spread explains them."""
    target = stats.t_ppf(0.75, max(df, 1.0)) / 0.6744897501960817

    def spread(tau: float) -> float:
        z = resid / np.sqrt(se ** 2 + tau ** 2)
        return 1.4826 * float(np.median(np.abs(z - np.median(z))))
    if spread(0.0) <= target:
        return 0.0
    lo, hi = 0.0, max(1.0, float(np.max(np.abs(resid))) * 4)
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if spread(mid) > target else (lo, mid)
    return hi


def take_out(metric: str, comps: Sequence[stats.Comparison], *, threshold: float,
             alpha: float, ids: Sequence[str] | None = None) -> tuple[list[stats.Comparison], Shift | None]:
    """The comparisons of one deciding metric with the night's shift taken out (decided
    again, raw), and the Shift; unchanged and None with fewer than MIN_CELLS comparable.
    ``ids`` name the comparisons' cells (Shift.apart); their positions by default."""
    idx = [k for k, c in enumerate(comps) if c.evidence is not None and c.verdict is not stats.Verdict.INSUFFICIENT]
    out = list(comps)
    if len(idx) < MIN_CELLS:
        return out, None
    d = np.array([comps[k].evidence.d for k in idx])
    se = np.array([comps[k].evidence.se for k in idx])
    df = float(np.median([comps[k].evidence.df for k in idx]))
    est, se_shift = walsh_location(d, alpha)
    tau, kept, estimator = 0.0, np.ones(len(idx), dtype=bool), "hodges-lehmann"
    if len(idx) >= MIN_TAU_CELLS:
        majority = _majority(d, se, df)
        if majority is None:
            tau = between_run_tau(d - est, se, df)
        else:
            (est, se_shift, tau, kept), estimator = majority, "biweight"
    # Below MIN_TAU_CELLS each cell is judged with the shift's uncertainty as the *other*
    # cells give it: over four to eleven cells the signed-rank interval reaches out to the
    # outermost cells, so a cell that changed would widen its own yardstick by as much as it
    # moved (at 4 cells a metric, -15 % in one cell at 1 % noise stayed undecided every night)
    spreads = ([walsh_location(np.delete(d, i), alpha)[1] for i in range(len(idx))]
               if len(idx) < MIN_TAU_CELLS else [se_shift] * len(idx))
    for k, spread in zip(idx, spreads):
        c = comps[k]
        ev = stats.Evidence(c.evidence.d - est, math.sqrt(c.evidence.se ** 2 + spread ** 2 + tau ** 2),
                            c.evidence.df)
        out[k] = stats.with_evidence(c, ev, shift=est)
    first = comps[idx[0]]
    one = stats.Summary(n=len(idx), mean=1.0, median=1.0, stddev=None, rsd=None, ci_low=None,
                        ci_high=None, min=1.0, max=1.0)
    night = stats.Comparison(
        base=one, new=dataclasses.replace(one, mean=math.exp(est), median=math.exp(est)),
        delta=math.expm1(est), delta_rel=math.expm1(est), delta_pct=math.expm1(est) * 100,
        p_value=None, test=estimator, verdict=stats.Verdict.INCONCLUSIVE,
        higher_is_better=first.higher_is_better, threshold=threshold, alpha=alpha)
    night = stats.with_evidence(night, stats.Evidence(est, se_shift, float(max(len(idx) - 1, 1))))
    names = list(ids) if ids is not None else [str(k) for k in range(len(comps))]
    return out, Shift(metric, len(idx), night, tau, int(kept.sum()),
                      tuple(names[idx[k]] for k in np.flatnonzero(~kept)), estimator=estimator)


def _majority(d: np.ndarray, se: np.ndarray, df: float) -> tuple[float, float, float, np.ndarray] | None:
    """(shift, its standard error, tau, which cells share it) from the cells' log ratios ``d``:
    the biweight location of the majority (majority_location), each cell on its standard
    error with the between-run noise tau. tau is estimated again from the cells the shift
    kept, until they stay the same: a group of cells that moved apart would otherwise widen
    it, and with it every cell's interval and the biweight's own cut-off. None when fewer
    than MIN_CELLS cells are kept or it has no standard error: the caller keeps the
    Hodges-Lehmann."""
    kept = np.ones(d.size, dtype=bool)
    m = float(np.median(d))
    tau, est_se = 0.0, math.nan
    for _ in range(5):
        tau = between_run_tau((d - m)[kept], se[kept], df)
        m, est_se, now = majority_location(d, np.sqrt(se ** 2 + tau ** 2), start=m)
        if int(now.sum()) < MIN_CELLS or not math.isfinite(est_se):
            return None
        if np.array_equal(now, kept):
            break
        kept = now
    return m, est_se, tau, kept
