"""Hop latencies in the gate: a traced cell's per-hop percentiles (testbed.measure.hops)
compared like the tool's own, so a regression names the hop it happened in.

Each hop's p50 and p99 is one value per sample, compared with the method fit for quantiles
(testbed.analysis.tailgate: a permutation test, a bootstrap interval). They are informational
metrics: adjusted with Benjamini-Hochberg in their own family, never deciding a cell's
verdict (the tool's figures do), but a hop whose latency regressed credibly is named beside
the cell's verdict: the hops whose median moved first, then those whose tail did, each the
largest change first. A median names where the typical transaction's time went; a p99 on a
shared host also moves with whatever preempted the tool (a regression seeded in a bridge
port's netfilter rules here moved req.2.switch's p50 by +9.6 us, while a scheduling tail
moved another hop's p99 by 1.7 ms in the same run).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from testbed.analysis import stats, tailgate

#: the hop figures judged (p90 is recorded too; two per hop keep the family small)
PREFIXES = ("hop_p50_us.", "hop_p99_us.")


def hop_metrics(base: Sequence[Mapping[str, float]], new: Sequence[Mapping[str, float]]) -> list[str]:
    """Hop figures every sample of both sides carries."""
    sides = [list(base), list(new)]
    if not all(sides):
        return []
    common = set.intersection(*(set(m) for side in sides for m in side))
    return sorted(k for k in common if k.startswith(PREFIXES))


def names(metrics: Iterable[Mapping[str, float]]) -> list[str]:
    """Hop figures any of the samples carries."""
    return sorted({k for m in metrics for k in m if k.startswith(PREFIXES)})


def comparisons(base: Sequence[Mapping[str, float]], new: Sequence[Mapping[str, float]], *,
                threshold: float = 0.05, alpha: float = 0.05,
                min_samples: int = stats.MIN_SAMPLES) -> list[tuple[str, stats.Comparison]]:
    return [(k, tailgate.compare_quantile([float(m[k]) for m in base], [float(m[k]) for m in new],
                                          threshold=threshold, alpha=alpha, min_samples=min_samples))
            for k in hop_metrics(base, new)]


def hop_of(metric: str) -> str:
    """hop_p50_us.req.2.switch -> req.2.switch"""
    return metric.split(".", 1)[1]


def regressed(metrics: Iterable) -> list:  # noqa: ANN001 (compare.MetricResult)
    """A cell's hop metrics that regressed: medians first, then tails, each the largest
    change (in microseconds) first."""
    bad = [m for m in metrics if m.metric.startswith(PREFIXES)
           and m.comparison.verdict is stats.Verdict.REGRESSED]
    return sorted(bad, key=lambda m: (not m.metric.startswith(PREFIXES[0]), -(m.comparison.delta or 0.0)))


def attribution(cell_id: str, metrics: Iterable) -> str | None:  # noqa: ANN001
    """One line naming the hops a cell's latency regressed in, or None."""
    bad = regressed(metrics)
    if not bad:
        return None
    parts = [f"{hop_of(m.metric)} {m.metric.split('.', 1)[0].removeprefix('hop_').removesuffix('_us')} "
             f"{m.comparison.base.mean:.4g} -> {m.comparison.new.mean:.4g} us "
             f"({m.comparison.delta:+.4g} us, p adj {m.comparison.p_adjusted:.2g})" for m in bad]
    return f"  {cell_id}: regressed in hop {parts[0]}" + (f"; also {'; '.join(parts[1:])}" if parts[1:] else "")


__all__ = ["PREFIXES", "attribution", "comparisons", "hop_metrics", "hop_of", "names", "regressed"]
