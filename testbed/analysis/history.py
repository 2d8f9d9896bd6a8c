"""`testbed history`: each cell's metric over the runs in the results index, with change points.

A series is one cell (id and definition hash), one metric, one comparable environment
(accelerator class and CPU model) and one host (its machine id, testbed.host.hostid), in run
order; runs whose environments cannot be compared split a series instead of joining it, so a
TCG night never sits between two KVM nights, and two hosts writing to one store never make
one series (a change point would be one host's fault read as a regression). ``by="class"``
pools the hosts of one host class instead; a run without a class stays in its host's series.
Each point is the mean of the run's ok, non-warmup samples of the cell, divided by the night's
shift shared by the host's cells where one is taken out (judge_all, testbed.analysis.history_shift);
those shifts are a series of their own (cell id SHARED).

Change points come from ruptures' PELT search (Killick et al. 2012), not from a detector of
our own. Apache Otava (e-divisive) was the first choice, but its 0.8.0 wheel pins
numpy==2.2.0.* and scipy<1.17 (this project pins numpy 2.4.6 and scipy 1.17.1) and pulls in
google-cloud-bigquery and slack-sdk; ruptures needs only numpy and scipy. CSIT's jumpavg
was replayed too (docs/gate-statistics.md) and found fewer steps.

The search runs on the logs of the points (a night's noise is relative; a heavy upper tail
is tamed). Its noise is the run-to-run noise the series itself shows, not only the
within-run spread: the points' own variance pooled over the series (many degrees of
freedom) plus what the nights add beyond it, from the robust spread (Tukey's biweight)
about a first pass's segments. A change point counts when its step is significant
(one-sided t at STEP_ALPHA, spent over the three nights that first look at it and
weighted by the series' power to see a threshold-sized step, on that noise and the
segments' lengths) and at least
STEP_FRACTION of ``threshold``, so a lasting step of the threshold's size is found although
its estimate lands below the threshold half the time (at EARLY_ALPHA when fewer than
MIN_BEFORE runs precede it); it fails the job once CONFIRM runs bear it out.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from testbed.analysis import costs, history_shift, hopgate, stats
from testbed.analysis.compare import LATENCY_METRICS
from testbed.records.records import CellRecord, RunRecord
from testbed.records.store.schema import MAIN_METRICS

#: metrics where lower is better; every other gated metric is higher-is-better
#: ``--metric hops``: a series per hop figure of each traced cell (testbed.analysis.hopgate)
HOPS = "hops"
LOWER_IS_BETTER = frozenset((*LATENCY_METRICS, "latency_p50_us", "latency_p90_us", *costs.LOWER_IS_BETTER))
MIN_POINTS = 4


#: a regression is reported while the first run that could confirm it (CONFIRM runs from
#: its change point on) lies within the newest WINDOW runs: a lasting step fails the job for
#: a week from the night it could first be seen
WINDOW = 7
#: runs from the change point on that must confirm it (the change point's run included):
#: five, so that a run of unlucky nights on a heavy-tailed cell is not a step (`testbed bench
#: gate`'s history replay: with three, unchanged 30-night series at 10 % lognormal noise
#: and 2 % drift alarmed in 4-5 of 200; with five, STEP_ALPHA, the pooled noise and
#: MIN_BEFORE, 3-5 of 400, while a lasting -5 % step at 2.4 % nightly noise is found within
#: 7 nights in 179-183 of 200: docs/gate-statistics.md)
CONFIRM = 5
#: what a bisect range names: the environment keys that differ between last good and first bad
BISECT_KEYS = ("kernel", "host", "machine_id", "versions", "image")


@dataclass(frozen=True)
class Point:
    run_id: str
    started: str
    value: float            # mean of the run's ok samples
    n: int                  # ok samples behind it
    spread: float | None = None     # their standard deviation (None below 2 samples)
    #: (key, value) of the run's environment that a bisect range names (BISECT_KEYS)
    environment: tuple[tuple[str, str], ...] = ()
    #: a cost series' points: (role, mean ns per packet) of the run's samples
    roles: tuple[tuple[str, float], ...] = ()
    #: the night's shift shared by the host's cells, taken out of ``value`` and ``spread``
    #: (testbed.analysis.history_shift; 1.0 when none was estimated): measured = value x shared
    shared: float = 1.0

    @property
    def measured(self) -> float:
        """The run's mean as measured, before the night's shared shift was taken out."""
        return self.value * self.shared

    @property
    def stderr(self) -> float | None:
        """The standard error of the point's mean (None without a spread)."""
        return self.spread / math.sqrt(self.n) if self.spread is not None and self.n > 1 else None


@dataclass(frozen=True)
class ChangePoint:
    index: int              # first point of the new segment
    run_id: str             # the run where the change happened
    before: float           # mean of the segment before
    after: float            # mean of the segment from here on
    delta_pct: float
    regression: bool
    last_good: str = ""     # the run before the change: a bisect starts between the two
    #: (what, last good, first bad) of the environment between them
    bisect: tuple[tuple[str, str, str], ...] = ()
    #: a cost series: the role whose cost per packet moved most between the segments
    role: str = ""


@dataclass(frozen=True)
class Series:
    cell_id: str
    hash: str
    metric: str
    environment: str        # accelerator/comparable class and CPU model
    points: tuple[Point, ...]
    change_points: tuple[ChangePoint, ...]
    #: first bad runs of this cell's acknowledged changes (`testbed history --ack`)
    acked: tuple[str, ...] = ()
    #: the series of the nights' shared shift (cell id SHARED): the cells it was estimated from
    cells: tuple[str, ...] = ()

    def recent_regressions(self, window: int = WINDOW) -> tuple[ChangePoint, ...]:
        """Confirmed recent regressions not acknowledged: what fails the job."""
        return tuple(c for c in self.confirmed_recent(window) if c.run_id not in self.acked)

    def acknowledged(self, window: int = WINDOW) -> tuple[ChangePoint, ...]:
        """Confirmed recent regressions acknowledged with `testbed history --ack`."""
        return tuple(c for c in self.confirmed_recent(window) if c.run_id in self.acked)

    def confirmed_recent(self, window: int = WINDOW) -> tuple[ChangePoint, ...]:
        """Regressions that the runs from their change point on confirm (at least CONFIRM
        points in the new segment) and whose first confirmable run (the CONFIRM-th from the
        change point) lies within the newest ``window`` runs: a lasting step keeps failing
        the job for ``window`` nights from the night it could first be seen, not only then.

        Counted from the change point itself, as before, a step that chance low nights just
        before it pulled a few nights early was out of the window on the first night it was
        confirmed, and never failed the job (3 of 200 replayed -5 % steps at 2.4 % nightly
        noise): with seeds 7, 2, 11, 3 and 0, 927 of 1,000 such steps are now found within 7
        nights against 902, while unchanged heavy-tailed series alarm in 12 of 2,000 against
        9 (docs/gate-statistics.md)."""
        n = len(self.points)
        return tuple(c for c in self.change_points
                     if c.regression and n - window <= c.index + CONFIRM - 1 and c.index <= n - CONFIRM
                     and self.confirmed(c))

    def confirmed(self, c: ChangePoint) -> bool:
        """The runs from the change point to the next one bear it out: at least CONFIRM of
        them, the first (the first bad run a bisect starts from) and the newest (the step
        still holds tonight) on the new side of the midpoint between the segment means, and
        at most a third of them on the old side. PELT and the
        step's significance test already say the segments differ; this keeps a step that
        one outlying night made, or that tonight no longer shows, from failing the job, and
        lets a real step of the threshold's size through although one night in six of it
        lands beyond the midpoint at 2.4 % noise."""
        nxt = min((d.index for d in self.change_points if d.index > c.index), default=len(self.points))
        mid = (c.before + c.after) / 2
        side = [(p.value < mid) == (c.after < c.before) for p in self.points[c.index:nxt]]
        return len(side) >= CONFIRM and side[0] and side[-1] and 3 * side.count(False) <= len(side)

    @property
    def newest_regresses(self) -> bool:
        """A confirmed recent regression, not acknowledged (what fails the job)."""
        return bool(self.recent_regressions())

    @property
    def suspect(self) -> bool:
        """The newest point alone is worse than the segment before it by more than the
        threshold and three noise sigmas: a re-measure, not a regression (one night is not a
        lasting change)."""
        if len(self.points) < MIN_POINTS or self.newest_regresses:
            return False
        vals = np.array([p.value for p in self.points])
        start = max((c.index for c in self.change_points
                     if c.index < len(vals) - 1 and self.confirmed(c)), default=0)
        ref = vals[start:-1]
        if ref.size < 2:
            return False
        mean, sigma = float(ref.mean()), noise_sigma(ref)
        worse = (vals[-1] < mean) == (self.metric not in LOWER_IS_BETTER)
        return (worse and abs(vals[-1] - mean) > max(0.05 * abs(mean), 3 * sigma))


#: penalty per change, in sigma^2 ln(n), on the log scale (`testbed bench gate`'s history
#: replay tunes it with STEP_Z and STEP_FRACTION; docs/gate-statistics.md has the table)
PENALTY = 3.0
#: a change point counts only when its step is significant at this level (one-sided t on
#: the series' run-to-run noise over the two segments' lengths): PELT places steps, this
#: says whether one is more than the noise (0.0005 before the noise was pooled and
#: MIN_BEFORE held early nights back: at 0.001 the step is found in 179 of 200 against
#: 170, and heavy-tailed series alarm in 3 of 400)
STEP_ALPHA = 0.001
#: a change point with fewer runs than this before it is held to EARLY_ALPHA: on 400
#: unchanged heavy-tailed series the alarms that remained came from the first 10-13 nights
#: (a step test on ten nights' noise, looked at again every night). A large step early in
#: a series is still found (-15 % after 7 nights at 2 % noise); a -5 % one waits for more
#: nights, and meanwhile the nightly gate against BASE is what judges it.
MIN_BEFORE = 12
EARLY_ALPHA = 0.00001
#: ... and when the step is at least this share of the threshold: a lasting step of the
#: threshold's size (-5 %) must be found although its estimate lands below it half the
#: time, a drift of a fifth of it must not
STEP_FRACTION = 0.6

#: the nights a step is looked at before it is late for "found within a week": CONFIRM,
#: CONFIRM + 1 and CONFIRM + 2 runs after it. They spend STEP_ALPHA linearly (step_alpha): a
#: third of it at the first look, two thirds at the second, all of it from the third on.
#: Those looks share most of their runs, and each was a fresh chance of a false alarm at the
#: full level: on 2,000 unchanged 30-night series at 10 % lognormal noise with 2 % drift the
#: alarms fell from 21 to 13, and a lasting -5 % step at 2.4 % nightly noise was found within
#: 7 nights in 732 of 800 against 739 (docs/gate-statistics.md).
SPEND_LOOKS = 3


def step_alpha(after: int) -> float:
    """The level of a step test with ``after`` runs from the change point on (SPEND_LOOKS)."""
    return STEP_ALPHA * min(1.0, max(after - CONFIRM + 1, 1) / SPEND_LOOKS)


def power_weight(sigma: float, before: int, threshold: float, log: bool) -> float:
    """The share of the step test's level a series gets: its power to see a lasting step of
    the threshold's size at the last look that spends the level (SPEND_LOOKS), with
    ``before`` runs before the step, on the series' own noise ``sigma`` (levels weighted by
    power, as in Roeder and Wasserman 2009, never above the full level, never below
    EARLY_ALPHA).

    A quiet series keeps nearly all of STEP_ALPHA (at 2.4 % nightly noise and 20 nights
    before, 0.96 of it). A series too noisy for a threshold-sized step to show within a week
    would spend its full level on false alarms for little power; it is held to a smaller
    one. A step well beyond the threshold is still found there. On 3,000 unchanged 30-night
    series at 10 % lognormal samples with 2 % drift, 11 alarmed against 34 with the full
    level. The -5 % step at 2.4 % noise was found within 7 nights in 189, 174 and 154 of 200
    after 20, 15 and 12 nights, against 189, 175 and 156 (docs/gate-statistics.md)."""
    size = -math.log1p(-threshold) if log else threshold
    look = CONFIRM + SPEND_LOOKS - 1
    z = size / (sigma * math.sqrt(1.0 / max(before, 1) + 1.0 / look))
    return min(1.0, max(stats.norm_cdf(z - stats.norm_ppf(1.0 - STEP_ALPHA)), EARLY_ALPHA / STEP_ALPHA))


def noise_sigma(y: np.ndarray) -> float:
    """The series' between-run sigma from the median absolute successive difference,
    robust to the steps being looked for and to a heavy-tailed night: MAD(diff) / (sqrt 2 *
    0.6745), never below 0.1 % of the level (a perfectly flat series would otherwise make
    every wiggle a change)."""
    sigma = float(np.median(np.abs(np.diff(y)))) / (math.sqrt(2) * 0.6745) if y.size > 1 else 0.0
    return max(sigma, 1e-3 * float(np.mean(np.abs(y))) or 1e-9)


def robust_sigma(resid: np.ndarray, c: float = 9.0) -> float:
    """The spread of residuals about their segments' medians: Tukey's biweight midvariance
    (Mosteller and Tukey 1977; astropy's ``biweight_midvariance`` with the location given),
    whose efficiency at the normal is about 87 % against the MAD's 37 %, with the same
    bounded influence: a night beyond c MADs weighs nothing. On 25 nights the MAD's own
    noise made the step test's sigma swing enough to hide a real -5 % step or call a
    heavy-tailed night one; 0 when the MAD is (a flat series: the caller's floor holds)."""
    mad = float(np.median(np.abs(resid)))
    if mad == 0.0 or resid.size < 2:
        return 0.0
    u = resid / (c * mad)
    w = np.abs(u) < 1.0
    num = float(np.sum(resid[w] ** 2 * (1.0 - u[w] ** 2) ** 4))
    den = float(np.sum((1.0 - u[w] ** 2) * (1.0 - 5.0 * u[w] ** 2)))
    return math.sqrt(resid.size * num) / abs(den) if den else 1.4826 * mad


def _with_newest_split(y: np.ndarray, bounds: Sequence[int]) -> list[int]:
    """``bounds`` plus the split of the last segment, within the newest WINDOW runs and
    leaving CONFIRM after it, whose two-sample statistic is largest: the segments a step
    test there is judged on (a t-test's variance is the one about the two groups' means).
    Unchanged when the last segment has no room for such a split."""
    n, start = y.size, bounds[-2]
    lo, hi = max(start + CONFIRM, n - WINDOW), n - CONFIRM
    if lo > hi:
        return list(bounds)
    seg = y[start:]
    cs = np.cumsum(seg)
    best, at = -1.0, 0
    for j in range(lo - start, hi - start + 1):
        a, b = j, seg.size - j
        z = abs(cs[j - 1] / a - (cs[-1] - cs[j - 1]) / b) * math.sqrt(a * b / (a + b))
        if z > best:
            best, at = z, start + j
    return [*bounds[:-1], at, n]


def change_points(values: Sequence[float], *, higher_is_better: bool = True,
                  threshold: float = 0.05,
                  stderr: Sequence[float | None] = (),
                  counts: Sequence[int] = ()) -> list[tuple[int, float, float]]:
    """(index, level before, level after) of each change in ``values`` (ruptures PELT on
    the logs, where a night's noise is relative and a heavy upper tail is tamed; levels
    are geometric means).

    The noise is the run-to-run noise the series really shows: the points' own variance
    (``stderr``, each over its ``counts`` samples), pooled with the degrees of freedom of
    every night's samples, plus what the nights add beyond it (from the robust spread of
    the points about their segments). A change counts when its step is significant at
    step_alpha of the runs after it (one-sided t on that noise, with the sum's
    Satterthwaite degrees of freedom)
    and at least STEP_FRACTION of the threshold. Without counts, the between-run spread
    alone, floored by the points' median relative standard error."""
    import ruptures
    v = np.asarray(values, dtype=float)
    n = v.size
    if n < max(MIN_POINTS, 2 * CONFIRM):
        return []
    log = bool(np.all(v > 0))
    y = np.log(v) if log else v
    scale = 1.0 if log else float(np.mean(np.abs(v)))      # relative -> the series' units
    within = [(e / abs(x), k) for e, x, k in zip(stderr, v, list(counts) or [0] * n)
              if e is not None and math.isfinite(e) and x]
    # the floor without counts: the points' median relative standard error (on a short
    # series a few calm nights made the between-run estimate small)
    floor = float(np.median([r for r, _ in within])) * scale if within else 0.0
    # The points' own variance, pooled with the degrees of freedom of every night's samples
    # (about 100 on 25 nights of 5): the precise part of the run-to-run noise, where the
    # between-run spread has only the nights' count. On 200 stepped series this raised the
    # -5 % step's power from 161 to 170, since Student's t no longer pays for 25 nights'
    # degrees of freedom when the nights add nothing beyond their samples.
    df_w = sum(k - 1 for _, k in within if k > 1)
    w_var = sum((k - 1) * r * r for r, k in within if k > 1) / df_w * scale ** 2 if df_w else 0.0
    sigma = max(noise_sigma(y), floor)       # the first pass's noise
    # min_size=CONFIRM: a segment needs that many runs, so one or two outlying nights are
    # never a change (a lone one is "suspect" instead) and a change is confirmed by the runs
    # after it
    algo = ruptures.Pelt(model="l2", min_size=CONFIRM, jump=1).fit(y.reshape(-1, 1))
    bounds = [0, *algo.predict(pen=PENALTY * sigma ** 2 * math.log(n))]
    # Two passes: the successive differences give a first noise (robust to steps, but
    # inefficient: on 27 nights at 2.4 % it read 3-4 % often enough to hide a 5 % step);
    # the robust spread about the first pass's segments is the second, and the one the
    # step test uses.
    tau2, df_b = 0.0, max(n - len(bounds) + 1, 1)
    for _ in range(2):
        # the noise about the segments with the newest window's best split added: a step
        # there that the first pass missed would otherwise count as noise and hide itself
        # (the missed -5 % steps at 2.4 % nightly noise read a spread of 3-4 %; with the
        # split, 724 of 800 replayed steps found against 526 of 600: gate-statistics.md)
        nb = _with_newest_split(y, bounds)
        resid = np.concatenate([y[nb[k]:nb[k + 1]] - np.median(y[nb[k]:nb[k + 1]])
                                for k in range(len(nb) - 1)])
        df_b = max(n - len(nb) + 1, 1)
        between = robust_sigma(resid) * math.sqrt(n / df_b)
        if df_w:
            # what the nights add beyond their samples (drift, a busy neighbour): tau^2
            tau2 = max(between ** 2 - w_var, 0.0)
            sigma = max(math.sqrt(w_var + tau2), 1e-9)
        else:
            sigma = max(between, floor, 1e-9)
        bounds = [0, *algo.predict(pen=PENALTY * sigma ** 2 * math.log(n))]
    # Student's t with the noise's degrees of freedom: few on a short series without counts
    # (a few calm nights cannot make a normal one a step); with them, Satterthwaite's for
    # the pooled variance plus tau^2
    df = float(df_b) if not df_w else (w_var + tau2) ** 2 / (w_var ** 2 / df_w + tau2 ** 2 / df_b)
    early = float(stats.t_ppf(1.0 - EARLY_ALPHA, max(df, 1.0)))
    out = []
    for k in range(1, len(bounds) - 1):
        a, b = y[bounds[k - 1]:bounds[k]], y[bounds[k]:bounds[k + 1]]
        # spent by the nights since the change point (a step followed by another one is
        # old: its looks are long past)
        crit = float(stats.t_ppf(1.0 - step_alpha(n - bounds[k]) * power_weight(
            sigma, a.size, threshold if log else threshold * scale, log), max(df, 1.0)))
        step = float(np.mean(b) - np.mean(a))
        se = sigma * math.sqrt(1.0 / a.size + 1.0 / b.size)
        before = math.exp(float(np.mean(a))) if log else float(np.mean(a))
        after = math.exp(float(np.mean(b))) if log else float(np.mean(b))
        rel_step = abs(math.expm1(step)) if log else (abs(step) / abs(before) if before else 0.0)
        if rel_step >= STEP_FRACTION * threshold and abs(step) >= (crit if bounds[k] >= MIN_BEFORE else early) * se:
            out.append((bounds[k], before, after))
    return out


def bisect_fields(env: dict) -> tuple[tuple[str, str], ...]:
    """The environment keys a bisect range names, flattened (versions.qemu, image...)."""
    out = []
    for k in BISECT_KEYS:
        v = env.get(k)
        if isinstance(v, dict):
            if k == "image":
                out.append((k, str(v.get("digest") or v.get("name"))))
            else:
                out += [(f"{k}.{t}", str(x)) for t, x in sorted(v.items())]
        elif v is not None:
            out.append((k, str(v)))
    return tuple(out)


def env_difference(good: Point, bad: Point) -> tuple[tuple[str, str, str], ...]:
    g, b = dict(good.environment), dict(bad.environment)
    return tuple((k, g.get(k, "-"), b.get(k, "-")) for k in sorted(set(g) | set(b))
                 if g.get(k) != b.get(k))


#: what a series is kept apart by besides the environment: each host, or each host class
BY = ("host", "class")


def _env_key(run: object, env: dict, by: str = "host") -> str:
    r = run  # store RunRow
    base = f"{r.comparable_class or r.accelerator}/{r.cpu_model}"  # type: ignore[attr-defined]
    if by == "class" and env.get("host_class"):
        return f"{base} class {env['host_class']}"
    from testbed.host import hostid
    name = env.get("inventory_host") or env.get("host") or "?"
    key = hostid.host_key(env)
    return f"{base} host {name}" + (f" ({key[:12]})" if key != name else "")


def _primary(samples: Sequence[object], rec: RunRecord) -> str:
    return rec.primary_metric(samples[0].profile)  # type: ignore[attr-defined]


def series(store: object, *, cell: str | None = None, metric: str | None = None,
           threshold: float = 0.05, by: str = "host") -> list[Series]:
    """Every series in the index ``store`` (testbed.records.store.Store), with its change points;
    ``by``: one series per host (default) or per host class (BY)."""
    points: dict[tuple[str, str, str, str], list[Point]] = defaultdict(list)
    for run in store.runs():  # type: ignore[attr-defined]
        # the index keeps the run's topology; read it as the run record would
        rec = RunRecord.from_dict({"run_id": run.run_id, "topology": json.loads(run.topology)})
        by_cell: dict[str, list] = defaultdict(list)
        for s in store.samples(run.run_id):  # type: ignore[attr-defined]
            # every cell, also under ``cell``: the nights' shared shift is the cells' together
            if s.ok:
                by_cell[s.cell_id].append(s)
        try:
            env_d = json.loads(run.environment or "{}")
        except ValueError:
            env_d = {}
        env = _env_key(run, env_d if isinstance(env_d, dict) else {}, by)
        env_t = bisect_fields(env_d)
        for cid, samples in by_cell.items():
            s0 = samples[0]
            # the definition hash, recomputed from the run's topology as for an upgraded
            # format 1 run (the index keeps no hash column)
            h = rec.cell_hash(CellRecord(attachment=s0.attachment, backend=s0.backend,
                                         mtu=s0.mtu, connections=s0.connections,
                                         profile=s0.profile, tool=s0.tool,
                                         present=frozenset({"attachment", "backend", "mtu",
                                                            "connections", "profile", "tool"})))
            # by default each cell's primary metric and its cost per packet (when recorded)
            for m in (hopgate.names(s.metric_dict() for s in samples) if metric == HOPS
                      else [metric] if metric else [_primary(samples, rec), *costs.DECIDING]):
                if m in MAIN_METRICS:
                    vals = [getattr(s, m) for s in samples if getattr(s, m) is not None]
                else:
                    vals = [s.metric_dict()[m] for s in samples if m in s.metric_dict()]
                if vals:
                    points[(cid, h, m, env)].append(Point(
                        run.run_id, run.started or "", float(np.mean(vals)), len(vals),
                        float(np.std(vals, ddof=1)) if len(vals) > 1 else None, env_t,
                        costs.role_means([s.metric_dict() for s in samples]) if m in costs.DECIDING else ()))
    return judge_all(points, threshold, only=cell)


#: the cell id of a series of the nights' shift shared by a host's cells (one per metric and
#: environment); `testbed history --ack shared@RUN` acknowledges a step of it
SHARED = "shared"

Key = tuple[str, str, str, str]         # cell id, definition hash, metric, environment


def judge_all(points: dict[Key, list[Point]], threshold: float = 0.05, only: str | None = None) -> list[Series]:
    """Every cell's series judged after the nights' shared shift is taken out (where a night
    has enough comparable cells: testbed.analysis.history_shift), then the series of that
    shift per metric and environment, judged like a cell: a lasting step there is every
    cell slower together, one finding rather than one regression per cell. ``only``: that
    cell's series alone (the shift still estimated from every cell), or SHARED's."""
    judged, shared = take_out_shared(points)
    if only is not None:
        judged = {k: v for k, v in judged.items() if k[0] == only}
        shared = shared if only == SHARED else {}
    return ([judge(cid, h, m, env, pts, threshold) for (cid, h, m, env), pts in sorted(judged.items())]
            + [dataclasses.replace(judge(SHARED, "shared", m, env, pts, threshold), cells=cells)
               for (m, env), (pts, cells) in sorted(shared.items())])


def take_out_shared(points: dict[Key, list[Point]]
                    ) -> tuple[dict[Key, list[Point]], dict[tuple[str, str], tuple[list[Point], tuple[str, ...]]]]:
    """Each series' points divided by its night's shared shift (Point.shared records it), and
    per (metric, environment) with a shift the points of that shift (its factor as the
    value, the number of cells as the count) and the cells it was estimated from."""
    groups: dict[tuple[str, str], list[Key]] = defaultdict(list)
    for key in points:
        groups[(key[2], key[3])].append(key)
    out = dict(points)
    shared: dict[tuple[str, str], tuple[list[Point], tuple[str, ...]]] = {}
    for (m, env), keys in groups.items():
        found = history_shift.take_out({f"{k[0]}[{k[1]}]": {p.run_id: p.value for p in points[k]}
                                        for k in keys})
        if found is None:
            continue
        shifts = found.nights
        by_run: dict[str, list[Point]] = defaultdict(list)
        for k in keys:
            adjusted, own = [], found.cells.get(f"{k[0]}[{k[1]}]", {})
            for p in points[k]:
                f = math.exp(own.get(p.run_id, 0.0))
                # the shift is estimated: its noise is the point's now, beside the samples'
                # (else only the between-run spread would carry it, and with little weight)
                v = found.noise.get(p.run_id, 0.0) if p.run_id in own else 0.0
                spread = (None if p.spread is None
                          else math.sqrt(p.spread ** 2 + p.n * v * p.value ** 2) / f)
                adjusted.append(dataclasses.replace(p, value=p.value / f, spread=spread, shared=f))
                if p.run_id in shifts:
                    by_run[p.run_id].append(p)
            out[k] = adjusted
        # in the store's run order (testbed.records.store.Store.runs); no spread: the shift's
        # noise from night to night is the drift itself, which only the series shows (taking
        # the cells' own spreads as its within-run part, unchanged hosts' shifts alarmed in 4
        # of 100 series against 1 without)
        pts = [Point(run_id, ps[0].started, math.exp(shifts[run_id]), len(ps), None, ps[0].environment)
               for run_id, ps in sorted(by_run.items(), key=lambda kv: (kv[1][0].started, kv[0]))]
        shared[(m, env)] = (pts, tuple(sorted({k[0] for k in keys})))
    return out, shared


def judge(cell_id: str, h: str, metric: str, env: str, pts: Sequence[Point],
          threshold: float = 0.05) -> Series:
    """A series of points with its change points (each with its bisect range)."""
    higher = metric not in LOWER_IS_BETTER and not metric.startswith(hopgate.PREFIXES)
    found = change_points([p.value for p in pts], higher_is_better=higher, threshold=threshold,
                          stderr=[p.stderr for p in pts], counts=[p.n for p in pts])
    bounds = [0, *(i for i, _, _ in found), len(pts)]
    cps = tuple(
        ChangePoint(i, pts[i].run_id, b, a, (a - b) / abs(b) * 100,
                    regression=(a < b) == higher, last_good=pts[i - 1].run_id,
                    bisect=env_difference(pts[i - 1], pts[i]),
                    role=costs.segment_role([p.roles for p in pts[bounds[k]:i]],
                                            [p.roles for p in pts[i:bounds[k + 2]]]))
        for k, (i, b, a) in enumerate(found))
    return Series(cell_id, h, metric, env, tuple(pts), cps)


def render_text(all_series: Sequence[Series]) -> str:
    lines = []
    for s in all_series:
        what = (f"the nights' shift shared by {len(s.cells)} cells" if s.cells else f"[{s.hash}]")
        lines.append(f"{s.cell_id} {what} {s.metric} on {s.environment}: "
                     f"{len(s.points)} runs, {len(s.change_points)} change point(s)")
        cps = {c.index: c for c in s.change_points}
        for i, p in enumerate(s.points):
            mark = ""
            if i in cps:
                c = cps[i]
                mark = (f"  <- CHANGE {c.delta_pct:+.1f}% ({c.before:.4g} -> {c.after:.4g})"
                        f"{' REGRESSION' if c.regression else ''}"
                        f"{'' if s.confirmed(c) else ' (unconfirmed)'}" + (f": {c.role}" if c.role else ""))
            sd = "" if p.spread is None else f" sd={p.spread:.3g}"
            night = (f" (measured {p.measured:.4g}, the night's shared shift {p.shared - 1:+.1%} "
                     f"taken out)" if p.shared != 1.0 else "")
            lines.append(f"  {p.run_id}  {p.value:12.4g}  n={p.n}{sd}{night}{mark}")
    for s in all_series:
        for c in s.recent_regressions():
            diff = "; ".join(f"{k} {g} -> {b}" for k, g, b in c.bisect) or "no environment difference"
            every = (f" (every cell together, {len(s.cells)} cells: the host, or the whole build?)"
                     if s.cells else "")
            lines.append(f"REGRESSION {s.cell_id} {s.metric} {c.delta_pct:+.1f}%{every}"
                         + (f" ({c.role})" if c.role else "") + f": last good "
                         f"{c.last_good}, first bad {c.run_id} ({diff})")
        for c in s.acknowledged():
            lines.append(f"acknowledged {s.cell_id} {s.metric} {c.delta_pct:+.1f}% at {c.run_id} "
                         f"(testbed history --ack): not failing the job")
        if s.suspect:
            lines.append(f"SUSPECT {s.cell_id} {s.metric}: newest run {s.points[-1].run_id} "
                         f"alone is worse; measure it again (not a regression yet)")
    if not all_series:
        lines.append("no series (index some runs with `testbed index`)")
    return "\n".join(lines) + "\n"


ACKS = "history-acks.jsonl"


#: an acknowledgement's cell and run ids: what the testbed writes (cell ids, run ids)
ACK_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:+-]{0,199}")
#: the acknowledgement file is read whole: at most this many bytes
MAX_ACKS_BYTES = 16 << 20


def acknowledge(root: object, spec: str, by: str | None, why: str | None) -> int:
    """Store an acknowledgement (who, when, why) of CELL@RUN, a known change whose first bad
    run is RUN; it no longer fails `testbed history`. Bad input: UserFileError (exit 2),
    before the file is touched: ids of the testbed's own form, one printable line each for
    who and why, and an acknowledgement file that is a regular file this testbed can read."""
    import os
    from pathlib import Path

    from testbed.host.safeio import UserFileError
    from testbed.records import results
    cell, sep, run = spec.partition("@")
    if not sep or not cell or not run:
        raise UserFileError("--ack", f"{spec!r}: expected CELL@RUN (cell id @ first bad run id)")
    for what, v in (("cell id", cell), ("run id", run)):
        if not ACK_ID.fullmatch(v):
            raise UserFileError("--ack", f"{spec!r}: {what} {v[:60]!r} is not one the testbed writes "
                                         f"(letters, digits and _ . : + -)")
    if not by or not why:
        raise UserFileError("--ack", "needs --who NAME and --why TEXT: an acknowledgement says who and why")
    for arg, v in (("--who", by), ("--why", why)):
        if not v.strip() or not v.isprintable() or len(v) > 1000:
            raise UserFileError(arg, f"{v[:40]!r}: one printable line of at most 1000 characters")
    path = Path(str(root)) / ACKS
    data = _acks_data(path)
    _parse_acks(path, data)     # a file that cannot be read is refused, not appended to
    if data and not data.endswith(b"\n"):
        # a writer killed mid-line: appended to, the new line would be glued to the torn one
        # and lost, and the file unreadable from then on
        raise UserFileError(path, "its last line is torn (a writer stopped mid-line): remove that line, "
                                  "then acknowledge again")
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps({"cell": cell, "run": run, "by": by, "why": why, "when": results.now()}) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    with os.fdopen(fd, "a") as f:
        f.write(line)
    print(f"acknowledged {cell} change at {run} by {by}: {why}")
    return 0


def read_acks(root: object) -> list[dict]:
    """The acknowledgements of ``root``'s history-acks.jsonl: a regular file of at most
    MAX_ACKS_BYTES, each line an object with a cell and a run id (a line that is not is
    refused with its number; a torn last line, the mark of a writer killed mid-line, is left
    out)."""
    from pathlib import Path
    path = Path(str(root)) / ACKS
    return _parse_acks(path, _acks_data(path))


def _acks_data(path: object) -> bytes:
    """The acknowledgement file's bytes, read once (b"" when there is none)."""
    from testbed.host import safeio
    if not os.path.lexists(str(path)):
        return b""
    if os.path.islink(str(path)):
        raise safeio.UserFileError(path, "is a symbolic link; the acknowledgement file is a regular file")
    return safeio.read_regular(path, MAX_ACKS_BYTES)


def _parse_acks(path: object, data: bytes) -> list[dict]:
    from testbed.host import safeio
    out = []
    for n, a in safeio.json_lines(data, str(path)):
        if not isinstance(a, dict) or not all(isinstance(a.get(k), str) and ACK_ID.fullmatch(a[k])
                                              for k in ("cell", "run")):
            raise safeio.UserFileError(f"{path}:{n}", "not an acknowledgement (an object with a cell and "
                                                      "a run id)")
        out.append(a)
    return out


def with_acks(found: Sequence[Series], acks: Sequence[dict]) -> list[Series]:
    by_cell: dict[str, set[str]] = defaultdict(set)
    for a in acks:
        by_cell[str(a.get("cell"))].add(str(a.get("run")))
    return [dataclasses.replace(s, acked=tuple(sorted(by_cell.get(s.cell_id, ())))) for s in found]
