"""sockperf 3.7 (Debian main): argv for its server and its three client modes, and a pure
parser for what they print.

How a profile maps to sockperf:

- request/response, unpaced: ``ping-pong``, one message outstanding (closed loop), the
  unloaded latency floor;
- request/response paced (``rate: 5000tps``): ``under-load --mps N --reply-every 1``, which
  sends on its clock whatever the replies do (open loop) and times every message;
- a TCP stream: ``throughput``, the client's one-way send rate. A UDP stream is refused:
  sockperf's server counts what arrived only when it exits, so what a UDP stream delivered
  is unknown (iperf3 counts it).

Latency comes from the fullest source sockperf has. Each request/response client writes its
per-message round-trip times (``--full-log``); a small shell wrapper around the client
reduces them to a histogram of buckets one hundredth of a decade wide (at most 1 % of the
value) and prints it after sockperf's own summary, so the chosen percentiles are computed
from every message and the report's CDF draws them. sockperf's own percentiles (p25 to
p99.999, each over the "Total N observations" it prints) are parsed too, and checked against
the histogram: its row count, and its buckets at each percentile's rank (_disagrees).

sockperf's quirks, read from its 3.7 source (src/client.cpp) and seen here:

- it exits 0 whatever happened (a refused connection, an unknown option): failure is read
  from what it printed;
- a client sleeps 2 s after its warm-up messages, then runs ``-t`` seconds, of which the
  first 400 ms and the last 50 ms are left out of its statistics ("Valid Duration"); the
  client runs ``duration + 1`` seconds so the measured interval covers the duration asked;
- ``-t`` takes whole seconds; messages carry a 14-byte header (``-m`` 14 at least) and at
  most 65,507 bytes; the server replies with the request's own size;
- its server serves one TCP connection at a time unless it multiplexes (``-F epoll``),
  which needs a feed file: the server's wrapper writes one (TCP and UDP on the same port),
  opens it and deletes it before sockperf starts, so nothing is left behind.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence

from testbed.tools import pacing
from testbed.tools.base import ToolDriver, ToolResult, check_addr, check_port, no_confidence, sizes
from testbed.topology.model import Pattern, Profile, Protocol, Tool

#: sockperf's message header (MsgHeader::EFFECTIVE_SIZE) and largest payload (UDP)
MIN_MESSAGE = 14
MAX_MESSAGE = 65507
#: the ``--mps`` sockperf shows for ping-pong's "max" (MPS_MAX_PP in src/defs.h)
MPS_MAX_PP = 600_000
PORT = 11111
#: seconds the client runs beyond the profile's duration: its statistics leave out 0.45 s
EXTRA_S = 1

# The server: one process for TCP and UDP on one port, multiplexed with epoll (which sockperf
# allows only with a feed file). The file is opened on fd 3 and deleted at once; sockperf
# reads it through /proc/self/fd/3, and exec keeps the server's pid the one that is stopped.
_SERVER_SH = ('f=/tmp/tb-sockperf-$$.feed; printf "T:0.0.0.0:%s\\nU:0.0.0.0:%s\\n" "$1" "$1" > "$f" '
              '&& exec 3< "$f" && rm -f "$f" || exit 125; '
              'exec sockperf server -f /proc/self/fd/3 -F epoll')
# The request/response client: sockperf writes its full log to a deleted file held open on
# fd 3 (nothing is left behind, even when the client is killed), then awk reduces the
# per-message times to buckets of a hundredth of a decade and prints them with the
# parameters sockperf wrote there. The exit status is sockperf's.
_CLIENT_SH = r'''f=/tmp/tb-sockperf-$$.log
: > "$f" && exec 3<> "$f" && rm -f "$f" || exit 125
"$@" --full-log /proc/self/fd/3
rc=$?
awk '
/^test was performed/ { print "sockperf-full-log: " $0; next }
NF == 4 && $1 ~ /^[0-9]+,$/ {
  v = $4 + 0; rows++
  if (v <= 0) { z++; next }
  e = int(log(v) / log(10)); if (10 ^ e > v) e--; if (10 ^ (e + 1) <= v) e++
  w = 10 ^ (e - 2); lo = int(v / w + 1e-9) * w
  n[sprintf("%.6g %.6g", lo, lo + w)]++
}
END {
  for (k in n) print "sockperf-full-log-bucket: " k " " n[k]
  if (z) print "sockperf-full-log-bucket: 0 0 " z
  print "sockperf-full-log-rows: " rows + 0
}' /proc/self/fd/3
exit $rc
'''


class SockperfDriver(ToolDriver):
    name = Tool("sockperf")
    version_args = ("--version",)
    version_re = r"version (\d+(?:\.\d+)+)"
    search_unsupported = ("sockperf's server counts what a UDP stream delivered only when it exits, "
                          "so no loss can be measured per trial; use iperf3")
    pacing_loop = "open"        # under-load sends on its clock; every message is timed
    default_port = PORT
    reusable_server = True      # stateless: replies to whatever arrives, test after test
    # its client sleeps 2 s after the warm-up messages, whatever the mode; a TCG guest on a
    # busy host took 1 s to start the client and the silence lasted over 4 s there
    quiet_start_s = 4.0

    def pacing_reason(self, protocol, pattern, rate):
        if pattern.is_transactional:
            return None if pattern is Pattern.RR else "sockperf has no connect/request/response test"
        if protocol is Protocol.UDP:
            return "sockperf's throughput mode is paced, but what a UDP stream delivered is unknown to it"
        return None

    def pacing_probe(self, write):
        # --mps is parsed before the connection; a TCP connect to the discard port is refused at once
        return ["sockperf", "under-load", "--tcp", "-i", "127.0.0.1", "-p", "9", "--mps", "10", "-t", "1"]

    def pacing_verdict(self, stdout, stderr, rc):
        out = strip(f"{stdout}\n{stderr}")
        if "Usage: sockperf" in out or "Invalid" in out:
            line = next((ln for ln in out.splitlines() if "Invalid" in ln or "Usage" in ln), "")
            return f"the installed sockperf refuses under-load --mps: {line.strip()}"
        if "connect" in out.lower() or "refused" in out.lower():
            return None
        return super().pacing_verdict(stdout, stderr, rc)

    def unsupported_reason(self, profile: Profile) -> str | None:
        if profile.pattern is Pattern.CRR:
            return "sockperf has no connect/request/response test (one connection per client)"
        if profile.pattern in (Pattern.MAERTS, Pattern.BIDIRECTIONAL):
            return "sockperf's throughput mode sends from the client only; use iperf3 for maerts and bidirectional"
        if profile.pattern is Pattern.STREAM and profile.protocol is Protocol.UDP:
            return ("sockperf's server counts what a UDP stream delivered only when it exits, so the "
                    "received rate is unknown; use iperf3 (or sockperf request/response)")
        if profile.rate_tps is not None and not profile.pattern.is_transactional:
            return "a transactions-per-second target paces request/response patterns only"
        size, resp = sizes(profile)
        if profile.pattern.is_transactional and profile.message_size is None:
            return (f"sockperf messages carry its {MIN_MESSAGE}-byte header: set message_size to "
                    f"{MIN_MESSAGE} or more (the request/response default is {size} byte)")
        if size < MIN_MESSAGE:
            return f"message_size {size} is below sockperf's {MIN_MESSAGE}-byte message header"
        if size > MAX_MESSAGE:
            return f"message_size {size} is above sockperf's largest message, {MAX_MESSAGE} bytes"
        if profile.pattern.is_transactional and profile.response_size is not None and resp != size:
            return ("response_size must equal message_size or be left out: sockperf's server "
                    "replies with the request's own size")
        return None

    def server_argv(self, profile: Profile, *, port: int | None = None) -> list[str]:
        return ["sh", "-c", _SERVER_SH, "sockperf-server", str(check_port(port) or PORT)]

    def mode(self, profile: Profile) -> str:
        """sockperf's subcommand for the profile."""
        if not profile.pattern.is_transactional:
            return "throughput"
        return "under-load" if profile.rate_tps is not None else "ping-pong"

    def client_argv(self, profile: Profile, server_addr: str, *, port: int | None = None,
                    confidence: tuple[int, int] | None = None,
                    iterations: tuple[int, int] | None = None, instances: int = 1) -> list[str]:
        """``instances``: how many clients share the pair's paced target (each sends target/N)."""
        self._check(profile)
        no_confidence("sockperf", confidence, iterations)
        mode = self.mode(profile)
        size, _ = sizes(profile)
        argv = ["sockperf", mode, "-i", check_addr(server_addr), "-p", str(check_port(port) or PORT),
                "--msg-size", str(size), "--time", str(profile.duration_s + EXTRA_S)]
        if profile.protocol is Protocol.TCP:
            argv.append("--tcp")
        if mode == "throughput":
            if profile.rate_bps:
                per_s = profile.rate_bps / (8 * size)
                argv += ["--mps", str(pacing.per_stream(max(1, round(per_s)), instances))]
            return argv
        argv.append("--full-rtt")            # round trips, not sockperf's default half of one
        if mode == "under-load":
            # every message answered and timed: at --reply-every 100 (the default) only one in
            # a hundred is, and a p99.9 would need ten times the duration
            argv += ["--mps", str(pacing.per_stream(profile.rate_tps, instances)), "--reply-every", "1"]
        return ["sh", "-c", _CLIENT_SH, "sockperf-client", *argv]

    def client_plan(self, profile: Profile, server_addr: str, *, port: int | None, connections: int,
                    write_file: Callable[[str, str], object]) -> tuple[list[str], int]:
        """``connections`` synchronised clients, each its own connection (and share of a target)."""
        return self.client_argv(profile, server_addr, port=port, instances=connections), connections

    def parse(self, stdout: str, stderr: str = "", rc: int = 0) -> ToolResult:
        return parse(stdout, stderr, rc)

    def parse_sample(self, stdout: str, stderr: str = "", rc: int = 0, *, profile: Profile,
                     server_output: str = "") -> ToolResult:
        return parse(stdout, stderr, rc, profile=profile)

    def distribution(self, stdout: str) -> list[tuple[float, float, int]] | None:
        return histogram(stdout)


# -- parsing ------------------------------------------------------------------------------
# From sockperf 3.7's src/client.cpp (log_msg lines, each "sockperf: " first, some coloured).

_ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")
_TOTAL_RE = re.compile(r"\[Total Run\] RunTime=([\d.]+) sec; Warm up time=(\d+) msec; SentMessages=(\d+); "
                       r"ReceivedMessages=(\d+)(?:; SkippedMessages=(\d+))?")
_VALID_RE = re.compile(r"\[Valid Duration\] RunTime=([\d.]+) sec; SentMessages=(\d+); ReceivedMessages=(\d+)")
_SERVER_RE = re.compile(r"Printing statistics for Server No: (\d+)")
# 3.8 and later add ", mean-ad=..., median-ad=..., siqr=..., cv=..., std-error=..., 99.0% ci=[...]"
_AVG_RE = re.compile(r"====> avg-(rtt|latency)=([\d.]+) \(std-dev=([\d.]+)[,)]")
_DROPS_RE = re.compile(r"# dropped messages = (\d+); # duplicated messages = (\d+); # out-of-order messages = (\d+)")
_OBS_RE = re.compile(r"Total (\d+) observations")
_PCT_RE = re.compile(r"---> percentile\s+([\d.]+) =\s+([\d.]+)")
_EDGE_RE = re.compile(r"---> <(MAX|MIN)> observation =\s+([\d.]+)")
_PARAMS_RE = re.compile(r"test was performed using the following parameters: (.*)")
_STREAM_RE = re.compile(r"Total of (\d+) messages sent in ([\d.]+) sec(?: \((\d+) messages skipped\))?")
_STREAM_MPS_RE = re.compile(r"NOTE: test was performed, using .*?mps=(\d+)")
_BANDWIDTH_RE = re.compile(r"BandWidth is ([\d.]+) (MBps|GBps)")
_BUCKET_RE = re.compile(r"^sockperf-full-log-bucket: ([\d.e+-]+) ([\d.e+-]+) (\d+)$")
_ROWS_RE = re.compile(r"^sockperf-full-log-rows: (\d+)$", re.M)
_TOO_HIGH = "requested message-per-second rate is too high"
_FAIL_RE = re.compile(r"(?<![\w-])ERROR\b|Can`t|No messages were (?:received|sent)|No valid observations|"
                      r"Usage: sockperf|Invalid|not a regular file|Failed", re.I)


def strip(text: str) -> str:
    """Without the terminal colour codes sockperf wraps some lines in."""
    return _ANSI_RE.sub("", text or "")


def _params(text: str) -> dict[str, str]:
    m = _PARAMS_RE.search(text)
    return dict(re.findall(r"--([\w-]+)(?:=(\S+))?", m.group(1))) if m else {}


def histogram(stdout: str) -> list[tuple[float, float, int]] | None:
    """The buckets the client's wrapper made from sockperf's full log, round trips in us
    (doubled when sockperf logged half round trips); None when there are none."""
    text = strip(stdout)
    rows = [(float(m.group(1)), float(m.group(2)), int(m.group(3)))
            for ln in text.splitlines() if (m := _BUCKET_RE.match(ln.strip()))]
    if not rows:
        return None
    k = 1.0 if "full-rtt" in _params(text) else 2.0
    return sorted((lo * k, hi * k, c) for lo, hi, c in rows)


def parse(stdout: str, stderr: str = "", rc: int = 0, *, profile: Profile | None = None) -> ToolResult:
    """What a sockperf client printed (through this driver's wrapper or not) -> ToolResult.
    Pure. With ``profile``: a paced profile must show the rate it asked for, and a stream's
    bytes are its messages times the profile's size."""
    out, err = strip(stdout), strip(stderr)
    lines = [ln.strip() for ln in f"{out}\n{err}".splitlines() if ln.strip()]
    bad = next((ln for ln in lines if _FAIL_RE.search(ln)), None)
    if rc != 0 or bad:
        why = bad or (lines[-1] if lines else "no output")
        return ToolResult.failed(f"sockperf exited {rc}: {why}" if rc else f"sockperf: {why}")
    if m := _STREAM_RE.search(out):
        return _stream(m, out, profile)
    return _latency(out, lines, profile)


#: sockperf's own percentile lies in the full log's buckets (each at most 1 % of the value
#: wide) around its rank, give or take this share of the value
HISTOGRAM_TOLERANCE = 0.01


def _bucket_at(rows: Sequence[tuple[float, float, int]], rank: float) -> tuple[float, float]:
    """The bucket (lower, upper us) that holds the message of this rank (1 = the fastest)."""
    seen = 0
    for lo, hi, c in rows:
        seen += c
        if seen >= rank:
            return lo, hi
    return rows[-1][0], rows[-1][1]


def _disagrees(hist: Sequence[tuple[float, float, int]], n_obs: int, m: Mapping[str, float]) -> str | None:
    """Why the full log's histogram and sockperf's summary are not two sources of one
    distribution, with both figures: their message counts differ, or a percentile sockperf
    printed lies outside the buckets of the messages ranked next to it in the log (its
    rank and one on either side: in a sparse tail neighbouring messages can be far apart,
    so a percentile is never held to its neighbour's value). None when they agree."""
    from testbed.records.percentiles import metric_name
    rows = sorted(b for b in hist if b[2] > 0)
    got = sum(c for *_, c in rows)
    if got != n_obs:
        return (f"sockperf's full log gives {got} messages, its summary {n_obs} observations: the log "
                f"is incomplete")
    for p in (50.0, 90.0, 99.0, 99.9):
        if (mine := m.get(metric_name(p))) is None or not rows:
            continue
        rank = p / 100 * got
        lo = _bucket_at(rows, max(1.0, rank - 1))[0] * (1 - HISTOGRAM_TOLERANCE)
        hi = _bucket_at(rows, min(float(got), rank + 1))[1] * (1 + HISTOGRAM_TOLERANCE)
        if not lo <= mine <= hi:
            return (f"sockperf's p{p:g} is {mine:g} us, its full log puts the messages of that rank "
                    f"between {lo:g} and {hi:g} us")
    return None


def _latency(out: str, lines: Sequence[str], profile: Profile | None) -> ToolResult:
    total, valid, obs = _TOTAL_RE.search(out), _VALID_RE.search(out), _OBS_RE.search(out)
    if not (total and valid and obs):
        missing = [n for n, m in (("[Total Run]", total), ("[Valid Duration]", valid),
                                  ("observations", obs)) if not m]
        return ToolResult.failed(f"sockperf printed no result ({', '.join(missing)} missing): "
                                 f"{lines[-1] if lines else 'no output'}")
    servers = {int(n) for n in _SERVER_RE.findall(out)}
    if servers - {0}:
        return ToolResult.failed(f"sockperf measured {len(servers)} servers; the testbed runs one per client")
    warnings: list[str] = []
    secs, v_sent, v_recv = float(valid.group(1)), int(valid.group(2)), int(valid.group(3))
    n_obs = int(obs.group(1))
    if secs <= 0 or n_obs == 0:
        return ToolResult.failed(f"sockperf timed no message: {valid.group(0)}")
    avg = _AVG_RE.search(out)
    k = 2.0 if avg is not None and avg.group(1) == "latency" else 1.0
    if k == 2.0:
        warnings.append("sockperf printed half round trips (no --full-rtt): figures doubled")
    m: dict[str, float] = {
        "transactions_per_s": v_recv / secs,
        "duration_s": secs,
        "offered_per_s": v_sent / secs,
        # the whole run, warm-up included: what the wire carried over the sample's window
        "msgs_sent": float(total.group(3)),
        "msgs_replied": float(total.group(4)),
    }
    params = _params(out)
    size = int(params["msg-size"]) if params.get("msg-size", "").isdigit() else (
        sizes(profile)[0] if profile is not None else None)
    if size is not None:
        m["bytes"] = float((int(total.group(3)) + int(total.group(4))) * size)
    if avg is not None:
        m["latency_mean_us"] = float(avg.group(2)) * k
        m["latency_stddev_us"] = float(avg.group(3)) * k
    for which, value in _EDGE_RE.findall(out):
        m["latency_max_us" if which == "MAX" else "latency_min_us"] = float(value) * k
    from testbed.records.percentiles import metric_name
    for p, value in _PCT_RE.findall(out):
        m[metric_name(float(p))] = float(value) * k
    udp = profile is not None and profile.protocol is Protocol.UDP or "# UDP" in out
    if udp and v_sent:
        m["loss_pct"] = 100.0 * max(0, v_sent - v_recv) / v_sent
    if drops := _DROPS_RE.search(out):
        dropped, dup, ooo = (int(x) for x in drops.groups())
        if dup or ooo:
            warnings.append(f"sockperf: {dup} duplicated and {ooo} out-of-order replies (left out of its figures)")
        if dropped:
            warnings.append(f"sockperf: {dropped} messages without a reply in the measured interval")
    if n_obs != v_recv:
        warnings.append(f"sockperf timed {n_obs} messages of the {v_recv} answered")
    if (rows := _ROWS_RE.search(out)) and int(rows.group(1)) != n_obs:
        return ToolResult.failed(f"sockperf's full log has {rows.group(1)} messages, its summary "
                                 f"{n_obs} observations: the log is incomplete")
    if (hist := histogram(out)) is not None and (why := _disagrees(hist, n_obs, m)):
        return ToolResult.failed(why, warnings)
    if _TOO_HIGH in out:
        warnings.append(f"sockperf: the {_TOO_HIGH}")
    asked = int(params["mps"]) if params.get("mps", "").isdigit() else None
    paced = profile.rate_tps is not None if profile is not None else asked is not None and asked < MPS_MAX_PP
    if paced:
        if asked is None:
            return ToolResult.failed("sockperf printed no parameters (its full log is missing): the "
                                     "rate it was asked for cannot be checked", warnings)
        if pacing.shortfall(asked, m["offered_per_s"]):
            return ToolResult.failed(
                f"sockperf offered {m['offered_per_s']:.0f} requests/s of the {asked} asked (the sender fell "
                f"behind by more than {pacing.SHORTFALL:.0%}, so the latency is not that of the load asked)"
                + (f"; sockperf: the {_TOO_HIGH}" if _TOO_HIGH in out else ""), warnings)
    return ToolResult(ok=True, metrics=m, warnings=tuple(warnings))


def _stream(m: re.Match[str], out: str, profile: Profile | None) -> ToolResult:
    count, secs = int(m.group(1)), float(m.group(2))
    if secs <= 0 or count == 0:
        return ToolResult.failed(f"sockperf sent nothing: {m.group(0)}")
    metrics: dict[str, float] = {"duration_s": secs, "msgs_sent": float(count)}
    warnings = ["throughput_mbps: what the sockperf client sent (its server counts nothing per test)"]
    if profile is not None:
        metrics["bytes"] = float(count * sizes(profile)[0])
    elif bw := _BANDWIDTH_RE.search(out):
        # MBps is MiB/s (2^20 bytes), GBps GiB/s, three decimals
        metrics["bytes"] = float(bw.group(1)) * 2 ** (20 if bw.group(2) == "MBps" else 30) * secs
    else:
        return ToolResult.failed("sockperf printed no bandwidth and the message size is unknown")
    metrics["throughput_mbps"] = metrics["bytes"] * 8 / secs / 1e6
    asked = _STREAM_MPS_RE.search(out)
    if asked and pacing.shortfall(int(asked.group(1)), count / secs):
        return ToolResult.failed(f"sockperf sent {count / secs:.0f} messages/s of the {asked.group(1)} asked "
                                 f"(the sender fell behind by more than {pacing.SHORTFALL:.0%})", warnings)
    return ToolResult(ok=True, metrics=metrics, warnings=tuple(warnings))


DRIVER = SockperfDriver()
