"""uperf: the profile XML, argv for master and slave, and a pure parser for what uperf prints.

uperf is not packaged for Debian; the parser is tested against captured real output: the
``-a -R`` output it is run with (exact byte counts, the Txn and Flowop tables, the slaves'
rows), the default format where its sizes are cut to 8 characters (read with their unit
suffixes, refused where the unit was cut off), the pre-1.0.4 layout, and terminal captures
where ``\\r`` repaints appear as separate lines. The slave's own output is read too: its
errors never reach the master's.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import jinja2

from testbed.host import paths
from testbed.tools import pacing
from testbed.tools.base import (
    ToolDriver,
    ToolResult,
    UnsupportedProfile,
    check_addr,
    check_port,
    error_line,
    no_confidence,
    sizes,
)
from testbed.topology.model import Pattern, Profile, Protocol, Tool

# Writes (reads) per transaction iteration. uperf reads the clock and updates its statistics
# once per iteration; batching 16 operations, as pbench-uperf's stream profiles do (16 writes
# per Txn in its captured output), keeps that overhead out of a stream's throughput.
STREAM_BATCH = 16

_SAFE_NAME = re.compile(r"[^a-z0-9_-]+")


@dataclass(frozen=True)
class Flowop:
    type: str
    options: tuple[tuple[str, str | None], ...] = ()     # None: a bare flag (tcp_nodelay)


@dataclass(frozen=True)
class Transaction:
    flowops: tuple[Flowop, ...]
    duration_s: int | None = None        # the timed loop; None: ``iterations`` times
    iterations: int = 1
    #: uperf's <transaction rate=N>: N transactions per second per thread (rate.c); None: flat out
    rate: int | None = None


@dataclass(frozen=True)
class Group:
    nthreads: int
    transactions: tuple[Transaction, ...]


@lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    # trim/lstrip blocks: control lines leave no blank lines, so one element per line
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(paths.templates_dir())),
                              undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                              autoescape=jinja2.select_autoescape(["xml", "xml.j2"]),
                              trim_blocks=True, lstrip_blocks=True)


class UperfDriver(ToolDriver):
    name = Tool("uperf")
    version_args = ("-V",)
    # its "Uperf Version x.y.z" line; the first digits after "uperf" are in an e-mail address
    version_re = r"(?m)^Uperf(?:_slave)? Version (\d+(?:\.\d+)+)"
    search_unsupported = "uperf paces transactions per second on request/response only here; use iperf3"
    pacing_loop = "closed"      # rate.c paces each thread's transactions, one outstanding at a time

    def pacing_reason(self, protocol, pattern, rate):
        if rate.bps is not None:
            return ("uperf paces transactions per second (<transaction rate=...>), not bits; "
                    "use iperf3 for a bit-rate target")
        return None

    def pacing_probe(self, write):
        # uperf's parser reads the rate before it connects: a one-transaction profile with a
        # rate, aimed at the discard port
        if write is None:
            return "uperf pacing probe needs a file on the client"
        path = "/tmp/tb-pace-probe.xml"
        write(path, '<?xml version="1.0"?>\n<profile name="tb-pace-probe">\n  <group nthreads="1">\n'
                    '    <transaction duration="1s" rate="10">\n'
                    '      <flowop type="connect" options="remotehost=127.0.0.1 protocol=tcp port=9"/>\n'
                    '    </transaction>\n  </group>\n</profile>\n')
        return ["uperf", "-m", path, "-P", "9"]

    def pacing_verdict(self, stdout, stderr, rc):
        out = f"{stdout}\n{stderr}"
        low = out.lower()
        if "error" in low and "rate" in low:
            return f"the installed uperf refuses <transaction rate=...>: {out.strip()[:200]}"
        if "connect" in low or "refused" in low:
            return None
        return super().pacing_verdict(stdout, stderr, rc)
    cpu_scope = "system"
    default_port = 20000
    connections_as = "streams"
    reads_server_output = True

    def unsupported_reason(self, profile: Profile) -> str | None:
        if profile.protocol is Protocol.UDP and profile.pattern is Pattern.CRR:
            return "connect/request/response needs a connection; UDP has none"
        if profile.protocol is Protocol.UDP and profile.pattern is Pattern.BIDIRECTIONAL:
            return ("uperf's slave counts what it sent and received as one figure, so what "
                    "arrived in each direction is unknown; run stream and maerts")
        if profile.rate_bps is not None:
            return ("uperf paces transactions per second, not bits; a bit-rate target is not "
                    "mapped (use iperf3)")
        if profile.rate_tps is not None and not profile.pattern.is_transactional:
            return "a transactions-per-second target paces request/response patterns only"
        return None

    def groups(self, profile: Profile, server_addr: str, nthreads: int) -> tuple[Group, ...]:
        """The workload as data; the template turns it into uperf's XML."""
        self._check(profile)
        if not (isinstance(nthreads, int) and 0 < nthreads <= 4096):
            raise UnsupportedProfile(f"nthreads {nthreads!r} is not in 1..4096")
        # Request/response over TCP sets TCP_NODELAY, as pbench's and crucible's uperf profiles
        # do: otherwise Nagle holds a small request until the previous one is acknowledged.
        nodelay = ((("tcp_nodelay", None),) if profile.pattern.is_transactional
                   and profile.protocol is Protocol.TCP else ())
        connect = Flowop("connect", (("remotehost", check_addr(server_addr)),
                                     ("protocol", profile.protocol.value), *nodelay))
        disconnect = Flowop("disconnect")
        size, resp = sizes(profile)
        dur = profile.duration_s

        def stream(op: str) -> Group:
            loop = Flowop(op, (("count", str(STREAM_BATCH)), ("size", str(size))))
            return Group(nthreads, (Transaction((connect,)), Transaction((loop,), dur),
                                    Transaction((disconnect,))))
        write, read = Flowop("write", (("size", str(size)),)), Flowop("read", (("size", str(resp)),))
        if profile.pattern is Pattern.STREAM:
            return (stream("write"),)
        if profile.pattern is Pattern.MAERTS:
            return (stream("read"),)          # the slave does the inverse: it writes
        if profile.pattern is Pattern.BIDIRECTIONAL:
            return (stream("write"), stream("read"))   # nthreads connections each way
        # Paced: the pair's target split over its threads (rate is per thread)
        rate = pacing.per_stream(profile.rate_tps, nthreads) if profile.rate_tps else None
        if profile.pattern is Pattern.RR:
            return (Group(nthreads, (Transaction((connect,)), Transaction((write, read), dur, rate=rate),
                                     Transaction((disconnect,)))),)
        return (Group(nthreads, (Transaction((connect, write, read, disconnect), dur, rate=rate),)),)

    def profile_xml(self, profile: Profile, server_addr: str, nthreads: int) -> str:
        groups = self.groups(profile, server_addr, nthreads)
        name = _SAFE_NAME.sub("-", profile.name.lower()).strip("-") or "testbed"
        return _env().get_template("uperf/profile.xml.j2").render(name=name, groups=groups)

    def profile_path(self, profile: Profile, port: int | None = None) -> str:
        """Where the caller writes ``profile_xml`` on the client; one file per instance."""
        name = _SAFE_NAME.sub("-", profile.name.lower()).strip("-") or "testbed"
        return f"/tmp/tb-uperf-{name}{f'-{port}' if port else ''}.xml"

    def client_plan(self, profile: Profile, server_addr: str, *, port: int | None, connections: int,
                    write_file: Callable[[str, str], object]) -> tuple[list[str], int]:
        """One client whose profile XML (written where the client runs) has ``connections``
        threads, each with its own connection."""
        path = self.profile_path(profile, port)
        write_file(path, self.profile_xml(profile, server_addr, connections))
        return self.client_argv(profile, server_addr, port=port, profile_path=path), 1

    def server_argv(self, profile: Profile, *, port: int | None = None) -> list[str]:
        return ["uperf", "-s", *(["-P", str(port)] if check_port(port) else [])]

    def client_argv(self, profile: Profile, server_addr: str, *, port: int | None = None,
                    confidence: tuple[int, int] | None = None,
                    iterations: tuple[int, int] | None = None,
                    profile_path: str | None = None) -> list[str]:
        """The server address lives in the profile XML; it is checked here all the same."""
        self._check(profile)
        check_addr(server_addr)
        no_confidence("uperf", confidence, iterations)
        # -a: Txn/Flowop tables (per-transaction latency and counts), run statistics with the
        # slave's error count. -R: raw cumulative samples with exact byte counts and ms
        # timestamps instead of rounded "GB" figures repainted with \r. -i 1: one per second.
        argv = ["uperf", "-m", profile_path or self.profile_path(profile, port), "-a", "-R", "-i", "1"]
        return argv + (["-P", str(port)] if check_port(port) else [])

    def parse(self, stdout: str, stderr: str = "", rc: int = 0) -> ToolResult:
        return parse(stdout, stderr, rc)

    def parse_sample(self, stdout: str, stderr: str = "", rc: int = 0, *, profile: Profile,
                     server_output: str = "") -> ToolResult:
        return parse(stdout, stderr, rc, server_output=server_output, profile=profile)


# -- parsing ------------------------------------------------------------------------------
# Formats, from uperf's src/print.c and src/numbers.c:
#   -R       "timestamp_ms:%.4f name:%s nr_bytes:%lu nr_ops:%lu", cumulative per transaction
#   default  "%-8.8s " + size in an 8-wide field + "/%7.2f(s) = " + rate + " %10.0fop/s",
#            repainted in place with \r. The size comes from snprintf(buf, 8, "%.2f%cB"), so it
#            is cut to 7 characters: "602.40MB" prints as "602.40M", and "1015.23KB" as
#            "1015.23" with its unit gone.
#   -a       Txn and Flowop tables: count (summed over threads), average, cpu, max, min; the
#            Run Statistics rows of every slave and the master (Data in a 10-wide field, so
#            whole), then "Difference(%)" whose last column is the larger error percentage.
#   slave    its error log, "** <message> <strerror>" or "** N Errors <message> ...", on its
#            own stdout: "Error executing transactions" never reaches the master's output.

_RAW_RE = re.compile(r"timestamp_ms:([\d.]+)\s+name:(\S+)\s+nr_bytes:(\d+)\s+nr_ops:(\d+)")
_SUMMARY_RE = re.compile(
    r"^(?P<name>[\w.-]+)\s+(?P<data>[\d.]+)\s*(?P<du>[KMGTPEZ]?B?)\s*/\s*(?P<secs>[\d.]+)\s*\(s\)"
    r"\s*=\s*(?P<rate>[\d.]+)\s*(?P<ru>[KMGTPEZ]?b(?:/s|ps))?(?:\s+(?P<ops>[\d.]+)(?P<opu>op|txn)/s)?")
_TIME = r"[\d.]+[num]?s"
_ROW_RE = re.compile(rf"^(\S+)\s+(\d+)\s+({_TIME})\s+({_TIME})\s+({_TIME})\s+({_TIME})\s*$")
_LEGACY_TXN_RE = re.compile(r"^(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$")
_RUN_RE = re.compile(r"^(?P<host>\S+)\s+(?P<t>[\d.]+)(?P<tu>[num]?s)?\s+(?P<d>[\d.]+)(?P<du>[KMGTPEZ]?B)?"
                     r"\s+(?P<r>[\d.]+)(?P<ru>[KMGTPEZ]?b(?:/s|ps))?\s+(?P<ops>\d+)\s+(?P<err>[\d.]+)\s*$")
_DIFF_RE = re.compile(r"^Difference\(%\)((?:\s+-?[\d.]+%){5})\s*$")
_THREADS_RE = re.compile(r"^Starting (\d+) threads")
_VERSION_RE = re.compile(r"^Uperf(?:_slave)? Version (\d+(?:\.\d+)+)", re.M)
_FAIL_RE = re.compile(r"Errors detected during run|Slave aborted|\babort(?:ed)?\b|^Error \d+:|"
                      r"^Error (?:parsing|connecting|in handshake|saying goodbye|starting slave)|"
                      r"^Cannot (?:stat|open|read)|^No profile found|^Zero byte file", re.I)
_LOGGED_RE = re.compile(r"^\*\* (?:\d+ (Errors|Warnings) )?(?:\[[^\]]*\] )?(.*)")
# The slave prints nothing when all went well (a real 1.0.7 slave, fixtures/uperf-real); what it
# does print are its own printf'ed failures (common.c, slave.c, goodbye.c, handshake.c), e.g.
# "Error during reading command: connection closed" then "Error in get command".
_SLAVE_FAIL_RE = re.compile(r"^(?:Error\b|error\b|Wrong (?:command|goodbye) magic|Cannot |"
                            r"Unknown command|Unsupported protocol|Quitting)")
_WARN_RE = re.compile(r"^(?:\*\* )?(?:\[[^\]]*\] )?Warning:")
_PREFIX = " KMGTPEZ"


class Unparseable(ValueError):
    """uperf printed a figure that cannot be read back faithfully."""


def parse_version(text: str) -> str | None:
    """The version from ``uperf -V``: its "Uperf Version 1.0.8" line, never the first digits
    found (the same output carries a bug-report address and a licence version)."""
    m = _VERSION_RE.search(text or "")
    return m.group(1) if m else None


def _bytes(value: str, unit: str | None) -> float:
    if not unit and "." in value:
        # "%.2fB" never prints a bare decimal: this is an 8-character field that lost its unit
        raise Unparseable(f"size {value!r} lost its unit to uperf's 8-character field")
    return float(value) * 1024 ** _PREFIX.index(unit[0] if unit and unit != "B" else " ")


def _bits(value: str, unit: str | None) -> float:
    return float(value) * 1000 ** _PREFIX.index(unit[0] if unit and unit[0] != "b" else " ")


def _secs(text: str) -> float:
    scale = {"n": 1e-9, "u": 1e-6, "m": 1e-3}.get(text[-2], 1.0) if len(text) > 1 else 1.0
    return float(text.rstrip("nums")) * scale


def _failure(line: str) -> bool:
    m = _LOGGED_RE.match(line)
    if m and m.group(1) != "Warnings" and not m.group(2).startswith("Warning"):
        return True       # uperf's error log: "** <message> <strerror>"
    return bool(_FAIL_RE.search(line))


def _lines(text: str) -> list[str]:
    # \r repaints (terminal captures) become separate lines; the last repaint wins below
    return [ln.strip() for ln in re.split(r"[\r\n]+", text or "") if ln.strip()]


@dataclass(frozen=True)
class Row:
    """One row of the Txn or Flowop table (times in seconds; count summed over threads)."""
    name: str
    count: int
    avg: float
    max: float
    min: float


@dataclass
class _Output:
    raw: dict[str, list[tuple[float, int, int]]]
    summary: dict[str, re.Match[str]]
    txn_rows: list[Row]
    flowop_rows: list[Row]
    legacy: dict[str, tuple[float, float, float]]
    run: dict[str, re.Match[str]]
    diff: list[float] | None
    threads: int | None


def _scan(lines: list[str]) -> _Output:
    out = _Output({}, {}, [], [], {}, {}, None, None)
    section = ""
    for ln in lines:
        if m := _RAW_RE.search(ln):
            out.raw.setdefault(m.group(2), []).append((float(m.group(1)), int(m.group(3)), int(m.group(4))))
            continue
        if (m := _THREADS_RE.match(ln)) and out.threads is None:
            out.threads = int(m.group(1))
        if ln.startswith(("Txn ", "Flowop ", "Netstat", "Group ", "Section:", "Strand", "Nic ")):
            section = ("txn" if re.match(r"Txn\s+(Count|Avg)", ln) else
                       "flowop" if re.match(r"Flowop\s+Count", ln) else "other")
        elif ln.startswith(("Run Statistics", "Error Statistics")):
            section = "run"
        elif m := _DIFF_RE.match(ln):
            out.diff = [float(v) for v in re.findall(r"-?[\d.]+", m.group(1))]
            section = ""
        if m := _SUMMARY_RE.match(ln):
            out.summary[m.group("name")] = m                       # the last repaint wins
        elif section in ("txn", "flowop") and (m := _ROW_RE.match(ln)):
            row = Row(m.group(1), int(m.group(2)), _secs(m.group(3)), _secs(m.group(5)), _secs(m.group(6)))
            (out.txn_rows if section == "txn" else out.flowop_rows).append(row)
        elif section == "txn" and (m := _LEGACY_TXN_RE.match(ln)):
            out.legacy[f"Txn{m.group(1)}"] = (float(m.group(2)) / 1e3, float(m.group(4)) / 1e3,
                                              float(m.group(5)) / 1e3)
        elif section == "run" and (m := _RUN_RE.match(ln)):
            out.run[m.group("host")] = m
    return out


def parse(stdout: str, stderr: str = "", rc: int = 0, *, server_output: str = "",
          profile: Profile | None = None) -> ToolResult:
    """What the master printed (and, when given, the slave's own output and the profile that
    ran) -> ToolResult. Pure. Without ``profile`` the figures uperf itself prints are used
    (no receiver-side UDP figure, no per-direction split, no completed-transaction check)."""
    lines, errs, srv = _lines(stdout), _lines(stderr), _lines(server_output)
    bad = next((ln for ln in errs + lines if _failure(ln)), None)
    if rc != 0 or bad:
        line = bad or error_line((stderr, stdout), _FAIL_RE) or "no output"
        return ToolResult.failed(f"uperf exited {rc}: {line}" if rc else f"uperf: {line}")
    if slave_bad := next((ln for ln in srv if _failure(ln) or _SLAVE_FAIL_RE.match(ln)), None):
        return ToolResult.failed(f"uperf server (slave) reported: {slave_bad}")
    warnings = list(dict.fromkeys(f"uperf: {ln.lstrip('* ')}" for ln in lines if _WARN_RE.match(ln)))
    out = _scan(lines)
    if "Total" not in out.raw and "Total" not in out.summary and not out.run:
        # uperf prints its totals only once every strand has finished
        return ToolResult.failed("uperf output ends before its totals (run cut short?): "
                                 f"{lines[-1] if lines else 'no output'}")
    try:
        res = _figures(out, profile, warnings)
    except Unparseable as e:
        return ToolResult.failed(f"uperf output is not parseable: {e}; the testbed runs uperf "
                                 "with -R for exact figures", warnings)
    if res.ok and (profile is None or profile.pattern is not Pattern.BIDIRECTIONAL) and \
            (why := stalled_threads(out.raw)):
        secs = res.metrics.get("duration_s")
        return ToolResult.failed(why + (f"; the run's time is {secs:.2f} s" + (
            f" of the requested {profile.duration_s} s" if profile is not None else "") if secs else ""),
            res.warnings)
    return res


#: threads of one sample whose operation counts lie more than this factor apart: the slow
#: ones stalled (seen: paced threads in TCG guests, three stopping at 127 operations while
#: one ran 2,488). Unpaced threads measured here were at most 1.8x apart.
STALL_FACTOR = 4.0


def stalled_threads(raw: dict[str, list[tuple[float, int, int]]], factor: float = STALL_FACTOR) -> str | None:
    """Pure: from uperf's per-strand totals (``-R``'s "Strand Details", Thr<N> lines), why
    the sample's threads did not run side by side, naming the slow ones and their counts;
    None when every thread ran within ``factor`` of the busiest."""
    thr = {n: v[-1][2] for n, v in raw.items() if re.fullmatch(r"Thr\d+", n) and v}
    if len(thr) < 2:
        return None
    top = max(thr.values())
    slow = {n: c for n, c in thr.items() if c * factor < top}
    if not slow:
        return None
    order = lambda n: int(n[3:])  # noqa: E731
    fast = ", ".join(f"{n} {thr[n]}" for n in sorted(thr, key=order) if n not in slow)
    return (f"uperf threads stalled: {', '.join(f'{n} {slow[n]}' for n in sorted(slow, key=order))} "
            f"operations against {fast} (more than {factor:g}x apart)")


def _figures(out: _Output, profile: Profile | None, warnings: list[str]) -> ToolResult:
    master = out.run.get("master") or out.run.get("Master")
    slaves = {h: m for h, m in out.run.items() if h not in ("master", "Master")}
    if bad := next((m for m in slaves.values() if float(m["err"]) > 0), None):
        return ToolResult.failed(f"uperf counted errors: {bad.group(0)} "
                                 "(the last column is the error percentage)", warnings)
    if out.diff is not None and out.diff[4] > 0:
        return ToolResult.failed(f"uperf counted errors: Difference(%) error column {out.diff[4]:.2f}%",
                                 warnings)
    metrics: dict[str, float] = {}
    intervals: list[dict[str, float]] = []
    main, main_bytes, printed_s = _main_txn(out, intervals)
    groups = _group_rows(out.txn_rows)
    shape = _shape(profile)
    nthreads = out.threads // max(len(groups), 1) if out.threads else None
    timed = [max(rows, key=lambda r: r.count) for rows in groups]

    # The time base: the transactions' own summed time per thread. uperf's interval samples
    # and its summary end when its one-second master loop notices the end, not when traffic
    # stopped (-9 % at 2 s, -3 % at 7 s).
    if timed and nthreads:
        metrics["duration_s"] = timed[0].count * timed[0].avg / nthreads
        warnings.append("duration_s: the timed transaction's own time (count x average / threads)")
    elif profile is not None:
        metrics["duration_s"] = float(profile.duration_s)
        warnings.append("duration_s: the requested duration (uperf printed no transaction table)")
    elif printed_s:
        metrics["duration_s"] = printed_s
        warnings.append("duration_s: uperf's own interval, which runs past the traffic by up "
                        "to a second (no transaction table, no profile)")
    if main_bytes is None and master:
        main_bytes = _bytes(master["d"], master["du"])
        warnings.append("uperf printed no per-transaction figures; bytes are over the whole run")
    if main_bytes is None or not metrics.get("duration_s"):
        return ToolResult.failed("uperf printed no result: no transferred bytes or no time", warnings)
    sent = main_bytes
    if "Total" in out.raw:
        metrics["bytes"] = float(out.raw["Total"][-1][1])          # exact, unlike "6.74GB"
    elif master:
        metrics["bytes"] = float(round(_bytes(master["d"], master["du"])))   # 3 digits only
    if master:
        metrics["operations"] = float(master["ops"])
        metrics["errors"] = 0.0
    received = main_bytes
    if profile is not None and profile.protocol is Protocol.UDP and not profile.pattern.is_transactional:
        if not slaves:
            return ToolResult.failed("uperf printed no slave row: a UDP stream's throughput is "
                                     "what arrived, and only the receiver counts that", warnings)
        slave_bytes = sum(_bytes(m["d"], m["du"]) for m in slaves.values())
        if profile.pattern is Pattern.MAERTS:
            sent, received = slave_bytes, main_bytes
        else:
            received = slave_bytes
        size, _ = sizes(profile)
        metrics["udp_sent_msgs"] = float(round(sent / size))
        metrics["udp_recv_msgs"] = float(round(received / size))
        metrics["loss_pct"] = 100.0 * (sent - received) / sent if sent > 0 else 0.0
        metrics["bytes"] = float(round(received))
    elif master and slaves and profile is not None:
        slave_bytes = sum(_bytes(m["d"], m["du"]) for m in slaves.values())
        master_bytes = _bytes(master["d"], master["du"])
        if master_bytes and abs(slave_bytes - master_bytes) / master_bytes > 0.01:
            warnings.append(f"uperf's slave counted {slave_bytes / 2**20:.2f} MiB, its master "
                            f"{master_bytes / 2**20:.2f} MiB")
    metrics["throughput_mbps"] = received * 8 / metrics["duration_s"] / 1e6
    if main is not None and main in out.summary and out.summary[main]["opu"] == "txn":
        metrics["transactions_per_s"] = float(out.summary[main]["ops"])   # pre-1.0.4 layout
    _latency(out, timed, shape, profile, metrics, warnings, main)
    if profile is not None and profile.pattern is Pattern.BIDIRECTIONAL:
        _per_direction(timed, nthreads, profile, metrics, warnings)
    return ToolResult(ok=True, metrics=metrics, warnings=tuple(warnings), intervals=tuple(intervals))


def _main_txn(out: _Output, intervals: list[dict[str, float]]) -> tuple[str | None, float | None, float | None]:
    """(name, bytes, uperf's own seconds) of the timed transaction (the one with the most
    operations): from the exact raw samples, else from the last repaint of its summary line."""
    txns = {n: s for n, s in out.raw.items() if re.fullmatch(r"Txn\d+", n)}
    if txns:
        main = max(txns, key=lambda n: (txns[n][-1][2], txns[n][-1][1]))
        samples = txns[main]
        for (ta, ba, oa), (tb, bb, ob) in zip(samples, samples[1:]):
            if tb > ta:
                dt = (tb - ta) / 1e3
                intervals.append({"timestamp_ms": tb, "duration_s": dt, "bytes": float(bb - ba),
                                  "operations": float(ob - oa),
                                  "throughput_mbps": (bb - ba) * 8 / dt / 1e6})
        return main, float(samples[-1][1]), (samples[-1][0] - samples[0][0]) / 1e3 or None
    lines = {n: m for n, m in out.summary.items() if re.fullmatch(r"Txn\d+", n)}
    if not lines:
        return None, None, None
    main = max(lines, key=lambda n: float(lines[n]["ops"] or 0) * float(lines[n]["secs"]))
    m = lines[main]
    return main, _bytes(m["data"], m["du"]), float(m["secs"])


def _group_rows(rows: list[Row]) -> list[list[Row]]:
    """The Txn table lists every group's transactions in turn, each numbered from Txn0."""
    groups: list[list[Row]] = []
    for row in rows:
        if row.name == "Txn0" or not groups:
            groups.append([])
        groups[-1].append(row)
    return groups


def _shape(profile: Profile | None) -> list[list[int]] | None:
    """Flowops per transaction, per group, of the profile this driver generates for it."""
    if profile is None:
        return None
    try:
        groups = UperfDriver().groups(profile, "198.18.0.1", 1)
    except UnsupportedProfile:
        return None
    return [[len(t.flowops) for t in g.transactions] for g in groups]


def _timed_flowops(out: _Output, shape: list[list[int]] | None, group: int) -> list[Row] | None:
    """The Flowop table rows of one group's timed transaction, found through the profile's shape."""
    if not shape or group >= len(shape):
        return None
    offset = sum(sum(g) for g in shape[:group])
    counts = shape[group]
    timed = 0 if len(counts) == 1 else 1        # alone (CRR), or between connect and disconnect
    start = offset + sum(counts[:timed])
    rows = out.flowop_rows[start:start + counts[timed]]
    return rows if len(rows) == counts[timed] else None


def _latency(out: _Output, timed: list[Row], shape: list[list[int]] | None, profile: Profile | None,
             metrics: dict[str, float], warnings: list[str], main: str | None) -> None:
    """Per-transaction time of the timed transaction from the Txn table."""
    if timed:
        row = timed[0]
        name, count, avg, mx, mn = row.name, row.count, row.avg, row.max, row.min
        ops = _timed_flowops(out, shape, 0)
        if profile is not None and profile.pattern.is_transactional and ops:
            # An iteration cut short at the end (a read interrupted when time ran out) counts in
            # the Txn row but not in the Flowop rows: only complete ones are transactions.
            count = min(count, *(r.count for r in ops))
            floor = sum(r.min for r in ops)
            if mn < floor * 0.999:
                warnings.append(f"uperf's minimum {name} time {mn * 1e6:.2f} us is below the sum "
                                f"of its flowops' minima ({floor * 1e6:.2f} us): it is an "
                                "interrupted last iteration; left out")
                mn = float("nan")
        if metrics.get("duration_s") and profile is not None and profile.pattern is not Pattern.BIDIRECTIONAL:
            metrics["transactions_per_s"] = count / metrics["duration_s"]
        elif metrics.get("duration_s") and profile is None:
            metrics["transactions_per_s"] = count / metrics["duration_s"]
    elif main in out.legacy and main in out.summary:
        name, (avg, mn, mx) = main, out.legacy[main]
    else:
        return
    if profile is not None and profile.pattern is Pattern.BIDIRECTIONAL:
        return                      # per direction below: one group's row is half the story
    metrics["latency_mean_us"] = avg * 1e6
    if mn == mn:                    # not NaN
        if mn <= avg:
            metrics["latency_min_us"] = mn * 1e6
        else:
            warnings.append(f"uperf printed a minimum {name} time above its average; left out")
    longest = max([_secs(m["t"] + (m["tu"] or "s")) for m in out.run.values()] + [metrics.get("duration_s", 0.0)])
    if avg <= mx <= max(longest, avg):
        metrics["latency_max_us"] = mx * 1e6
    else:
        warnings.append(f"uperf printed an impossible maximum {name} time ({mx:.0f} s in a "
                        f"{longest:.0f} s run, a counter wrap); left out")


def _per_direction(timed: list[Row], nthreads: int | None, profile: Profile,
                   metrics: dict[str, float], warnings: list[str]) -> None:
    """A bidirectional run is two groups: 0 writes (client to server), 1 reads. Each
    direction's rate is its own transactions' payload over their own time."""
    if len(timed) != 2 or not nthreads:
        warnings.append("uperf printed no per-group transaction table; no per-direction figures")
        return
    size, _ = sizes(profile)
    total = 0.0
    for row, side in zip(timed, ("out", "in")):
        secs = row.count * row.avg / nthreads
        if secs <= 0:
            continue
        mbps = row.count * STREAM_BATCH * size * 8 / secs / 1e6
        metrics[f"throughput_{side}_mbps"] = mbps
        metrics[f"latency_{side}_mean_us"] = row.avg * 1e6
        total += mbps
    if total:
        metrics["throughput_mbps"] = total


DRIVER = UperfDriver()
