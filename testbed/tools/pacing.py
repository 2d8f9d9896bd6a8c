"""Paced load: a profile's target rate per pair, what each tool can express, and
whether the installed binary can pace, found by trying it.

``rate: 2gbit`` (bit, kbit, mbit, gbit: decimal bits per second) paces a stream pattern;
``rate: 5000tps`` paces request/response. How each tool paces:

- iperf3: ``-b`` bits per second, per stream: with ``-P N`` each stream gets target/N.
- uperf: the ``rate`` attribute of a ``<transaction>`` (uperf's parse.c ``TOKEN_RATE``;
  rate.c runs that many transactions per second per thread), so transactions per second
  only; with ``nthreads N`` each thread gets target/N.
- netperf: ``-w`` (interval) and ``-b`` (sends or transactions per interval), only in
  builds configured with ``--enable-intervals`` / ``--enable-burst``; a build without them
  prints "Packet rate control is not compiled in." (Debian's netperf 2.7.0 does).

Whether a binary paces is found by running it with the pacing option against a port nobody
listens on: an option the build does not know is refused before it connects; a build that
knows it gets as far as the connection and fails there. The answer is cached per run.
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from testbed.topology.model import Pattern, Protocol

_RATE_RE = re.compile(r"^(?P<num>[0-9]+(?:\.[0-9]+)?)\s*(?P<unit>bit|kbit|mbit|gbit|tps)$")
_BITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9}
#: a pair more than this short of its target marks the cell saturated (capacity_model reads it)
SHORTFALL = 0.05


@dataclass(frozen=True)
class Rate:
    """A parsed target: exactly one of bps and tps is set."""

    text: str
    bps: int | None = None
    tps: int | None = None


def parse_rate(text: str) -> Rate:
    """``2gbit`` -> 2e9 bit/s; ``5000tps`` -> 5000 transactions/s. Raises ValueError."""
    t = str(text).strip().lower()
    m = _RATE_RE.match(t)
    if not m:
        raise ValueError(f"{text!r} is not a rate (a number and bit, kbit, mbit, gbit or tps, "
                         f"e.g. 2gbit or 5000tps)")
    value = float(m["num"])
    if not math.isfinite(value):        # 400 digits are a float's infinity
        raise ValueError(f"{text!r}: not a finite number")
    if m["unit"] == "tps":
        if value < 1 or value != int(value) or value > 10**8:
            raise ValueError(f"{text!r}: transactions per second must be a whole number in 1..1e8")
        return Rate(t, tps=int(value))
    bps = round(value * _BITS[m["unit"]])
    if not 1000 <= bps <= 10**12:
        raise ValueError(f"{text!r}: a bit rate must lie in 1kbit..1000gbit")
    return Rate(t, bps=bps)


def express_reason(driver, protocol: Protocol, pattern: Pattern, rate: Rate) -> str | None:
    """Why ``driver``'s tool cannot express this target on this pattern (None: it can, if
    the installed build paces at all, which is found by trying)."""
    if pattern.is_transactional and rate.bps is not None:
        return "a request/response pattern is paced in transactions per second (e.g. 5000tps), not bits"
    if not pattern.is_transactional and rate.tps is not None:
        return "a stream pattern is paced in bits per second (e.g. 2gbit), not transactions"
    return driver.pacing_reason(protocol, pattern, rate)


def loop_label(driver) -> str:
    """What a paced sample's latency is: the label the records and report carry."""
    return ("open-loop" if driver.pacing_loop == "open" else
            "closed-loop (coordinated omission: a late reply delays the next request, so "
            "queueing delay is under-reported)")


def resolve_fraction(cell, profiles, outcomes) -> tuple[object, str | None]:
    """A cell paced at a fraction of a maximum (``rates: [0.5max]``) with its target per
    pair resolved from the maximum its base profile measured earlier in this run: (cell,
    None), or (cell, why not) when that maximum is missing or failed. ``profiles``: the
    matrix's; ``outcomes``: the run's cell outcomes so far (records.CellOutcome, run.json ``cells``)."""
    import dataclasses
    p = cell.profile
    if p.rate_fraction is None:
        return cell, None
    base = next((q for q in profiles if q.name == p.rate_of), None)
    if base is None:
        return cell, f"profile {p.rate_of!r}, whose maximum {p.rate} is a fraction of, is not in the matrix"
    sibling = dataclasses.replace(cell, profile=base).id
    out = next((o for o in outcomes if o.id == sibling), None)
    mean = out.summary_mean(base.pattern.primary_metric) if out is not None else None
    if out is None or not mean:
        return cell, (f"{p.rate}: the maximum of {sibling} was not measured in this run"
                      + (f" ({out.reason})" if out is not None and out.reason else ""))
    per_pair = mean / max(1, cell.pairs)
    tps = max(1, round(p.rate_fraction * per_pair))
    return dataclasses.replace(cell, profile=dataclasses.replace(p, rate_tps=tps)), None


def per_stream(target: int, streams: int) -> int:
    """iperf3 -b and uperf's rate are per stream/thread: split a pair's target among them."""
    return max(1, target // max(1, streams))


# --------------------------------------------------------------------------- detection

class Detector:
    """Per run: tool -> None (paces) or why not, asked once per place the tool runs (a
    guest image, this host's namespaces). ``run(argv) -> (stdout, stderr, rc)``. The probe
    and its reading are the driver's (ToolDriver.pacing_probe, pacing_verdict)."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, str], str | None] = {}

    def reason(self, where: str, driver, run: Callable[[list[str]], tuple[str, str, int]],
               write: Callable[[str, str], None] | None = None) -> str | None:
        key = (where, driver.name.value)
        if key not in self._cache:
            argv = driver.pacing_probe(write)
            if isinstance(argv, str):
                self._cache[key] = argv
                return argv
            try:
                out, err, rc = run(argv)
            except Exception as e:   # the binary is missing, the agent failed: say so
                self._cache[key] = f"{driver.name.value} pacing probe could not run: {e}"
            else:
                self._cache[key] = driver.pacing_verdict(out, err, rc)
        return self._cache[key]


def shortfall(target: float | None, achieved: float | None) -> bool:
    """More than 5 % short of the target."""
    return (target is not None and achieved is not None and target > 0
            and achieved < target * (1 - SHORTFALL))
