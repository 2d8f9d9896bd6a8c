"""Repetitions, stopping rule, confidence intervals, significance and efficiency ratios.

Everything here is pure: numbers in, frozen records out. The measuring code decides what a
sample is; this module only decides what the samples say.

Missing or undefined quantities are ``None``, never ``0``, ``inf`` or ``NaN``: a result file
or a nightly gate must not be able to mistake "could not be computed" for a measurement.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

import numpy as np

from testbed.lazy import Lazy
from testbed.topology.model import Repetitions

# scipy is imported at the first test or interval: `testbed compare` and `capacity` refuse a
# bad argument before that (the import takes ~0.5 s)
sps: Any = Lazy("scipy.stats")
spx: Any = Lazy("scipy.special")

T = TypeVar("T")

#: significance tests that :func:`compare` knows, by the name recorded in a Comparison
TESTS = ("welch", "mannwhitney")


# --------------------------------------------------------------------------- summaries

@dataclass(frozen=True)
class Summary:
    """Descriptive statistics of one cell's samples.

    ``stddev``, ``rsd``, ``ci_low`` and ``ci_high`` are ``None`` when they are undefined
    (fewer than two samples; ``rsd`` also when the mean is 0), so that a single sample never
    reads as "zero spread".
    """

    n: int
    mean: float
    median: float
    stddev: float | None        # sample standard deviation (ddof=1)
    rsd: float | None           # stddev / |mean|
    ci_low: float | None        # Student-t interval for the mean
    ci_high: float | None
    min: float
    max: float
    confidence: float = 0.95


def _as_array(values: Sequence[float], what: str = "values") -> np.ndarray:
    arr = np.asarray(values, dtype=float)
    if arr.ndim != 1:
        raise ValueError(f"{what} must be a flat sequence of numbers, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{what} is empty; nothing to summarize")
    if not np.all(np.isfinite(arr)):
        # A NaN or inf sample is a parser or collector bug upstream; averaging it in would
        # hide the bug behind a NaN mean.
        raise ValueError(f"{what} contains non-finite samples: {arr.tolist()}")
    return arr


def _is_constant(arr: np.ndarray) -> bool:
    # max == min is exact; np.var of e.g. [0.1, 0.1, 0.1] can come out as 1e-33, not 0.
    return bool(arr.max() == arr.min())


@functools.lru_cache(maxsize=256)
def _t_quantiles(confidence: float, df: int) -> tuple[float, float]:
    """The two quantiles of Student's t that bound a ``confidence`` interval, as
    scipy.stats.t.interval takes them: computed once per (confidence, df), not per cell."""
    lo, hi = sps.t.ppf([(1.0 - confidence) / 2.0, (1.0 + confidence) / 2.0], df)
    return float(lo), float(hi)


def summarize(values: Sequence[float], confidence: float = 0.95) -> Summary:
    """Summarize samples; raises ValueError on an empty or non-finite sequence."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    arr = _as_array(values)
    n = int(arr.size)
    mean = float(np.mean(arr))
    stddev = rsd = ci_low = ci_high = None
    if n >= 2:
        stddev = 0.0 if _is_constant(arr) else float(np.std(arr, ddof=1))
        # |mean| so that rsd stays a non-negative spread measure even for signed data.
        rsd = stddev / abs(mean) if mean != 0.0 else None
        if stddev == 0.0:
            # scipy returns (nan, nan) for scale=0; the interval of a constant is a point.
            ci_low = ci_high = mean
        else:
            # t.interval(confidence, n - 1, loc=mean, scale=sem), with the quantiles cached
            q_lo, q_hi = _t_quantiles(confidence, n - 1)
            sem = stddev / np.sqrt(n)
            ci_low, ci_high = float(mean + sem * q_lo), float(mean + sem * q_hi)
    return Summary(n=n, mean=mean, median=float(np.median(arr)), stddev=stddev, rsd=rsd,
                   ci_low=ci_low, ci_high=ci_high, min=float(arr.min()),
                   max=float(arr.max()), confidence=confidence)


# --------------------------------------------------------------------------- stopping rule

@dataclass(frozen=True)
class Decision:
    more: bool          # take another sample
    converged: bool     # rsd was computed and met the target
    reason: str


@dataclass(frozen=True)
class StoppingRule:
    """When to stop repeating a cell.

    ``decide`` expects the *measured* samples only: the caller runs and discards the
    ``repetitions.warmup`` samples itself, so they never count towards ``min_samples`` and
    never widen the spread.

    Stop, converged, once ``n >= min_samples`` and ``rsd <= rsd_target``. Otherwise stop at
    ``max_samples``, not converged. ``converged`` is True only when the rsd was actually
    computed and met: with ``rsd_target == 0`` (rule disabled, a fixed sample count) or a
    mean of 0 it is always False, and ``reason`` says why. The rsd needs two samples, so
    ``min_samples == 1`` still takes a second sample before it can stop early.
    """

    repetitions: Repetitions

    def __post_init__(self) -> None:
        r = self.repetitions
        if r.min_samples < 1:
            raise ValueError(f"min_samples must be >= 1, got {r.min_samples}")
        if r.max_samples < r.min_samples:
            raise ValueError(f"max_samples ({r.max_samples}) < min_samples ({r.min_samples})")
        if r.rsd_target < 0:
            raise ValueError(f"rsd_target must be >= 0 (0 disables it), got {r.rsd_target}")
        if r.warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {r.warmup}")

    def decide(self, values: Sequence[float]) -> Decision:
        r = self.repetitions
        n = len(values)
        if n < r.min_samples:
            return Decision(more=True, converged=False,
                            reason=f"{n} of at least {r.min_samples} samples")
        rsd = summarize(values).rsd if n >= 2 else None
        met = r.rsd_target > 0 and rsd is not None and rsd <= r.rsd_target
        if met:
            return Decision(more=False, converged=True,
                            reason=f"rsd {rsd:.4f} <= target {r.rsd_target} after {n} samples")
        if n >= r.max_samples:
            if r.rsd_target == 0:
                why = "rsd rule disabled"
            elif rsd is None:
                why = "rsd undefined (fewer than 2 samples or mean 0)"
            else:
                why = f"rsd {rsd:.4f} > target {r.rsd_target}"
            return Decision(more=False, converged=False,
                            reason=f"reached max_samples={r.max_samples}; {why}")
        return Decision(more=True, converged=False,
                        reason=("rsd rule disabled" if r.rsd_target == 0 else
                                "rsd undefined" if rsd is None else
                                f"rsd {rsd:.4f} > target {r.rsd_target}")
                        + f"; {n} of at most {r.max_samples} samples")


# --------------------------------------------------------------------------- comparison

#: significance tests that :func:`compare` knows, by the name recorded in a Comparison;
#: "auto" chooses per metric (:func:`choose_test`)
TESTS = ("auto", "welch", "permutation", "bootstrap", "mannwhitney")
#: fewer ok samples than this on either side: no verdict, INSUFFICIENT
MIN_SAMPLES = 5
#: false-discovery rate for Benjamini-Hochberg across one comparison's tests
FDR_Q = 0.05
#: resamples for the permutation test (exact when the distinct splits are fewer) and bootstrap
RESAMPLES = 9999


class Verdict(StrEnum):
    IMPROVED = "improved"
    REGRESSED = "regressed"
    UNCHANGED = "unchanged"
    #: the change is beyond the threshold but the samples cannot tell it from noise
    #: (adjusted p >= alpha), or the relative change is undefined (base mean 0): rerun
    INCONCLUSIVE = "inconclusive"
    #: too few samples on a side to carry a verdict (fewer than ``min_samples``)
    INSUFFICIENT = "insufficient"
    #: credibly no worse than the threshold (the one-sided half of the equivalence test),
    #: but not shown within it on the better side: passes a regression gate
    NOT_WORSE = "not-worse"


def t_ppf(p: float, df: float) -> float:
    """Student's t quantile: scipy.special's, which is what scipy.stats.t.ppf calls after
    a millisecond of argument checks per scalar (a nightly of 200 cells asks thousands)."""
    return float(spx.stdtrit(df, p))


def t_cdf(x: float, df: float) -> float:
    return float(spx.stdtr(df, x))


def norm_cdf(x: float) -> float:
    return float(spx.ndtr(x))


def norm_ppf(p: float) -> float:
    return float(spx.ndtri(p))


@dataclass(frozen=True)
class Evidence:
    """A change on the log scale, what every verdict is decided on: ``d`` = log(NEW / BASE)
    (the difference of mean logs, or of the logs of the means), its standard error ``se``
    and degrees of freedom ``df``. Relative noise is alike on this scale for cells of any
    magnitude, and a change and its inverse are symmetric."""

    d: float
    se: float
    df: float

    def p_two_sided(self) -> float:
        """The two-sided p of d = 0 (1 for no change and no spread, 0 for a change without)."""
        if self.se <= 0.0:
            return 1.0 if self.d == 0.0 else 0.0
        return 2.0 * t_cdf(-abs(self.d) / self.se, self.df)

    def interval(self, alpha: float) -> tuple[float, float]:
        """The (1 - 2 alpha) interval of d (the two one-sided tests' interval)."""
        half = t_ppf(1.0 - alpha, self.df) * self.se if self.se > 0 else 0.0
        return self.d - half, self.d + half


@dataclass(frozen=True)
class Comparison:
    """A new build's samples against a baseline's, for one cell and one metric."""

    base: Summary
    new: Summary
    delta: float                # new.mean - base.mean, in the metric's unit
    delta_rel: float | None     # delta / |base.mean|; what ``threshold`` is compared with
    delta_pct: float | None     # delta_rel * 100, for people
    p_value: float | None       # None when no test could be run
    test: str | None            # the test that produced p_value; None when none ran
    verdict: Verdict
    higher_is_better: bool
    threshold: float
    alpha: float
    note: str = ""
    #: p after Benjamini-Hochberg across the comparison's family (None: not adjusted)
    p_adjusted: float | None = None
    #: the metric's resolution (1.0 for integer-valued samples), None when continuous
    quantum: float | None = None
    #: bootstrap test only: 95 % interval of new.mean / base.mean
    ratio_ci: tuple[float, float] | None = None
    #: why this test was chosen; the start of ``note`` whenever the verdict is taken again
    test_note: str = ""
    #: the log-scale figures :func:`moderate` needs (Welch comparisons of positive samples)
    log_spread: LogSpread | None = None
    #: (1 - 2 alpha) interval of the relative change (the two one-sided tests' interval):
    #: UNCHANGED needs all of it within +-threshold
    change_ci: tuple[float, float] | None = None
    #: the smallest relative change this cell could detect at its noise and n (two-sided
    #: alpha, 80 % power); None when the spread is undefined
    mdc: float | None = None
    #: the change on the log scale as decided: after the night's shared shift when one was
    #: taken out (testbed.analysis.shift), its uncertainty and the between-run noise added
    evidence: Evidence | None = None
    #: the night's shared shift taken out of this comparison (log scale), None when none
    shift: float | None = None
    #: one-sided p that the change is worse than the threshold (H0: no worse than it), and
    #: that it is better than the threshold; REGRESSED / IMPROVED need them below the
    #: family's Benjamini-Hochberg level (``p_adjusted`` is p_worse's adjusted value)
    p_worse: float | None = None
    p_better: float | None = None
    p_better_adjusted: float | None = None


#: power at which :attr:`Comparison.mdc` is stated
MDC_POWER = 0.80


def interval_and_mdc(diff: float, se: float, df: float, alpha: float, *,
                     log: bool = False, base_mean: float = 1.0) -> tuple[tuple[float, float], float]:
    """The (1 - 2 alpha) interval of a relative change and its minimum detectable change,
    from a difference ``diff`` with standard error ``se`` on ``df`` degrees of freedom: of
    mean logs when ``log`` (the interval is exp(.) - 1), else of means (divided by
    |base_mean|)."""
    half = t_ppf(1.0 - alpha, df) * se
    mdc = (t_ppf(1.0 - alpha / 2, df) + t_ppf(MDC_POWER, df)) * se
    if log:
        return (math.expm1(diff - half), math.expm1(diff + half)), -math.expm1(-mdc)
    b = abs(base_mean)
    return ((diff - half) / b, (diff + half) / b), mdc / b


def welch_interval(sb: Summary, sn: Summary, alpha: float) -> tuple[tuple[float, float] | None, float | None]:
    if sb.stddev is None or sn.stddev is None or sb.mean == 0.0:
        return None, None
    vb, vn = sb.stddev ** 2 / sb.n, sn.stddev ** 2 / sn.n
    se = math.sqrt(vb + vn)
    d = sn.mean - sb.mean
    if se == 0.0:
        return (d / abs(sb.mean), d / abs(sb.mean)), 0.0
    df = (vb + vn) ** 2 / ((vb ** 2 / (sb.n - 1) if vb else 0.0) + (vn ** 2 / (sn.n - 1) if vn else 0.0))
    return interval_and_mdc(d, se, df, alpha, base_mean=sb.mean)


@dataclass(frozen=True)
class LogSpread:
    """One comparison on the log scale, where noise is relative and so comparable across
    cells of different magnitude: the difference of mean logs, the pooled variance of the
    logs with its degrees of freedom, and sqrt(1/n1 + 1/n2)."""

    diff: float
    s2: float
    df: int
    scale: float


def rounding_variance(x: np.ndarray, quantum: float) -> float:
    """The log variance that rounding to ``quantum`` adds at the level of ``x``: quantum^2 /
    12 (Sheppard) over the squared mean, the floor of a quantised side's log variance."""
    return quantum ** 2 / 12.0 / float(np.mean(x)) ** 2


def log_spread(b: np.ndarray, nw: np.ndarray, spread_from: int | None = None,
               quantum: float | None = None) -> LogSpread | None:
    """None when a sample is not positive (no log) or the pooled log variance is 0.

    ``spread_from``: estimate the variance from each side's first that many samples only.
    An adaptive stopping rule (stop once the rsd is small) stops sides that happen to look
    tight, so the variance of all samples is biased low and the test too eager (about 1.3
    times its nominal rate at 3 % noise, min 5, max 10, rsd 3 %); the first ``min_samples``
    are taken whatever the rule says, so their variance is not. The difference of means
    still uses every sample.

    ``quantum``: the samples' resolution (1 us for netperf's integer percentiles). Rounding
    to it adds quantum^2 / 12 of variance (Sheppard) that five tied samples do not show: the
    log variance is at least that over the squared level, so a tie is never read as a
    noiseless measurement."""
    if b.min() <= 0 or nw.min() <= 0:
        return None
    lb, ln = np.log(b), np.log(nw)
    vb, vn = (lb, ln) if spread_from is None else (lb[:spread_from], ln[:spread_from])
    df = vb.size + vn.size - 2
    if df < 1:
        return None
    s2 = float((np.sum((vb - vb.mean()) ** 2) + np.sum((vn - vn.mean()) ** 2)) / df)
    if quantum:
        s2 = max(s2, rounding_variance(np.concatenate([b, nw]), quantum))
    if not s2 > 0.0:
        return None
    return LogSpread(float(ln.mean() - lb.mean()), s2, int(df),
                     math.sqrt(1.0 / lb.size + 1.0 / ln.size))


def log_evidence(b: np.ndarray, nw: np.ndarray, spread_from: int | None = None,
                 quantum: float | None = None) -> Evidence | None:
    """The change on the log scale with its own (unmoderated) standard error: Welch's t on
    log samples (unequal variances, Welch-Satterthwaite degrees of freedom), each side's
    log variance floored by its resolution (:func:`log_spread`). For samples that are not
    all positive, the delta method on the means (log(mean NEW / mean BASE)); None when a
    mean is not positive (no relative change) or a side has one sample."""
    if b.size < 2 or nw.size < 2:
        return None
    if b.min() > 0 and nw.min() > 0:
        lb, ln = np.log(b), np.log(nw)
        d = float(ln.mean() - lb.mean())
        xb, xn = (lb, ln) if spread_from is None else (lb[:spread_from], ln[:spread_from])
        vb, vn = float(np.var(xb, ddof=1)), float(np.var(xn, ddof=1))
        if quantum:
            vb, vn = max(vb, rounding_variance(b, quantum)), max(vn, rounding_variance(nw, quantum))
        nb_, nn_ = xb.size, xn.size
    else:
        mb, mn = float(np.mean(b)), float(np.mean(nw))
        if mb <= 0 or mn <= 0:
            return None
        d = math.log(mn / mb)
        vb, vn = float(np.var(b, ddof=1)) / mb ** 2, float(np.var(nw, ddof=1)) / mn ** 2
        nb_, nn_ = b.size, nw.size
    ub, un = vb / b.size, vn / nw.size
    se = math.sqrt(ub + un)
    if se == 0.0:
        return Evidence(d, 0.0, float(b.size + nw.size - 2))
    df = (ub + un) ** 2 / ((ub ** 2 / (nb_ - 1) if ub else 0.0) + (un ** 2 / (nn_ - 1) if un else 0.0))
    return Evidence(d, se, float(df))


#: share of each side trimmed from either end by Yuen's test (a side with a hiccup, see
#: HICCUP): one sample of ten, so five samples a side are never trimmed
TRIM = 0.1


#: a sample this many robust standard deviations (1.4826 MAD of the logs) from its side's
#: median is a hiccup (a stall, a scheduler delay), not the noise. Simulated sides of ten
#: samples have one that far in 0.2 % of normal sides (the MAD of ten is itself noisy: at
#: 5, 3.6 %) and 3 % of Student's t with 3 degrees of freedom; a real p99 hiccup of one
#: quiet night (335 us among 65-99 us) is 38 robust SDs out
HICCUP = 10.0


def hiccup(arr: np.ndarray, quantum: float | None = None) -> bool:
    """Whether a side of at least 1 / TRIM samples has a hiccup (see HICCUP). Shapiro-Wilk
    is not the trigger: integer percentiles with ties fail it at any spread, and trimming
    them costs a normal cell the power its equivalence test needs (on `testbed bench gate`,
    an unchanged night in six stayed undecided)."""
    if arr.size * TRIM < 1 or arr.min() <= 0:
        return False
    y = np.log(arr)
    med = float(np.median(y))
    floor = (quantum / float(np.mean(arr))) if quantum else 0.0
    sd = max(1.4826 * float(np.median(np.abs(y - med))), floor, 1e-12)
    return bool(np.max(np.abs(y - med)) > HICCUP * sd)


def trimmed_evidence(b: np.ndarray, nw: np.ndarray, trim: float = TRIM,
                     quantum: float | None = None) -> Evidence | None:
    """Yuen's test on the logs (Yuen 1974; scipy's ``ttest_ind(trim=)``): the difference of
    trimmed means with a standard error from the winsorized variances and Welch-type
    degrees of freedom. A percentile's per-sample values have a heavy upper tail: on a
    quiet 2-core host one tcp_rr sample's p99 read 335 us against 65-99 us for nine others,
    which made the mean-of-logs interval 2.6 times wider and kept an unchanged cell
    undecided night after night. Trimming one sample of ten from each end takes such a
    sample out of the location and the spread alike, and keeps the test's error rate (the
    winsorized variance is divided by the kept count, not by n). None when a side has too
    few samples left or a sample is not positive; each side's variance floored by its
    resolution as in :func:`log_evidence`."""
    if b.min() <= 0 or nw.min() <= 0:
        return None
    parts = []
    for x in (np.sort(np.log(b)), np.sort(np.log(nw))):
        n = x.size
        g = int(math.floor(trim * n))
        h = n - 2 * g
        if h < 2:
            return None
        w = x.copy()
        w[:g], w[n - g:] = x[g], x[n - g - 1]
        vw = float(np.var(w, ddof=1))
        parts.append((float(np.mean(x[g:n - g])), (n - 1) * vw / (h * (h - 1)), h))
    if quantum:
        floors = [rounding_variance(a, quantum) / a.size for a in (b, nw)]
        parts = [(m, max(d, f), h) for (m, d, h), f in zip(parts, floors)]
    (mb, db, hb), (mn, dn, hn) = parts
    se = math.sqrt(db + dn)
    if se == 0.0:
        return Evidence(mn - mb, 0.0, float(hb + hn - 2))
    df = (db + dn) ** 2 / ((db ** 2 / (hb - 1) if db else 0.0) + (dn ** 2 / (hn - 1) if dn else 0.0))
    return Evidence(mn - mb, se, float(df))


def quantum_of(arr: np.ndarray) -> float | None:
    """1.0 when every sample is a whole number (netperf's integer-microsecond percentiles,
    counters), else None. A difference of less than one quantum is never a change."""
    return 1.0 if bool(np.all(arr == np.round(arr))) else None


def min_mannwhitney_p(n1: int, n2: int) -> float:
    """The smallest two-sided p the exact Mann-Whitney U test can give (no ties)."""
    return min(1.0, 2.0 / math.comb(n1 + n2, n1))


def choose_test(base: np.ndarray, new: np.ndarray) -> tuple[str, str]:
    """The test ``auto`` uses, and why. Welch's t by default, also for quantised samples
    with ties (netperf's integer-microsecond p99): the exact permutation test's smallest p at
    5+5 is 2/252, which no cell of a hundred-cell family can bring below its corrected level,
    while Welch's t on the logs (moderated across the family) can. The exact (or
    9999-resample) permutation test of the difference of means only where Welch is
    undefined (both sides constant) or, from 8 samples a side (Shapiro-Wilk has no power
    below), Shapiro-Wilk rejects normality at 0.01. Mann-Whitney is never
    chosen automatically: it tests ranks, not means, and at small n cannot reach alpha."""
    if _is_constant(base) and _is_constant(new):
        return "permutation", "both sides have zero variance"
    for name, arr in (("base", base), ("new", new)):
        if arr.size >= 8 and float(sps.shapiro(arr).pvalue) < 0.01:
            return "permutation", f"{name} fails Shapiro-Wilk (p < 0.01)"
    return "welch", ""


def _diff_of_means(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(y, axis=axis) - np.mean(x, axis=axis)


def _p_value(test: str, b: np.ndarray, nw: np.ndarray, sb: Summary,
             sn: Summary) -> tuple[float, tuple[float, float] | None]:
    if test == "welch":
        # From the summaries rather than ttest_ind: their stddev is exactly 0 for a constant
        # side, where ttest_ind recomputes it and warns about catastrophic cancellation.
        res = sps.ttest_ind_from_stats(sb.mean, sb.stddev, sb.n, sn.mean, sn.stddev, sn.n,
                                       equal_var=False)
        return float(res.pvalue), None
    if test == "permutation":
        # Exact over all C(n1+n2, n1) splits when they are at most RESAMPLES; its smallest
        # p is 2/C(n1+n2, n1) (0.0079 at 5+5), never 0.
        res = sps.permutation_test((b, nw), _diff_of_means, permutation_type="independent",
                                   vectorized=True, n_resamples=RESAMPLES,
                                   alternative="two-sided", rng=np.random.default_rng(0))
        return float(res.pvalue), None
    if test == "bootstrap":
        return bootstrap_t_p(b, nw), _ratio_ci(b, nw)
    res = sps.mannwhitneyu(b, nw, alternative="two-sided")
    return float(res.pvalue), None


def _fmt_ci(ci: tuple[float, float] | None) -> str:
    return "undefined" if ci is None else f"[{ci[0]:+.1%}, {ci[1]:+.1%}]"


def distinct_resamples(n1: int, n2: int) -> int:
    """How many different pairs of bootstrap resamples (multisets) two samples have."""
    return math.comb(2 * n1 - 1, n1) * math.comb(2 * n2 - 1, n2)


def bootstrap_t_p(b: np.ndarray, nw: np.ndarray, resamples: int = RESAMPLES) -> float:
    """Two-sided p of the studentized (bootstrap-t) test of equal means (Efron and
    Tibshirani 1993, 16.4): each side is shifted to the pooled mean so that the null holds,
    resampled, and Welch's t of each resample is held against the observed one. Studentizing
    is what keeps it near its nominal level at n=5, where the percentile bootstrap of the
    ratio gave 1e-4 to data Welch put at 0.04. The p is floored at one over the distinct
    resamples (at most 252 distinct splits of two 5-sample sides cannot give 1e-4)."""
    def t_of(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        se = np.sqrt(np.var(x, axis=-1, ddof=1) / x.shape[-1] + np.var(y, axis=-1, ddof=1) / y.shape[-1])
        d = np.mean(y, axis=-1) - np.mean(x, axis=-1)
        with np.errstate(divide="ignore", invalid="ignore"):
            t = np.where(se > 0, d / np.where(se > 0, se, 1.0), np.where(d == 0, 0.0, np.inf))
        return t
    t_obs = float(np.abs(t_of(b, nw)))
    pooled = float(np.mean(np.concatenate([b, nw])))
    b0, n0 = b - b.mean() + pooled, nw - nw.mean() + pooled
    rng = np.random.default_rng(0)
    tb = t_of(rng.choice(b0, (resamples, b.size)), rng.choice(n0, (resamples, nw.size)))
    p = (float(np.sum(np.abs(tb) >= t_obs * (1 - 1e-12))) + 1.0) / (resamples + 1.0)
    return min(1.0, max(p, 1.0 / distinct_resamples(b.size, nw.size)))


def _ratio_ci(b: np.ndarray, nw: np.ndarray) -> tuple[float, float] | None:
    """95 % percentile interval of mean(NEW) / mean(BASE), shown beside the bootstrap-t p;
    None when BASE's mean can come near 0 (the ratio is then meaningless)."""
    if b.min() <= 0:
        return None
    rng = np.random.default_rng(0)
    mb = np.mean(rng.choice(b, (RESAMPLES, b.size)), axis=1)
    mn = np.mean(rng.choice(nw, (RESAMPLES, nw.size)), axis=1)
    lo, hi = np.percentile(mn / mb, [2.5, 97.5])
    return float(lo), float(hi)


def limits(c: Comparison) -> tuple[float, float]:
    """(worse, better): the threshold on the log scale of NEW / BASE, in the metric's
    direction, widened by one quantum of its resolution (a change within the resolution is
    none: 1 us on a 20 us p50 is 5 %)."""
    r = abs(c.quantum / c.base.mean) if c.quantum and c.base.mean else 0.0
    lo, hi = math.log(max(1e-9, 1.0 - c.threshold - r)), math.log1p(c.threshold + r)
    return (lo, hi) if c.higher_is_better else (hi, lo)


def threshold_ps(c: Comparison, ev: Evidence) -> tuple[float, float]:
    """One-sided p-values against the threshold: (p_worse, p_better). p_worse tests H0 "the
    change is no worse than the threshold" (small when the change is credibly beyond it on
    the worse side); p_better mirrors it. The equivalence test of UNCHANGED is the same two
    tests against the inner side of the limits; these are their outer halves."""
    worse, better = limits(c)
    sign = 1.0 if c.higher_is_better else -1.0
    g, w, b = sign * ev.d, sign * worse, sign * better      # goodness: positive is better
    if ev.se <= 0.0:
        return (0.0 if g < w else 1.0), (0.0 if g > b else 1.0)
    return t_cdf((g - w) / ev.se, ev.df), t_cdf(-(g - b) / ev.se, ev.df)


def with_evidence(c: Comparison, ev: Evidence | None, shift: float | None = None) -> Comparison:
    """``c`` decided on ``ev`` (after a night's shift ``shift`` when one was taken out): its
    interval, both threshold p-values and the raw verdict."""
    if ev is None:
        return decide(dataclasses.replace(c, evidence=None, shift=shift))
    lo, hi = ev.interval(c.alpha)
    pw, pb = threshold_ps(c, ev)
    return decide(dataclasses.replace(c, evidence=ev, shift=shift, p_worse=pw, p_better=pb,
                                      change_ci=(math.expm1(lo), math.expm1(hi))))


def decide(c: Comparison, p_worse: float | None = None, p_better: float | None = None,
           level: float | None = None) -> Comparison:
    """``c`` with its verdict taken again: REGRESSED when ``p_worse`` (default: the raw
    one; an adjusted one after Benjamini-Hochberg) is below ``c.alpha``, IMPROVED when
    ``p_better`` is, else UNCHANGED when the (1 - 2 alpha) interval of the change lies
    within +-threshold and its estimate too (two one-sided tests, at alpha, never scaled
    by the family's size: an equivalence claim is no discovery), else NOT_WORSE when the
    worse half of that test alone holds, else INCONCLUSIVE. A change whose estimate is
    beyond the threshold is never unchanged, and a point estimate beyond it is never
    enough to regress: the interval must be beyond it. ``level``: the significance level
    of the threshold tests (Benjamini-Hochberg's q for adjusted p-values; default alpha);
    the equivalence test always runs at alpha, never at a level scaled by the family."""
    if c.verdict is Verdict.INSUFFICIENT:
        return c
    notes = [c.test_note] if c.test_note else []
    pw = c.p_worse if p_worse is None else p_worse
    pb = c.p_better if p_better is None else p_better
    ev = c.evidence
    if ev is None:
        if c.delta == 0.0 or (c.quantum is not None and abs(c.delta) <= c.quantum):
            v = Verdict.UNCHANGED
            if c.delta != 0.0:
                notes.append(f"change within one quantum ({c.quantum:g})")
        else:
            v = Verdict.INCONCLUSIVE
            notes.append("base mean is 0; relative change undefined" if c.delta_rel is None
                         else "no relative change to decide on (a mean is not positive)")
        return dataclasses.replace(c, verdict=v, p_adjusted=pw, p_better_adjusted=pb, note="; ".join(notes))
    worse, better = limits(c)
    lo, hi = ev.interval(c.alpha)
    inner_lo, inner_hi = min(worse, better), max(worse, better)
    sign = 1.0 if c.higher_is_better else -1.0
    sig = c.alpha if level is None else level
    if pw is not None and pw < sig:
        v = Verdict.REGRESSED
    elif pb is not None and pb < sig:
        v = Verdict.IMPROVED
    elif inner_lo <= lo and hi <= inner_hi:
        v = Verdict.UNCHANGED
    elif c.quantum is not None and abs(c.delta) <= c.quantum and c.shift is None:
        # the means differ by at most the resolution: no change this metric can show
        v = Verdict.UNCHANGED
        notes.append(f"change within one quantum ({c.quantum:g})")
    elif (sign * (lo if sign > 0 else hi)) > sign * worse:
        v = Verdict.NOT_WORSE
        notes.append(f"not worse than {c.threshold:.0%} ({1 - 2 * c.alpha:.0%} interval "
                     f"{_fmt_ci(c.change_ci)}), not shown within it on the better side")
    else:
        v = Verdict.INCONCLUSIVE
        est = math.expm1(ev.d)
        if (sign * ev.d) < sign * worse:
            notes.append(f"change {est:+.1%} beyond -{c.threshold:.0%} but not credibly "
                         f"(interval {_fmt_ci(c.change_ci)}" + ("" if pw is None else f", p {pw:.3g} >= {sig:g}")
                         + ")")
        else:
            notes.append(f"change {est:+.1%}, but not shown unchanged: its interval "
                         f"{_fmt_ci(c.change_ci)} reaches beyond +-{c.threshold:.0%}"
                         + ("" if c.mdc is None else f" (smallest detectable change {c.mdc:.1%})"))
    return dataclasses.replace(c, verdict=v, p_adjusted=pw, p_better_adjusted=pb, note="; ".join(notes))


def compare(base: Sequence[float], new: Sequence[float], *, higher_is_better: bool,
            threshold: float = 0.05, alpha: float = 0.05, test: str = "auto",
            min_samples: int = MIN_SAMPLES, spread_from: int | None = None,
            trim: float = 0.0) -> Comparison:
    """Decide whether ``new`` improved, regressed or left a metric unchanged against ``base``.

    IMPROVED/REGRESSED needs both a significant difference (p < alpha) and a relative
    change beyond ``threshold`` in that direction. UNCHANGED needs equivalence: the
    (1 - 2 alpha) interval of the change (two one-sided tests) lies within +-threshold; a
    small observed change whose interval reaches beyond is INCONCLUSIVE (measure again).
    A change beyond the threshold with p >= alpha is INCONCLUSIVE rather than UNCHANGED:
    a noisy 30 % drop must not pass a gate silently. The verdict here uses the raw p;
    :func:`adjust` takes it again with Benjamini-Hochberg across a family of comparisons.

    Rules, each recorded in ``note``:
    - fewer than ``min_samples`` on a side: INSUFFICIENT, no test, p None.
    - the test: ``auto`` picks per :func:`choose_test`. ``mannwhitney`` is refused
      (INSUFFICIENT) when its smallest possible p, 2/C(n1+n2, n1), is not below alpha.
    - zero variance (one or both sides constant): the permutation test, never Welch's
      undefined statistic and never a made-up p = 0; equal constants are UNCHANGED, p = 1.
    - quantised samples (integers): a difference of at most one quantum is UNCHANGED.
    - base mean 0: the relative change is undefined; INCONCLUSIVE unless the means match.
    - ``spread_from``: the samples were taken under an adaptive stopping rule (an rsd
      target between min and max samples) that always takes this many; the variance the
      moderated t uses comes from each side's first ``spread_from`` samples, which the
      rule cannot have chosen (:func:`log_spread`).
    - ``trim`` (the gate: :data:`TRIM`): where a side of ten or more samples has a hiccup
      (:func:`hiccup`), Yuen's trimmed test on the logs decides (:func:`trimmed_evidence`):
      a stalled sample moves a mean, not a trimmed one.
    """
    if test not in TESTS:
        raise ValueError(f"unknown test {test!r}; expected one of {TESTS}")
    if threshold < 0:
        raise ValueError(f"threshold must be >= 0, got {threshold}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if min_samples < 2:
        raise ValueError(f"min_samples must be >= 2, got {min_samples}")
    b, nw = _as_array(base, "base"), _as_array(new, "new")
    sb, sn = summarize(b), summarize(nw)
    delta = sn.mean - sb.mean
    delta_rel = delta / abs(sb.mean) if sb.mean != 0.0 else None
    q = quantum_of(b) if quantum_of(nw) else None
    c = Comparison(base=sb, new=sn, delta=delta, delta_rel=delta_rel,
                   delta_pct=None if delta_rel is None else delta_rel * 100.0, p_value=None,
                   test=None, verdict=Verdict.INCONCLUSIVE, higher_is_better=higher_is_better,
                   threshold=threshold, alpha=alpha, quantum=q)
    if sb.n < min_samples or sn.n < min_samples:
        return dataclasses.replace(
            c, verdict=Verdict.INSUFFICIENT,
            note=f"insufficient: {sb.n} BASE and {sn.n} NEW samples, {min_samples} needed a side")
    used, why = (choose_test(b, nw) if test == "auto" else (test, ""))
    far = [name for name, arr in (("base", b), ("new", nw)) if trim and test == "auto" and hiccup(arr, q)]
    robust = trimmed_evidence(b, nw, trim, q) if far else None
    if robust is not None:
        used, why = "yuen", f"{' and '.join(far)} has a sample beyond {HICCUP:g} robust SDs: {trim:.0%} trimmed from each end"
    if used == "welch" and _is_constant(b) and _is_constant(nw):
        used, why = "permutation", "zero variance: Welch undefined"
    if used == "mannwhitney" and min_mannwhitney_p(sb.n, sn.n) >= alpha:
        return dataclasses.replace(
            c, verdict=Verdict.INSUFFICIENT,
            note=f"insufficient: Mann-Whitney at n={sb.n}+{sn.n} cannot reach p < {alpha} "
                 f"(smallest p {min_mannwhitney_p(sb.n, sn.n):.3g})")
    if _is_constant(b) and _is_constant(nw) and delta == 0.0:
        p, ci = 1.0, None
    elif robust is not None:
        p, ci = robust.p_two_sided(), None
    else:
        p, ci = _p_value(used, b, nw, sb, sn)
    if not math.isfinite(p):
        return dataclasses.replace(c, test=used, note=f"{used} test gave p={p}")
    cci, mdc = welch_interval(sb, sn, alpha)
    c = dataclasses.replace(c, p_value=p, test=used, ratio_ci=ci, change_ci=cci, mdc=mdc,
                            test_note=f"{used}: {why}" if why else "",
                            log_spread=(log_spread(b, nw, spread_from, q)
                                        if used == "welch" else None))
    if robust is not None:
        c = dataclasses.replace(c, mdc=interval_and_mdc(robust.d, robust.se, robust.df, alpha, log=True)[1])
    return with_evidence(c, robust or log_evidence(b, nw, spread_from, q))


#: fewer Welch comparisons than this in a family: no variance prior, per-cell Welch
MIN_PRIOR_CELLS = 3
#: a prior worth less than this many degrees of freedom (cells too heterogeneous for one
#: prior, e.g. half at 1 % noise and half at 6 %, where d0 fits to about 1.3) is not used:
#: per-cell Welch, which also allows unequal variances on the two sides. Measured over 50
#: seeded nights of 100 unchanged cells at 1 %/6 % noise: with that d0 the moderated t let
#: 3 false regressions through (2 in one night), per-cell Welch none; a prior this weak
#: adds little power beyond a cell's own 8 degrees of freedom anyway
MIN_PRIOR_DF = 4.0


@dataclass(frozen=True)
class Prior:
    """The variance prior of one family's Welch comparisons (limma's ``squeezeVar``), or why
    there is none. ``d0`` is ``math.inf`` when the cells' log variances are no more spread
    than sampling alone explains (one common variance, ``s0_2``)."""

    method: str                 # "moderated" or "welch" (the fallback)
    cells: int                  # comparisons the prior was estimated from
    d0: float | None = None     # prior degrees of freedom
    s0_2: float | None = None   # prior variance of the logs
    reason: str = ""            # why the fallback

    def describe(self) -> str:
        if self.method != "moderated":
            return f"per-cell Welch ({self.reason})"
        d0 = "inf" if math.isinf(self.d0) else f"{self.d0:.3g}"
        return (f"moderated t (empirical Bayes, limma): prior d0 {d0}, s0 "
                f"{math.sqrt(self.s0_2):.3%} relative, from {self.cells} cells")


def trigamma_inverse(y: float) -> float:
    """x with trigamma(x) = y (y > 0): limma's Newton iteration, with its asymptotes."""
    if y > 1e7:
        return 1.0 / math.sqrt(y)
    if y < 1e-6:
        return 1.0 / y
    x = 0.5 + 1.0 / y
    for _ in range(50):
        tri = float(spx.polygamma(1, x))
        step = tri * (1.0 - tri / y) / float(spx.polygamma(2, x))
        x += step
        if -step / x < 1e-8:
            break
    return x


def fit_prior(s2: Sequence[float], df: Sequence[float]) -> tuple[float, float]:
    """(d0, s0^2) of the scaled F (scaled chi-square) distribution the variances ``s2`` with
    degrees of freedom ``df`` are drawn from: limma's ``fitFDist`` without covariates, the
    method of moments on log variances (Smyth 2004, section 6)."""
    s2a, d = np.asarray(s2, dtype=float), np.asarray(df, dtype=float)
    e = np.log(s2a) - spx.digamma(d / 2) + np.log(d / 2)
    emean = float(e.mean())
    evar = float(np.sum((e - emean) ** 2) / (e.size - 1) - np.mean(spx.polygamma(1, d / 2)))
    if evar <= 0:
        return math.inf, math.exp(emean)
    d0 = 2.0 * trigamma_inverse(evar)
    return d0, math.exp(emean + float(spx.digamma(d0 / 2)) - math.log(d0 / 2))


def moderate(comparisons: Sequence[Comparison],
             min_cells: int = MIN_PRIOR_CELLS) -> tuple[list[Comparison], Prior]:
    """An empirical-Bayes moderated t-test (limma, Smyth 2004) in place of Welch's, across
    the comparisons of one metric in one family. Each cell's pooled variance of log samples
    is squeezed towards a prior estimated from all of them, s~^2 = (d0 s0^2 + d s^2) /
    (d0 + d), and its t on the difference of mean logs has d0 + d degrees of freedom (at
    most the family's pooled degrees of freedom, as limma caps it). At n = 5 a side Welch
    has about 8 degrees of freedom; with a prior from many similar cells the moderated t
    has tens, so a real 10 % drop reaches the p that Benjamini-Hochberg asks of it across a
    hundred cells. Only comparisons that used Welch take part; permutation, bootstrap and
    Mann-Whitney ones and those of non-positive samples keep their p. With fewer than
    ``min_cells`` such comparisons or a prior worth less than MIN_PRIOR_DF, every
    comparison keeps its Welch p and the returned Prior says why."""
    idx = [i for i, c in enumerate(comparisons)
           if c.test == "welch" and c.p_value is not None and c.log_spread is not None]
    out = list(comparisons)
    if len(idx) < min_cells:
        return out, Prior("welch", len(idx), reason=f"{len(idx)} Welch comparisons, "
                                                    f"{min_cells} needed for a variance prior")
    ls = [comparisons[i].log_spread for i in idx]
    d0, s0_2 = fit_prior([x.s2 for x in ls], [x.df for x in ls])
    if d0 < MIN_PRIOR_DF:
        return out, Prior("welch", len(idx), d0, s0_2,
                          reason=f"variances too heterogeneous for a prior (d0 {d0:.2g})")
    pooled = float(sum(x.df for x in ls))
    for i, x in zip(idx, ls):
        s2_post = s0_2 if math.isinf(d0) else (d0 * s0_2 + x.df * x.s2) / (d0 + x.df)
        df = min(d0 + x.df, pooled)
        t = x.diff / (math.sqrt(s2_post) * x.scale)
        p = 2.0 * t_cdf(-abs(t), df)
        cci, mdc = interval_and_mdc(x.diff, math.sqrt(s2_post) * x.scale, df,
                                    comparisons[i].alpha, log=True)
        c = dataclasses.replace(comparisons[i], p_value=p, test="moderated", change_ci=cci,
                                mdc=mdc)
        out[i] = with_evidence(c, Evidence(x.diff, math.sqrt(s2_post) * x.scale, float(df)))
    return out, Prior("moderated", len(idx), d0, s0_2)


def adjust(comparisons: Sequence[Comparison], q: float = FDR_Q) -> list[Comparison]:
    """Benjamini-Hochberg across one family (every cell and deciding metric of a run
    comparison): each comparison decided again at its adjusted p, with ``alpha`` = ``q``
    as the false-discovery rate. Comparisons without a p keep their verdict."""
    return adjust_family(comparisons, (), q)[0]


def adjust_family(comparisons: Sequence[Comparison], extra: Sequence[float],
                  q: float = FDR_Q) -> tuple[list[Comparison], list[float]]:
    """:func:`adjust` with further p-values in the same family (a cell's failure-rate test:
    it is one more way a cell can fail the gate, so it shares the false-discovery budget);
    returns the comparisons decided again and the extra p-values adjusted."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"q must be in (0, 1), got {q}")
    idx = [i for i, c in enumerate(comparisons) if c.p_worse is not None]
    out = list(comparisons)
    ps = [comparisons[i].p_worse for i in idx] + [float(p) for p in extra]
    if not ps:
        return out, []
    adj = [float(a) for a in sps.false_discovery_control(ps, method="bh")]
    better = [float(a) for a in sps.false_discovery_control(
        [comparisons[i].p_better for i in idx], method="bh")] if idx else []
    for i, pa, pb in zip(idx, adj, better):
        out[i] = decide(comparisons[i], pa, pb, level=q)
    return out, adj[len(idx):]


def failure_rate_p(base_failed: int, base_n: int, new_failed: int, new_n: int) -> float:
    """One-sided p that NEW's failure rate is above BASE's: Fisher's exact test on the 2x2
    table of failed and ok samples. One transient failure in 5 against none gives p = 0.5,
    far from any corrected level; 5 of 5 against none gives 1/252."""
    table = [[new_failed, new_n - new_failed], [base_failed, base_n - base_failed]]
    return float(sps.fisher_exact(table, alternative="greater").pvalue)


# --------------------------------------------------------------------------- efficiency

def _ratio(numerator: float | None, denominator: float | None, what: str) -> float | None:
    # None, NaN and a zero denominator all mean "not measured": return None, never 0 or inf.
    if numerator is None or denominator is None:
        return None
    if not (math.isfinite(numerator) and math.isfinite(denominator)) or denominator == 0:
        return None
    if denominator < 0:
        raise ValueError(f"{what} must not be negative, got {denominator}")
    return numerator / denominator


def gbit_per_core(throughput_mbps: float | None, cores: float | None) -> float | None:
    """Gbit/s per CPU core consumed (``cores`` = CPU-seconds per second, e.g. 1.5)."""
    if throughput_mbps is None:
        return None
    return _ratio(throughput_mbps / 1000.0, cores, "cores")


def gbit_per_ghz(throughput_mbps: float | None, cores: float | None,
                 clock_ghz: float | None) -> float | None:
    """Gbit/s per GHz of CPU consumed: throughput / (cores x clock); comparable across hosts
    with different clocks."""
    if throughput_mbps is None or cores is None or clock_ghz is None:
        return None
    if clock_ghz < 0:
        raise ValueError(f"clock_ghz must not be negative, got {clock_ghz}")
    return _ratio(throughput_mbps / 1000.0, cores * clock_ghz, "cores")


def cpu_us_per_transaction(cores: float | None,
                           transactions_per_s: float | None) -> float | None:
    """CPU microseconds spent per transaction: cores busy / transactions per second."""
    if cores is None:
        return None
    return _ratio(cores * 1e6, transactions_per_s, "transactions_per_s")


# --------------------------------------------------------------------------- ordering

def randomized_order(items: Sequence[T], seed: int) -> list[T]:
    """A deterministic shuffle of ``items`` (a new list), so a run's cell order is random
    against drift (thermal, page cache, neighbours) yet reproducible from its seed."""
    out = list(items)
    random.Random(seed).shuffle(out)
    return out
