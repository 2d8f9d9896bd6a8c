"""Chosen latency percentiles, each with the transactions it rests on.

The topology chooses the percentiles (``matrix.percentiles``, default p50, p90, p99, p99.9).
Where a tool gives the whole distribution (netperf's ``-v 2`` histogram in builds with
``--enable-histogram``; sockperf's full log of every message, bucketed by its driver; a list
of per-transaction times) they are computed from it; else the tool's own figures are taken
where it prints them (netperf's P50/P90/P99 selectors, from its internal histogram;
sockperf's p25 to p99.999 over every message it timed), and a percentile no source gives is
recorded as unavailable, never guessed.

A percentile q rests on the transactions behind it: fewer than ``10 / (1 - q)`` (1,000 for
p99, 10,000 for p99.9) leave fewer than ten transactions above it, so the figure is mostly
one or two outliers. Such a percentile is recorded with ``sufficient: false`` and kept out
of the sample's metrics: it is neither gated nor plotted as a point.

Pure functions only.
"""
from __future__ import annotations

import bisect
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace

DEFAULT: tuple[float, ...] = (50.0, 90.0, 99.0, 99.9)
#: metric names of percentiles: latency_p50_us, latency_p99_9_us, latency_p99_99_us
METRIC_RE = re.compile(r"latency_p(\d{1,2})(?:_(\d{1,3}))?_us")


def metric_name(p: float) -> str:
    """99.9 -> latency_p99_9_us; 50 -> latency_p50_us."""
    whole, _, frac = f"{p:.3f}".rstrip("0").rstrip(".").partition(".")
    return f"latency_p{whole}{'_' + frac if frac else ''}_us"


def from_metric(name: str) -> float | None:
    m = METRIC_RE.fullmatch(name)
    return None if not m else float(f"{m.group(1)}.{m.group(2) or 0}")


def required(p: float) -> int:
    """Transactions a percentile needs: 10 / (1 - q), so that ten lie above it."""
    # in per-mille-of-a-percent units, so 99.9 is exact (1 - 0.999 is not, in floats)
    return math.ceil(10 * 100_000 / round(100_000 - p * 1000) - 1e-9)


@dataclass(frozen=True)
class Percentile:
    p: float                        # percent, e.g. 99.9
    value_us: float | None
    n: int | None                   # transactions behind it (None: unknown)
    sufficient: bool
    source: str                     # histogram | transactions | tool | unavailable
    note: str | None = None

    @property
    def metric(self) -> str:
        return metric_name(self.p)

    def as_dict(self) -> dict:
        return {**asdict(self), "metric": self.metric, "required": required(self.p)}


def _mark(p: float, value: float | None, n: int | None, source: str, note: str | None = None) -> Percentile:
    ok = value is not None and n is not None and n >= required(p)
    if value is not None and not ok:
        note = note or (f"{n} transactions behind p{p:g}, fewer than the {required(p)} it needs"
                        if n is not None else "no transaction count")
    return Percentile(p, value, n, ok, source, note)


# -- the full distribution ----------------------------------------------------------------

Bucket = tuple[float, float, int]     # (lower us, upper us, count)


def from_histogram(buckets: Sequence[Bucket], ps: Iterable[float]) -> list[Percentile]:
    """Each percentile from a histogram, interpolated linearly inside its bucket."""
    rows = sorted(b for b in buckets if b[2] > 0)
    n = sum(b[2] for b in rows)
    out = []
    for p in ps:
        if n == 0:
            out.append(Percentile(p, None, 0, False, "histogram", "empty histogram"))
            continue
        rank = p / 100 * n
        seen = 0
        value = rows[-1][1]
        for lo, hi, c in rows:
            if seen + c >= rank:
                value = lo + (hi - lo) * (rank - seen) / c
                break
            seen += c
        out.append(_mark(p, round(value, 3), n, "histogram"))
    return out


def from_values(values_us: Sequence[float], ps: Iterable[float]) -> list[Percentile]:
    """Each percentile of per-transaction times (nearest rank)."""
    xs = sorted(values_us)
    n = len(xs)
    out = []
    for p in ps:
        if not n:
            out.append(Percentile(p, None, 0, False, "transactions", "no transactions"))
            continue
        k = max(0, min(n - 1, math.ceil(round(p / 100 * n, 9)) - 1))   # 99.9 % of 1e5 is 99900, not 99900.00000000001
        out.append(_mark(p, xs[k], n, "transactions"))
    return out


def merge(hists: Sequence[Sequence[Bucket]]) -> list[Bucket]:
    """Histograms of concurrent instances with the same buckets, added up."""
    acc: dict[tuple[float, float], int] = {}
    for h in hists:
        for lo, hi, c in h:
            acc[(lo, hi)] = acc.get((lo, hi), 0) + c
    return [(lo, hi, c) for (lo, hi), c in sorted(acc.items())]


def cdf(buckets: Sequence[Bucket]) -> list[tuple[float, float]]:
    """(upper edge us, share of transactions at or below it), for the report's CDF."""
    rows = sorted(b for b in buckets if b[2] > 0)
    n = sum(b[2] for b in rows)
    out, seen = [], 0
    for _, hi, c in rows:
        seen += c
        out.append((hi, seen / n))
    return out


_NETPERF_ROWS = {"UNIT_USEC": 1, "TEN_USEC": 10, "HUNDRED_USEC": 100, "UNIT_MSEC": 1e3,
                 "TEN_MSEC": 1e4, "HUNDRED_MSEC": 1e5, "UNIT_SEC": 1e6, "TEN_SEC": 1e7}


def netperf_histogram(text: str) -> list[Bucket] | None:
    """netperf's "Histogram of request/response times" (``-v 2``, builds with
    ``--enable-histogram``): per decade row ten buckets of that decade's width, bucket k of
    row UNIT_MSEC holding [k ms, k+1 ms); the ">100_SECS" count beyond. None when absent."""
    if "Histogram of" not in (text or ""):
        return None
    out: list[Bucket] = []
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        width = _NETPERF_ROWS.get(name.strip())
        if width is not None:
            counts = [int(x) for x in rest.replace(":", " ").split()]
            for k, c in enumerate(counts[:10]):
                out.append((k * width, (k + 1) * width, c))
        elif name.strip() == ">100_SECS":
            c = int(rest.strip() or 0)
            out.append((1e8, 1e9, c))
    return out or None


# -- what a sample records ------------------------------------------------------------------

def choose(ps: Sequence[float], metrics: Mapping[str, float], *, histogram: Sequence[Bucket] | None = None,
           values_us: Sequence[float] | None = None, tool: str = "the tool",
           duration_s: float | None = None) -> list[Percentile]:
    """The chosen percentiles of one sample from the best source it has: per-transaction
    times, a histogram, else the tool's own figures with the transaction count the sample's
    rate and interval give. ``duration_s``: the sample's length, so an insufficient
    percentile's note says how long a sample at this rate would need to be."""
    return _lost(_needs(_from_best(ps, metrics, histogram, values_us, tool), duration_s), metrics)


def _from_best(ps: Sequence[float], metrics: Mapping[str, float], histogram: Sequence[Bucket] | None,
               values_us: Sequence[float] | None, tool: str) -> list[Percentile]:
    if values_us:
        return from_values(values_us, ps)
    if histogram:
        return from_histogram(histogram, ps)
    n = None
    if "transactions_per_s" in metrics and "duration_s" in metrics:
        n = int(round(metrics["transactions_per_s"] * metrics["duration_s"]))
    out = []
    for p in ps:
        key = metric_name(float(p))     # netperf's P50/P90/P99 selectors; sockperf's p25 .. p99.999
        if key in metrics:
            out.append(_mark(p, metrics[key], n, "tool"))
        else:
            out.append(Percentile(p, None, n, False, "unavailable",
                                  f"{tool} gave no p{p:g} and no distribution to compute it from"))
    return out


def _lost(chosen: list[Percentile], metrics: Mapping[str, float]) -> list[Percentile]:
    """Percentiles of the answered requests only, where an open-loop client sent more than it
    got answers to (sockperf's ``offered_per_s`` beside ``transactions_per_s``): a request
    with no reply has no time, so a percentile past the answered share lies among the lost
    requests, and the figure over the answered ones would be a guess at it."""
    sent, got = metrics.get("offered_per_s"), metrics.get("transactions_per_s")
    if not sent or got is None or sent <= 0 or got >= sent:
        return chosen
    share = got / sent
    return [replace(c, sufficient=False,
                    note=f"{1 - share:.2%} of the requests got no reply: p{c.p:g} lies among them")
            if c.sufficient and c.p / 100 > share else c for c in chosen]


def _needs(chosen: list[Percentile], duration_s: float | None) -> list[Percentile]:
    """An insufficient percentile's note with the sample length its rate would need: what
    to ask for up front (a p99.9 needs 10,000 transactions; a TCG guest answering 300 a
    second needs 34 s, not the 10 s that suits its p50)."""
    if not duration_s or duration_s <= 0:
        return chosen
    out = []
    for c in chosen:
        if not c.sufficient and c.value_us is not None and c.n:
            rate = c.n / duration_s
            need = math.ceil(required(c.p) / rate)
            c = replace(c, note=f"{c.note}: at {rate:,.0f} transactions/s, a sample of {need} s or more would have it")
        out.append(c)
    return out


def apply(metrics: Mapping[str, float], chosen: Sequence[Percentile]) -> dict[str, float]:
    """The sample's metrics with its percentiles as chosen: sufficient ones set, every other
    percentile metric (insufficient, not chosen) left out."""
    out = {k: v for k, v in metrics.items() if not METRIC_RE.fullmatch(k)}
    out.update({c.metric: c.value_us for c in chosen if c.sufficient and c.value_us is not None})
    return out


def insufficient(chosen: Sequence[Percentile]) -> list[str]:
    return [f"p{c.p:g}: {c.note}" for c in chosen if not c.sufficient]


def rank_of(buckets: Sequence[Bucket], value_us: float) -> float:
    """Share of transactions at or below ``value_us`` (for plots)."""
    edges = [hi for _, hi, _ in sorted(buckets)]
    i = bisect.bisect_right(edges, value_us)
    n = sum(c for *_, c in buckets) or 1
    return sum(c for _, hi, c in sorted(buckets)[:i]) / n
