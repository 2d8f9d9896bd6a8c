"""Host networking operations on an executor (testbed.host.executor): one implementation of each
link operation, the namespace, the offloads and the wire counters, whatever the host is.

``on(ex)`` picks how links are changed where ``ex`` runs:

* this machine (``executor.Local``, a local ``remote.Shell``) or one of its namespaces
  (``executor.Netns``, ``nsagent.NsAgent``): netlink through pyroute2's ``IPRoute``, for a
  namespace on a socket a thread opened inside it; no subprocess, no fork;
* a real host over ssh (a remote ``remote.Shell``): ``ip`` commands run through it.

Both answer the same calls with the same errors (a CommandError naming the device and where),
so the host layer's datapaths (bridge, VXLAN, macvtap) are written once for emulated hosts
(namespaces) and real ones (ssh). Every call refuses a device that is not a ``tb-`` object.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
from collections.abc import Iterator, Sequence

from pyroute2 import IPRoute, NetlinkError
from pyroute2 import netns as pr_netns
from pyroute2.netlink import NETLINK_ROUTE

from testbed import PREFIX
from testbed.errors import CommandError, TestbedError
from testbed.host import offloads
from testbed.host.executor import Executor, Local, Netns, in_thread_netns
from testbed.host.net.counters import Wire

log = logging.getLogger(__name__)

_WIRE = ("rx_bytes", "tx_bytes", "rx_packets", "tx_packets")

#: where a moved device goes: a namespace name, or a pid (that process's namespace)
Target = str | int


def check_ours(name: str) -> None:
    # Defence in depth: the testbed only ever changes objects it created.
    if not name.startswith(PREFIX):
        raise TestbedError(f"refusing to touch {name!r}: not a {PREFIX} object")


def iproute(netns: str | None = None) -> IPRoute:
    """pyroute2's IPRoute on the root namespace or the named one. In a namespace its socket is
    opened by a thread that joined it, never by pyroute2's ``netns=``: that forks a copy of
    this process, and a fork of a process with other threads (a test worker's, a run's
    watchers) can hang forever in a lock one of them held."""
    if not netns:
        return IPRoute()
    try:
        fd = in_thread_netns(netns, lambda: socket.socket(
            socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_ROUTE).detach())
        return IPRoute(fileno=fd)
    except OSError as e:
        raise CommandError(["netlink", "netns", netns], e.errno,
                           f"cannot open namespace {netns}: {e.strerror}") from None


class Netlink:
    """Link operations over pyroute2 in this machine's root namespace or a named one."""

    def __init__(self, netns: str | None = None) -> None:
        self.netns = netns
        self.where = f"namespace {netns}" if netns else "the root namespace"

    def _ipr(self) -> IPRoute:
        return iproute(self.netns)

    @staticmethod
    def _idx(ipr: IPRoute, name: str) -> int | None:
        found = ipr.link_lookup(ifname=name)
        return found[0] if found else None

    def _need(self, ipr: IPRoute, name: str) -> int:
        idx = self._idx(ipr, name)
        if idx is None:
            raise CommandError(["netlink", "link", "show", name], 19, f"link {name} not found in {self.where}")
        return idx

    def _do(self, what: str, fn) -> None:
        try:
            with self._ipr() as ipr:
                fn(ipr)
        except NetlinkError as e:
            # A CommandError like a failed `ip` command's, so callers catch one kind of
            # failure whichever way the link was changed; the "argv" names the request.
            raise CommandError(["netlink", *what.split()], e.code, f"{what} in {self.where}: {e.args[-1]}") from None

    # -- create and delete --

    def add(self, name: str, kind: str, *, mtu: int | None = None, **kw) -> None:
        check_ours(name)
        extra = {"mtu": mtu} if mtu else {}

        def fn(ipr: IPRoute) -> None:
            for k in ("link", "vxlan_link"):       # device names -> indexes
                if k in kw:
                    kw[k] = self._need(ipr, kw[k])
            ipr.link("add", ifname=name, kind=kind, **extra, **kw)
        self._do(f"cannot create {kind} {name}", fn)

    def add_bridge(self, name: str, *, mtu: int | None = None) -> None:
        self.add(name, "bridge", mtu=mtu)

    def add_veth(self, name: str, peer: str, *, mtu: int | None = None,
                 peer_netns: Target | None = None) -> None:
        """A veth pair in this namespace; ``peer_netns``: its peer is created there."""
        check_ours(peer)
        p: dict = {"ifname": peer, **({"mtu": mtu} if mtu else {})}
        if isinstance(peer_netns, int):
            p["net_ns_pid"] = peer_netns
        elif peer_netns:
            p["net_ns_fd"] = peer_netns
        self.add(name, "veth", mtu=mtu, peer=p)

    def add_vxlan(self, name: str, *, vni: int, local: str, remote: str, port: int, dev: str,
                  mtu: int | None = None) -> None:
        self.add(name, "vxlan", mtu=mtu, vxlan_id=vni, vxlan_local=local, vxlan_group=remote,
                 vxlan_port=port, vxlan_link=dev)

    def add_macvtap(self, name: str, lower: str, mode: str, *, mac: str | None = None,
                    kind: str = "macvtap") -> None:
        """A macvtap (or macvlan) on ``lower``; ``mode`` as the kernel spells it."""
        kw: dict = {f"{kind}_mode": mode, "link": lower}
        if mac:
            kw["address"] = mac
        self.add(name, kind, **kw)

    def delete(self, name: str) -> None:
        """Delete a link; 'already gone' (or its namespace gone) is fine."""
        check_ours(name)
        try:
            with self._ipr() as ipr:
                idx = self._idx(ipr, name)
                if idx is not None:
                    with contextlib.suppress(NetlinkError):
                        ipr.link("del", index=idx)
        except (CommandError, NetlinkError) as e:
            log.debug("delete %s in %s: %s", name, self.where, e)

    # -- change --

    def _set(self, name: str, what: str, **kw) -> None:
        check_ours(name)
        self._do(f"cannot set {what} of {name}", lambda ipr: ipr.link("set", index=self._need(ipr, name), **kw))

    def set_mtu(self, name: str, mtu: int) -> None:
        self._set(name, f"MTU {mtu}", mtu=mtu)

    def set_up(self, name: str, up: bool = True) -> None:
        # lo is everyone's; bringing a namespace's own loopback up is the one exception.
        if name != "lo":
            check_ours(name)
        self._do(f"cannot set {name} {'up' if up else 'down'}",
                 lambda ipr: ipr.link("set", index=self._need(ipr, name), state="up" if up else "down"))

    def enslave(self, name: str, master: str) -> None:
        check_ours(master)
        self._do(f"cannot make {name} a port of {master}",
                 lambda ipr: ipr.link("set", index=self._need(ipr, name), master=self._need(ipr, master)))

    def hairpin(self, name: str, on: bool = True) -> None:
        check_ours(name)
        # IFLA_BRPORT_MODE is the port's hairpin flag (BRIDGE_MODE_HAIRPIN).
        self._do(f"cannot set hairpin on {name}",
                 lambda ipr: ipr.brport("set", index=self._need(ipr, name), mode=1 if on else 0))

    def move(self, name: str, to: Target) -> None:
        """Move a device to namespace ``to`` (a name, or a pid for that process's namespace)."""
        check_ours(name)
        kw = {"net_ns_pid": to} if isinstance(to, int) else {"net_ns_fd": to}
        self._set(name, f"namespace {to}", **kw)

    def add_address(self, name: str, cidr: str) -> None:
        check_ours(name)
        addr, plen = cidr.split("/")
        self._do(f"cannot add {cidr} to {name}",
                 lambda ipr: ipr.addr("add", index=self._need(ipr, name), address=addr, prefixlen=int(plen)))

    def neigh_permanent(self, ip: str, mac: str, dev: str) -> None:
        check_ours(dev)
        self._do(f"cannot add neighbour {ip} on {dev}",
                 lambda ipr: ipr.neigh("replace", dst=ip, lladdr=mac, ifindex=self._need(ipr, dev),
                                       state="permanent"))

    # -- read --

    def _get(self, name: str, attr: str):
        with self._ipr() as ipr:
            return ipr.get_links(self._need(ipr, name))[0].get(attr)

    def exists(self, name: str) -> bool:
        with self._ipr() as ipr:
            return self._idx(ipr, name) is not None

    def mtu_of(self, name: str) -> int:
        return int(self._get(name, "IFLA_MTU"))

    def mac_of(self, name: str) -> str:
        return str(self._get(name, "IFLA_ADDRESS"))

    def ipv4_of(self, name: str) -> list[str]:
        """The link's IPv4 addresses (read only: it may be an operator's interface)."""
        with self._ipr() as ipr:
            idx = self._need(ipr, name)
            return [a.get("IFA_ADDRESS") for a in ipr.get_addr(index=idx, family=socket.AF_INET)]

    def wire(self, name: str) -> Wire:
        """Byte and packet counters (the kernel's 64-bit link statistics)."""
        st = self._get(name, "IFLA_STATS64")
        return Wire(*(int(st[k]) for k in _WIRE))

    def shape(self, name: str, rate_bps: int, burst: int, limit: int) -> None:
        """A token-bucket (tbf) root qdisc on ``name``: ``rate_bps`` bits of frames per
        second, a ``burst`` bytes bucket, ``limit`` bytes queued before it drops. Replaces
        any root qdisc; it goes with the device."""
        check_ours(name)
        # pyroute2 takes the rate in bytes per second
        self._do(f"cannot shape {name} to {rate_bps} bit/s", lambda ipr: ipr.tc(
            "replace", "tbf", self._need(ipr, name), rate=rate_bps // 8, burst=burst, limit=limit))

    def redirect(self, src: str, dst: str) -> None:
        """Every frame arriving on ``src`` leaves by ``dst`` (an ingress qdisc with a
        match-all u32 filter and a mirred egress redirect, as ``tc`` would add them)."""
        check_ours(src)
        # The tc actions' netlink encoding is pyroute2's least settled corner; the tc binary
        # speaks it for us, in the same namespace, through the one subprocess wrapper.
        ex = netns_executor(self.netns)
        ex.run(["tc", "qdisc", "replace", "dev", src, "ingress"], timeout=10)
        ex.run(["tc", "filter", "add", "dev", src, "parent", "ffff:", "protocol", "all", "u32",
                "match", "u32", "0", "0", "action", "mirred", "egress", "redirect", "dev", dst], timeout=10)

    def names(self) -> list[str]:
        """Every link's name here."""
        with self._ipr() as ipr:
            return [link.get_attr("IFLA_IFNAME") for link in ipr.get_links()]

    def qdisc_drops(self, name: str) -> int:
        """Packets the root qdisc of ``name`` dropped (its own statistics)."""
        with self._ipr() as ipr:
            idx = self._need(ipr, name)
            for q in ipr.get_qdiscs(index=idx):
                if q.get("parent") == 0xFFFFFFFF:
                    st = q.get("TCA_STATS2")
                    basic = st.get("TCA_STATS_QUEUE") if st else None
                    if basic:
                        return int(basic["drops"])
                    return int(q.get("TCA_STATS")["drops"])
        raise CommandError(["netlink", "qdisc", "show", name], 2, f"no root qdisc on {name} in {self.where}")


class IpCommands:
    """The same operations as ``Netlink``, as ``ip`` commands run by an executor (a real
    host over ssh, where this process has no netlink socket)."""

    def __init__(self, ex: Executor) -> None:
        self.ex = ex
        self.where = f"host {ex.name}"

    def _ip(self, *args: str, check: bool = True) -> str:
        # A failure is the executor's CommandError: it names the host, the argv and ip's message.
        return self.ex.run(["ip", *args], timeout=30, check=check).stdout

    def add(self, name: str, kind: str, *, mtu: int | None = None, args: Sequence[str] = ()) -> None:
        check_ours(name)
        self._ip("link", "add", name, *(["mtu", str(mtu)] if mtu else []), "type", kind, *args)

    def add_bridge(self, name: str, *, mtu: int | None = None) -> None:
        self.add(name, "bridge", mtu=mtu)

    def add_veth(self, name: str, peer: str, *, mtu: int | None = None,
                 peer_netns: Target | None = None) -> None:
        check_ours(peer)
        self.add(name, "veth", mtu=mtu, args=["peer", "name", peer, *(["netns", str(peer_netns)] if peer_netns else []),
                                              *(["mtu", str(mtu)] if mtu else [])])

    def add_vxlan(self, name: str, *, vni: int, local: str, remote: str, port: int, dev: str,
                  mtu: int | None = None) -> None:
        self.add(name, "vxlan", mtu=mtu, args=["id", str(vni), "local", local, "remote", remote,
                                               "dstport", str(port), "dev", dev])

    def add_macvtap(self, name: str, lower: str, mode: str, *, mac: str | None = None,
                    kind: str = "macvtap") -> None:
        check_ours(name)
        self._ip("link", "add", "link", lower, "name", name, *(["address", mac] if mac else []),
                 "type", kind, "mode", mode)

    def delete(self, name: str) -> None:
        check_ours(name)
        self.ex.run(["ip", "link", "del", name], timeout=30, check=False)

    def set_mtu(self, name: str, mtu: int) -> None:
        check_ours(name)
        self._ip("link", "set", "dev", name, "mtu", str(mtu))

    def set_up(self, name: str, up: bool = True) -> None:
        if name != "lo":
            check_ours(name)
        self._ip("link", "set", "dev", name, "up" if up else "down")

    def enslave(self, name: str, master: str) -> None:
        check_ours(master)
        self._ip("link", "set", "dev", name, "master", master)

    def hairpin(self, name: str, on: bool = True) -> None:
        check_ours(name)
        self._ip("link", "set", "dev", name, "type", "bridge_slave", "hairpin", "on" if on else "off")

    def move(self, name: str, to: Target) -> None:
        check_ours(name)
        self._ip("link", "set", "dev", name, "netns", str(to))

    def add_address(self, name: str, cidr: str) -> None:
        check_ours(name)
        self._ip("addr", "add", cidr, "dev", name)

    def neigh_permanent(self, ip: str, mac: str, dev: str) -> None:
        check_ours(dev)
        self._ip("neigh", "replace", ip, "lladdr", mac, "dev", dev, "nud", "permanent")

    def _show(self, name: str) -> dict:
        return json.loads(self._ip("-j", "link", "show", "dev", name))[0]

    def exists(self, name: str) -> bool:
        res = self.ex.run(["ip", "link", "show", "dev", name], timeout=30, check=False)
        if res.rc not in (0, 1):     # not ip's "does not exist": ssh itself failed (255)
            raise CommandError(["ip", "link", "show", "dev", name], res.rc, res.stderr or res.stdout)
        return res.rc == 0

    def mtu_of(self, name: str) -> int:
        return int(self._show(name)["mtu"])

    def mac_of(self, name: str) -> str:
        return str(self._show(name)["address"])

    def ipv4_of(self, name: str) -> list[str]:
        info = json.loads(self._ip("-j", "addr", "show", "dev", name) or "[]")
        return [a["local"] for i in info for a in i.get("addr_info", []) if a.get("family") == "inet"]

    def shape(self, name: str, rate_bps: int, burst: int, limit: int) -> None:
        check_ours(name)
        self.ex.run(["tc", "qdisc", "replace", "dev", name, "root", "tbf", "rate", f"{rate_bps}bit",
                     "burst", str(burst), "limit", str(limit)], timeout=30)

    def redirect(self, src: str, dst: str) -> None:
        check_ours(src)
        self.ex.run(["tc", "qdisc", "replace", "dev", src, "ingress"], timeout=10)
        self.ex.run(["tc", "filter", "add", "dev", src, "parent", "ffff:", "protocol", "all", "u32",
                     "match", "u32", "0", "0", "action", "mirred", "egress", "redirect", "dev", dst], timeout=10)

    def names(self) -> list[str]:
        info = json.loads(self._ip("-j", "link", "show") or "[]")
        return [i["ifname"] for i in info if "ifname" in i]

    def qdisc_drops(self, name: str) -> int:
        info = json.loads(self.ex.run(["tc", "-s", "-j", "qdisc", "show", "dev", name, "root"],
                                      timeout=30).stdout or "[]")
        if not info:
            raise CommandError(["tc", "qdisc", "show", "dev", name], 2, f"no root qdisc on {name}")
        return int(info[0].get("drops", 0))

    def wire(self, name: str) -> Wire:
        out = self.ex.run(["cat", *(f"/sys/class/net/{name}/statistics/{k}" for k in _WIRE)],
                          timeout=30).stdout.split()
        return Wire(*(int(x) for x in out[:4]))


LinkOps = Netlink | IpCommands


def on(ex: Executor | None) -> LinkOps:
    """The link operations where ``ex`` runs (None: this machine's root namespace)."""
    if ex is None or isinstance(ex, Local):
        return Netlink(None)
    if isinstance(ex, Netns):
        return Netlink(ex.netns)
    if getattr(ex, "remote", True) is False:   # a remote.Shell for this machine
        return Netlink(None)
    return IpCommands(ex)


def netns_executor(netns: str | None) -> Executor:
    return Netns(netns) if netns else Local()


# -- the one implementation of each host operation -----------------------------------------

def set_mtu(ex: Executor | None, name: str, mtu: int) -> None:
    on(ex).set_mtu(name, mtu)


def set_mtus(ex: Executor | None, names: Sequence[str], mtu: int) -> None:
    """The same MTU on several devices, in the order given (callers put a bridge's ports
    before the bridge when raising: a bridge cannot exceed its smallest port)."""
    links = on(ex)
    for n in names:
        links.set_mtu(n, mtu)


def no_ipv6(ex: Executor | None, name: str) -> None:
    """Keep the kernel from giving our own link an IPv6 link-local address: the segment
    carries only test traffic and the host gets no address on it."""
    check_ours(name)
    ex = ex or Local()
    path = f"/proc/sys/net/ipv6/conf/{name}/disable_ipv6"
    if isinstance(ex, Local):
        if os.path.exists(path):
            ex.write_file(path, "1")
        return
    with contextlib.suppress(CommandError):    # no IPv6 in that kernel: nothing to disable
        ex.write_file(path, "1")


@contextlib.contextmanager
def namespace(name: str) -> Iterator[Netns]:
    """A network namespace on this machine with its loopback up and IPv6 off for everything
    created in it (no router solicitations or DAD frames move a counter); removed on exit."""
    check_ours(name)
    try:
        # Unshared by a thread and bound to /run/netns/<name> like `ip netns add` does;
        # pyroute2's netns.create would fork this process for it.
        in_thread_netns(None, lambda: pr_netns.attach(name, "thread-self"), new=True)
    except OSError as e:
        raise CommandError(["netns", "add", name], e.errno, f"cannot create namespace {name}: {e.strerror}") from None
    try:
        ns = Netns(name)
        # Our namespace, so a namespace-wide default.
        for key in ("all", "default"):
            ns.write_file(f"/proc/sys/net/ipv6/conf/{key}/disable_ipv6", "1")
        Netlink(name).set_up("lo")
        yield ns
    finally:
        delete_namespace(name)


def pids_in(name: str) -> list[int]:
    """The processes whose network namespace is ``name`` (what ``ip netns pids`` lists):
    their /proc/<pid>/ns/net is the same file as /run/netns/<name>."""
    try:
        target = os.stat(f"/run/netns/{name}")
    except OSError:
        return []
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                st = os.stat(f"/proc/{entry.name}/ns/net")
            except OSError:
                continue
            if (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino):
                found.append(int(entry.name))
    return found


def delete_namespace(name: str) -> None:
    check_ours(name)
    with contextlib.suppress(OSError):
        pr_netns.remove(name)


# -- offloads: one implementation for hosts, namespaces and guests (testbed.host.offloads) ------

parse_ethtool_k = offloads.parse_ethtool_k
read_offloads = offloads.read_offloads
apply_offloads = offloads.apply_offloads
