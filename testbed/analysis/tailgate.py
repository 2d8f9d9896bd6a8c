"""The gate on latency tails: the chosen percentiles (testbed.records.percentiles) compared with a
method fit for quantiles, for `testbed compare`.

A tail percentile is not normally distributed across samples (a p99.9 jumps with one slow
transaction), so a t-test on it says little. Each sample's percentile is one value, and:

- p comes from an exact permutation test of the difference of the two sides' mean
  percentile (at 5 + 5 samples, 252 splits, smallest p 2/252): valid whatever the
  distribution, where a bootstrap p at five samples a side is too optimistic, and with more
  power than a difference of medians (whose ties among splits give p >= 12/924 at 6 + 6);
- the 95 % interval of NEW's over BASE's comes from a bootstrap of the quantile difference
  across samples (each side resampled with replacement), shown beside it.

The comparisons join the same Benjamini-Hochberg family as the means (compare._finish): a
rr/crr cell's tails decide its verdict as its mean latency does. Only percentiles present on
both sides are compared: an insufficient percentile (too few transactions behind it) is
never in a sample's metrics, so it is never gated.
"""
from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from testbed.analysis import stats
from testbed.records.percentiles import METRIC_RE, from_metric

TEST = "quantile-permutation"
BOOTSTRAP_RESAMPLES = 4000
#: exact permutation up to this many splits, else this many random ones
PERMUTATIONS = 20000


def tail_metrics(base: Iterable[Mapping[str, float]], new: Iterable[Mapping[str, float]],
                 skip: Sequence[str] = ()) -> list[str]:
    """Percentile metrics (latency_p<N>_us) that every sample of both sides carries."""
    sides = [list(base), list(new)]
    if not all(sides):
        return []
    common = set.intersection(*(set(m) for side in sides for m in side))
    return sorted((k for k in common if METRIC_RE.fullmatch(k) and k not in skip), key=from_metric)


def _diff(b: np.ndarray, n: np.ndarray) -> float:
    return float(np.mean(n) - np.mean(b))


def permutation_p(b: Sequence[float], n: Sequence[float], seed: int = 0) -> float:
    """Two-sided p of the difference of means under exchangeability: exact over every
    split when they are at most PERMUTATIONS, else that many random ones (vectorised)."""
    from math import comb
    x = np.concatenate([np.asarray(b, float), np.asarray(n, float)])
    nb, total = len(b), len(x)
    nn = total - nb
    whole = x.sum()
    obs = abs(_diff(x[:nb], x[nb:]))
    if comb(total, nb) <= PERMUTATIONS:
        idx = np.fromiter(itertools.chain.from_iterable(itertools.combinations(range(total), nb)),
                          dtype=np.intp).reshape(-1, nb)
        sb = x[idx].sum(axis=1)
        diffs = np.abs((whole - sb) / nn - sb / nb)
        return float(np.mean(diffs >= obs - 1e-9 * max(1.0, obs)))
    rng = np.random.default_rng(seed)
    perm = rng.permuted(np.tile(x, (PERMUTATIONS, 1)), axis=1)
    sb = perm[:, :nb].sum(axis=1)
    diffs = np.abs((whole - sb) / nn - sb / nb)
    return float((np.sum(diffs >= obs - 1e-9 * max(1.0, obs)) + 1) / (PERMUTATIONS + 1))


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


def compare_quantile(base: Sequence[float], new: Sequence[float], *, threshold: float = 0.05,
                     alpha: float = 0.05, min_samples: int = stats.MIN_SAMPLES) -> stats.Comparison:
    """One percentile metric, BASE against NEW (lower is better). ``delta`` is the
    difference of the sides' mean percentile, ``delta_rel`` it over BASE's: what
    ``threshold`` is held against."""
    sb, sn = stats.summarize(base), stats.summarize(new)
    mb, mn = sb.mean, sn.mean
    delta = mn - mb
    rel = delta / abs(mb) if mb else None
    c = stats.Comparison(base=sb, new=sn, delta=delta, delta_rel=rel,
                         delta_pct=None if rel is None else rel * 100, p_value=None, test=None,
                         verdict=stats.Verdict.INCONCLUSIVE, higher_is_better=False,
                         threshold=threshold, alpha=alpha)
    if sb.n < min_samples or sn.n < min_samples:
        return dataclasses.replace(c, verdict=stats.Verdict.INSUFFICIENT,
                                   note=f"insufficient: {sb.n} BASE and {sn.n} NEW samples, "
                                        f"{min_samples} needed a side")
    p = permutation_p(base, new)
    cci, mdc = stats.welch_interval(sb, sn, alpha)
    c = dataclasses.replace(c, p_value=p, test=TEST, ratio_ci=bootstrap_ratio_ci(base, new),
                            change_ci=cci, mdc=mdc,
                            test_note=f"{TEST}: per-sample percentiles, mean "
                                      f"{mb:.4g} -> {mn:.4g} us")
    return stats.decide(c, p)


def comparisons(base: Sequence[Mapping[str, float]], new: Sequence[Mapping[str, float]], *,
                skip: Sequence[str] = (), threshold: float = 0.05, alpha: float = 0.05,
                min_samples: int = stats.MIN_SAMPLES) -> list[tuple[str, stats.Comparison]]:
    """(metric, comparison) for every percentile both sides' ok samples carry, but ``skip``."""
    return [(k, compare_quantile([float(m[k]) for m in base], [float(m[k]) for m in new],
                                 threshold=threshold, alpha=alpha, min_samples=min_samples))
            for k in tail_metrics(base, new, skip)]
