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

Request/response tools that count their messages (sockperf: sent and replied over its whole
run) are also held to the client device's packet counters, per direction
(:func:`with_messages`): over UDP one message is one datagram, so every request counted as
sent left the client's device, and every reply counted arrived through it. What was lost is
split by where: beyond the client's device (the path, the server) or after it (the client's
socket, or a reply that came after the client stopped counting).
"""
from __future__ import annotations

import dataclasses
import math
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
    #: request/response messages against the packet counters (:func:`with_messages`), if counted
    messages: Mapping | None = None

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


#: frames beyond the tool's own a client's device may carry in a sample's window (ARP,
#: sockperf's warm-up messages, a guest's IPv6 neighbour and router messages), plus a share
MESSAGE_SLACK = 8
MESSAGE_SLACK_SHARE = 0.001


def frames_per_datagram(payload: int, mtu: int) -> int:
    """Frames one UDP datagram of ``payload`` bytes takes at ``mtu`` (IP fragments carry a
    multiple of 8 bytes each)."""
    per = max(8, (mtu - IPV4) // 8 * 8)
    return max(1, math.ceil((payload + UDP) / per))


@dataclass(frozen=True)
class Messages:
    """Request/response messages a tool counted against its client device's packets."""

    sent: int                     # requests the tool counted as sent (its whole run)
    replied: int                  # replies it counted
    lost: int                     # sent - replied
    wire_from_client: int         # frames the device carried from the client
    wire_to_client: int           # frames it delivered to the client
    frames_per_message: int
    #: requests whose reply never reached the client's device (lost on the path or at the
    #: server), and replies that reached it but not the tool (its socket, or after it stopped)
    lost_beyond_client: int
    lost_at_client: int
    verdict: str                  # ok | fail | unchecked
    reason: str | None = None


def messages(protocol: Protocol, metrics: Mapping[str, float], from_client: int, to_client: int, *,
             message_size: int, mtu: int, device: str = "") -> Messages | None:
    """A request/response tool's messages (``msgs_sent``, ``msgs_replied``) against the packets
    the client's device carried each way over the same window; None when the tool counted none.
    Over TCP a message is no packet (segments coalesce, ACKs travel alone): unchecked."""
    if "msgs_sent" not in metrics or "msgs_replied" not in metrics:
        return None
    sent, replied = int(metrics["msgs_sent"]), int(metrics["msgs_replied"])
    f = frames_per_datagram(message_size, mtu) if protocol is Protocol.UDP else 1
    beyond, at_client = max(0, from_client - to_client), max(0, to_client - replied * f) // f
    base = dict(sent=sent, replied=replied, lost=sent - replied, wire_from_client=from_client,
                wire_to_client=to_client, frames_per_message=f, lost_beyond_client=beyond // f,
                lost_at_client=at_client)
    if protocol is not Protocol.UDP:
        return Messages(**base, verdict="unchecked",
                        reason="over TCP a message is not a packet (segments coalesce, ACKs travel alone)")
    slack = MESSAGE_SLACK + math.ceil(MESSAGE_SLACK_SHARE * sent * f)
    where = f" ({device})" if device else ""
    why = None
    if from_client < sent * f:
        why = (f"the tool counted {sent} requests sent ({sent * f} frames), the client's device{where} "
               f"carried {from_client} from it")
    elif from_client > sent * f + slack:
        why = (f"the client's device{where} carried {from_client} frames from it, {from_client - sent * f} "
               f"more than the {sent} requests the tool counted (slack {slack})")
    elif replied * f > to_client:
        why = (f"the tool counted {replied} replies ({replied * f} frames), the client's device{where} "
               f"delivered {to_client}")
    return Messages(**base, verdict="fail" if why else "ok", reason=why)


def with_messages(c: Check, m: Messages | None) -> Check:
    """The byte check with the message check added: failed if either failed, both reasons kept."""
    if m is None:
        return c
    rec = asdict(m)
    if m.verdict != "fail":
        return dataclasses.replace(c, messages=rec)
    reason = f"messages: {m.reason}" + (f"; {c.reason}" if c.reason else "")
    return dataclasses.replace(c, messages=rec, verdict="fail", reason=reason)
