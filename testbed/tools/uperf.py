"""uperf: the profile XML, argv for master and slave, and a pure parser for what uperf prints.

uperf is not packaged for Debian; the parser is tested against captured real output: the
default format, ``-a`` all statistics, ``-R`` raw timestamped samples, the pre-1.0.4 layout,
and terminal captures where ``\\r`` repaints appear as separate lines.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import jinja2

from testbed.model import Pattern, Profile, Protocol, Tool
from testbed.tools.base import (ToolDriver, ToolResult, UnsupportedProfile, check_addr,
                                check_port, error_line, no_confidence, sizes)

TEMPLATES = Path(__file__).resolve().parents[2] / "templates"

# Writes (reads) per transaction iteration. uperf reads the clock and updates its statistics
# once per iteration; batching 16 operations, as pbench-uperf's stream profiles do (16 writes
# per Txn in its captured output), keeps that overhead out of a stream's throughput.
STREAM_BATCH = 16

_SAFE_NAME = re.compile(r"[^a-z0-9_-]+")


@dataclass(frozen=True)
class Flowop:
    type: str
    options: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Transaction:
    flowops: tuple[Flowop, ...]
    duration_s: int | None = None        # the timed loop; None: ``iterations`` times
    iterations: int = 1


@dataclass(frozen=True)
class Group:
    nthreads: int
    transactions: tuple[Transaction, ...]


@lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    # trim/lstrip blocks: control lines leave no blank lines, so one element per line
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)),
                              undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                              autoescape=jinja2.select_autoescape(["xml", "xml.j2"]),
                              trim_blocks=True, lstrip_blocks=True)


class UperfDriver(ToolDriver):
    name = Tool.UPERF
    cpu_scope = "system"
    default_port = 20000
    connections_as = "streams"

    def unsupported_reason(self, profile: Profile) -> str | None:
        if profile.protocol is Protocol.UDP and profile.pattern is Pattern.CRR:
            return "connect/request/response needs a connection; UDP has none"
        if profile.rate_bps is not None:
            return ("uperf paces transactions per second, not bits; a bit-rate target is not "
                    "mapped (use iperf3)")
        return None

    def groups(self, profile: Profile, server_addr: str, nthreads: int) -> tuple[Group, ...]:
        """The workload as data; the template turns it into uperf's XML."""
        self._check(profile)
        if not (isinstance(nthreads, int) and 0 < nthreads <= 4096):
            raise UnsupportedProfile(f"nthreads {nthreads!r} is not in 1..4096")
        connect = Flowop("connect", (("remotehost", check_addr(server_addr)),
                                     ("protocol", profile.protocol.value)))
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
        if profile.pattern is Pattern.RR:
            return (Group(nthreads, (Transaction((connect,)), Transaction((write, read), dur),
                                     Transaction((disconnect,)))),)
        return (Group(nthreads, (Transaction((connect, write, read, disconnect), dur),)),)

    def profile_xml(self, profile: Profile, server_addr: str, nthreads: int) -> str:
        groups = self.groups(profile, server_addr, nthreads)
        name = _SAFE_NAME.sub("-", profile.name.lower()).strip("-") or "testbed"
        return _env().get_template("uperf/profile.xml.j2").render(name=name, groups=groups)

    def profile_path(self, profile: Profile, port: int | None = None) -> str:
        """Where the caller writes ``profile_xml`` on the client; one file per instance."""
        name = _SAFE_NAME.sub("-", profile.name.lower()).strip("-") or "testbed"
        return f"/tmp/tb-uperf-{name}{f'-{port}' if port else ''}.xml"

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


# -- parsing ------------------------------------------------------------------------------

_RAW_RE = re.compile(r"timestamp_ms:([\d.]+)\s+name:(\S+)\s+nr_bytes:(\d+)\s+nr_ops:(\d+)")
_SUMMARY_RE = re.compile(
    r"^(?P<name>[\w.-]+)\s+(?P<data>[\d.]+)\s*(?P<du>[KMGTPEZ]?B)?\s*/\s*(?P<secs>[\d.]+)\s*\(s\)"
    r"\s*=\s*(?P<rate>[\d.]+)\s*(?P<ru>[KMGTPEZ]?b(?:/s|ps))?(?:\s+(?P<ops>[\d.]+)(?P<opu>op|txn)/s)?")
_TIME = r"[\d.]+[num]?s"
_AVG_RE = re.compile(rf"^(Txn\d+)\s+(\d+)\s+({_TIME})\s+({_TIME})\s+({_TIME})\s+({_TIME})\s*$")
_LEGACY_TXN_RE = re.compile(r"^(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$")
_RUN_RE = re.compile(r"^(?P<host>\S+)\s+(?P<t>[\d.]+)(?P<tu>[num]?s)?\s+(?P<d>[\d.]+)(?P<du>[KMGTPEZ]?B)?"
                     r"\s+(?P<r>[\d.]+)(?P<ru>[KMGTPEZ]?b(?:/s|ps))?\s+(?P<ops>\d+)\s+(?P<err>[\d.]+)\s*$")
_FAIL_RE = re.compile(r"Errors detected during run|Slave aborted|\babort(?:ed)?\b|^Error \d+:|"
                      r"^Error (?:parsing|connecting|in handshake|saying goodbye)|"
                      r"^Cannot (?:stat|open|read)|^No profile found|^Zero byte file", re.I)
_LOGGED_RE = re.compile(r"^\*\* (?:\d+ (Errors|Warnings) )?(?:\[[^\]]*\] )?(.*)")
_WARN_RE = re.compile(r"^(?:\*\* )?(?:\[[^\]]*\] )?Warning:")
_PREFIX = " KMGTPEZ"


def _bytes(value: str, unit: str | None) -> float:
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


def parse(stdout: str, stderr: str = "", rc: int = 0) -> ToolResult:
    # \r repaints (terminal captures) become separate lines; the last repaint wins below
    lines = [ln.strip() for ln in re.split(r"[\r\n]+", stdout or "") if ln.strip()]
    errs = [ln.strip() for ln in re.split(r"[\r\n]+", stderr or "") if ln.strip()]
    bad = next((ln for ln in errs + lines if _failure(ln)), None)
    if rc != 0 or bad:
        line = bad or error_line((stderr, stdout), _FAIL_RE) or "no output"
        return ToolResult.failed(f"uperf exited {rc}: {line}" if rc else f"uperf: {line}")
    warnings = list(dict.fromkeys(f"uperf: {ln.lstrip('* ')}" for ln in lines if _WARN_RE.match(ln)))

    raw: dict[str, list[tuple[float, int, int]]] = {}
    summary: dict[str, re.Match[str]] = {}
    table: list[tuple[str, int, float, float, float]] = []     # name, count, avg, max, min (s)
    legacy: dict[str, tuple[float, float, float]] = {}         # name: avg, min, max (s)
    run: dict[str, re.Match[str]] = {}
    section = ""
    for ln in lines:
        if m := _RAW_RE.search(ln):
            raw.setdefault(m.group(2), []).append((float(m.group(1)), int(m.group(3)), int(m.group(4))))
            continue
        if ln.startswith(("Txn ", "Flowop ", "Netstat", "Group ", "Section:", "Strand", "Nic ")):
            section = "txn" if re.match(r"Txn\s+(Count|Avg)", ln) else "other"
        elif ln.startswith(("Run Statistics", "Error Statistics")):
            section = "run"
        elif ln.startswith("Difference"):
            section = ""
        if m := _SUMMARY_RE.match(ln):
            summary[m.group("name")] = m                       # the last repaint wins
        elif section == "txn" and (m := _AVG_RE.match(ln)):
            table.append((m.group(1), int(m.group(2)), *(_secs(m.group(i)) for i in (3, 5, 6))))
        elif section == "txn" and (m := _LEGACY_TXN_RE.match(ln)):
            legacy[f"Txn{m.group(1)}"] = (float(m.group(2)) / 1e3, float(m.group(4)) / 1e3,
                                          float(m.group(5)) / 1e3)
        elif section == "run" and (m := _RUN_RE.match(ln)):
            run[m.group("host")] = m

    if "Total" not in raw and "Total" not in summary and not run:
        # uperf prints its totals only once every strand has finished
        return ToolResult.failed("uperf output ends before its totals (run cut short?): "
                                 f"{lines[-1] if lines else 'no output'}")
    metrics: dict[str, float] = {}
    intervals: list[dict[str, float]] = []
    main = _main_txn(raw, summary, metrics, intervals)
    master = run.get("master") or run.get("Master")
    if "throughput_mbps" not in metrics and master:
        metrics["throughput_mbps"] = _bits(master["r"], master["ru"]) / 1e6
        warnings.append("uperf printed no per-transaction figures; throughput is over the whole "
                        "run, connection setup included")
    if "throughput_mbps" not in metrics:
        return ToolResult.failed(f"uperf printed no result: {error_line((stderr, stdout), _FAIL_RE) or 'no output'}")
    slaves_err = [m for h, m in run.items() if h not in ("master", "Master") and float(m["err"]) > 0]
    if slaves_err:
        return ToolResult.failed(f"uperf counted errors: {slaves_err[0].group(0)} "
                                 "(the last column is the error percentage)", warnings)
    if master:
        metrics["operations"] = float(master["ops"])
        metrics["errors"] = 0.0
    if "Total" in raw:
        metrics["bytes"] = float(raw["Total"][-1][1])          # exact, unlike "6.74GB"
    elif master:
        metrics["bytes"] = float(round(_bytes(master["d"], master["du"])))   # 3 digits only
    longest = max([_secs(m["t"] + (m["tu"] or "s")) for m in run.values()] + [metrics.get("duration_s", 0.0)])
    _latency(main, table, legacy, summary, longest, metrics, warnings)
    return ToolResult(ok=True, metrics=metrics, warnings=tuple(warnings), intervals=tuple(intervals))


def _main_txn(raw: dict[str, list[tuple[float, int, int]]], summary: dict[str, re.Match[str]],
              metrics: dict[str, float], intervals: list[dict[str, float]]) -> str | None:
    """Throughput of the timed transaction (the one with the most operations), as pbench
    computes it: the connect and disconnect phases and uperf's 1 s settling are left out."""
    txns = {n: s for n, s in raw.items() if re.fullmatch(r"Txn\d+", n)}
    if txns:
        main = max(txns, key=lambda n: (txns[n][-1][2], txns[n][-1][1]))
        samples = txns[main]
        (t0, b0, _), (t1, b1, _) = samples[0], samples[-1]
        if t1 > t0:
            metrics["duration_s"] = (t1 - t0) / 1e3
            metrics["throughput_mbps"] = (b1 - b0) * 8 / metrics["duration_s"] / 1e6
        for (ta, ba, oa), (tb, bb, ob) in zip(samples, samples[1:]):
            if tb > ta:
                dt = (tb - ta) / 1e3
                intervals.append({"timestamp_ms": tb, "duration_s": dt, "bytes": float(bb - ba),
                                  "operations": float(ob - oa),
                                  "throughput_mbps": (bb - ba) * 8 / dt / 1e6})
        return main
    lines = {n: m for n, m in summary.items() if re.fullmatch(r"Txn\d+", n)}
    if not lines:
        return None
    main = max(lines, key=lambda n: (float(lines[n]["ops"] or 0) * float(lines[n]["secs"]),
                                     _bytes(lines[n]["data"], lines[n]["du"])))
    m = lines[main]
    metrics["duration_s"] = float(m["secs"])
    metrics["throughput_mbps"] = _bits(m["rate"], m["ru"]) / 1e6
    if m["opu"] == "txn":       # the pre-1.0.4 layout counts transactions, not flowops
        metrics["transactions_per_s"] = float(m["ops"])
    return main


def _latency(main: str | None, table: list[tuple[str, int, float, float, float]],
             legacy: dict[str, tuple[float, float, float]], summary: dict[str, re.Match[str]],
             longest: float, metrics: dict[str, float], warnings: list[str]) -> None:
    """Per-transaction time of the timed transaction from the Txn table. The table numbers
    transactions from 0, the samples from 1, so the timed one is the row with most counts."""
    if table:
        name, count, avg, mx, mn = max(table, key=lambda row: row[1])
        if metrics.get("duration_s"):
            metrics["transactions_per_s"] = count / metrics["duration_s"]
    elif main in legacy and main in summary:
        name, (avg, mn, mx) = main, legacy[main]
    else:
        return
    metrics["latency_mean_us"] = avg * 1e6
    if mn <= avg:
        metrics["latency_min_us"] = mn * 1e6
    else:
        warnings.append(f"uperf printed a minimum {name} time above its average; left out")
    if avg <= mx <= max(longest, avg):
        metrics["latency_max_us"] = mx * 1e6
    else:
        warnings.append(f"uperf printed an impossible maximum {name} time ({mx:.0f} s in a "
                        f"{longest:.0f} s run, a counter wrap); left out")
