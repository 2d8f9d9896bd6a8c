"""netperf 2.7.0: argv for netserver and netperf, and a pure parser for what netperf prints.

The parser reads every format netperf has: omni keyval (``-k``, what this driver asks for),
omni CSV (``-o``), omni columns (``-O``) and the classic tables (what tests print without an
output selector), with ``-c/-C`` CPU columns, ``-v 2`` blocks, histograms, ``-D`` interim
results and the "!!! WARNING" confidence block.
"""
from __future__ import annotations

import math
import re
from collections.abc import Sequence

from testbed.errors import one_line
from testbed.tools.base import ToolDriver, ToolResult, UnsupportedProfile, check_addr, check_port, error_line, sizes
from testbed.topology.model import Pattern, Profile, Protocol, Tool

# Output selectors for ``-- -k``. Keyval rather than CSV because each line names its selector:
# order-independent, immune to the 80-column wrapping seen in captured CSV headers, stray
# stderr lines merged into stdout ("enable_enobufs failed") cannot shift a column, and -D
# interim results arrive as keys too.
SELECTORS = (
    "THROUGHPUT", "THROUGHPUT_UNITS", "ELAPSED_TIME", "PROTOCOL", "DIRECTION",
    "TRANSACTION_RATE", "MEAN_LATENCY", "MIN_LATENCY", "MAX_LATENCY", "STDDEV_LATENCY",
    "P50_LATENCY", "P90_LATENCY", "P99_LATENCY",
    "LOCAL_SEND_CALLS", "REMOTE_RECV_CALLS", "LOCAL_BYTES_RECVD", "REMOTE_BYTES_RECVD",
    "LOCAL_BYTES_XFERD", "LOCAL_CPU_UTIL", "REMOTE_CPU_UTIL", "LOCAL_SD", "REMOTE_SD", "SD_UNITS",
    "CONFIDENCE_LEVEL", "CONFIDENCE_INTERVAL", "CONFIDENCE_ITERATION",
    "THROUGHPUT_CONFID", "LOCAL_CPU_CONFID", "REMOTE_CPU_CONFID",
    "LOCAL_TRANSPORT_RETRANS", "REMOTE_TRANSPORT_RETRANS",
)

# -o and -O print human names instead of selectors (recorded from netperf 2.7.0).
_HUMAN = {
    "Throughput": "THROUGHPUT", "Throughput Units": "THROUGHPUT_UNITS",
    "Elapsed Time (sec)": "ELAPSED_TIME", "Protocol": "PROTOCOL", "Direction": "DIRECTION",
    "Transaction Rate Tran/s": "TRANSACTION_RATE", "Round Trip Latency usec/tran": "RT_LATENCY",
    "Mean Latency Microseconds": "MEAN_LATENCY", "Minimum Latency Microseconds": "MIN_LATENCY",
    "Maximum Latency Microseconds": "MAX_LATENCY", "Stddev Latency Microseconds": "STDDEV_LATENCY",
    "50th Percentile Latency Microseconds": "P50_LATENCY",
    "90th Percentile Latency Microseconds": "P90_LATENCY",
    "99th Percentile Latency Microseconds": "P99_LATENCY",
    "Local Send Calls": "LOCAL_SEND_CALLS", "Remote Recv Calls": "REMOTE_RECV_CALLS",
    "Local Bytes Received": "LOCAL_BYTES_RECVD", "Remote Bytes Received": "REMOTE_BYTES_RECVD",
    "Local Bytes Xferred": "LOCAL_BYTES_XFERD",
    "Local CPU Util %": "LOCAL_CPU_UTIL", "Remote CPU Util %": "REMOTE_CPU_UTIL",
    "Local Service Demand": "LOCAL_SD", "Remote Service Demand": "REMOTE_SD",
    "Service Demand Units": "SD_UNITS", "Confidence Level Percent": "CONFIDENCE_LEVEL",
    "Confidence Width Target": "CONFIDENCE_INTERVAL",
    "Confidence Iterations Run": "CONFIDENCE_ITERATION",
    "Throughput Confidence Width (%)": "THROUGHPUT_CONFID",
    "Local CPU Confidence Width (%)": "LOCAL_CPU_CONFID",
    "Remote CPU Confidence Width (%)": "REMOTE_CPU_CONFID",
    "Local Transport Retransmissions": "LOCAL_TRANSPORT_RETRANS",
    "Remote Transport Retransmissions": "REMOTE_TRANSPORT_RETRANS",
}

_TESTS = frozenset({"TCP_STREAM", "TCP_MAERTS", "TCP_RR", "TCP_CRR", "UDP_STREAM", "UDP_RR"})
# banner test names (classic and MIGRATED) -> what they measure
_BANNERS = (("TCP STREAM", Protocol.TCP, Pattern.STREAM), ("TCP MAERTS", Protocol.TCP, Pattern.MAERTS),
            ("TCP REQUEST/RESPONSE", Protocol.TCP, Pattern.RR),
            ("TCP Connect/Request/Response", Protocol.TCP, Pattern.CRR),
            ("UDP STREAM", Protocol.UDP, Pattern.STREAM),
            ("UDP UNIDIRECTIONAL SEND", Protocol.UDP, Pattern.STREAM),
            ("UDP REQUEST/RESPONSE", Protocol.UDP, Pattern.RR))
_DIRECTIONS = {"Send": Pattern.STREAM, "Receive": Pattern.MAERTS, "Send|Recv": Pattern.RR,
               "Connect|Send|Recv": Pattern.CRR}

_BANNER_RE = re.compile(r"^(?:MIGRATED )?(.+?) TEST from ")
_CONF_RE = re.compile(r"\+/-([\d.]+)% @ (\d+)% conf\.")
_KEYVAL_RE = re.compile(r"^([A-Z][A-Z0-9_]*)(?:\[(\d+)\])?=(.*)$")
_UNIT_RE = re.compile(r"10\^(\d+)bits/s(?:ec)?|([KMG])Bytes/s(?:ec)?|Trans/s|per sec")
_INTERIM_RE = re.compile(r"^Interim result:\s+([\d.]+)\s+(\S+)\s+over\s+([\d.]+)\s+seconds"
                         r"\s+ending at\s+([\d.]+)")
_CONFID_RE = re.compile(r"(Throughput|Local CPU util|Remote CPU util)\s*:\s*([\d.]+)%")
_ERR_RE = re.compile(r"\b(error|errno|could not|are you sure|unknown|failed|refused|unreachable|"
                     r"timed out|no response|reset by peer|not found|invalid|cannot)\b", re.I)
_NUM_RE = re.compile(r"^-?\d+(?:\.\d+)?$")
#: netperf prints this from its SIGALRM handler when the timer pops again after the test's
#: end (a starved client); on the same stdio stream, so it can land inside a line being
#: printed ("NETPERF_INTERIM_RESULT[3]=" + it + "10125.91"). Taken out, the line is whole.
_CATCHER_RE = re.compile(r"catcher: timer popped with times_up != 0\n?")


#: the interval when pacing (ms): bursts every 10 ms, fine enough for 1 s reporting
INTERVAL_MS = 10


def burst(profile: Profile) -> int:
    """Sends (stream) or transactions (rr) per INTERVAL_MS for the profile's target."""
    per_s = (profile.rate_tps if profile.rate_tps is not None else
             (profile.rate_bps or 0) / (8 * max(1, profile.message_size or 16384)))
    return max(1, round(per_s * INTERVAL_MS / 1000))


class NetperfDriver(ToolDriver):
    name = Tool("netperf")
    version_args = ("-V",)
    version_re = r"[Vv]ersion (\d+(?:\.\d+)+)"
    options = frozenset({"confidence", "iterations"})
    search_unsupported = ("Debian's netperf is built without pacing (it needs --enable-intervals "
                          "and --enable-burst, and then sends bursts per interval); use iperf3")
    pacing_loop = "closed"      # -w/-b: bursts of transactions per interval, each waiting its reply

    def pacing_reason(self, protocol, pattern, rate):
        if pattern is Pattern.CRR:
            return "netperf's interval pacing does not cover TCP_CRR"
        return None

    def pacing_probe(self, write):
        return ["netperf", "-H", "127.0.0.1", "-p", "9", "-l", "1", "-t", "TCP_RR",
                "-w", str(INTERVAL_MS), "-b", "1"]

    def pacing_verdict(self, stdout, stderr, rc):
        out = f"{stdout}\n{stderr}"
        low = out.lower()
        if "not compiled in" in low:
            lines = [ln.strip() for ln in out.splitlines() if "not compiled in" in ln.lower()]
            return (f"the installed netperf has no interval pacing ({'; '.join(lines)}): it needs a "
                    f"build configured with --enable-intervals and --enable-burst")
        if "establish control" in low or "establish_control" in low or "netserver" in low:
            return None         # got past the options to the connection: -w/-b accepted
        return super().pacing_verdict(stdout, stderr, rc)
    cpu_scope = "system"          # netperf -c/-C measure the whole host
    default_port = 12865
    reusable_server = True         # netserver forks a fresh child for every test

    def unsupported_reason(self, profile: Profile) -> str | None:
        if profile.pattern is Pattern.BIDIRECTIONAL:
            return ("netperf has no bidirectional test; run TCP_STREAM and TCP_MAERTS "
                    "concurrently, or use iperf3 --bidir or uperf")
        if profile.netperf_test not in _TESTS:
            return f"netperf has no {profile.netperf_test} test"
        if profile.rate_bps is not None and not profile.paced:
            return "netperf cannot pace a stream by bit rate (needs an --enable-intervals build); use iperf3"
        if profile.paced and profile.pattern is Pattern.CRR:
            return "netperf's interval pacing does not cover TCP_CRR"
        return None

    def server_argv(self, profile: Profile, *, port: int | None = None) -> list[str]:
        # -D: stay in the foreground so the caller owns (and stops) the process
        return ["netserver", "-D", *(["-p", str(port)] if check_port(port) else [])]

    def client_argv(self, profile: Profile, server_addr: str, *, port: int | None = None,
                    confidence: tuple[int, int] | None = None,
                    iterations: tuple[int, int] | None = None) -> list[str]:
        self._check(profile)
        argv = ["netperf", "-H", check_addr(server_addr)]
        if check_port(port):
            argv += ["-p", str(port)]
        # -c -C: CPU and service demand on both ends. -j asks for the latency histogram that the
        # MIN/MAX/P50/P90/P99 selectors read; netperf 2.7.0 also turns it on by itself when such
        # a selector is requested (checked here), -j keeps that explicit.
        argv += ["-t", profile.netperf_test, "-l", str(profile.duration_s),
                 "-c", "-C", "-j"]
        if profile.paced:
            # -w interval, -b sends (or transactions) per interval: builds with
            # --enable-intervals/--enable-burst only (pacing.Detector tries that first)
            argv += ["-w", str(INTERVAL_MS), "-b", str(burst(profile))]
        if confidence is not None:
            level, width = confidence
            if level not in (95, 99) or width <= 0:
                raise UnsupportedProfile(f"netperf -I takes level 95 or 99 and a width > 0, not {confidence}")
            argv += ["-I", f"{level},{width}"]
        if iterations is not None:
            hi, lo = iterations
            if not 1 <= lo <= hi <= 30:
                raise UnsupportedProfile(f"netperf -i takes max,min with 1 <= min <= max <= 30, not {iterations}")
            argv += ["-i", f"{hi},{lo}"]
        argv += ["--", "-k", ",".join(SELECTORS)]
        size, resp = sizes(profile)
        if profile.pattern.is_transactional:
            argv += ["-r", f"{size},{resp}"]
        elif profile.pattern is Pattern.MAERTS:
            argv += ["-m", f",{size}"]     # the remote (netserver) send size; "-m N" is ignored
        else:
            argv += ["-m", str(size)]
        return argv

    def distribution(self, stdout: str) -> list[tuple[float, float, int]] | None:
        """netperf's -v 2 histogram, printed by builds with --enable-histogram (Debian's
        prints none: its P50/P90/P99 selectors are then all there is)."""
        from testbed.records.percentiles import netperf_histogram
        return netperf_histogram(stdout)

    def parse(self, stdout: str, stderr: str = "", rc: int = 0) -> ToolResult:
        return parse(stdout, stderr, rc)

    def runs(self, profile: Profile) -> int:
        # -i max,min: up to max back-to-back runs of the test; -I alone lets netperf run up
        # to 10 (its default maximum when a confidence interval is asked for).
        if profile.iterations is not None:
            return profile.iterations[0]
        return 10 if profile.confidence is not None else 1


def parse(stdout: str, stderr: str = "", rc: int = 0) -> ToolResult:
    stdout = _CATCHER_RE.sub("", stdout or "")
    lines = [ln.rstrip() for ln in stdout.splitlines()]
    if rc != 0:
        line = error_line((stderr, stdout), _ERR_RE) or "no output"
        return ToolResult.failed(f"netperf exited {rc}: {line}")
    end, proto, pattern = _banner(lines)
    conf = _CONF_RE.search(stdout or "")
    body = [ln for ln in lines[end:] if ln.strip() and not ln.startswith("!!!")]
    warnings = _noise(stderr, stdout)
    metrics: dict[str, float] = {}
    intervals: list[dict[str, float]] = []

    fields = _keyval(lines, intervals, warnings)
    if not fields and not any(ln.split()[:1] == ["bytes"] for ln in body):
        fields = _csv(body, warnings) or _columns(body)
    if fields:
        if proto is None and fields.get("PROTOCOL") in ("TCP", "UDP"):
            proto = Protocol(fields["PROTOCOL"].lower())
        pattern = pattern or _DIRECTIONS.get(fields.get("DIRECTION", ""))
        _omni(fields, proto, pattern, metrics, warnings)
    else:
        _classic(lines, proto, pattern, metrics, intervals, warnings)
    for k in sorted(k for k, v in metrics.items() if not math.isfinite(v)):
        # the classic and CSV outputs too can hold an inf or nan (see _not_a_figure)
        warnings.append(f"netperf printed {k} = {metrics.pop(k)}: not a figure; left out")
    if "throughput_mbps" not in metrics and "transactions_per_s" not in metrics:
        line = error_line((stderr, stdout), _ERR_RE) or "no output"
        return ToolResult.failed(f"netperf printed no result: {line}")
    _confidence(stdout or "", fields, conf, metrics, warnings)
    return ToolResult(ok=True, metrics=metrics, warnings=tuple(dict.fromkeys(warnings)),
                      intervals=tuple(intervals))


def _banner(lines: Sequence[str]) -> tuple[int, Protocol | None, Pattern | None]:
    """Index of the first line after the banner (it may be wrapped onto two), and its test."""
    for i, ln in enumerate(lines):
        m = _BANNER_RE.match(ln)
        if m:
            # a whole banner names two address families ("... AF_INET to ... AF_INET")
            end = i + 1 if ln.count(" AF_") >= 2 or i + 1 >= len(lines) else i + 2
            for name, proto, pattern in _BANNERS:
                if m.group(1) == name:
                    return end, proto, pattern
            return end, None, None
    return 0, None, None


def _noise(stderr: str, stdout: str) -> list[str]:
    """Error-looking lines that did not stop the run (e.g. "enable_enobufs failed")."""
    out = []
    for text in (stderr, stdout):
        for ln in (text or "").splitlines():
            if _ERR_RE.search(ln) and "=" not in ln and not ln.startswith("!!!"):
                out.append(f"netperf: {ln.strip()}")
    return out


def _num(fields: dict[str, str], key: str, lowest: float = 0.0) -> float | None:
    """A measured value; netperf prints -1 for "not measured" (below ``lowest``: None), and
    inf or nan for a ratio whose divisor it measured as 0 (None)."""
    try:
        value = float(fields[key])
    except (KeyError, ValueError):
        return None
    return value if math.isfinite(value) and value >= lowest else None


def _not_a_figure(fields: dict[str, str], key: str) -> bool:
    """Printed, but neither a figure nor netperf's -1 for "not measured": -2147483648, inf,
    nan (a service demand on a busy host: CPU time over a throughput it read as 0)."""
    try:
        value = float(fields[key])
    except (KeyError, ValueError):
        return False
    return not math.isfinite(value) or (value < 0 and value != -1.0)


def _figure(fields: dict[str, str], key: str, name: str, m: dict[str, float], warnings: list[str]) -> None:
    """``key``'s value into ``m[name]`` when it is a figure; said so when netperf printed
    something that is not one (netperf 2.7.0 prints P50_LATENCY=-2147483648 when most sends
    of a stream took under a microsecond, and a service demand of inf on a busy host)."""
    if (v := _num(fields, key)) is not None:
        m[name] = v
    elif _not_a_figure(fields, key):
        warnings.append(f"netperf printed {key}={fields[key]}: not a figure; left out")


def _mbps(value: float, unit: str) -> float | None:
    m = _UNIT_RE.fullmatch(unit)
    if not m or not (m.group(1) or m.group(2)):
        return None
    if m.group(1):
        return value * 10 ** int(m.group(1)) / 1e6
    return value * 1024 ** ("KMG".index(m.group(2)) + 1) * 8 / 1e6   # netperf's K/M/G are binary


def _keyval(lines: Sequence[str], intervals: list[dict[str, float]], warnings: list[str]) -> dict[str, str]:
    fields: dict[str, str] = {}
    interim: dict[int, dict[str, str]] = {}
    for ln in lines:
        m = _KEYVAL_RE.match(ln.strip())
        if m and m.group(2) is not None:
            interim.setdefault(int(m.group(2)), {})[m.group(1)] = m.group(3)
        elif m:
            fields[m.group(1)] = m.group(3)
    for i, iv in sorted(interim.items()):
        try:
            _interim(iv.get("NETPERF_INTERIM_RESULT"), iv.get("NETPERF_UNITS"),
                     iv.get("NETPERF_INTERVAL"), iv.get("NETPERF_ENDING"), intervals)
        except ValueError:
            # one garbled interval is left out; the test's own result may still be whole
            warnings.append(f"netperf interim result {i} is not figures "
                            f"({one_line(repr(iv), 200)}); left out")
    return fields if set(fields) & set(SELECTORS) else {}


def _interim(value: str | None, unit: str | None, secs: str | None, ending: str | None,
             intervals: list[dict[str, float]]) -> None:
    if value is None or unit is None:
        return
    sample: dict[str, float] = {}
    if unit.startswith("Trans"):
        sample["transactions_per_s"] = float(value)
    elif (mbps := _mbps(float(value), unit)) is not None:
        sample["throughput_mbps"] = mbps
    if secs is not None:
        sample["duration_s"] = float(secs)
    if ending is not None:
        sample["timestamp_ms"] = float(ending) * 1000.0
    intervals.append(sample)


def _csv(body: Sequence[str], warnings: list[str]) -> dict[str, str]:
    """-o: header (possibly wrapped over several lines) then one row of values."""
    for j, ln in enumerate(body):
        values = ln.strip().split(",")
        if j and not re.search(r"\s", ln.strip()) and _NUM_RE.match(values[0]):
            names = [" ".join(n.split()) for n in " ".join(body[:j]).split(",")]
            if len(values) != len(names):
                warnings.append(f"netperf CSV row has {len(values)} values for {len(names)} "
                                "header fields; values matched to fields from the left")
            return {_HUMAN.get(n, n): v for n, v in zip(names, values)}
    return {}


def _columns(body: Sequence[str]) -> dict[str, str]:
    """-O: a header block whose columns start where the values in the last line start."""
    for j, ln in enumerate(body):
        tokens = list(re.finditer(r"\S+", ln))
        if j and tokens and _NUM_RE.match(tokens[0].group()):
            starts = [t.start() for t in tokens] + [None]
            names = [" ".join(h[a:b].strip() for h in body[:j] if h[a:b].strip())
                     for a, b in zip(starts, starts[1:])]
            return {_HUMAN.get(" ".join(n.split()), n): t.group() for n, t in zip(names, tokens)}
    return {}


def _omni(fields: dict[str, str], proto: Protocol | None, pattern: Pattern | None,
          m: dict[str, float], warnings: list[str]) -> None:
    units = fields.get("THROUGHPUT_UNITS")
    rr = pattern.is_transactional if pattern else units == "Trans/s"
    thr = _num(fields, "THROUGHPUT")
    if thr is not None:
        if units is None:
            units = "Trans/s" if rr else "10^6bits/s"
            warnings.append(f"netperf printed no THROUGHPUT_UNITS; read THROUGHPUT as {units}, "
                            "its default for this test")
        if units.startswith("Trans"):
            m["transactions_per_s"] = thr
        elif (mbps := _mbps(thr, units)) is not None:
            m["throughput_mbps"] = mbps
        else:
            warnings.append(f"netperf throughput unit {units!r} not understood; left out")
    if rr and (rate := _num(fields, "TRANSACTION_RATE")) is not None:
        m["transactions_per_s"] = rate       # same figure as THROUGHPUT, more digits
    mean = _num(fields, "MEAN_LATENCY")
    for key, name in (("MIN_LATENCY", "latency_min_us"), ("MAX_LATENCY", "latency_max_us"),
                      ("STDDEV_LATENCY", "latency_stddev_us"), ("P50_LATENCY", "latency_p50_us"),
                      ("P90_LATENCY", "latency_p90_us"), ("P99_LATENCY", "latency_p99_us"),
                      ("LOCAL_CPU_UTIL", "local_cpu_pct"), ("REMOTE_CPU_UTIL", "remote_cpu_pct"),
                      ("ELAPSED_TIME", "duration_s")):
        _figure(fields, key, name, m, warnings)
    if (v := mean if mean is not None else _num(fields, "RT_LATENCY")) is not None:
        m["latency_mean_us"] = v
    sd_units = fields.get("SD_UNITS") or ("usec/KB" if pattern and not rr else None)
    if sd_units == "usec/KB":       # RR tests report usec/Tran, which has no canonical name
        for key, name in (("LOCAL_SD", "local_sd_us_per_kb"), ("REMOTE_SD", "remote_sd_us_per_kb")):
            _figure(fields, key, name, m, warnings)
    retrans = [v for k in ("LOCAL_TRANSPORT_RETRANS", "REMOTE_TRANSPORT_RETRANS")
               if (v := _num(fields, k)) is not None]
    if retrans and proto is not Protocol.UDP:
        m["retransmits"] = sum(retrans)
    received = {Pattern.STREAM: "REMOTE_BYTES_RECVD", Pattern.MAERTS: "LOCAL_BYTES_RECVD",
                Pattern.RR: "LOCAL_BYTES_XFERD", Pattern.CRR: "LOCAL_BYTES_XFERD"}.get(pattern)
    if received and (v := _num(fields, received)) is not None:
        m["bytes"] = v
    if (proto, pattern) == (Protocol.UDP, Pattern.STREAM):
        _udp_loss(_num(fields, "LOCAL_SEND_CALLS"), _num(fields, "REMOTE_RECV_CALLS"), m, warnings)


def _udp_loss(sent: float | None, recv: float | None, m: dict[str, float],
              warnings: list[str]) -> None:
    if sent is None or recv is None:
        return
    m["udp_sent_msgs"], m["udp_recv_msgs"] = sent, recv
    if sent > 0:
        m["loss_pct"] = max(0.0, 100.0 * (sent - recv) / sent)
    if recv == 0 and sent > 0:
        # A real measurement (e.g. datagrams larger than the receiver's socket buffer):
        # reported as 0 throughput and 100 % loss so it can never pass as a missing number.
        warnings.append(f"receiver got 0 of {sent:.0f} datagrams sent")


def _classic(lines: Sequence[str], proto: Protocol | None, pattern: Pattern | None,
             m: dict[str, float], intervals: list[dict[str, float]], warnings: list[str]) -> None:
    for ln in lines:
        if im := _INTERIM_RE.match(ln.strip()):
            _interim(im.group(1), im.group(2), im.group(3), im.group(4), intervals)
    head = next((i for i, ln in enumerate(lines) if ln.split()[:1] == ["bytes"]), None)
    if head is None or pattern is None:
        return
    units = _UNIT_RE.search(lines[head])
    unit = units.group() if units else ("per sec" if pattern.is_transactional else "10^6bits/s")
    per_kb = "us/KB" in lines[head]
    rows = _rows(lines, head + 1)
    if not rows:
        return
    r = rows[0]
    if (proto, pattern) == (Protocol.UDP, Pattern.STREAM) and len(r) >= 6:
        m["duration_s"], m["errors"] = r[2], r[4]
        _cpu("local", *(r[6:8] + [None, None])[:2], per_kb, m)
        if len(rows) > 1 and len(rows[1]) >= 4:
            recv = rows[1]
            thr = recv[3]                  # what the receiver got, not what was sent
            _cpu("remote", *(recv[4:6] + [None, None])[:2], per_kb, m)
            _udp_loss(r[3], recv[2], m, warnings)
        else:
            warnings.append("netperf printed no receive-side line; throughput is the send rate")
            thr = r[5]
        if (mbps := _mbps(thr, unit)) is not None:
            m["throughput_mbps"] = mbps
        return
    col = 5 if pattern.is_transactional else 4
    if len(r) <= col:
        return
    m["duration_s"] = r[col - 1]
    if unit in ("per sec", "Trans/s"):
        m["transactions_per_s"] = r[col]
    elif (mbps := _mbps(r[col], unit)) is not None:
        m["throughput_mbps"] = mbps
    if len(r) >= col + 5:
        _cpu("local", r[col + 1], r[col + 3], per_kb, m)
        _cpu("remote", r[col + 2], r[col + 4], per_kb, m)
    align = next((i for i, ln in enumerate(lines) if ln.startswith("Alignment")), None)
    v2 = _rows(lines, align + 1) if align is not None else []
    if v2 and len(v2[0]) >= 8:        # -v 2 on RR: latency usec/Tran and rate per sec
        m["latency_mean_us"] = v2[0][4]
        m.setdefault("transactions_per_s", v2[0][5])


def _rows(lines: Sequence[str], start: int) -> list[list[float]]:
    """Consecutive all-numeric lines from ``start`` (leading header and blank lines skipped)."""
    rows: list[list[float]] = []
    for ln in lines[start:]:
        tokens = ln.split()
        if tokens and all(_NUM_RE.match(t) for t in tokens):
            rows.append([float(t) for t in tokens])
        elif rows:
            break
    return rows


def _cpu(side: str, util: float | None, sd: float | None, per_kb: bool, m: dict[str, float]) -> None:
    if util is not None and util >= 0:
        m[f"{side}_cpu_pct"] = util
    if per_kb and sd is not None and sd >= 0:
        m[f"{side}_sd_us_per_kb"] = sd


def _confidence(stdout: str, fields: dict[str, str], conf: re.Match[str] | None,
                m: dict[str, float], warnings: list[str]) -> None:
    """confidence_achieved from the warning block (classic) or the CONFID selectors (omni)."""
    block = " ".join(ln[3:].strip() for ln in stdout.splitlines() if ln.startswith("!!!"))
    level = _num(fields, "CONFIDENCE_LEVEL")
    if not (conf or (level or 0) > 0 or block):
        return
    target = _num(fields, "CONFIDENCE_INTERVAL") or (2 * float(conf.group(1)) if conf else None)
    asked = f"+/-{target / 2:g}% @ {conf.group(2) if conf else f'{level:g}'}%" if target else "requested"
    if "confidence was not achieved" in block:
        confids = dict(_CONFID_RE.findall(block))
        if "Throughput" in confids:
            m["confidence_interval_pct"] = float(confids["Throughput"])
        m["confidence_achieved"] = 0.0
        warnings.append(f"netperf: desired confidence ({asked}) was not achieved: " +
                        ", ".join(f"{k} {v}%" for k, v in confids.items()))
        return
    if not fields:                 # classic output prints the block whenever it was missed
        m["confidence_achieved"] = 1.0
        return
    if "THROUGHPUT_CONFID" not in fields:
        warnings.append("netperf: confidence was requested but THROUGHPUT_CONFID was not "
                        "printed; cannot tell whether it was achieved")
        return
    width = _num(fields, "THROUGHPUT_CONFID")
    iters = fields.get("CONFIDENCE_ITERATION", "?")
    if width is None:
        m["confidence_achieved"] = 0.0
        warnings.append(f"netperf: confidence ({asked}) requested but no interval was computed "
                        f"({iters} iteration(s) run)")
        return
    m["confidence_interval_pct"] = width
    widths = {"throughput": width}
    for side in ("LOCAL", "REMOTE"):       # netperf also holds CPU to the interval unless -r
        if _num(fields, f"{side}_CPU_UTIL") is not None and (w := _num(fields, f"{side}_CPU_CONFID")) is not None:
            widths[f"{side.lower()} CPU"] = w
    if target is None:
        warnings.append("netperf: confidence target unknown; cannot tell whether it was achieved")
        return
    missed = {k: w for k, w in widths.items() if w > target}
    m["confidence_achieved"] = 0.0 if missed else 1.0
    if missed:
        warnings.append(f"netperf: desired confidence ({asked}) was not achieved after {iters} "
                        "iterations: " + ", ".join(f"{k} {w:g}%" for k, w in missed.items()))


DRIVER = NetperfDriver()
