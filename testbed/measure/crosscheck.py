"""The wire cross-check: a tool's payload bytes against the byte and packet counters of the
device under test, over the same window.

Pure functions. The expected overhead is computed from the packet count the device saw and
the protocol headers each packet carries (plus, for UDP, one transport header per datagram),
not from rates over slightly different intervals, so the check does not depend on when the
counters were read as long as the window encloses the whole transfer.

Which counter: the receiving endpoint's device in the data's direction. What arrived is
what the receiver counted (netperf's REMOTE_BYTES_RECVD, UDP's received datagrams), and
packets a sender's qdisc dropped never reach it. For request/response both directions of
the client's device, against the bytes the client sent and received.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass

from testbed.host.net.counters import Wire  # noqa: F401 (its home is the host layer; imported from here too)
from testbed.topology.model import Pattern, Protocol

#: Largest relative gap between the measured payload/wire ratio and the expected one that
#: still passes. Above the expected ratio only by this much (the wire never carries less
#: than the payload); below it by this much plus what retransmissions explain.
TOLERANCE = 0.03

ETHERNET = 14
IPV4 = 20
#: TCP header with the timestamp option Linux puts on every segment of an established
#: connection (20 + 12).
TCP = 32
UDP = 8


@dataclass(frozen=True)
class Check:
    tool_bytes: int
    wire_bytes: int
    wire_packets: int
    expected_ratio: float
    ratio: float
    verdict: str                 # ok | fail | unchecked
    device: str = ""
    direction: str = ""          # to-endpoint | both
    reason: str | None = None
    #: wire bytes retransmissions (TCP) or datagrams sent but not read (UDP) can explain
    explained_extra_bytes: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


def header_bytes(protocol: Protocol, packets: int, datagrams: int = 0) -> int:
    """Bytes of headers on `packets` frames. UDP: IP fragments of one datagram each carry
    Ethernet and IP headers, only the first carries the UDP header."""
    if protocol is Protocol.UDP:
        return packets * (ETHERNET + IPV4) + datagrams * UDP
    return packets * (ETHERNET + IPV4 + TCP)


def tool_bytes(metrics: Mapping[str, float]) -> int | None:
    """Payload bytes the tool counted; from its rate and interval when it gives no count."""
    if "bytes" in metrics:
        return int(metrics["bytes"])
    if "throughput_mbps" in metrics and "duration_s" in metrics:
        return int(metrics["throughput_mbps"] * 1e6 / 8 * metrics["duration_s"])
    return None


def datagrams(metrics: Mapping[str, float], payload: int, message_size: int) -> int:
    if "udp_recv_msgs" in metrics:
        return int(metrics["udp_recv_msgs"])
    return -(-payload // max(1, message_size))


def check(protocol: Protocol, pattern: Pattern, metrics: Mapping[str, float], wire_bytes: int,
          wire_packets: int, *, mtu: int, message_size: int, device: str = "",
          direction: str = "to-endpoint", tolerance: float = TOLERANCE) -> Check:
    """The verdict for one sample. `wire_*` are the deltas of the chosen counter.

    Request/response is held to the lower bound only (the wire carries at least the
    payload): with one-byte messages the headers are nearly all of the wire, and netperf's
    control connection and connection set-up (SYN options) move the ratio by more than the
    tolerance."""
    payload = tool_bytes(metrics)
    if payload is None:
        return Check(0, wire_bytes, wire_packets, 0.0, 0.0, "unchecked", device, direction,
                     "the tool reported no payload byte count or rate and interval")
    if wire_bytes <= 0:
        return Check(payload, wire_bytes, wire_packets, 0.0, 0.0, "fail", device, direction,
                     f"tool counted {payload} payload bytes, the wire ({device}) carried {wire_bytes}")
    dgrams = datagrams(metrics, payload, message_size) if protocol is Protocol.UDP else 0
    expected_wire = payload + header_bytes(protocol, wire_packets, dgrams)
    expected = payload / expected_wire
    ratio = payload / wire_bytes
    bound_only = pattern.is_transactional or pattern is Pattern.BIDIRECTIONAL
    # What can be on the receiving device without being in the payload: TCP segments
    # retransmitted that did arrive (spurious ones, or after a lost ACK), each at most one
    # full frame; UDP datagrams sent that the receiver did not count (dropped after the
    # device, at a full socket buffer: netperf counts only what it read).
    retrans = int(metrics.get("retransmits", 0))
    explained = retrans * (mtu + ETHERNET)
    unread = 0
    if protocol is Protocol.UDP and "udp_sent_msgs" in metrics:
        unread = max(0, int(metrics["udp_sent_msgs"]) - dgrams)
        frags = -(-(message_size + UDP) // max(1, mtu - IPV4))
        explained += unread * (message_size + UDP + frags * (ETHERNET + IPV4))
    low = payload / (expected_wire + explained) * (1 - tolerance)
    high = expected * (1 + tolerance)
    fig = (f"tool {payload} payload bytes, wire ({device}, {direction}) {wire_bytes} bytes in "
           f"{wire_packets} packets: ratio {ratio:.4f}, expected {expected:.4f}")
    if wire_bytes < payload:
        verdict, why = "fail", f"the wire carried less than the payload: {fig}"
    elif bound_only:
        verdict, why = "ok", None
    elif ratio > high:
        verdict, why = "fail", f"fewer bytes on the wire than the headers need: {fig}"
    elif ratio < low:
        verdict, why = "fail", (f"more on the wire than headers, {retrans} retransmissions and "
                                f"{unread} unread datagrams explain: {fig}")
    else:
        verdict, why = "ok", None
    return Check(payload, wire_bytes, wire_packets, round(expected, 5), round(ratio, 5), verdict,
                 device, direction, why, explained)


def receiving_end(pattern: Pattern) -> str | None:
    """Which endpoint's device counts the payload: 'server' for stream, 'client' for maerts,
    None (both directions at the client) for request/response and bidirectional."""
    if pattern is Pattern.STREAM:
        return "server"
    if pattern is Pattern.MAERTS:
        return "client"
    return None
