"""What an attachment mode declares (``Mode``) and the one shape that joins endpoints
(``Fabric``).

A mode module (testbed/attachments/<mode>.py) defines ``MODES``: one or more ``Mode``
values. The registry (attachments/__init__.py) lists the modules by name; config, the
runner and doctor ask it, so no other module names a mode. The model's ``Attachment`` is
only the name: nothing below the registry imports it.
"""
from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ContextManager

if TYPE_CHECKING:
    from testbed.guests import render
    from testbed.measure.crosscheck import Wire
    from testbed.topology.model import Backend, Offloads, Topology


@dataclass(frozen=True)
class Request:
    """What a fabric is built for: the mode, the run's tag (every object it makes is
    ``tb-<tag>-...``), the topology it reads its own fields from, the largest MTU of the
    matrix (NICs advertise it so cells can change MTU live), a work folder for private
    daemons, and the endpoints' requested offloads (namespace endpoints apply them)."""

    attachment: str
    tag: str
    topology: Topology
    max_mtu: int
    workdir: Path
    offloads: Offloads | None = None


class Fabric(abc.ABC):
    """The thing that joins endpoints, entered as a context manager by the mode's
    ``fabric(request)``. Endpoint ``i`` of ``n``: pair k's client is 2k, its server 2k+1;
    across two hosts even endpoints sit on the first host, odd ones on the second.

    Guest endpoints: the runner (testpaths.plug) calls ``port`` (before libvirt opens the
    host-side device), renders ``nic`` and hot-plugs it, then ``attach`` (after QEMU holds
    the device). Namespace endpoints: ``own_pairs`` yields the endpoints the fabric made,
    and ``endpoint`` says which device and address endpoint i has."""

    #: what forwards between the endpoints: linux-bridge, ovs-netdev, macvtap-<mode>, veth, ...
    datapath: str = ""
    #: A tap counts what the guest sends as rx (QEMU writes into it); a macvtap counts it as
    #: tx (it transmits towards its lower device), and so does a namespace's own device.
    guest_sends_as_rx: bool = True

    def nic(self, i: int, n: int, target: str, mac: str, backend: Backend, mtu: int,
            queues: int) -> render.NicParams:
        """The libvirt interface of endpoint i of n, its host-side device named ``target``."""
        raise NotImplementedError(f"{type(self).__name__} has no guest NICs")

    def port(self, i: int, target: str, mac: str) -> ContextManager[Any]:
        """Before endpoint i's NIC is plugged (e.g. a device libvirt must find)."""
        return contextlib.nullcontext()

    def attach(self, i: int, target: str) -> ContextManager[Any]:
        """After endpoint i's NIC is plugged: the host-side device gets no IPv6 (not even a
        link-local address); fabrics that move it elsewhere do that here too."""
        from testbed.host.net import links
        links.no_ipv6(target)
        return contextlib.nullcontext()

    @abc.abstractmethod
    def set_mtu(self, mtu: int, taps: Sequence[str]) -> None:
        """The MTU on every hop between the endpoints (not the guests' own NICs), in the
        order the devices allow (a bridge cannot exceed its smallest port, a macvtap its
        lower)."""

    def counters(self, i: int, tap: str) -> Wire:
        """Byte and packet counters of endpoint i's device under test, host side."""
        from testbed.host.net import links
        return links.wire(tap)

    def leftovers(self) -> tuple[str, ...]:
        """The tb- objects this fabric made (for cleanup and doctor); the guests' taps are
        libvirt's and go with the NICs."""
        return ()

    def own_pairs(self, out_dir: str) -> ContextManager[list[tuple[Any, Any]]] | None:
        """Namespace fabrics: their endpoints as (client, server) hosts; None for guests."""
        return None

    def endpoint(self, i: int) -> tuple[str, str, Mapping[str, str]] | None:
        """Namespace fabrics: endpoint i's (device, address, offloads as reported); None
        for guests (the runner plugs and addresses their NICs)."""
        return None

    def path_devices(self, client: str, server: str) -> tuple[tuple[str, str | None, str], ...]:
        """The devices from a client's host-side device to its server's, each as (name,
        namespace or None, "rx" or "tx": the side client-to-server traffic passes): where
        per-hop tracing (testbed.measure.hops) looks. By default the two devices alone."""
        out = "rx" if self.guest_sends_as_rx else "tx"
        return ((client, None, out), (server, None, "tx" if out == "rx" else "rx"))


@dataclass(frozen=True)
class Check:
    """A topology check's finding: the field it is about and why it cannot run."""

    field: str
    why: str


@dataclass(frozen=True)
class ObjectKind:
    """A kind of tb- object a mode leaves on a host, as cleanup sees it."""
    name: str                                        # how cleanup reports it: "ovs_bridges"
    #: the tb- objects of this kind on a host (an executor; None: this host)
    find: Callable[[Any], list[str]]
    #: remove one (gone already is fine)
    delete: Callable[[Any, str], None]


@dataclass(frozen=True)
class Mode:
    """One attachment mode, as the registry knows it."""

    name: str
    fabric: Callable[[Request], ContextManager[Fabric]]
    #: "guests" (VM NICs, hot-plugged) or "netns" (namespace endpoints, no VMs)
    endpoints: str = "guests"
    #: where the client and server may be: "one" host, "two" hosts, "any", or "none" (the
    #: endpoints are namespaces: where guests are placed does not matter)
    placement: str = "one"
    #: placement "one" refused with guests on two hosts: the mode to use instead
    across_instead: str | None = None
    needs_ovs: bool = False
    #: several guest pairs on one fabric for matrix.variants
    variants: bool = False
    #: bytes the mode adds on the underlay when across hosts, and what they are
    overhead: int = 0
    overhead_label: str = ""
    #: top-level topology keys this mode owns, each with its parser (config.Node -> value
    #: of the Topology field of that name)
    fields: Mapping[str, Callable[[Any], Any]] = field(default_factory=dict)
    #: why this host cannot run the mode (None: it can), found by trying
    unavailable: Callable[[], str | None] = lambda: None
    #: why this topology cannot run it here, with the field to name (None: it can)
    check: Callable[[Topology], Check | None] = lambda t: None
    #: extra validation of parsed input: (topology, node of the field) -> error text or None
    validate: Callable[[Topology, Callable[[str], Any]], None] = lambda t, node: None
    #: one of the classic single-host modes measured by default (config.default, doctor)
    classic: bool = False
    #: the namespace connection kind (attachments.connect) of a netns mode
    netns_kind: str | None = None
    #: the host facts this mode depends on, for `testbed doctor` (found by trying): name ->
    #: an (ok, detail) pair, or a plain word (a datapath); modes sharing a fact give the same key
    doctor: Callable[[], Mapping[str, Any]] = lambda: {}
    #: kinds of host object the mode makes beyond links, namespaces and domains (the ovs
    #: mode's bridges on the host's switch), so cleanup finds and removes a dead run's
    object_kinds: tuple[ObjectKind, ...] = ()

    @property
    def guests(self) -> bool:
        return self.endpoints == "guests"

    def across(self, t: Topology) -> bool:
        """Whether this mode joins the client and server across two hosts in ``t``."""
        return self.placement == "two" or (
            self.placement == "any" and t.host_of(t.client) != t.host_of(t.server))

