"""Small netlink helpers over pyroute2, shared by the attachment modules."""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from pyroute2 import IPRoute, NetlinkError

from testbed import PREFIX
from testbed.crosscheck import Wire
from testbed.errors import TestbedError


def _check_ours(name: str) -> None:
    # Defence in depth: this module only ever changes objects the testbed created.
    if not name.startswith(PREFIX):
        raise TestbedError(f"refusing to touch {name!r}: not a {PREFIX} object")


def index(ipr: IPRoute, name: str) -> int | None:
    found = ipr.link_lookup(ifname=name)
    return found[0] if found else None


def exists(name: str) -> bool:
    with IPRoute() as ipr:
        return index(ipr, name) is not None


def delete(name: str) -> None:
    """Delete a link; 'already gone' is fine."""
    _check_ours(name)
    with IPRoute() as ipr:
        idx = index(ipr, name)
        if idx is not None:
            with contextlib.suppress(NetlinkError):
                ipr.link("del", index=idx)


def no_ipv6(name: str) -> None:
    """Keep the kernel from giving our own link an IPv6 link-local address: the segment
    carries only test traffic and the host gets no address on it."""
    _check_ours(name)
    path = f"/proc/sys/net/ipv6/conf/{name}/disable_ipv6"
    if os.path.exists(path):
        with open(path, "w") as f:
            f.write("1")


def set_mtu(name: str, mtu: int) -> None:
    _check_ours(name)
    with IPRoute() as ipr:
        idx = index(ipr, name)
        if idx is None:
            raise TestbedError(f"link {name} vanished")
        ipr.link("set", index=idx, mtu=mtu)


def up(name: str) -> None:
    _check_ours(name)
    with IPRoute() as ipr:
        ipr.link("set", index=index(ipr, name), state="up")


def mtu_of(name: str) -> int:
    with IPRoute() as ipr:
        return ipr.get_links(index(ipr, name))[0].get("IFLA_MTU")


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
    """Byte and packet counters of a link, for the wire cross-check (testbed.crosscheck)."""
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
    _check_ours(name)
    with IPRoute() as ipr:
        try:
            ipr.link("add", ifname=name, kind="bridge")
        except NetlinkError as e:
            raise TestbedError(f"cannot create bridge {name}: {e}") from None
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
    _check_ours(peer)
    with IPRoute() as ipr:
        try:
            ipr.link("add", ifname=name, kind="veth", peer=peer)
        except NetlinkError as e:
            raise TestbedError(f"cannot create veth {name}: {e}") from None
    try:
        for n in (name, peer):
            no_ipv6(n)
            set_mtu(n, mtu)
            up(n)
        yield name, peer
    finally:
        delete(name)  # deleting one end removes the pair
