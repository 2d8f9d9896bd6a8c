"""uperf driver against outputs of a real uperf binary, run by `testbed run` on netns-veth
(see fixtures/uperf-real/SOURCES.md). Each figure is checked against a second source in the
same capture that the parser does not use for it: the host-side veth byte counters, uperf's
slave row, its raw interval samples."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from testbed.tools import get_tool
from testbed.tools.uperf import parse_version
from testbed.topology.model import Pattern, Profile, Protocol, Tool

pytestmark = pytest.mark.unit

HERE = Path(__file__).resolve().parent / "fixtures" / "uperf-real"
UPERF = get_tool(Tool("uperf"))
CAPTURE = json.loads((HERE / "capture.json").read_text())
ARGV = json.loads((HERE / "argv.json").read_text())
PROFILES = {
    "tcp_stream": dict(protocol=Protocol.TCP, pattern=Pattern.STREAM, message_size=16384),
    "tcp_rr": dict(protocol=Protocol.TCP, pattern=Pattern.RR, message_size=1, response_size=1),
    "tcp_crr": dict(protocol=Protocol.TCP, pattern=Pattern.CRR, message_size=1, response_size=1),
    "udp_stream": dict(protocol=Protocol.UDP, pattern=Pattern.STREAM, message_size=1400),
    "udp_rr": dict(protocol=Protocol.UDP, pattern=Pattern.RR, message_size=1, response_size=1),
}
CASES = sorted(CAPTURE)


def profile(case: str) -> Profile:
    kind = case.rsplit("-", 1)[0].removeprefix("vm-")
    return Profile(name=f"u_{kind}", tool=Tool("uperf"), duration_s=3, **PROFILES[kind])


def parsed(case: str):
    text = (HERE / f"{case}.client.out").read_text()
    return text, UPERF.parse_sample(text, "", 0, profile=profile(case), server_output="")


def device_rx_bytes(case: str) -> float:
    """Bytes the receiving namespace's veth took in over the sample window (host counters)."""
    c = CAPTURE[case]
    return max(d["to_guest"] for d in c["device_mbps"].values()) * c["window_s"] / 8 * 1e6


def txn_rows(text: str) -> dict[str, tuple[int, float]]:
    scale = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
    rows = {}
    for m in re.finditer(r"^(Txn\d+)\s+(\d+)\s+([\d.]+)(ns|us|ms|s)\s", text, re.M):
        rows[m.group(1)] = (int(m.group(2)), float(m.group(3)) * scale[m.group(4)])
    return rows


def test_version_is_read_from_the_real_version_line():
    # The binary is the reconstructed upstream tree, whose uperf.h says 1.0.7 (SOURCES.md);
    # the same output carries an e-mail address and "GNU GPL Version 3", which must not win.
    text = (HERE / "uperf-V.txt").read_text()
    assert "uperf-discuss@lists.sourceforge.net" in text and "Version 3" in text
    assert parse_version(text) == "1.0.7"


@pytest.mark.parametrize("case", CASES)
def test_every_real_capture_is_an_ok_sample_with_the_figures_recorded_at_capture(case):
    _, res = parsed(case)
    assert res.ok, res.reason
    for key, value in CAPTURE[case]["metrics_at_capture"].items():
        assert res.metrics[key] == pytest.approx(value, rel=1e-9), key


@pytest.mark.parametrize("case", ["tcp_stream-conn1", "tcp_stream-conn4", "vm-tcp_stream-conn1"])
def test_tcp_stream_bytes_are_uperfs_exact_total_and_what_the_wire_carried(case):
    text, res = parsed(case)
    total = int(re.findall(r"name:Total nr_bytes:(\d+)", text)[-1])
    assert res.metrics["bytes"] == total
    # the receiver's veth counted payload plus headers (about 3 %) over the same transfer
    assert 1.0 <= device_rx_bytes(case) / total < 1.03


@pytest.mark.parametrize("case", ["udp_stream-conn1", "udp_stream-conn4", "vm-udp_stream-conn1"])
def test_udp_stream_throughput_is_what_arrived_over_the_traffic_time(case):
    text, res = parsed(case)
    m = res.metrics
    # uperf's slave row: what the receiver read (MB to 2 decimals, 2^20 bytes)
    slave = re.search(r"^198\.18\.0\.\d+\s+[\d.]+s\s+([\d.]+)MB", text, re.M)
    received = float(slave.group(1)) * 2**20
    count, avg = txn_rows(text)["Txn1"]
    threads = int(case[-1])
    traffic_s = count * avg / threads
    assert m["throughput_mbps"] == pytest.approx(received * 8 / traffic_s / 1e6, rel=0.02)
    # Loss happened at the receiving socket: the veth delivered every datagram that was sent
    # (1400 B payload + 42 B of UDP/IP/Ethernet headers), and uperf's sender counted them.
    wire = device_rx_bytes(case)
    assert wire == pytest.approx(m["udp_sent_msgs"] * 1442, rel=0.02)
    assert m["loss_pct"] == pytest.approx(100 * (1 - received / (m["udp_sent_msgs"] * 1400)), abs=0.5)
    assert m["loss_pct"] > 3       # these captures lost datagrams: sent != received is exercised


@pytest.mark.parametrize("case", ["tcp_rr-conn1", "tcp_rr-conn4", "udp_rr-conn1", "udp_rr-conn4",
                                  "vm-tcp_rr-conn1"])
def test_rr_rate_agrees_with_uperfs_interval_samples(case):
    text, res = parsed(case)
    # whole one-second intervals of the timed transaction (Txn2): ops are its two flowops
    samples = [(float(t), int(o)) for t, o in re.findall(r"timestamp_ms:([\d.]+) name:Txn2 nr_bytes:\d+ nr_ops:(\d+)", text)]
    (t0, o0), (t1, o1) = samples[1], samples[-2]
    rate = (o1 - o0) / 2 / ((t1 - t0) / 1e3)
    assert res.metrics["transactions_per_s"] == pytest.approx(rate, rel=0.05)


@pytest.mark.parametrize("case", ["tcp_crr-conn1", "tcp_crr-conn4"])
def test_crr_time_is_the_traffic_time_not_the_requested_duration(case):
    """uperf's callouts have one-second granularity (shm.c truncates the stop time to whole
    seconds), so a 3 s CRR loop stopped after about 2.1-2.4 s; the interval samples show the
    same span. Dividing by the requested 3 s would understate the rate by a third."""
    text, res = parsed(case)
    samples = [(float(t), int(o)) for t, o in re.findall(r"timestamp_ms:([\d.]+) name:Txn1 nr_bytes:\d+ nr_ops:(\d+)", text)]
    moving = [t for (t, o), (_, prev) in zip(samples[1:], samples) if o > prev]
    span = (moving[-2] - samples[0][0]) / 1e3         # last full sample before the stop
    assert res.metrics["duration_s"] < 2.9
    assert span <= res.metrics["duration_s"] <= span + 0.35
    ops = samples[-1][1]
    assert res.metrics["transactions_per_s"] == pytest.approx(ops / 4 / res.metrics["duration_s"], rel=0.01)


def test_profiles_and_argv_recorded_are_what_the_driver_generates_today():
    for case in CASES:
        p = profile(case)
        n = int(case[-1])
        assert UPERF.profile_xml(p, "198.18.0.2", n) == (HERE / f"{case}.profile.xml").read_text()
        assert UPERF.client_argv(p, "198.18.0.2", profile_path=UPERF.profile_path(p)) == ARGV[case]["client"]
        rr = p.pattern in (Pattern.RR, Pattern.CRR) and p.protocol is Protocol.TCP
        assert ("tcp_nodelay" in (HERE / f"{case}.profile.xml").read_text()) == rr


def test_a_slave_that_died_mid_run_fails_the_sample():
    # the slave's connection child was killed 2 s into a 4 s stream; uperf exited 1
    text = (HERE / "slave-killed.client.out").read_text()
    assert "Slave aborted" in text
    res = UPERF.parse_sample(text, "", 1, profile=profile("tcp_stream-conn1"), server_output="")
    assert not res.ok and "Slave aborted" in res.reason
    # the same text with a zero exit status (a wrapper that lost it) still fails
    assert not UPERF.parse_sample(text, "", 0, profile=profile("tcp_stream-conn1")).ok


def test_the_slaves_own_error_lines_fail_an_otherwise_clean_master_output():
    # Real slave stdout after its master vanished mid-run: plain printf lines, not "** ..."
    # log lines. Paired with a clean master output they must still fail the sample.
    srv = (HERE / "master-killed.server.out").read_text()
    assert srv.splitlines() == ["Error during reading command: connection closed", "Error in get command"]
    text = (HERE / "tcp_stream-conn1.client.out").read_text()
    res = UPERF.parse_sample(text, "", 0, profile=profile("tcp_stream-conn1"), server_output=srv)
    assert not res.ok and "Error during reading command" in res.reason
    # a clean slave prints nothing at all (every capture above ran with server_output "")
    assert UPERF.parse_sample(text, "", 0, profile=profile("tcp_stream-conn1"), server_output="").ok


def test_a_master_killed_mid_run_is_a_failed_sample():
    text = (HERE / "master-killed.client.out").read_text()
    res = UPERF.parse_sample(text, "", -9, profile=profile("tcp_stream-conn1"), server_output="")
    assert not res.ok
