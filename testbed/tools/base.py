"""The interface every traffic tool implements, and the result record all of them return.

Drivers build argv (and uperf's profile XML) from a ``Profile`` and parse what the tool
printed. Parsers are pure: strings in, ``ToolResult`` out. A run that failed never yields a
metric, so a broken run can never pass for a slow one.
"""
from __future__ import annotations

import ipaddress
import math
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import ClassVar

from testbed.errors import TestbedError
from testbed.topology.model import Profile, Protocol, Tool

#: Canonical metric names. Every driver reports only these, in these units, so a table or a
#: comparison never has to know which tool measured a number.
METRICS: Mapping[str, str] = MappingProxyType({
    "throughput_mbps": "application payload rate, 10^6 bit/s; the receiver's figure where the "
                       "tool reports one (UDP: what arrived); request/response and bidirectional "
                       "count both directions",
    "transactions_per_s": "completed request/response (or connect/request/response) exchanges "
                          "per second; uperf: iterations of the timed transaction",
    "latency_mean_us": "mean time of one transaction in microseconds (netperf: the histogram "
                       "mean, per send() on stream tests; uperf: the timed transaction's average)",
    "latency_min_us": "minimum transaction time, us",
    "latency_max_us": "maximum transaction time, us",
    "latency_stddev_us": "standard deviation of the transaction time, us",
    "latency_p50_us": "50th percentile transaction time, us",
    "latency_p90_us": "90th percentile transaction time, us",
    "latency_p99_us": "99th percentile transaction time, us",
    "throughput_out_mbps": "bidirectional: client-to-server payload rate, 10^6 bit/s",
    "throughput_in_mbps": "bidirectional: server-to-client payload rate, 10^6 bit/s",
    "latency_out_mean_us": "bidirectional: mean time of one client-to-server transaction, us",
    "latency_in_mean_us": "bidirectional: mean time of one server-to-client transaction, us",
    "udp_sent_msgs": "UDP datagrams sent (iperf3: as counted by the receiver's sequence numbers)",
    "udp_recv_msgs": "UDP datagrams received",
    "loss_pct": "UDP datagrams lost, percent of those sent",
    "jitter_ms": "UDP inter-arrival jitter (RFC 3550), ms",
    "retransmits": "TCP segments retransmitted during the test",
    "local_cpu_pct": "client-side CPU utilisation, percent, as the tool measures it (netperf: the "
                     "whole system, all CPUs = 100; iperf3: its own process, one CPU = 100)",
    "remote_cpu_pct": "server-side CPU utilisation, percent, same caveat as local_cpu_pct",
    "local_sd_us_per_kb": "client service demand: CPU microseconds per KB transferred",
    "remote_sd_us_per_kb": "server service demand: CPU microseconds per KB transferred",
    "confidence_achieved": "1.0 when the requested confidence interval was met, 0.0 when not "
                           "(present only when confidence intervals were requested)",
    "confidence_interval_pct": "measured width of the throughput confidence interval, percent "
                               "of the mean (netperf THROUGHPUT_CONFID)",
    "errors": "errors the tool counted (netperf UDP send errors, uperf failed operations)",
    "bytes": "payload bytes the tool counted as transferred",
    "operations": "operations the tool counted (uperf flowops)",
    "duration_s": "length of the measured interval, seconds",
    "offered_per_s": "requests per second the client sent over the measured interval (sockperf); "
                     "for an open-loop target, the load actually offered (replies are "
                     "transactions_per_s)",
    "msgs_sent": "request/response: requests the client sent over its whole run, warm-up "
                 "included (sockperf); what the wire cross-check counts on the client's device",
    "msgs_replied": "request/response: replies the client received over its whole run, warm-up "
                    "included (sockperf)",
})

#: Keys an interval sample may carry besides the canonical metrics.
INTERVAL_KEYS: frozenset[str] = frozenset(METRICS) | {
    "timestamp_ms",   # wall-clock end of the interval, ms since the Unix epoch
    "start_s",        # interval start, seconds since the test started
    "end_s",          # interval end, seconds since the test started
    "omitted",        # 1.0: iperf3 -O warm-up interval, not part of the totals
    "instance",       # index of the concurrent instance (after aggregate)
}

#: Sizes used when a Profile leaves them open. Every driver passes sizes explicitly, so the
#: same Profile means the same traffic whichever tool runs it (tool defaults differ: netperf
#: sends its socket buffer size, iperf3 128 KiB, uperf nothing at all).
DEFAULT_STREAM_SIZE = 16384
DEFAULT_UDP_SIZE = 1472          # one datagram per 1500-byte frame: 1500 - 20 (IP) - 8 (UDP)
DEFAULT_RR_SIZE = 1              # netperf's default request and response size

_HOSTNAME_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,62})(?:\.[A-Za-z0-9-]{1,63})*$")


class UnsupportedProfile(TestbedError, ValueError):
    """The tool cannot produce this traffic pattern (or option) faithfully."""

    exit_status = 2


def _frozen(values: Mapping[str, float], allowed: Iterable[str], what: str) -> Mapping[str, float]:
    from testbed.records.percentiles import METRIC_RE
    out = {str(k): float(v) for k, v in dict(values).items()}
    # any chosen percentile (latency_p99_9_us...) is canonical too (testbed.records.percentiles)
    unknown = sorted(k for k in set(out) - set(allowed) if not METRIC_RE.fullmatch(k))
    if unknown:
        raise ValueError(f"{what}: not canonical names: {unknown}")
    bad = sorted(k for k, v in out.items() if not math.isfinite(v))
    if bad:
        raise ValueError(f"{what}: non-finite values for {bad}")
    return MappingProxyType(out)


@dataclass(frozen=True)
class ToolResult:
    """What one tool run measured. Failed results carry a reason and no metrics."""

    ok: bool
    reason: str | None = None
    metrics: Mapping[str, float] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    intervals: tuple[Mapping[str, float], ...] = ()

    def __post_init__(self) -> None:
        if self.ok == bool(self.reason):
            raise ValueError("a ToolResult has a reason exactly when it failed")
        metrics = _frozen(self.metrics, METRICS, "metrics")
        if not self.ok and metrics:
            raise ValueError("a failed ToolResult carries no metrics")
        object.__setattr__(self, "metrics", metrics)
        object.__setattr__(self, "warnings", tuple(str(w) for w in self.warnings))
        object.__setattr__(self, "intervals",
                           tuple(_frozen(i, INTERVAL_KEYS, "interval") for i in self.intervals))

    def __hash__(self) -> int:
        # mappingproxy is unhashable; hash an equivalent tuple so results can sit in sets
        return hash((self.ok, self.reason, tuple(sorted(self.metrics.items())), self.warnings,
                     tuple(tuple(sorted(i.items())) for i in self.intervals)))

    @classmethod
    def failed(cls, reason: str, warnings: Iterable[str] = ()) -> ToolResult:
        return cls(ok=False, reason=reason, warnings=tuple(warnings))


class ToolDriver(ABC):
    """One traffic tool: argv for both ends, a pure parser, and how N instances combine."""

    name: ClassVar[Tool]
    #: how the binary reports its version (on this host, in a guest image): argv after the
    #: program's name, and the pattern whose first group is the version
    version_args: ClassVar[tuple[str, ...]] = ("--version",)
    version_re: ClassVar[str] = r"(\d+(?:\.\d+)+)"
    #: profile options only this tool has (e.g. netperf's confidence iterations)
    options: ClassVar[frozenset[str]] = frozenset()
    #: why the loss-bounded rate search (udp_ndr) cannot use this tool; None: it can
    search_unsupported: ClassVar[str | None] = "this tool sends no paced UDP stream for the rate search"
    #: how its pacing schedules work: "open" (sends on a schedule whatever the replies:
    #: queueing delay shows in the latency) or "closed" (the next transaction waits for the
    #: last reply, so a slow reply delays the schedule and hides queueing: coordinated omission)
    pacing_loop: ClassVar[str] = "closed"
    #: "system": each instance reports whole-host CPU (concurrent instances see the same CPU,
    #: so average it); "process": each reports its own process (sum it).
    cpu_scope: ClassVar[str] = "system"
    #: How a cell's connection count is realised: "processes" (N synchronised client
    #: instances, aggregated: netperf) or "streams" (one client with N streams or threads:
    #: iperf3 -P, uperf nthreads).
    connections_as: ClassVar[str] = "processes"
    #: True when one server process serves test after test without carrying anything from
    #: one to the next (netserver forks a child per test). It is then started once per test
    #: path and checked before each sample, instead of being started and stopped per sample.
    reusable_server: ClassVar[bool] = False
    #: the port the server listens on unless told otherwise
    default_port: ClassVar[int | None] = None
    #: seconds from the client's start in which the tool may fall silent by design (sockperf
    #: sleeps after its warm-up messages): a silence that begins then is not a link flap
    quiet_start_s: ClassVar[float] = 0.0

    def pacing_reason(self, protocol: Protocol, pattern: object, rate: object) -> str | None:
        """Why this tool cannot express a target ``rate`` (tools.pacing.Rate) on ``pattern``
        (None: it can, if the installed build paces at all, which is found by trying)."""
        return None

    def pacing_probe(self, write: Callable[[str, str], None] | None) -> list[str] | str:
        """argv that tries the pacing option against a port nobody listens on (9: discard),
        or why no probe can run. ``write(path, text)`` writes a file where it runs."""
        return f"{self.name.value} has no pacing"

    def pacing_verdict(self, stdout: str, stderr: str, rc: int) -> str | None:
        """Pure: what the probe printed -> None when the binary paces, else why not."""
        first = (f"{stdout}\n{stderr}".strip().splitlines() or [f"exit status {rc}, no output"])[0]
        return f"{self.name.value} pacing probe gave no recognisable answer: {first}"

    @abstractmethod
    def unsupported_reason(self, profile: Profile) -> str | None:
        """Why this tool cannot run ``profile`` (None: it can). For skips with a reason."""

    @abstractmethod
    def server_argv(self, profile: Profile, *, port: int | None = None) -> list[str]:
        """argv that runs the server side in the foreground, in the peer."""

    @abstractmethod
    def client_argv(self, profile: Profile, server_addr: str, *, port: int | None = None,
                    confidence: tuple[int, int] | None = None,
                    iterations: tuple[int, int] | None = None) -> list[str]:
        """argv for the client side; raises UnsupportedProfile for what the tool cannot do."""

    @abstractmethod
    def parse(self, stdout: str, stderr: str = "", rc: int = 0) -> ToolResult:
        """Pure: what the client printed (and its exit status) -> ToolResult."""

    #: True when the server's own output says whether the run went well (uperf's slave logs
    #: its errors only there); it is then collected when the server stops, for parse_sample.
    reads_server_output: ClassVar[bool] = False

    def parse_sample(self, stdout: str, stderr: str = "", rc: int = 0, *, profile: Profile,
                     server_output: str = "") -> ToolResult:
        """``parse`` with what only a measurement knows: the profile that ran, the server's output."""
        return self.parse(stdout, stderr, rc)

    def distribution(self, stdout: str) -> list[tuple[float, float, int]] | None:
        """The latency histogram the client printed, as (lower us, upper us, count) buckets
        (testbed.records.percentiles); None when the tool prints none."""
        return None

    def aggregate(self, results: Sequence[ToolResult]) -> ToolResult:
        """Combine N concurrent instances of this tool into one result."""
        return aggregate(results, cpu_scope=self.cpu_scope)

    def client_plan(self, profile: Profile, server_addr: str, *, port: int | None, connections: int,
                    write_file: Callable[[str, str], object]) -> tuple[list[str], int]:
        """(argv, number of client processes) that realise ``connections`` connections. The
        default runs ``connections`` synchronised instances ("processes"); a tool that opens
        N streams itself overrides this. ``write_file(path, text)`` writes a file where the
        client runs, for a tool that reads its test from one (uperf's profile XML)."""
        if self.connections_as != "processes":
            raise UnsupportedProfile(f"{self.name.value}: no way to run {connections} connections")
        return self.client_argv(profile, server_addr, port=port, confidence=profile.confidence,
                                iterations=profile.iterations), connections

    def runs(self, profile: Profile) -> int:
        """How many times the client runs the test back to back (netperf's confidence
        iterations): the per-sample timeout counts them all."""
        return 1

    def _check(self, profile: Profile) -> None:
        if profile.tool != self.name:
            raise UnsupportedProfile(f"profile {profile.name!r} is for {profile.tool.value}, "
                                     f"not {self.name.value}")
        reason = self.unsupported_reason(profile)
        if reason:
            raise UnsupportedProfile(f"profile {profile.name!r}: {reason}")


# -- argv helpers shared by the drivers ---------------------------------------------------

def check_addr(addr: str) -> str:
    """An IP address or a plain hostname; anything else could smuggle options or markup."""
    try:
        return str(ipaddress.ip_address(addr))
    except ValueError:
        if _HOSTNAME_RE.fullmatch(addr) and len(addr) <= 253:
            return addr
    raise UnsupportedProfile(f"server address {addr!r} is neither an IP address nor a hostname")


def check_port(port: int | None) -> int | None:
    if port is not None and not (isinstance(port, int) and 0 < port < 65536):
        raise UnsupportedProfile(f"port {port!r} is not in 1..65535")
    return port


def sizes(profile: Profile) -> tuple[int, int]:
    """(send or request size, response size) with the documented defaults filled in."""
    if profile.pattern.is_transactional:
        req = profile.message_size or DEFAULT_RR_SIZE
        return req, profile.response_size or req
    default = DEFAULT_UDP_SIZE if profile.protocol is Protocol.UDP else DEFAULT_STREAM_SIZE
    size = profile.message_size or default
    return size, size


def no_confidence(tool: str, confidence: object, iterations: object) -> None:
    if confidence is not None or iterations is not None:
        raise UnsupportedProfile(f"{tool} has no confidence-interval iterations; repeat the "
                                 "sample instead (testbed.analysis.stats)")


# -- what every sample must show before its figures count ------------------------------

#: A tool interval shorter than this share of the requested duration fails the sample.
MIN_INTERVAL_SHARE = 0.9


#: what a parser raises on output it was not written for (a tool version that prints a
#: field differently): the sample fails with it, the run goes on
PARSE_ERRORS = (ValueError, KeyError, IndexError, TypeError, ArithmeticError, AttributeError)


def read_sample(driver: ToolDriver, stdout: str, stderr: str, rc: int, *, profile: Profile,
                server_output: str = "") -> ToolResult:
    """The driver's parse of one client's output, vetted (:func:`vet`). A parser that
    raises on output it does not know fails that sample with the error in its reason (the
    raw output is kept in the run), never the run."""
    try:
        res = driver.parse_sample(stdout, stderr, rc, profile=profile, server_output=server_output)
    except PARSE_ERRORS as e:
        return ToolResult.failed(f"{driver.name.value} output could not be read ({type(e).__name__}: {e}); "
                                 f"its raw output is kept in the run")
    return vet(res, profile)


def vet(result: ToolResult, profile: Profile) -> ToolResult:
    """A run that exited 0 but moved nothing, or measured over a much shorter interval than
    asked for (a peer that went away, a test cut short), fails with its figures."""
    if not result.ok:
        return result
    m = result.metrics
    key = profile.pattern.primary_metric
    if key in m and m[key] <= 0:
        extra = f" ({w})" if (w := next((w for w in result.warnings if "0 of" in w), None)) else ""
        return ToolResult.failed(f"{profile.tool.value} exited 0 but reported {key} {m[key]:g}{extra}",
                                 result.warnings)
    secs = m.get("duration_s")
    if secs is not None and secs < MIN_INTERVAL_SHARE * profile.duration_s:
        return ToolResult.failed(f"{profile.tool.value} measured over {secs:.2f} s, less than "
                                 f"{MIN_INTERVAL_SHARE:g} of the requested {profile.duration_s} s",
                                 result.warnings)
    return result


# -- combining concurrent instances -------------------------------------------------------

_SUMMED = ("throughput_mbps", "transactions_per_s", "udp_sent_msgs", "udp_recv_msgs",
           "retransmits", "errors", "bytes", "operations", "offered_per_s", "msgs_sent", "msgs_replied")


def aggregate(results: Sequence[ToolResult], *, cpu_scope: str = "system") -> ToolResult:
    """Sum rates and counts, weight latency by transactions, fail if any instance failed."""
    n = len(results)
    if n == 0:
        return ToolResult.failed("no results to aggregate")
    failed = [f"instance {i} of {n} failed: {r.reason}" for i, r in enumerate(results, 1)
              if not r.ok]
    if failed:
        return ToolResult.failed("; ".join(failed),
                                 [f"instance {i}: {w}" for i, r in enumerate(results, 1)
                                  for w in r.warnings])
    if n == 1:
        return results[0]

    warnings = [f"instance {i}: {w}" for i, r in enumerate(results, 1) for w in r.warnings]
    names = {k for r in results for k in r.metrics}
    full = {k for k in names if all(k in r.metrics for r in results)}
    for k in sorted(names - full):
        warnings.append(f"{k} reported by only some of {n} instances; left out")

    def col(k: str) -> list[float]:
        return [r.metrics[k] for r in results]

    out: dict[str, float] = {k: sum(col(k)) for k in _SUMMED if k in full}
    if {"udp_sent_msgs", "udp_recv_msgs"} <= full and out["udp_sent_msgs"] > 0:
        out["loss_pct"] = 100.0 * (out["udp_sent_msgs"] - out["udp_recv_msgs"]) / out["udp_sent_msgs"]
    elif "loss_pct" in full:
        out["loss_pct"] = sum(col("loss_pct")) / n

    # Latency: each instance's mean stands for its transactions, so weight by its rate.
    w = col("transactions_per_s") if "transactions_per_s" in full else [1.0] * n
    if sum(w) <= 0:
        w = [1.0] * n
    if "latency_mean_us" in full:
        mean = _wmean(col("latency_mean_us"), w)
        out["latency_mean_us"] = mean
        if "latency_stddev_us" in full:   # pooled: E[X^2] over the mixture minus mean^2
            ex2 = _wmean([s * s + m * m for s, m in zip(col("latency_stddev_us"),
                                                        col("latency_mean_us"))], w)
            out["latency_stddev_us"] = math.sqrt(max(ex2 - mean * mean, 0.0))
    if "latency_min_us" in full:
        out["latency_min_us"] = min(col("latency_min_us"))
    if "latency_max_us" in full:
        out["latency_max_us"] = max(col("latency_max_us"))
    from testbed.records.percentiles import METRIC_RE, from_metric, required
    pct = sorted(k for k in full if METRIC_RE.fullmatch(k))   # p50 .. p99.999, whichever all gave
    if {"transactions_per_s", "duration_s"} <= full:
        # the largest instance's percentile stands for the whole only where each instance's
        # own rests on the transactions it needs: a pair's two clients at 1,000/s for 6 s
        # give 12,000 between them, but each p99.9 rests on 6,000 (six above it)
        least = min(t * d for t, d in zip(col("transactions_per_s"), col("duration_s")))
        need = {k: required(from_metric(k) or 0.0) for k in pct}
        for k in pct:
            if least < need[k]:
                warnings.append(f"{k} left out: an instance's own figure rests on {least:.0f} transactions, "
                                f"fewer than the {need[k]} it needs")
        pct = [k for k in pct if least >= need[k]]
    for k in pct:
        out[k] = max(col(k))
    if pct:
        warnings.append(f"latency percentiles of {n} instances combined as the largest "
                        "(an upper bound of the combined percentile)")
    if "jitter_ms" in full:
        jw = col("udp_recv_msgs") if "udp_recv_msgs" in full and sum(col("udp_recv_msgs")) else [1.0] * n
        out["jitter_ms"] = _wmean(col("jitter_ms"), jw)

    for side in ("local", "remote"):
        cpu, sd = f"{side}_cpu_pct", f"{side}_sd_us_per_kb"
        if cpu in full:
            out[cpu] = sum(col(cpu)) / (n if cpu_scope == "system" else 1)
        if sd in full and all(v > 0 for v in col(sd)):
            if cpu_scope == "system":
                # every instance charged the whole host's CPU to its own bytes: SD_i = C/T_i,
                # so the host's demand over all bytes is C/sum(T_i) = 1/sum(1/SD_i)
                out[sd] = 1.0 / sum(1.0 / v for v in col(sd))
            elif "throughput_mbps" in full and out.get("throughput_mbps", 0) > 0:
                out[sd] = _wmean(col(sd), col("throughput_mbps"))

    if "confidence_achieved" in full:
        out["confidence_achieved"] = min(col("confidence_achieved"))
    if "confidence_interval_pct" in full:
        out["confidence_interval_pct"] = max(col("confidence_interval_pct"))
    if "duration_s" in full:
        out["duration_s"] = max(col("duration_s"))

    intervals = tuple({**iv, "instance": float(i)} for i, r in enumerate(results, 1)
                      for iv in r.intervals)
    return ToolResult(ok=True, metrics=out, warnings=tuple(warnings), intervals=intervals)


def _wmean(values: Sequence[float], weights: Sequence[float]) -> float:
    return sum(v * w for v, w in zip(values, weights)) / sum(weights)


def error_line(texts: Iterable[str], pattern: re.Pattern[str],
               ignore: re.Pattern[str] | None = None) -> str | None:
    """The first line that looks like an error; else the last line of the first text that has
    any (pass stderr before stdout). None when the tool printed nothing at all."""
    per_text = [[ln.strip() for ln in re.split(r"[\r\n]+", t or "")
                 if ln.strip() and not (ignore is not None and ignore.search(ln))] for t in texts]
    for lines in per_text:
        for ln in lines:
            if pattern.search(ln):
                return ln
    return next((lines[-1] for lines in per_text if lines), None)
