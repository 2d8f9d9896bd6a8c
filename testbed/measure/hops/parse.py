"""The tracer's output, and the statistics made from it. Pure.

The program (templates/tracing/hops.bt.j2) prints, when it stops, one line per histogram
bucket that saw a packet::

    @h[5, 6, 1200]: 17        hop from point 5 to point 6, 1200..1299 ns, 17 packets
    @s[1, 48000]: 3           span 1, 48000..48999 ns, 3 transactions

A bucket keeps two significant digits of nanoseconds (under 100 ns: 1 ns wide), so a
percentile taken at its bucket's middle is within half a bucket (0.5 % to 5 %) of the
exact one.
"""
from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

LINE_RE = re.compile(r"^@([hs])\[(-?\d+(?:,\s*-?\d+)*)\]:\s*(\d+)\s*$")
READY = "tb-hops ready"
END = "tb-hops end"
#: the percentiles each hop reports
PERCENTILES = (50.0, 90.0, 99.0)


class TracerOutputError(ValueError):
    """Output that is not the program's: a line that should have parsed did not."""


@dataclass(frozen=True)
class Output:
    #: (from point, to point) -> {bucket ns: count}
    hops: Mapping[tuple[int, int], Mapping[int, int]]
    #: span id -> {bucket ns: count}
    spans: Mapping[int, Mapping[int, int]]
    ended: bool                 # the program's END ran (it was stopped, not killed)


def parse(text: str) -> Output:
    hops: dict[tuple[int, int], dict[int, int]] = defaultdict(dict)
    spans: dict[int, dict[int, int]] = defaultdict(dict)
    ended = False
    for line in text.splitlines():
        line = line.strip()
        if line == END:
            ended = True
            continue
        if not line.startswith(("@h[", "@s[")):
            continue            # bpftrace's own lines: "Attaching 4 probes...", warnings
        m = LINE_RE.match(line)
        if not m:
            raise TracerOutputError(f"tracer output line not understood: {line[:120]!r}")
        keys = [int(x) for x in m.group(2).split(",")]
        count = int(m.group(3))
        if m.group(1) == "h":
            if len(keys) != 3:
                raise TracerOutputError(f"hop line without from, to and bucket: {line[:120]!r}")
            d = hops[(keys[0], keys[1])]
            d[keys[2]] = d.get(keys[2], 0) + count
        else:
            if len(keys) != 2:
                raise TracerOutputError(f"span line without id and bucket: {line[:120]!r}")
            d = spans[keys[0]]
            d[keys[1]] = d.get(keys[1], 0) + count
    return Output(dict(hops), dict(spans), ended)


def bucket_width(b: int) -> int:
    """The width of the bucket whose lower edge is ``b`` ns (the program's rounding)."""
    if b < 100:
        return 1
    w = 1
    while b >= 100 * w:
        w *= 10
    return min(w, 1_000_000) if b < 100_000_000 else 1


@dataclass(frozen=True)
class Stats:
    n: int
    p50_us: float
    p90_us: float
    p99_us: float
    mean_us: float

    def as_dict(self) -> dict:
        return {"n": self.n, "p50_us": self.p50_us, "p90_us": self.p90_us, "p99_us": self.p99_us,
                "mean_us": self.mean_us}


def stats(buckets: Mapping[int, int]) -> Stats | None:
    """Count, p50, p90, p99 and mean (µs) of a histogram, each value at its bucket's middle."""
    items = sorted((b, c) for b, c in buckets.items() if c > 0)
    n = sum(c for _, c in items)
    if not n:
        return None

    def mid(b: int) -> float:
        return b + (bucket_width(b) - 1) / 2 if b < 100 else b + bucket_width(b) / 2

    def q(p: float) -> float:
        rank = p / 100 * n
        seen = 0
        for b, c in items:
            seen += c
            if seen >= rank:
                return mid(b)
        return mid(items[-1][0])
    mean = sum(mid(b) * c for b, c in items) / n
    return Stats(n, round(q(50) / 1000, 3), round(q(90) / 1000, 3), round(q(99) / 1000, 3), round(mean / 1000, 3))


def merge(parts: Iterable[Mapping[int, int]]) -> dict[int, int]:
    out: dict[int, int] = {}
    for p in parts:
        for b, c in p.items():
            out[b] = out.get(b, 0) + c
    return out


__all__ = ["END", "Output", "PERCENTILES", "READY", "Stats", "TracerOutputError", "bucket_width", "merge",
           "parse", "stats"]
