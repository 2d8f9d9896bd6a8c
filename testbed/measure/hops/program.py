"""The bpftrace program of one tracer, rendered from its plan (templates/tracing/hops.bt.j2).

Pure: the plan, where each device and namespace is in this kernel's terms (ifindex and
network namespace inode, which the tracer's caller looks up), the test subnet, and the
probes this kernel offers (a :class:`Flavour`, chosen by trying: testbed.admin.capabilities).
"""
from __future__ import annotations

import ipaddress
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache

import jinja2

from testbed.host import paths
from testbed.host.bpftrace import DEVICES_ONLY, FLAVOURS, KPROBES, TRACEPOINTS, Flavour
from testbed.measure.hops.plan import Plan, TracerPlan


@dataclass(frozen=True)
class Where:
    """A device or a namespace in one kernel's terms."""

    ifindex: Mapping[tuple[str, str | None], int]      # (device, netns name) -> ifindex
    netns: Mapping[str | None, int]                      # netns name (None: own) -> inode


@cache
def _env() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(paths.templates_dir())),
                              undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                              trim_blocks=True, lstrip_blocks=True, autoescape=False)


def _u32(addr: ipaddress.IPv4Address) -> int:
    """An address as the program reads it: four network-order bytes loaded as a
    little-endian integer."""
    return struct.unpack("<I", addr.packed)[0]


#: one transaction in this many is followed (see the template's note) where several
#: kernels follow the same transactions (guest cells: hundreds to thousands a second, so a
#: sample still holds enough of them for a p99)
SAMPLE = 8
#: ... and where one tracer sees the whole path (namespace cells: tens of thousands a
#: second). Following costs each followed transaction its time stamps and histogram
#: updates: on a 5 us namespace transaction, one in eight cost about 4.5 % of
#: transactions/s beyond the common case (`testbed bench tracing`), one in 32 a quarter of it,
#: and a 5 s sample at 30 000 transactions/s still follows about 4 700.
ONE_KERNEL_SAMPLE = 32


def sample_for(plan: Plan) -> int:
    """Pure: how many transactions in one are followed on a path of this plan."""
    return ONE_KERNEL_SAMPLE if len(plan.tracers) == 1 else SAMPLE


def render(tracer: TracerPlan, where: Where, subnet: str, flavour: Flavour, sample: int = SAMPLE) -> str:
    net = ipaddress.ip_network(subnet, strict=False)
    sides = tracer.sides if flavour.send_probe else ()
    devices = [{"ifindex": where.ifindex[(d.device.name, d.device.netns)], "netns": where.netns[d.device.netns],
                "xmit": d.xmit, "recv": d.recv} for d in tracer.devices]
    events = {d.xmit: "xmit" for d in tracer.devices} | {d.recv: "recv" for d in tracer.devices}

    def on(ev: str, points) -> list:  # noqa: ANN001
        return [p for p in points if events[p if isinstance(p, int) else p[0]] == ev]

    def side_of() -> str:
        if any(s.netns is None for s in sides):
            return f"$s = {sides[0].base};"
        arms = " else ".join(f"if ($ns == {where.netns[s.netns]}) {{ $s = {s.base}; }}" for s in sides)
        return f"$ns = curtask->nsproxy->net_ns->ns.inum; $s = 0; {arms}"

    # without socket probes a tracer follows the packets that enter it and the sends' ones
    # are not told apart: every kernel then draws its sample from the headers
    at_send = tracer.sample_at_send and bool(sides)
    return _env().get_template("tracing/hops.bt.j2").render(
        devices=devices, sides=sides, spans=tracer.spans, mask=_u32(net.netmask),
        net=_u32(net.network_address), first=list(tracer.first) if sides else [],
        entries=lambda ev: on(ev, [*tracer.entries, *(() if sides else ((p, role) for p, _, role in tracer.first))]),
        last=lambda ev: on(ev, tracer.last), copy_in=lambda ev: on(ev, tracer.copy_in),
        copy_out=lambda ev: on(ev, tracer.copy_out), sample=sample, sample_at_send=at_send,
        server_base=max((s.base for s in sides), default=0), side_of=side_of,
        send_probe=flavour.send_probe, recv_probe=flavour.recv_probe, recv_sk=flavour.recv_sk,
        recv_len=flavour.recv_len, ready_probe=flavour.ready_probe, ready_sk=flavour.ready_sk,
        xmit_event=flavour.xmit_event)


__all__ = ["DEVICES_ONLY", "FLAVOURS", "Flavour", "KPROBES", "ONE_KERNEL_SAMPLE", "SAMPLE", "TRACEPOINTS", "Where",
           "render", "sample_for"]
