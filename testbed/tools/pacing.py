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

import re
from collections.abc import Callable
from dataclasses import dataclass

from testbed.topology.model import Pattern, Profile, Protocol, Tool

_RATE_RE = re.compile(r"^(?P<num>[0-9]+(?:\.[0-9]+)?)\s*(?P<unit>bit|kbit|mbit|gbit|tps)$")
_BITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9}
#: a pair more than this short of its target marks the cell saturated (capacity_model reads it)
SHORTFALL = 0.05
#: netperf's interval when pacing (ms): bursts every 10 ms, fine enough for 1 s reporting
NETPERF_INTERVAL_MS = 10


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
    if m["unit"] == "tps":
        if value < 1 or value != int(value) or value > 10**8:
            raise ValueError(f"{text!r}: transactions per second must be a whole number in 1..1e8")
        return Rate(t, tps=int(value))
    bps = round(value * _BITS[m["unit"]])
    if not 1000 <= bps <= 10**12:
        raise ValueError(f"{text!r}: a bit rate must lie in 1kbit..1000gbit")
    return Rate(t, bps=bps)


def express_reason(tool: Tool, protocol: Protocol, pattern: Pattern, rate: Rate) -> str | None:
    """Why ``tool`` cannot express this target on this pattern (None: it can, if the
    installed build paces at all, which is found by trying)."""
    if pattern.is_transactional and rate.bps is not None:
        return "a request/response pattern is paced in transactions per second (e.g. 5000tps), not bits"
    if not pattern.is_transactional and rate.tps is not None:
        return "a stream pattern is paced in bits per second (e.g. 2gbit), not transactions"
    if tool is Tool.IPERF3 and rate.tps is not None:
        return "iperf3 paces bits only"
    if tool is Tool.UPERF and rate.bps is not None:
        return ("uperf paces transactions per second (<transaction rate=...>), not bits; "
                "use iperf3 for a bit-rate target")
    if tool is Tool.NETPERF and pattern is Pattern.CRR:
        return "netperf's interval pacing does not cover TCP_CRR"
    return None


#: how each tool's pacing schedules work: "open" (sends on a schedule whatever the replies:
#: queueing delay shows in the latency) or "closed" (the next transaction waits for the last
#: reply, so a slow reply delays the schedule and hides queueing: coordinated omission)
LOOP: dict[Tool, str] = {
    Tool.IPERF3: "open",     # UDP datagrams on its pacing timer; iperf3 times no transactions
    Tool.UPERF: "closed",    # rate.c paces each thread's transactions, one outstanding at a time
    Tool.NETPERF: "closed",  # -w/-b: bursts of transactions per interval, each waiting its reply
}


def loop_label(tool: Tool) -> str:
    """What a paced sample's latency is: the label the records and report carry."""
    return ("open-loop" if LOOP.get(tool) == "open" else
            "closed-loop (coordinated omission: a late reply delays the next request, so "
            "queueing delay is under-reported)")


def resolve_fraction(cell, profiles, outcomes) -> tuple[object, str | None]:
    """A cell paced at a fraction of a maximum (``rates: [0.5max]``) with its target per
    pair resolved from the maximum its base profile measured earlier in this run: (cell,
    None), or (cell, why not) when that maximum is missing or failed. ``profiles``: the
    matrix's; ``outcomes``: the run's cell entries so far (run.json ``cells``)."""
    import dataclasses
    p = cell.profile
    if p.rate_fraction is None:
        return cell, None
    base = next((q for q in profiles if q.name == p.rate_of), None)
    if base is None:
        return cell, f"profile {p.rate_of!r}, whose maximum {p.rate} is a fraction of, is not in the matrix"
    sibling = dataclasses.replace(cell, profile=base).id
    out = next((o for o in outcomes if o.get("id") == sibling), None)
    mean = (((out or {}).get("summary") or {}).get(base.pattern.primary_metric) or {}).get("mean")
    if out is None or out.get("status") == "failed" or not mean:
        return cell, (f"{p.rate}: the maximum of {sibling} was not measured in this run"
                      + (f" ({out.get('reason')})" if out and out.get("reason") else ""))
    per_pair = mean / max(1, cell.pairs)
    tps = max(1, round(p.rate_fraction * per_pair))
    return dataclasses.replace(cell, profile=dataclasses.replace(p, rate_tps=tps)), None


def per_stream(target: int, streams: int) -> int:
    """iperf3 -b and uperf's rate are per stream/thread: split a pair's target among them."""
    return max(1, target // max(1, streams))


def netperf_burst(profile: Profile) -> int:
    """Sends (stream) or transactions (rr) per NETPERF_INTERVAL_MS for the profile's target."""
    per_s = (profile.rate_tps if profile.rate_tps is not None else
             (profile.rate_bps or 0) / (8 * max(1, profile.message_size or 16384)))
    return max(1, round(per_s * NETPERF_INTERVAL_MS / 1000))


# --------------------------------------------------------------------------- detection

#: argv that tries the tool's pacing option against a port nobody listens on (9: discard)
PROBES: dict[Tool, list[str]] = {
    Tool.IPERF3: ["iperf3", "-c", "127.0.0.1", "-p", "9", "-t", "1", "-b", "1000"],
    Tool.NETPERF: ["netperf", "-H", "127.0.0.1", "-p", "9", "-l", "1", "-t", "TCP_RR",
                   "-w", str(NETPERF_INTERVAL_MS), "-b", "1"],
}


def probe_verdict(tool: Tool, stdout: str, stderr: str, rc: int) -> str | None:
    """Pure: what a probe printed -> None when the binary paces, else why not."""
    out = f"{stdout}\n{stderr}"
    low = out.lower()
    if tool is Tool.NETPERF:
        if "not compiled in" in low:
            lines = [ln.strip() for ln in out.splitlines() if "not compiled in" in ln.lower()]
            return (f"the installed netperf has no interval pacing ({'; '.join(lines)}): it needs a "
                    f"build configured with --enable-intervals and --enable-burst")
        if "establish control" in low or "establish_control" in low or "netserver" in low:
            return None         # got past the options to the connection: -w/-b accepted
    elif tool is Tool.IPERF3:
        if "unrecognized option" in low or "invalid option" in low or "parameter" in low and "error" in low:
            return f"the installed iperf3 refuses -b: {out.strip().splitlines()[0] if out.strip() else rc}"
        if "unable to connect" in low or "connection refused" in low:
            return None
    elif tool is Tool.UPERF:
        if "error" in low and "rate" in low:
            return f"the installed uperf refuses <transaction rate=...>: {out.strip()[:200]}"
        if "connect" in low or "refused" in low:
            return None
    first = out.strip().splitlines()[0] if out.strip() else f"exit status {rc}, no output"
    return f"{tool.value} pacing probe gave no recognisable answer: {first}"


def uperf_probe_xml() -> str:
    """A one-transaction profile with a rate, aimed at the discard port: uperf's parser
    reads the rate before it connects."""
    return ('<?xml version="1.0"?>\n<profile name="tb-pace-probe">\n  <group nthreads="1">\n'
            '    <transaction duration="1s" rate="10">\n'
            '      <flowop type="connect" options="remotehost=127.0.0.1 protocol=tcp port=9"/>\n'
            '    </transaction>\n  </group>\n</profile>\n')


class Detector:
    """Per run: tool -> None (paces) or why not, asked once per place the tool runs (a
    guest image, this host's namespaces). ``run(argv) -> (stdout, stderr, rc)``."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, Tool], str | None] = {}

    def reason(self, where: str, tool: Tool, run: Callable[[list[str]], tuple[str, str, int]],
               write: Callable[[str, str], None] | None = None) -> str | None:
        key = (where, tool)
        if key not in self._cache:
            if tool is Tool.UPERF:
                path = "/tmp/tb-pace-probe.xml"
                if write is None:
                    self._cache[key] = "uperf pacing probe needs a file on the client"
                    return self._cache[key]
                write(path, uperf_probe_xml())
                argv = ["uperf", "-m", path, "-P", "9"]
            else:
                argv = list(PROBES[tool])
            try:
                out, err, rc = run(argv)
            except Exception as e:   # the binary is missing, the agent failed: say so
                self._cache[key] = f"{tool.value} pacing probe could not run: {e}"
            else:
                self._cache[key] = probe_verdict(tool, out, err, rc)
        return self._cache[key]


def shortfall(target: float | None, achieved: float | None) -> bool:
    """More than 5 % short of the target."""
    return (target is not None and achieved is not None and target > 0
            and achieved < target * (1 - SHORTFALL))
