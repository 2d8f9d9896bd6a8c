"""Small netlink helpers for this machine's root namespace, shared by the attachment
modules: thin names over testbed.host.net.ops (which does the same on any executor)."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

from pyroute2 import IPRoute

from testbed.host.net import ops
from testbed.host.net.counters import Wire


def _check_ours(name: str) -> None:
    ops.check_ours(name)


def index(ipr: IPRoute, name: str) -> int | None:
    found = ipr.link_lookup(ifname=name)
    return found[0] if found else None


_ROOT = ops.Netlink(None)


def exists(name: str) -> bool:
    return _ROOT.exists(name)


def delete(name: str) -> None:
    """Delete a link; 'already gone' is fine."""
    _ROOT.delete(name)


def no_ipv6(name: str) -> None:
    """Keep the kernel from giving our own link an IPv6 link-local address: the segment
    carries only test traffic and the host gets no address on it."""
    ops.no_ipv6(None, name)


def set_mtu(name: str, mtu: int) -> None:
    ops.set_mtu(None, name, mtu)


def up(name: str) -> None:
    _ROOT.set_up(name)


def mtu_of(name: str) -> int:
    return _ROOT.mtu_of(name)


def counters(name: str) -> tuple[int, int]:
    """(rx_bytes, tx_bytes) of a link, for cross-checking tool throughput."""
    with open(f"/sys/class/net/{name}/statistics/rx_bytes") as r, \
            open(f"/sys/class/net/{name}/statistics/tx_bytes") as t:
        return int(r.read()), int(t.read())


def counters_via(name: str, run) -> tuple[int, int]:
    """counters() of a link this process cannot open directly (in another namespace, on
    another host): ``run(argv)`` runs a command there and returns a proc.Completed."""
    out = run(["cat", f"/sys/class/net/{name}/statistics/rx_bytes",
               f"/sys/class/net/{name}/statistics/tx_bytes"]).stdout.split()
    return int(out[0]), int(out[1])


_WIRE = ("rx_bytes", "tx_bytes", "rx_packets", "tx_packets")


def wire(name: str) -> Wire:
    """Byte and packet counters of a link, for the wire cross-check (testbed.measure.crosscheck)."""
    vals = []
    for k in _WIRE:
        with open(f"/sys/class/net/{name}/statistics/{k}") as f:
            vals.append(int(f.read()))
    return Wire(*vals)


def wire_via(name: str, run) -> Wire:
    """wire() of a link in another namespace or on another host, read by one command."""
    out = run(["cat", *(f"/sys/class/net/{name}/statistics/{k}" for k in _WIRE)]).stdout.split()
    return Wire(*(int(x) for x in out[:4]))


@contextlib.contextmanager
def bridge(name: str, mtu: int = 1500) -> Iterator[str]:
    """A Linux bridge with no uplink and no host address."""
    _ROOT.add_bridge(name)
    try:
        no_ipv6(name)
        set_mtu(name, mtu)
        up(name)
        yield name
    finally:
        delete(name)


@contextlib.contextmanager
def veth(name: str, peer: str, mtu: int = 1500) -> Iterator[tuple[str, str]]:
    _check_ours(name)
    _ROOT.add_veth(name, peer)
    try:
        for n in (name, peer):
            no_ipv6(n)
            set_mtu(n, mtu)
            up(n)
        yield name, peer
    finally:
        delete(name)  # deleting one end removes the pair
