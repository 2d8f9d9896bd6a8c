"""iperf3: argv for a one-off server and a ``-J`` client, and a pure parser for its JSON."""
from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from testbed.tools import pacing
from testbed.tools.base import ToolDriver, ToolResult, check_addr, check_port, error_line, no_confidence, sizes
from testbed.topology.model import Pattern, Profile, Protocol, Tool

_ERR_RE = re.compile(r"iperf3: error|error -|\berror\b", re.I)


class Iperf3Driver(ToolDriver):
    name = Tool("iperf3")
    version_args = ("--version",)
    version_re = r"iperf (\d+(?:\.\d+)+)"
    search_unsupported = None   # -b per trial on a UDP stream: what the rate search drives
    pacing_loop = "open"        # UDP datagrams on its pacing timer; iperf3 times no transactions

    def pacing_reason(self, protocol, pattern, rate):
        return "iperf3 paces bits only" if rate.tps is not None else None

    def pacing_probe(self, write):
        return ["iperf3", "-c", "127.0.0.1", "-p", "9", "-t", "1", "-b", "1000"]

    def pacing_verdict(self, stdout, stderr, rc):
        out = f"{stdout}\n{stderr}"
        low = out.lower()
        if "unrecognized option" in low or "invalid option" in low or "parameter" in low and "error" in low:
            return f"the installed iperf3 refuses -b: {out.strip().splitlines()[0] if out.strip() else rc}"
        if "unable to connect" in low or "connection refused" in low:
            return None
        return super().pacing_verdict(stdout, stderr, rc)
    cpu_scope = "process"         # iperf3 reports its own process's CPU; instances add up
    default_port = 5201
    connections_as = "streams"

    def unsupported_reason(self, profile: Profile) -> str | None:
        if profile.pattern.is_transactional:
            return "iperf3 measures streams only; use netperf or uperf for request/response"
        return None

    def server_argv(self, profile: Profile, *, port: int | None = None) -> list[str]:
        # -1: serve exactly one test and exit, so a stale server never answers the next sample
        return ["iperf3", "-s", "-1", *(["-p", str(port)] if check_port(port) else [])]

    def client_argv(self, profile: Profile, server_addr: str, *, port: int | None = None,
                    confidence: tuple[int, int] | None = None,
                    iterations: tuple[int, int] | None = None, streams: int = 1) -> list[str]:
        self._check(profile)
        no_confidence("iperf3", confidence, iterations)
        argv = ["iperf3", "-c", check_addr(server_addr)]
        if check_port(port):
            argv += ["-p", str(port)]
        size, _ = sizes(profile)
        argv += ["-J", "-i", "1", "-t", str(profile.duration_s), "-l", str(size)]
        if streams > 1:
            argv += ["-P", str(streams)]
        # A paced profile's target is per pair; iperf3's -b is per stream (-P), so split it.
        bps = pacing.per_stream(profile.rate_bps, streams) if profile.paced and profile.rate_bps else profile.rate_bps
        if profile.protocol is Protocol.UDP:
            # iperf3 paces UDP at 1 Mbit/s unless told otherwise; 0 means unlimited, as
            # netperf's UDP_STREAM sends
            argv += ["-u", "-b", str(bps or 0)]
        elif bps:
            argv += ["-b", str(bps)]
        if profile.pattern is Pattern.MAERTS:
            argv.append("-R")
        elif profile.pattern is Pattern.BIDIRECTIONAL:
            argv.append("--bidir")
        return argv

    def client_plan(self, profile: Profile, server_addr: str, *, port: int | None, connections: int,
                    write_file: Callable[[str, str], object]) -> tuple[list[str], int]:
        """One client with ``connections`` parallel streams (-P)."""
        return self.client_argv(profile, server_addr, port=port, streams=connections), 1

    def parse(self, stdout: str, stderr: str = "", rc: int = 0) -> ToolResult:
        return parse(stdout, stderr, rc)


def parse(stdout: str, stderr: str = "", rc: int = 0) -> ToolResult:
    text = stdout or ""
    start = text.find("{")
    try:
        doc, _ = json.JSONDecoder().raw_decode(text[start:]) if start >= 0 else (None, 0)
    except json.JSONDecodeError:
        doc = None
    if isinstance(doc, dict) and doc.get("error"):
        # iperf3 3.12 -J exits 0 even when it could not connect: the key is the only signal
        return ToolResult.failed(f"iperf3: {doc['error']}")
    if rc != 0 or not isinstance(doc, dict):
        line = error_line((stderr, stdout), _ERR_RE) or "no output"
        what = f"exited {rc}" if rc else "printed no JSON"
        return ToolResult.failed(f"iperf3 {what}: {line}")
    test = _get(doc, "start", "test_start")
    end = doc.get("end") or {}
    if not end:
        return ToolResult.failed("iperf3: JSON has no end summary (test did not finish)")
    udp = str(test.get("protocol", "")).upper() == "UDP"
    pairs = [("sum_sent", "sum_received")]
    if test.get("bidir") or "sum_received_bidir_reverse" in end:
        pairs.append(("sum_sent_bidir_reverse", "sum_received_bidir_reverse"))
    metrics: dict[str, float] = {}
    warnings: list[str] = []
    totals: dict[str, float] = {}
    for sent_key, recv_key in pairs:
        sent, recv = end.get(sent_key) or {}, end.get(recv_key) or {}
        if udp and not recv.get("packets") and (end.get("sum") or {}).get("packets"):
            recv = end["sum"]            # before 3.13 the receiver's UDP counts live in "sum"
        if "bits_per_second" not in recv:
            if "bits_per_second" not in (end.get("sum") or {}):
                return ToolResult.failed(f"iperf3: JSON end has no {recv_key}")
            recv = end["sum"]
            warnings.append(f"iperf3 printed no {recv_key}; throughput is the sender's rate")
        _add(totals, "throughput_mbps", recv["bits_per_second"] / 1e6)
        _add(totals, "bytes", recv.get("bytes"))
        _add(totals, "retransmits", None if udp else sent.get("retransmits"))
        totals["duration_s"] = max(totals.get("duration_s", 0.0), float(recv.get("seconds", 0.0)))
        if udp:
            _udp(recv, totals)
    metrics.update(totals)
    if udp and totals.get("udp_sent_msgs"):
        lost = totals["udp_sent_msgs"] - totals["udp_recv_msgs"]
        metrics["loss_pct"] = 100.0 * lost / totals["udp_sent_msgs"]
        if totals["udp_recv_msgs"] == 0:
            warnings.append(f"receiver got 0 of {totals['udp_sent_msgs']:.0f} datagrams sent")
    cpu = end.get("cpu_utilization_percent") or {}
    for key, name in (("host_total", "local_cpu_pct"), ("remote_total", "remote_cpu_pct")):
        if isinstance(cpu.get(key), (int, float)):
            metrics[name] = float(cpu[key])
    return ToolResult(ok=True, metrics=metrics, warnings=tuple(warnings),
                      intervals=tuple(_intervals(doc.get("intervals") or [], udp)))


def _get(doc: Mapping[str, Any], *keys: str) -> Mapping[str, Any]:
    for key in keys:
        doc = doc.get(key) or {}
    return doc


def _add(totals: dict[str, float], key: str, value: Any) -> None:
    if isinstance(value, (int, float)):
        totals[key] = totals.get(key, 0.0) + float(value)


def _udp(recv: Mapping[str, Any], totals: dict[str, float]) -> None:
    """The receiver's view: "packets" is what it expected by sequence number, "lost_packets"
    what never came. Packets still in flight when the test ended are in neither."""
    packets, lost = recv.get("packets"), recv.get("lost_packets")
    if isinstance(packets, int) and isinstance(lost, int):
        _add(totals, "udp_sent_msgs", packets)
        _add(totals, "udp_recv_msgs", packets - lost)
    if isinstance(recv.get("jitter_ms"), (int, float)):
        # one jitter per direction; keep the worse one
        totals["jitter_ms"] = max(totals.get("jitter_ms", 0.0), float(recv["jitter_ms"]))


def _intervals(intervals: list[Any], udp: bool) -> list[dict[str, float]]:
    out = []
    for iv in intervals:
        sums = [s for s in (iv.get("sum"), iv.get("sum_bidir_reverse")) if isinstance(s, dict)]
        if not sums:
            continue
        sample: dict[str, float] = {"start_s": float(sums[0].get("start", 0.0)),
                                    "end_s": float(sums[0].get("end", 0.0)),
                                    "duration_s": float(sums[0].get("seconds", 0.0)),
                                    "omitted": 1.0 if sums[0].get("omitted") else 0.0}
        for s in sums:
            _add(sample, "throughput_mbps", s.get("bits_per_second", 0.0) / 1e6)
            _add(sample, "bytes", s.get("bytes"))
            _add(sample, "retransmits", None if udp else s.get("retransmits"))
            if udp and isinstance(s.get("lost_packets"), int) and isinstance(s.get("packets"), int):
                _add(sample, "udp_sent_msgs", s["packets"])
                _add(sample, "udp_recv_msgs", s["packets"] - s["lost_packets"])
            if udp and isinstance(s.get("jitter_ms"), (int, float)):
                sample["jitter_ms"] = max(sample.get("jitter_ms", 0.0), float(s["jitter_ms"]))
        if sample.get("udp_sent_msgs"):
            sample["loss_pct"] = 100.0 * (sample["udp_sent_msgs"] - sample["udp_recv_msgs"]) / sample["udp_sent_msgs"]
        out.append(sample)
    return out


DRIVER = Iperf3Driver()
