"""`macvtap`: each guest NIC is a macvtap (libvirt ``type='direct'``) on a lower device.

On one host the lower is a tb- veth pair the testbed makes, or the user's device(s) named in
the topology's ``macvtap:`` block (plumbing.py makes it and describes the bridge, vepa and
passthrough modes on a veth; namespaces.py joins two namespaces by macvlans on it). With the guests placed on two hosts, each guest's lower is
its host's end of the wire (emulated hosts) or its underlay (real hosts), so guest frames
cross the wire as they are, with no tunnel.

A macvtap counts what its guest sends as tx (it transmits towards its lower), unlike a tap.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

from testbed.attachments import _across
from testbed.attachments.base import Check, Fabric, Mode, Request
from testbed.attachments.bridge import SegmentFabric
from testbed.attachments.macvtap.namespaces import CONNECTIONS


def parse(n):
    """The ``macvtap:`` block: {mode: bridge|vepa|passthrough, lower: dev | [dev1, dev2]}."""
    import yaml

    from testbed.topology.model import MacvtapMode, MacvtapSpec
    from testbed.topology.yamlnode import ifname
    m = n.mapping({"mode", "lower"})
    mode = m["mode"].enum(MacvtapMode) if "mode" in m else MacvtapMode.BRIDGE
    lower: tuple[str, ...] = ()
    if "lower" in m:
        items = m["lower"].seq(1) if isinstance(m["lower"].node, yaml.SequenceNode) else [m["lower"]]
        lower = tuple(ifname(i) for i in items)
        want = 2 if mode is MacvtapMode.PASSTHROUGH else 1
        if len(lower) != want:
            raise m["lower"].error(f"mode {mode.value} needs {want} lower device(s)"
                                   + (" (passthrough gives each guest a whole device)" if want == 2 else "")
                                   + f", got {len(lower)}")
        if len(set(lower)) != len(lower):
            raise m["lower"].error("the two passthrough lower devices must differ")
    return MacvtapSpec(mode=mode, lower=lower)


def validate(t, node) -> None:
    if t.macvtap.lower and MODE.across(t):
        # Across hosts each guest's lower device is its own host's underlay: on emulated
        # hosts the testbed's wire end, on real ones tunnel.underlay.
        raise node("macvtap.lower").error(
            "macvtap with the client and server on two hosts uses each host's underlay as the lower "
            "device; 'lower' is for guests on one host")
    from testbed.topology.model import MacvtapMode
    n = max(t.matrix.pairs)
    if t.macvtap.mode is MacvtapMode.PASSTHROUGH and t.macvtap.lower and len(t.macvtap.lower) < 2 * n:
        raise node("matrix.pairs").error(
            f"macvtap passthrough gives every guest a lower device of its own: {n} pairs need {2 * n}, "
            f"macvtap.lower names {len(t.macvtap.lower)}")


def unavailable() -> str | None:
    from testbed.host import probes as capabilities
    ok, why = capabilities.macvtap()
    return None if ok else why


def check(t) -> Check | None:
    if MODE.across(t):
        return _across.check(t)
    if t.macvtap.lower:
        from testbed.attachments.macvtap import plumbing as macvtap
        why = macvtap.check_lowers(t.macvtap.lower, t.macvtap.mode, max(t.matrix.mtus))
        if why:
            return Check("macvtap.lower", why)
    return None


class WireFabric(Fabric):
    """macvtap across two emulated hosts. libvirt's ``type='direct'`` can only make a macvtap
    on a root-namespace device, so the testbed makes it in the host's namespace on the wire
    end, lends it to the root namespace while libvirt opens it (``type='ethernet'``,
    ``managed='no'``: a macvtap keeps its lower across namespaces), and takes it back once
    QEMU holds /dev/tapN."""

    guest_sends_as_rx = False

    def __init__(self, ns: tuple[str, str], wires: tuple[str, str], mode) -> None:
        self.ns, self.wires, self.mode = ns, wires, mode
        self.datapath = f"macvtap-{mode.value}-wire"

    def port(self, i, target, mac):
        from testbed.attachments.macvtap import plumbing as macvtap
        s = _across.side(i)
        return macvtap.lent_to_root(target, self.wires[s], self.ns[s], self.mode, mac)

    def nic(self, i, n, target, mac, backend, mtu, queues):
        from testbed.guests import render
        return render.NicParams(kind="ethernet", source="", target=target, mac=mac,
                                driver=backend.driver_name, mtu=mtu, queues=queues, options=(("managed", "no"),))

    def attach(self, i, target):
        from testbed.attachments.macvtap import plumbing as macvtap
        macvtap.take_back(target, self.ns[_across.side(i)])
        return contextlib.nullcontext()

    def set_mtu(self, mtu: int, taps: Sequence[str]) -> None:
        from testbed.host.net import ops, vxlan
        # A macvtap's MTU cannot exceed its lower's: wires first when raising, last when lowering.
        devs = list(zip(self.wires, self.ns))
        mine = [(tap, self.ns[_across.side(i)]) for i, tap in enumerate(taps)]
        current = vxlan.mtu_of(self.wires[0], self.ns[0])
        for dev, n in ([*devs, *mine] if mtu >= current else [*mine, *devs]):
            ops.set_mtu(ops.netns_executor(n), dev, mtu)

    def counters(self, i: int, tap: str):
        from testbed.host.net import vxlan
        return vxlan.counters(tap, self.ns[_across.side(i)])

    def leftovers(self) -> tuple[str, ...]:
        return (*self.ns, *self.wires)


def real_segment(mode):
    """On each real host: nothing made up front; libvirt makes each guest's macvtap
    (``type='direct'``) on its host's underlay, so guest frames cross the wire as they are."""
    from testbed.guests import render
    from testbed.attachments import _realhost as realhost
    from testbed.host.net import ops

    def nic(side, target, mac, backend, mtu, queues):
        return render.NicParams(kind="direct", source=side.underlay, target=target, mac=mac,
                                driver=backend.driver_name, mtu=mtu, queues=queues, options=(("mode", mode.value),))

    return realhost.Segment(f"macvtap-{mode.value}-underlay", 0, lambda stack, side: (None, None), nic,
                            lambda side, tap, mtu: ops.set_mtu(side.shell, tap, mtu))


@contextlib.contextmanager
def fabric(req: Request) -> Iterator[Fabric]:
    t = req.topology
    if MODE.across(t):
        if not _across.emulated(t):
            with _across.real_fabric(req, real_segment(t.macvtap.mode), guest_sends_as_rx=False) as fab:
                yield fab
            return
        from testbed.host.net import vxlan
        with vxlan.hosts_and_wire(req.tag, req.max_mtu) as (ns, wires):
            yield WireFabric(ns, wires, t.macvtap.mode)
        return
    from testbed.attachments.macvtap import plumbing as macvtap
    with macvtap.segment(req.tag, req.max_mtu, t.macvtap.mode, t.macvtap.lower) as seg:
        fab = SegmentFabric(seg, tuple(d for d in (seg.lower, seg.peer, seg.hairpin) if d) if seg.owned else ())
        fab.guest_sends_as_rx = False
        yield fab


def doctor() -> dict:
    from testbed.host import probes as capabilities
    return {"macvtap": capabilities.macvtap()}


MODE = Mode("macvtap", fabric, placement="any", classic=True, fields={"macvtap": parse},
            unavailable=unavailable, check=check, validate=validate, doctor=doctor)
MODES = (MODE,)

__all__ = ["CONNECTIONS", "MODE", "MODES", "check", "fabric", "parse", "real_segment", "unavailable", "validate"]
