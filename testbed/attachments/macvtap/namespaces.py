"""The macvtap mode in namespaces: two macvlans on the macvtap segment, one in each
namespace. macvtap is macvlan with a character device in front, so this is the guests'
forwarding path without guests (plumbing.py describes the three modes on a veth lower)."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

from testbed.attachments.macvtap import plumbing
from testbed.host.net.netns import DEFAULT_SUBNET, Builder, Connection, Hop, desc_offloads, links_in
from testbed.topology.model import MacvtapMode, Offloads


@contextlib.contextmanager
def macvlan(tag: str, mode: MacvtapMode | str = MacvtapMode.BRIDGE, *,
            subnet: str = DEFAULT_SUBNET, mtu: int = 1500,
            offloads: Offloads | Sequence[Offloads | None] | None = None) -> Iterator[Connection]:
    """Two macvlans on the macvtap attachment's own segment (a veth lower, plus the hairpin
    bridge for vepa), one in each namespace: the guests' forwarding path without guests,
    since macvtap is macvlan with a character device in front."""
    mode = MacvtapMode(mode)
    with contextlib.ExitStack() as stack:
        b = Builder(stack, tag, subnet, mtu, None)
        b.namespace(b.ns_a)
        b.namespace(b.ns_b)
        seg = stack.enter_context(plumbing.segment(tag, mtu, mode))
        devs = []
        # Both are made before either moves: a moved device leaves its lower's upper_ list,
        # and passthrough picks the next free lower from that list.
        for side in ("a", "b"):
            dev, lower = b.name("m", side), seg.lower_for()
            links_in(None).add_macvtap(dev, lower, mode.kernel, kind="macvlan")
            stack.callback(b._del_link, dev, None)
            devs.append((dev, lower))
        for (dev, _), ns in zip(devs, (b.ns_a, b.ns_b)):
            links_in(None).move(dev, ns)
            stack.callback(b._del_link, dev, ns)
        ea, eb = b.endpoints(devs[0][0], devs[1][0], offloads)
        hops = [Hop(devs[0][0], b.ns_a, "tx")]
        if mode is not MacvtapMode.BRIDGE:
            hops += [Hop(seg.lower, None, "tx"), Hop(seg.peer, None, "rx")]
        hops.append(Hop(devs[1][0], b.ns_b, "rx"))
        via = {MacvtapMode.BRIDGE: f"on {seg.lower}, switched inside the macvlan driver",
               MacvtapMode.VEPA:
                   f"on {seg.lower}, reflected by hairpin bridge {seg.hairpin} on {seg.peer}",
               MacvtapMode.PASSTHROUGH:
                   f"on {devs[0][1]} and {devs[1][1]}, the veth pair as wire"}[mode]
        yield Connection(f"macvlan-{mode.value}", ea, eb, tuple(hops),
                         f"macvlans {devs[0][0]}/{devs[1][0]} mode {mode.value} {via}, mtu {mtu}, "
                         f"{desc_offloads(offloads)}", seg.datapath.replace("macvtap", "macvlan"),
                         tuple(x for x in (seg.hairpin,) if x))


CONNECTIONS = {"macvlan": macvlan}
