"""`veth-cable` (a toy mode, the example in docs/attachments.md, "Adding an attachment mode"): each guest's
NIC is a bare tap (libvirt ``type='ethernet'``), and the two taps are joined through a tb-
veth pair ``tb-<tag>-c0``/``-c1`` by tc mirred redirects: whatever enters tap i leaves by
veth end i, whatever enters veth end i leaves by tap i. Nothing learns or looks at MACs: it
is a cable, one pair of guests per cable.

Why mirred and not a one-port bridge on each side: a bridge would learn MACs, flood and
forward, so the mode would be `bridge` with an extra hop; redirects move every frame as it
is, and the only host objects are the veth pair and the taps' ingress qdiscs (which go with
their devices). The match-all filter is ``u32 match u32 0 0``: kernels without ``matchall``
(this machine's) still have u32. Capability: a redirect between two tb- veths is tried.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

from testbed.attachments.base import Fabric, Mode, Request


def _redirect(src: str, dst: str) -> None:
    """Every frame arriving on ``src`` leaves by ``dst``."""
    from testbed.host.net import ops
    ops.on(None).redirect(src, dst)


class CableFabric(Fabric):
    datapath = "veth-cable"

    def __init__(self, ends: tuple[str, str]) -> None:
        self.ends = ends

    def nic(self, i, n, target, mac, backend, mtu, queues):
        from testbed.guests import render
        if n != 2:
            raise ValueError(f"a veth cable joins one pair of guests, not {n // 2}")
        return render.NicParams(kind="ethernet", source="", target=target, mac=mac,
                                driver=backend.driver_name, mtu=mtu, queues=queues)

    def attach(self, i, target):
        from testbed.host.net import links
        links.no_ipv6(target)
        links.up(target)
        _redirect(target, self.ends[i])
        _redirect(self.ends[i], target)
        return contextlib.nullcontext()

    def set_mtu(self, mtu: int, taps: Sequence[str]) -> None:
        from testbed.host.net import links
        for dev in (*self.ends, *taps):
            links.set_mtu(dev, mtu)

    def leftovers(self) -> tuple[str, ...]:
        return self.ends


@contextlib.contextmanager
def fabric(req: Request) -> Iterator[Fabric]:
    from testbed.host.net import links
    from testbed.topology.model import object_name
    ends = (object_name(req.tag, "c0"), object_name(req.tag, "c1"))
    with links.veth(*ends, req.max_mtu):     # up, no IPv6, deleted on exit
        yield CableFabric(ends)


def unavailable() -> str | None:
    import os

    from testbed.errors import CommandError, TestbedError
    from testbed.host.net import links
    a, b = f"tb-vc{os.getpid() % 100000}a", f"tb-vc{os.getpid() % 100000}b"
    try:
        with links.veth(a, b):
            _redirect(a, b)
    except CommandError as e:
        return f"tc mirred redirect does not work here: {e.stderr_tail or e}"
    except TestbedError as e:
        return f"cannot try a tc mirred redirect: {e}"
    return None


MODES = (Mode("veth-cable", fabric, unavailable=unavailable),)
