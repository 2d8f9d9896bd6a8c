"""Shared by the modes that join guests on two hosts (bridge-vxlan, ovs-vxlan, macvtap
placed apart): which hosts, whether this topology can reach them, and the fabric over two
real hosts (attachments/_realhost.py). Not a mode itself.

Real hosts (this machine plus one reached over ssh, ``transport: ssh``) are joined through
their own underlay interfaces; each guest runs in its host's libvirt. Hosts emulated on
this machine (``transport: netns``) keep each host's datapath in its own namespace and run
both guests in the local libvirt: see the emulated fabrics in bridge_vxlan.py and macvtap.py.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

from testbed.attachments.base import Check, Fabric, Request
from testbed.topology.model import Topology


def side(i: int) -> int:
    """The host (0 or 1) of endpoint i: clients on the first host, servers on the second."""
    return i % 2


def unavailable(t: Topology) -> str | None:
    """Why this topology cannot join its client and server across their hosts (None: it can)."""
    used = [t.host_of(g) for g in (t.client, t.server)]
    if all(h.emulated for h in used):
        return None
    if any(h.emulated for h in used):
        return "the client's and server's hosts must both be emulated (transport netns) or both real"
    if not any(h.remote for h in used):
        # Two real hosts that are both this machine would share one root namespace.
        return (f"hosts {used[0].name} and {used[1].name} are both this machine; a mode across real hosts "
                "needs a second machine (transport ssh), or emulated hosts (transport netns)")
    return None


def check(t: Topology) -> Check | None:
    why = unavailable(t)
    return Check("", why) if why else None


def emulated(t: Topology) -> bool:
    return t.host_of(t.client).emulated


class RealHostsFabric(Fabric):
    """Two real hosts joined through their underlays (attachments/_realhost.RealFabric)."""

    def __init__(self, fab, guest_sends_as_rx: bool) -> None:
        self.fab = fab
        self.datapath = fab.datapath
        self.guest_sends_as_rx = guest_sends_as_rx

    def nic(self, i, n, target, mac, backend, mtu, queues):
        return self.fab.nic(side(i), target, mac, backend, mtu, queues)

    def attach(self, i, target):
        # The device is on its guest's own host, maybe a remote one: nothing to do here.
        return contextlib.nullcontext()

    def set_mtu(self, mtu: int, taps: Sequence[str]) -> None:
        # RealFabric takes one device per host: each pair's (client, server) in turn.
        for k in range(0, len(taps), 2):
            self.fab.set_mtu(mtu, list(taps[k:k + 2]))

    def counters(self, i: int, tap: str):
        return self.fab.counters(side(i), tap)

    def leftovers(self) -> tuple[str, ...]:
        return tuple(d for s in self.fab.sides for d in (s.bridge, s.vxlan) if d)

    def remote_objects(self) -> list[tuple[object, tuple[str, ...]]]:
        """The objects this fabric made on remote hosts, per host's shell (the host guard
        watches them there: testbed.host.remotewatch)."""
        return [(s.shell, tuple(d for d in (s.bridge, s.vxlan) if d)) for s in self.fab.sides if s.shell.remote]


@contextlib.contextmanager
def real_fabric(req: Request, segment, guest_sends_as_rx: bool = True) -> Iterator[Fabric]:
    """Two real hosts, each with the mode's ``segment`` (attachments/_realhost.Segment)."""
    from testbed.host import remote
    from testbed.attachments import _realhost as realhost
    t = req.topology
    specs = (t.host_of(t.client), t.host_of(t.server))
    shells = (remote.shell(specs[0]), remote.shell(specs[1]))
    with realhost.fabric(segment, req.tag, specs, shells, t.tunnel, req.max_mtu) as fab:
        yield RealHostsFabric(fab, guest_sends_as_rx)
