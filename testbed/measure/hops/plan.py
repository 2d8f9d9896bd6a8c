"""Which hops a request/response transaction crosses on a test path, and where each one is
seen: pure, from the devices the fabric lists (attachments.Fabric.path_devices).

A transaction is a chain of points: the client's socket send, each device the request
crosses (its transmit or its receive), the server's socket receive; the server's turnaround
to its send; the same back; the client's turnaround to its next send. A hop is the time
between two consecutive points, and is measured by the tracer that sees both (one kernel,
one clock: ``host``, or a guest). Between a guest and its host the clocks differ, so the
hand-off over virtio is derived from two spans instead: the guest's time from its NIC's
transmit of the request to its receive of the response, less the host's time between the
same packets on that guest's tap (both ways at once; the clocks' offset cancels).

Hop ids are stable across runs (``req.2.switch``, ``server_app``), so a regression in
`testbed compare` names the same hop in both runs; labels name this run's devices.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

#: the request's way (client to server), the response's, and the two applications' turnarounds
LEGS = ("request", "response", "server", "client")

HOST = "host"


@dataclass(frozen=True)
class Device:
    """A device on the path, a to b, as the fabric lists it."""

    name: str
    netns: str | None          # namespace name; None: the tracer's own (root) namespace
    a_to_b: str                # "tx" or "rx": the side of the device a-to-b traffic passes


@dataclass(frozen=True)
class DevicePoints:
    """One device in one tracer's program: its transmit and receive point numbers."""

    device: Device
    xmit: int
    recv: int


@dataclass(frozen=True)
class Side:
    """A socket end: its send point is base + 1, its receive point base + 2."""

    name: str                  # client | server
    base: int
    netns: str | None          # the namespace its tasks run in; None: any (a guest's own kernel)

    @property
    def send(self) -> int:
        return self.base + 1

    @property
    def recv(self) -> int:
        return self.base + 2


@dataclass(frozen=True)
class Span:
    """Time from ``start`` (a point, at its event) to ``end`` on the same connection, either
    direction: a guest's or the host's view of everything beyond one of its devices."""

    id: int
    start: int
    end: int
    start_event: str           # xmit | recv
    end_event: str


@dataclass(frozen=True)
class TracerPlan:
    """What one tracer (one kernel) watches."""

    name: str                  # host, or a guest's name
    devices: tuple[DevicePoints, ...]
    sides: tuple[Side, ...] = ()
    spans: tuple[Span, ...] = ()
    #: (xmit point, send point of its side, request|response): where a send's first packet leaves
    first: tuple[tuple[int, int, str], ...] = ()
    #: (receive point, request|response): where a direction enters this kernel from outside
    entries: tuple[tuple[int, str], ...] = ()
    #: points where a direction ends in this tracer (its entry is dropped there; with sides,
    #: handed to the socket receive)
    last: tuple[int, ...] = ()
    #: receive points before a switch that may hand on a copy, and the transmit points after
    #: it: matched by headers there, by buffer address everywhere else
    copy_in: tuple[int, ...] = ()
    copy_out: tuple[int, ...] = ()
    #: the sample is drawn at the client's send (one kernel sees the whole transaction);
    #: else from the headers at the first device, so every kernel follows the same ones
    sample_at_send: bool = False

    def point_names(self) -> dict[int, str]:
        out = {}
        for d in self.devices:
            out[d.xmit] = f"{d.device.name} transmit"
            out[d.recv] = f"{d.device.name} receive"
        for s in self.sides:
            out[s.send] = f"{s.name} send()"
            out[s.recv] = f"{s.name} recv()"
        return out


@dataclass(frozen=True)
class Hop:
    id: str                    # stable across runs
    label: str                 # this run's devices
    leg: str                   # one of LEGS
    tracer: str                # who measures it; "derived" for a hand-off from spans
    start: int = 0             # points in that tracer's program
    end: int = 0
    #: derived hops: (tracer, span id, sign) whose p50s add up to it
    spans: tuple[tuple[str, int, int], ...] = ()


@dataclass(frozen=True)
class Plan:
    hops: tuple[Hop, ...]
    tracers: tuple[TracerPlan, ...]
    #: (hop label, why) for hops no tracer can see on this path
    not_observed: tuple[tuple[str, str], ...] = field(default=())

    def tracer(self, name: str) -> TracerPlan:
        return next(t for t in self.tracers if t.name == name)


def _chain(devices: Sequence[DevicePoints], reverse: bool) -> list[tuple[int, str]]:
    """(point, kind) of each device a direction crosses, in order."""
    out = []
    for d in (reversed(devices) if reverse else devices):
        out_way = d.device.a_to_b if not reverse else ("rx" if d.device.a_to_b == "tx" else "tx")
        out.append((d.xmit, "xmit") if out_way == "tx" else (d.recv, "recv"))
    return out


def _device_hops(leg: str, tracer: str, chain: list[tuple[int, str]], names: dict[int, str],
                 datapath: str) -> list[Hop]:
    prefix = "req" if leg == "request" else "resp"
    hops = []
    # a path with no switch of its own between devices (a veth pair, OVS internal ports):
    # its wires are named by the datapath that carries them
    switched = any(kp == "recv" and kq == "xmit" for (_, kp), (_, kq) in zip(chain, chain[1:]))
    for k, ((p, kp), (q, kq)) in enumerate(zip(chain, chain[1:]), 1):
        a, b = names[p].rsplit(" ", 1)[0], names[q].rsplit(" ", 1)[0]
        if kp == "xmit" and kq == "recv":
            kind, label = "wire", f"{a} -> {b}" + ("" if switched else f" ({datapath})")
        elif kp == "recv" and kq == "xmit":
            kind, label = "switch", f"{a} -> {b} through {datapath}"
        else:
            kind, label = "stack", f"{names[p]} -> {names[q]}"
        hops.append(Hop(f"{prefix}.{k}.{kind}", label, leg, tracer, p, q))
    return hops


def _points(devices: Sequence[Device]) -> tuple[DevicePoints, ...]:
    return tuple(DevicePoints(d, 2 * i + 2, 2 * i + 3) for i, d in enumerate(devices))


def _copies(chains: Sequence[list[tuple[int, str]]]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The receive points before each switch hop and the transmit points after it."""
    ins, outs = [], []
    for chain in chains:
        for (p, kp), (q, kq) in zip(chain, chain[1:]):
            if kp == "recv" and kq == "xmit":
                ins.append(p)
                outs.append(q)
    return tuple(ins), tuple(outs)


def namespace_plan(devices: Sequence[Device], datapath: str, copies: bool = False) -> Plan:
    """Two namespaces joined by ``devices`` (a to b; the first in the client's namespace,
    the last in the server's): one tracer, the host, sees every hop. ``copies``: the
    switch may hand on a copy of a packet (OVS's userspace datapath)."""
    if len(devices) < 2:
        raise ValueError("a namespace path has at least its two endpoint devices")
    pts = _points(devices)
    client = Side("client", 100, devices[0].netns)
    server = Side("server", 110, devices[-1].netns)
    names = TracerPlan(HOST, pts, (client, server)).point_names()
    req, resp = _chain(pts, False), _chain(pts, True)
    hops = [Hop("req.client_stack", f"client send() -> {names[req[0][0]]}", "request", HOST,
                client.send, req[0][0]),
            *_device_hops("request", HOST, req, names, datapath),
            Hop("req.server_stack", f"{names[req[-1][0]]} -> server recv()", "request", HOST,
                req[-1][0], server.recv),
            Hop("server_app", "server recv() -> send() (the application's turnaround)", "server", HOST,
                server.recv, server.send),
            Hop("resp.server_stack", f"server send() -> {names[resp[0][0]]}", "response", HOST,
                server.send, resp[0][0]),
            *_device_hops("response", HOST, resp, names, datapath),
            Hop("resp.client_stack", f"{names[resp[-1][0]]} -> client recv()", "response", HOST,
                resp[-1][0], client.recv),
            Hop("client_app", "client recv() -> next send() (the tool's own loop)", "client", HOST,
                client.recv, client.send)]
    cin, cout = _copies((req, resp)) if copies else ((), ())
    tracer = TracerPlan(HOST, pts, (client, server),
                        first=((req[0][0], client.send, "request"), (resp[0][0], server.send, "response")),
                        last=(req[-1][0], resp[-1][0]), copy_in=cin, copy_out=cout, sample_at_send=True)
    return Plan(tuple(hops), (tracer,))


def guest_plan(host_devices: Sequence[Device], datapath: str, client: str, client_nic: str,
               server: str, server_nic: str, copies: bool = False) -> Plan:
    """Two guests whose NICs' host-side devices are ``host_devices`` (a to b: the client's
    tap first, the server's last): the host sees its datapath, each guest its own stack, and
    the hand-offs between them are derived from spans (see the module's note)."""
    pts = _points(host_devices)
    names = TracerPlan(HOST, pts).point_names()
    req, resp = _chain(pts, False), _chain(pts, True)
    # The host: the path between the taps, and a span at each tap.
    tap_c, tap_s = pts[0], pts[-1]
    host_spans = (Span(1, req[0][0], resp[-1][0], req[0][1], resp[-1][1]),     # client's tap: in -> out
                  Span(2, req[-1][0], resp[0][0], req[-1][1], resp[0][1]))     # server's tap: out -> in
    cin, cout = _copies((req, resp)) if copies else ((), ())
    host = TracerPlan(HOST, pts, spans=host_spans, entries=((req[0][0], "request"), (resp[0][0], "response")),
                      last=(req[-1][0], resp[-1][0]), copy_in=cin, copy_out=cout)

    def guest(name: str, nic: str, role: str) -> TracerPlan:
        dp = DevicePoints(Device(nic, None, "tx" if role == "client" else "rx"), 2, 3)
        side = Side(role, 100, None)
        out_first = (2, "xmit") if role == "client" else (3, "recv")
        back = (3, "recv") if role == "client" else (2, "xmit")
        sends, gets = ("request", "response") if role == "client" else ("response", "request")
        return TracerPlan(name, (dp,), (side,), spans=(Span(3, out_first[0], back[0], out_first[1], back[1]),),
                          first=((2, side.send, sends),), entries=((3, gets),), last=(2, 3))
    gc, gs = guest(client, client_nic, "client"), guest(server, server_nic, "server")
    host_hops = {leg: _device_hops(leg, HOST, chain, names, datapath)
                 for leg, chain in (("request", req), ("response", resp))}
    hops = [Hop("req.client_stack", f"client send() -> {client_nic} transmit ({client})", "request", client,
                101, 2),
            Hop("client.handoff", f"{client} {client_nic} <-> host {tap_c.device.name}, both ways "
                                  "(virtio and the tap)", "request", "derived",
                spans=((client, 3, 1), (HOST, 1, -1))),
            *host_hops["request"],
            Hop("server.handoff", f"host {tap_s.device.name} <-> {server} {server_nic}, both ways "
                                  "(the tap and virtio)", "request", "derived",
                spans=((HOST, 2, 1), (server, 3, -1))),
            Hop("req.server_stack", f"{server_nic} receive -> server recv() ({server})", "request", server, 3, 102),
            Hop("server_app", "server recv() -> send() (the application's turnaround)", "server", server, 102, 101),
            Hop("resp.server_stack", f"server send() -> {server_nic} transmit ({server})", "response", server,
                101, 2),
            *host_hops["response"],
            Hop("resp.client_stack", f"{client_nic} receive -> client recv() ({client})", "response", client,
                3, 102),
            Hop("client_app", "client recv() -> next send() (the tool's own loop)", "client", client, 102, 101)]
    return Plan(tuple(hops), (host, gc, gs))


__all__ = ["Device", "Hop", "Plan", "Side", "Span", "TracerPlan", "guest_plan", "namespace_plan"]
