"""The gate on latency tails: the chosen percentiles (testbed.records.percentiles), for
`testbed compare`.

A sample's percentile is one value per sample, often in whole microseconds (netperf's
P50/P90/P99 selectors), with ties. It is judged as every other metric is: on the log scale,
by a t-test (moderated across the cells of the metric), against the threshold. Two things
make that right for tails:

- **the resolution.** A tie of five integer samples is not a noiseless measurement: each
  side's log variance is at least quantum^2 / 12 over its squared level (rounding's own
  variance), and a change within one quantum is none (the limits widen by it), so a 20 us
  p50 that reads 20 or 21 is never "not shown within 5 %" for the 1 us it cannot resolve;
- **enough p-value.** The exact permutation test of 5 + 5 samples cannot go below
  2/252 = 0.0079, which no cell of a hundred-cell family brings under Benjamini-Hochberg's
  level: a +20 % p99 in 10 of 100 cells was never found. The t on the logs can.

A bootstrap interval of the ratio of the sides' mean percentile is shown beside it. Only percentiles
present on both sides are compared: an insufficient percentile (too few transactions
behind it) is never in a sample's metrics, so it is never gated. A percentile's noise
across samples sets how many samples it needs: each verdict prints its smallest detectable
change, and :func:`samples_for` says how many samples a side would bring it to the
threshold.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from testbed.analysis import stats
from testbed.records.percentiles import METRIC_RE, from_metric

TEST = "quantile-permutation"
BOOTSTRAP_RESAMPLES = 4000


def tail_metrics(base: Iterable[Mapping[str, float]], new: Iterable[Mapping[str, float]],
                 skip: Sequence[str] = ()) -> list[str]:
    """Percentile metrics (latency_p<N>_us) that every sample of both sides carries."""
    sides = [list(base), list(new)]
    if not all(sides):
        return []
    common = set.intersection(*(set(m) for side in sides for m in side))
    return sorted((k for k in common if METRIC_RE.fullmatch(k) and k not in skip), key=from_metric)


def bootstrap_ratio_ci(b: Sequence[float], n: Sequence[float], seed: int = 0) -> tuple[float, float] | None:
    """95 % percentile interval of mean(NEW) / mean(BASE), each side resampled."""
    rng = np.random.default_rng(seed)
    bb, nn = np.asarray(b, float), np.asarray(n, float)
    mb = np.mean(rng.choice(bb, (BOOTSTRAP_RESAMPLES, len(bb))), axis=1)
    mn = np.mean(rng.choice(nn, (BOOTSTRAP_RESAMPLES, len(nn))), axis=1)
    if np.any(mb <= 0):
        return None
    lo, hi = np.percentile(mn / mb, [2.5, 97.5])
    return float(lo), float(hi)


def samples_for(c: stats.Comparison) -> int | None:
    """Samples a side at which this comparison's smallest detectable change would reach
    its threshold (the mdc falls as one over the square root of n), None without an mdc."""
    if c.mdc is None or not c.threshold:
        return None
    n = max(c.base.n, c.new.n)
    return max(n, int(np.ceil(n * (c.mdc / c.threshold) ** 2)))


def compare_quantile(base: Sequence[float], new: Sequence[float], *, threshold: float = 0.05,
                     alpha: float = 0.05, min_samples: int = stats.MIN_SAMPLES,
                     spread_from: int | None = None) -> stats.Comparison:
    """One percentile metric, BASE against NEW (lower is better), decided as any metric
    (:func:`testbed.analysis.stats.compare`: the log-scale change against the threshold,
    with the resolution's variance), the bootstrap interval of the ratio shown."""
    c = stats.compare(base, new, higher_is_better=False, threshold=threshold, alpha=alpha,
                      min_samples=min_samples, spread_from=spread_from, trim=stats.TRIM)
    if c.verdict is stats.Verdict.INSUFFICIENT:
        return c
    note = f"{TEST}: per-sample percentiles, mean {c.base.mean:.4g} -> {c.new.mean:.4g} us"
    need = samples_for(c)
    if need is not None and need > max(c.base.n, c.new.n):
        note += f"; about {need} samples a side would resolve +-{threshold:.0%} at its noise"
    return stats.decide(dataclasses.replace(c, ratio_ci=bootstrap_ratio_ci(base, new),
                                            test_note="; ".join(filter(None, [c.test_note, note]))))


def comparisons(base: Sequence[Mapping[str, float]], new: Sequence[Mapping[str, float]], *,
                skip: Sequence[str] = (), threshold: float = 0.05, alpha: float = 0.05,
                min_samples: int = stats.MIN_SAMPLES,
                spread_from: int | None = None) -> list[tuple[str, stats.Comparison]]:
    """(metric, comparison) for every percentile both sides' ok samples carry, but ``skip``."""
    return [(k, compare_quantile([float(m[k]) for m in base], [float(m[k]) for m in new],
                                 threshold=threshold, alpha=alpha, min_samples=min_samples,
                                 spread_from=spread_from))
            for k in tail_metrics(base, new, skip)]
