"""The wire cross-check's arithmetic (testbed.measure.crosscheck). Real counters around real
netperf runs are in suites/netns/test_wire_crosscheck.py."""
from __future__ import annotations

from testbed.measure import crosscheck
from testbed.topology.model import Pattern, Protocol

TCP_HDR = 14 + 20 + 32


def test_exact_tcp_stream_is_ok():
    payload, packets = 10_000_000, 7000
    c = crosscheck.check(Protocol.TCP, Pattern.STREAM, {"bytes": payload}, payload + packets * TCP_HDR,
                         packets, mtu=1500, message_size=16384, device="tb-x")
    assert c.verdict == "ok" and c.ratio == c.expected_ratio


def test_wire_below_payload_fails_with_both_figures():
    c = crosscheck.check(Protocol.TCP, Pattern.STREAM, {"bytes": 1_200_000}, 1_000_000, 700,
                         mtu=1500, message_size=16384, device="tb-x")
    assert c.verdict == "fail" and "less than the payload" in c.reason
    assert "1200000" in c.reason and "1000000" in c.reason


def test_wire_above_what_headers_and_retransmissions_explain_fails():
    payload, packets = 10_000_000, 7000
    wire = payload + packets * TCP_HDR
    extra = 100 * 1514
    c = crosscheck.check(Protocol.TCP, Pattern.STREAM, {"bytes": payload}, int(wire * 1.05) + extra,
                         packets, mtu=1500, message_size=16384)
    assert c.verdict == "fail" and "retransmissions" in c.reason
    # the same wire with 100 retransmissions reported and 5 % is still too much; within
    # tolerance plus the retransmitted frames it passes
    c = crosscheck.check(Protocol.TCP, Pattern.STREAM, {"bytes": payload, "retransmits": 100},
                         wire + extra, packets, mtu=1500, message_size=16384)
    assert c.verdict == "ok"


def test_rate_and_interval_stand_in_for_a_missing_byte_count():
    assert crosscheck.tool_bytes({"throughput_mbps": 80.0, "duration_s": 2.0}) == 20_000_000
    assert crosscheck.tool_bytes({"transactions_per_s": 5.0}) is None


def test_udp_headers_once_per_datagram_and_per_fragment():
    # 3000-byte datagrams at MTU 1500: three fragments each, one UDP header
    assert crosscheck.header_bytes(Protocol.UDP, packets=30, datagrams=10) == 30 * 34 + 10 * 8


def test_udp_datagrams_not_read_explain_extra_wire_but_not_more():
    size, recv, sent = 1472, 1000, 1200
    payload = recv * size
    wire_all = sent * (size + 42)
    m = {"bytes": payload, "udp_recv_msgs": recv, "udp_sent_msgs": sent}
    assert crosscheck.check(Protocol.UDP, Pattern.STREAM, m, wire_all, sent, mtu=1500,
                            message_size=size).verdict == "ok"
    c = crosscheck.check(Protocol.UDP, Pattern.STREAM, m, int(wire_all * 1.2), sent, mtu=1500,
                         message_size=size)
    assert c.verdict == "fail" and "200 unread datagrams" in c.reason


def test_request_response_held_to_the_lower_bound():
    ok = crosscheck.check(Protocol.TCP, Pattern.RR, {"bytes": 2000}, 2000 + 3000 * TCP_HDR, 3000,
                          mtu=1500, message_size=1)
    assert ok.verdict == "ok"
    bad = crosscheck.check(Protocol.TCP, Pattern.RR, {"bytes": 2000}, 1500, 20, mtu=1500, message_size=1)
    assert bad.verdict == "fail"


def test_receiving_side_and_direction():
    assert crosscheck.receiving_end(Pattern.STREAM) == "server"
    assert crosscheck.receiving_end(Pattern.MAERTS) == "client"
    assert crosscheck.receiving_end(Pattern.RR) is None
    w = crosscheck.Wire(10, 20, 1, 2) - crosscheck.Wire(1, 2, 0, 0)
    assert w.towards(True) == (18, 2)      # a tap delivers to its guest as tx
    assert w.towards(False) == (9, 1)      # a macvtap or the endpoint's own device: rx
    assert w.both() == (27, 3)


def test_window_record_states_each_interval_and_the_coverage():
    from testbed.measure import sampling as measure
    w = measure.window_record(10.0, 10, 10.5, {"g1": 9.0, "g2": 10.2})
    assert w["tool_s"] == 10.0 and w["host_s"] == 10.5 and w["guest_s"] == {"g1": 9.0, "g2": 10.2}
    assert w["coverage"] == {"host": 1.0, "g1": 0.9, "g2": 1.0}
    assert w["excess_s"]["host"] == 0.5
    assert measure.window_record(None, 10, 10.5, {})["coverage"] == {"host": None}
