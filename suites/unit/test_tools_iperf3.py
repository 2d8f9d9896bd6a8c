"""iperf3 driver: every captured JSON parses to the numbers in it; argv is exact; and (as
root) the real iperf3 runs between two network namespaces."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from testbed.tools import ToolResult, UnsupportedProfile, get_tool
from testbed.topology.model import Pattern, Profile, Protocol, Tool

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "recorded"   # see its SOURCES.md
IPERF3 = get_tool(Tool("iperf3"))


def read(name: str) -> str:
    return (FIXTURES / "iperf3" / name).read_bytes().decode()    # keeps CRLF as stored


# Values read off the fixture files: end.sum_received (the receiver), end.sum_sent.retransmits.
EXPECTED: dict[str, dict[str, float]] = {
    "iperf3_json_tcp_linux_3.9_omit3_cloudpilot.json": dict(
        throughput_mbps=1822.7897514320772, bytes=2279001216, retransmits=752,
        duration_s=10.002256, local_cpu_pct=5.8311311002902215, remote_cpu_pct=16.945834155369724),
    "iperf3_json_tcp_sender_macos_3.14_opte.json": dict(
        throughput_mbps=204.7374474407, bytes=255931304, duration_s=10.000371,
        local_cpu_pct=5.906207383298452, remote_cpu_pct=0.731671),
    "iperf3_json_udp_reverse_-u-R-b_macos_3.14_opte.json": dict(
        throughput_mbps=32.034981770479407, bytes=44048160, jitter_ms=0.068292653230841,
        udp_sent_msgs=30421, udp_recv_msgs=30420, loss_pct=0.003287202919036192),
}
INTERVALS = {"iperf3_json_tcp_linux_3.9_omit3_cloudpilot.json": 13,
             "iperf3_json_tcp_sender_macos_3.14_opte.json": 10,
             "iperf3_json_udp_reverse_-u-R-b_macos_3.14_opte.json": 11}


def fixture_files() -> list[Path]:
    return sorted(p for p in (FIXTURES / "iperf3").iterdir() if p.is_file())


@pytest.mark.parametrize("path", fixture_files(), ids=lambda p: p.name)
def test_every_fixture_parses(path: Path) -> None:
    result = IPERF3.parse(read(path.name))
    if "error" in json.loads(read(path.name)):
        assert not result.ok and result.reason
        return
    assert result.ok, result.reason
    assert result.metrics["throughput_mbps"] > 0
    for name, value in EXPECTED.get(path.name, {}).items():
        assert result.metrics.get(name) == pytest.approx(value), name
    if path.name in INTERVALS:
        assert len(result.intervals) == INTERVALS[path.name]


def test_expectations_name_real_files() -> None:
    assert set(EXPECTED) <= {p.name for p in fixture_files()}


def test_crlf_fixture_and_omitted_intervals() -> None:
    text = read("iperf3_json_tcp_linux_3.9_omit3_cloudpilot.json")
    assert "\r\n" in text
    intervals = IPERF3.parse(text).intervals
    assert [iv["omitted"] for iv in intervals[:4]] == [1.0, 1.0, 1.0, 0.0]
    assert intervals[0]["throughput_mbps"] == pytest.approx(1588.268070049601)
    assert intervals[0]["retransmits"] == 715


def test_no_retransmits_when_the_os_reports_none() -> None:
    result = IPERF3.parse(read("iperf3_json_tcp_sender_macos_3.14_opte.json"))
    assert "retransmits" not in result.metrics            # macOS: no such field, not 0


def test_udp_intervals_carry_loss_and_jitter() -> None:
    first = IPERF3.parse(read("iperf3_json_udp_reverse_-u-R-b_macos_3.14_opte.json")).intervals[0]
    assert first["udp_sent_msgs"] == 2516 and first["udp_recv_msgs"] == 2515
    assert first["jitter_ms"] == pytest.approx(0.33695417070836736)
    assert first["loss_pct"] == pytest.approx(0.0397456279809221)


# iperf 3.12 on this machine, verbatim: with -J it exits 0 although it could not connect.
REFUSED_JSON = ('{\n\t"start":\t{\n\t\t"connected":\t[],\n\t\t"version":\t"iperf 3.12",\n'
                '\t\t"system_info":\t"Linux vm 6.18.44-fc-v657 #1 SMP PREEMPT_DYNAMIC @0 x86_64"\n'
                '\t},\n\t"intervals":\t[],\n\t"end":\t{\n\t},\n'
                '\t"error":\t"unable to connect to server: Connection refused"\n}\n')


def test_error_key_fails_even_with_rc_0() -> None:
    result = IPERF3.parse(REFUSED_JSON, "", 0)
    assert result == ToolResult.failed("iperf3: unable to connect to server: Connection refused")


def test_plain_text_error_fails() -> None:
    result = IPERF3.parse("", "iperf3: error - unable to connect to server: Connection refused\n", 1)
    assert result.reason == "iperf3 exited 1: iperf3: error - unable to connect to server: Connection refused"


def test_nothing_printed_fails() -> None:
    assert IPERF3.parse("").reason == "iperf3 printed no JSON: no output"
    text = read("iperf3_json_tcp_sender_macos_3.14_opte.json")
    assert not IPERF3.parse(text, "", 1).ok                 # exit status counts too
    assert not IPERF3.parse(text[: len(text) // 2]).ok      # cut off mid-JSON


def test_aggregate_adds_process_cpu() -> None:
    a = IPERF3.parse(read("iperf3_json_tcp_sender_macos_3.14_opte.json"))
    both = IPERF3.aggregate([a, a])
    assert both.metrics["throughput_mbps"] == pytest.approx(2 * 204.7374474407)
    assert both.metrics["local_cpu_pct"] == pytest.approx(2 * 5.906207383298452)
    assert {iv["instance"] for iv in both.intervals} == {1.0, 2.0}


# -- argv ---------------------------------------------------------------------------------

def prof(pattern: Pattern, protocol: Protocol = Protocol.TCP, **kw) -> Profile:
    return Profile("p", tool=Tool("iperf3"), protocol=protocol, pattern=pattern, **kw)


BASE = ["iperf3", "-c", "198.18.0.2", "-J", "-i", "1", "-t", "10"]


@pytest.mark.parametrize("profile,tail", [
    (prof(Pattern.STREAM), ["-l", "16384"]),
    (prof(Pattern.MAERTS), ["-l", "16384", "-R"]),
    (prof(Pattern.BIDIRECTIONAL), ["-l", "16384", "--bidir"]),
    (prof(Pattern.STREAM, Protocol.UDP), ["-l", "1472", "-u", "-b", "0"]),
    (prof(Pattern.STREAM, Protocol.UDP, rate_bps=10**9, message_size=8000),
     ["-l", "8000", "-u", "-b", "1000000000"]),
    (prof(Pattern.STREAM, rate_bps=5 * 10**8), ["-l", "16384", "-b", "500000000"]),
], ids=["tcp_stream", "tcp_maerts", "tcp_bidir", "udp_stream", "udp_paced", "tcp_paced"])
def test_client_argv(profile: Profile, tail: list[str]) -> None:
    assert IPERF3.client_argv(profile, "198.18.0.2") == BASE + tail


def test_port_and_server_argv() -> None:
    profile = prof(Pattern.STREAM, duration_s=30)
    assert IPERF3.client_argv(profile, "198.18.0.2", port=5202) == [
        "iperf3", "-c", "198.18.0.2", "-p", "5202", "-J", "-i", "1", "-t", "30", "-l", "16384"]
    assert IPERF3.server_argv(profile) == ["iperf3", "-s", "-1"]
    assert IPERF3.server_argv(profile, port=5202) == ["iperf3", "-s", "-1", "-p", "5202"]


@pytest.mark.parametrize("profile,kw,match", [
    (prof(Pattern.RR), {}, "streams only"),
    (prof(Pattern.CRR), {}, "streams only"),
    (prof(Pattern.STREAM), dict(iterations=(10, 3)), "no confidence"),
    (Profile("p", tool=Tool("uperf")), {}, "is for uperf"),
])
def test_unsupported(profile, kw, match) -> None:
    with pytest.raises(UnsupportedProfile, match=match):
        IPERF3.client_argv(profile, "198.18.0.2", **kw)


