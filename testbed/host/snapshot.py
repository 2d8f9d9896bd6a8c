"""A comparable picture of a network namespace, to prove a run left the host as it found it.

``take()`` records what a run could change: links, addresses, routes and rules in every table,
bridge ports and VLANs, iptables/ip6tables/nftables rulesets, every readable sysctl under
/proc/sys/net, and, for the root namespace only, the host-wide state: the list of named network
namespaces and the Open vSwitch database. ``diff()`` says in plain lines what changed.

Canonical means two snapshots of an untouched host are equal: records are sorted, ifindexes are
replaced by names (they change when an object is recreated), and everything that moves on its
own is left out: counters, timers, lifetimes, carrier flags, DAD state, generated secrets.
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import logging
import os
import re
import socket
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import testbed
from testbed.errors import CommandError, TestbedError
from testbed.host import proc

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
UNAVAILABLE: Literal["unavailable"] = "unavailable"
NETNS_DIR = "/run/netns"
SYSCTL_DIR = "/proc/sys/net"

#: A ruleset is its canonical lines, or UNAVAILABLE when the tool is missing or refuses.
Ruleset = tuple[str, ...] | Literal["unavailable"]

# Sysctls left out on purpose. Unreadable ones (route/flush is write-only) are skipped anyway.
# There is deliberately no match on "stat": net.ipv6.flowlabel_state_ranges is configuration.
SKIP_SYSCTLS = {
    "net.netfilter.nf_conntrack_count": "live number of tracked connections; moves with traffic",
    "net.ipv4.tcp_fastopen_key": "a secret, and the kernel generates it on first TCP Fast Open use",
    "net.core.netdev_rss_key": "a secret, generated when the first multiqueue driver asks for it",
}
SKIP_SYSCTL_LEAVES = {
    "stable_secret": "per-interface IPv6 address-generation secret; unreadable (EIO) until set",
}

# ifi_flags worth comparing. RUNNING, LOWER_UP and DORMANT are left out: they follow carrier
# (the peer, the wire) rather than configuration, and operstate already reports it.
_LINK_FLAGS = {0x1: "UP", 0x2: "BROADCAST", 0x8: "LOOPBACK", 0x10: "POINTOPOINT", 0x80: "NOARP",
               0x100: "PROMISC", 0x200: "ALLMULTI", 0x400: "MASTER", 0x800: "SLAVE",
               0x1000: "MULTICAST"}

# Kind-specific settings, by allow-list: IFLA_INFO_DATA also carries timers and topology state
# (a bridge's gc_timer, hello_timer, root id) that differ between two reads.
_LINK_INFO = {
    "bridge": ("IFLA_BR_STP_STATE", "IFLA_BR_VLAN_FILTERING", "IFLA_BR_VLAN_PROTOCOL",
               "IFLA_BR_VLAN_DEFAULT_PVID", "IFLA_BR_FORWARD_DELAY", "IFLA_BR_AGEING_TIME",
               "IFLA_BR_MCAST_SNOOPING", "IFLA_BR_NF_CALL_IPTABLES", "IFLA_BR_NF_CALL_IP6TABLES",
               "IFLA_BR_NF_CALL_ARPTABLES"),
    "vxlan": ("IFLA_VXLAN_ID", "IFLA_VXLAN_GROUP", "IFLA_VXLAN_GROUP6", "IFLA_VXLAN_LOCAL",
              "IFLA_VXLAN_LOCAL6", "IFLA_VXLAN_LINK", "IFLA_VXLAN_PORT", "IFLA_VXLAN_TTL",
              "IFLA_VXLAN_LEARNING", "IFLA_VXLAN_UDP_CSUM"),
    "vlan": ("IFLA_VLAN_ID", "IFLA_VLAN_PROTOCOL"),
    "macvlan": ("IFLA_MACVLAN_MODE",),
    "macvtap": ("IFLA_MACVTAP_MODE",),
    "tun": ("IFLA_TUN_TYPE", "IFLA_TUN_PI", "IFLA_TUN_VNET_HDR", "IFLA_TUN_PERSIST",
            "IFLA_TUN_MULTI_QUEUE", "IFLA_TUN_OWNER", "IFLA_TUN_GROUP"),
}

# Kernel ABI numbers (rtnetlink.h) -> the names `ip route` prints; unknown ones stay numbers.
_FAMILY = {socket.AF_INET: "inet", socket.AF_INET6: "inet6"}
_TABLE = {253: "default", 254: "main", 255: "local"}
_PROTO = {0: "unspec", 1: "redirect", 2: "kernel", 3: "boot", 4: "static", 9: "ra", 11: "zebra",
          12: "bird", 16: "dhcp", 18: "keepalived", 186: "bgp", 188: "ospf"}
_SCOPE = {0: "global", 200: "site", 253: "link", 254: "host", 255: "nowhere"}
_RTYPE = {1: "unicast", 2: "local", 3: "broadcast", 4: "anycast", 5: "multicast", 6: "blackhole",
          7: "unreachable", 8: "prohibit", 9: "throw", 10: "nat"}
_RULE_ACTION = {1: "lookup", 2: "goto", 3: "nop", 6: "blackhole", 7: "unreachable", 8: "prohibit"}
_IFA_F_TEMPORARY = 0x01     # privacy addresses rotate on their own
_FIB_RULE_INVERT = 0x02
_RULE_WORDS = {"FRA_IIFNAME": "iif", "FRA_OIFNAME": "oif", "FRA_PROTOCOL": "proto"}
_BRIDGE_VLAN_FLAGS = {0x2: "pvid", 0x4: "untagged"}

# OVS columns that are configuration. Left out: _uuid (new on every re-create; references are
# resolved to names instead), statistics/status/ofport/link_state (vswitchd's live view), and
# external_ids (libvirt and ovn-controller rewrite keys such as iface-status on their own).
_OVS_COLUMNS = {
    "Open_vSwitch": ("other_config",),
    "Bridge": ("name", "datapath_type", "fail_mode", "stp_enable", "protocols", "other_config",
               "ports"),
    "Port": ("name", "tag", "trunks", "vlan_mode", "bond_mode", "other_config", "interfaces"),
    "Interface": ("name", "type", "options", "mtu_request", "other_config"),
}


# --------------------------------------------------------------------------- records

@dataclass(frozen=True)
class Link:
    name: str
    kind: str                        # "" for devices without rtnl kind (a NIC, loopback)
    mtu: int
    flags: tuple[str, ...]
    operstate: str
    master: str | None
    mac: str | None
    lower: str | None                # veth peer / macvtap or VLAN lower device; "(other netns)"
    info: tuple[tuple[str, str], ...]

    @property
    def key(self) -> str:
        return self.name


@dataclass(frozen=True)
class Address:
    dev: str
    family: str
    address: str
    prefixlen: int
    peer: str | None                 # point-to-point peer, when it differs from the address

    @property
    def key(self) -> str:
        peer = f" peer {self.peer}" if self.peer else ""
        return f"{self.dev} {self.family} {self.address}/{self.prefixlen}{peer}"


@dataclass(frozen=True)
class Route:
    family: str
    table: str
    type: str
    dst: str
    src: str | None                  # IPv6 source-specific routing prefix
    gateway: str | None
    dev: str | None
    proto: str
    scope: str
    metric: int | None
    prefsrc: str | None
    nexthops: tuple[str, ...]        # multipath legs and nexthop ids
    metrics: tuple[tuple[str, str], ...]   # RTA_METRICS: mtu, advmss, ...

    @property
    def key(self) -> str:
        parts = [self.family, f"table {self.table}", self.type, self.dst]
        for word, value in (("from", self.src), ("via", self.gateway), ("dev", self.dev),
                            ("proto", self.proto), ("scope", self.scope), ("metric", self.metric),
                            ("src", self.prefsrc)):
            if value is not None:
                parts.append(f"{word} {value}")
        parts += [f"nexthop {n}" for n in self.nexthops] + [f"{k} {v}" for k, v in self.metrics]
        return " ".join(parts)


@dataclass(frozen=True)
class Rule:
    family: str
    priority: int
    selector: tuple[tuple[str, str], ...]   # from, to, iif, fwmark, not, ... as `ip rule` says
    action: str
    table: str

    @property
    def key(self) -> str:
        sel = " ".join(f"{k} {v}" if v else k for k, v in self.selector) or "all"
        target = f" {self.table}" if self.action == "lookup" else ""
        return f"{self.family} {self.priority}: {sel} {self.action}{target}"


@dataclass(frozen=True)
class Bridge:
    name: str
    ports: tuple[str, ...]
    vlans: tuple[str, ...]           # "PORT VID [pvid] [untagged]"; "self" is the bridge itself

    @property
    def key(self) -> str:
        return self.name


@dataclass(frozen=True)
class OvsRow:
    table: str
    name: str                        # "." for the single Open_vSwitch row, as ovs-vsctl names it
    columns: tuple[tuple[str, str], ...]

    @property
    def key(self) -> str:
        return f"{self.table} {self.name}"


@dataclass(frozen=True)
class Snapshot:
    netns: str | None                # None: the namespace the caller runs in (the root one)
    links: tuple[Link, ...]
    addresses: tuple[Address, ...]
    routes: tuple[Route, ...]
    rules: tuple[Rule, ...]
    bridges: tuple[Bridge, ...]
    iptables: Ruleset
    ip6tables: Ruleset
    nftables: Ruleset
    sysctls: tuple[tuple[str, str], ...]
    # Host-wide, so recorded only in a root snapshot (None in a named one): otherwise a
    # namespace's snapshot would change whenever anything else on the host did.
    netns_names: tuple[str, ...] | None
    ovs: tuple[OvsRow, ...] | Literal["unavailable"] | None

    def to_json(self) -> str:
        # Sysctls as an object: a thousand `"key": "value"` lines read better than pairs.
        fields = {**dataclasses.asdict(self), "sysctls": dict(self.sysctls)}
        return json.dumps({"format": FORMAT_VERSION, **fields}, indent=1)

    @classmethod
    def from_json(cls, text: str) -> Snapshot:
        raw = json.loads(text)
        if raw.pop("format", None) != FORMAT_VERSION:
            raise TestbedError(f"snapshot: unknown format (this code reads {FORMAT_VERSION})")
        rows = {"links": Link, "addresses": Address, "routes": Route, "rules": Rule,
                "bridges": Bridge, "ovs": OvsRow}
        fields: dict[str, Any] = {}
        for name, value in raw.items():
            if name in rows and isinstance(value, list):
                value = tuple(rows[name](**_tuples(r)) for r in value)
            fields[name] = tuple(sorted(value.items())) if name == "sysctls" else _tuples(value)
        return cls(**fields)


def _tuples(value: Any) -> Any:
    """JSON lists back to the tuples the frozen records hold, so a round trip keeps equality."""
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    if isinstance(value, dict):
        return {k: _tuples(v) for k, v in value.items()}
    return value


# --------------------------------------------------------------------------- take

def take(netns: str | None = None, *, ovs_db: str | None = None) -> Snapshot:
    """Snapshot one network namespace: a name under /run/netns, or None for the caller's own.

    ``ovs_db`` points ovs-vsctl at another ovsdb-server (``unix:/path``); by default it uses
    its compiled-in socket. Read-only throughout: nothing is created, not even the namespace.
    """
    # isfile: a named namespace is an nsfs bind mount, which stats as a regular file; this
    # also turns away "", "." and "..". No "/": the name must not reach outside NETNS_DIR.
    if netns is not None and ("/" in netns or not os.path.isfile(os.path.join(NETNS_DIR, netns))):
        raise TestbedError(f"network namespace {netns!r} does not exist (no {NETNS_DIR}/{netns})")
    # Commands before sysctls: iptables-nft or nft may autoload a kernel module that adds
    # sysctls, and that must land in this snapshot, not show up as a change in the next one.
    iptables = _ruleset(["iptables-save"], netns, _clean_iptables)
    ip6tables = _ruleset(["ip6tables-save"], netns, _clean_iptables)
    nftables = _ruleset(["nft", "-s", "list", "ruleset"], netns, _clean_nft)
    ovs = _ovs(ovs_db) if netns is None else None
    links, addresses, routes, rules, bridges = _netlink(netns)
    return Snapshot(
        netns=netns, links=links, addresses=addresses, routes=routes, rules=rules,
        bridges=bridges, iptables=iptables, ip6tables=ip6tables, nftables=nftables,
        sysctls=read_sysctls() if netns is None else _sysctls_in(netns),
        netns_names=_netns_names() if netns is None else None, ovs=ovs)


def _netns_names() -> tuple[str, ...]:
    try:
        return tuple(sorted(os.listdir(NETNS_DIR)))
    except FileNotFoundError:           # no namespace was ever named on this host
        return ()


def _ruleset(argv: list[str], netns: str | None, clean: Callable[[str], list[str]]) -> Ruleset:
    try:
        out = proc.run(argv, netns=netns, timeout=30).stdout
    except CommandError as e:           # missing binary, or no kernel support for the family
        log.info("snapshot: %s unavailable: %s", argv[0], e)
        return UNAVAILABLE
    return tuple(clean(out))


# [packets:bytes]: after a chain's policy, and before each rule when saved with -c.
_CHAIN_COUNTERS = re.compile(r"^(:\S+ \S+) \[\d+:\d+\]$")
_RULE_COUNTERS = re.compile(r"^\[\d+:\d+\] ")


def _clean_iptables(text: str) -> list[str]:
    lines = (_RULE_COUNTERS.sub("", _CHAIN_COUNTERS.sub(r"\1", line.strip()))
             for line in text.splitlines())
    # '#' lines carry the time of the dump.
    return [line for line in lines if line and not line.startswith("#")]


_NFT_VOLATILE = re.compile(r"\s+(?:packets \d+ bytes \d+|expires [\dhmsd.]+|used \d+ \w*bytes)")


def _clean_nft(text: str) -> list[str]:
    # -s already drops most counters; these catch what older nft versions still print,
    # plus the remaining lifetime of dynamic set elements.
    lines = (_NFT_VOLATILE.sub("", line).rstrip() for line in text.splitlines())
    return [line.expandtabs(2) for line in lines
            if line.strip() and not line.lstrip().startswith("#")]


# --------------------------------------------------------------------------- netlink

def _netlink(netns: str | None) -> tuple[tuple[Link, ...], tuple[Address, ...], tuple[Route, ...],
                                        tuple[Rule, ...], tuple[Bridge, ...]]:
    # Imported here, not at the top: `python -m testbed.host.snapshot sysctls` runs inside the
    # namespace on every named snapshot and should not pay pyroute2's ~0.3 s import.
    from pyroute2 import IPRoute
    from pyroute2.netlink.exceptions import NetlinkError

    def dump() -> tuple[list, list, list, list, list]:
        with IPRoute() as ipr:
            raw_links = list(ipr.get_links())
            raw_addrs = list(ipr.get_addr())
            raw_routes = [r for fam in _FAMILY for r in ipr.get_routes(family=fam)]
            raw_rules = [r for fam in _FAMILY for r in ipr.get_rules(family=fam)]
            try:
                raw_vlans = list(ipr.get_vlans())
            except NetlinkError as e:     # no bridge support at all
                log.info("snapshot: no bridge VLAN dump: %s", e)
                raw_vlans = []
        return raw_links, raw_addrs, raw_routes, raw_rules, raw_vlans

    read = dump
    if netns:
        # The netlink socket is opened by a thread that joined the namespace, not by
        # pyroute2's netns=, which forks this process to open it: a fork of a process with
        # other threads (a test worker's, a run's watchers) can hang in a lock one of them held.
        from testbed.host.executor import in_thread_netns
        read = functools.partial(in_thread_netns, netns, dump)
    # The dumps are one after another: a link made or removed between the link dump and the
    # route dump (another run's, beside this one) leaves a route or address naming an
    # interface the snapshot does not know, seen as "ifNNN" and taken for a change of the
    # host's own. Dumped again (at most 5 times) until every interface they name is a link.
    for _ in range(5):
        raw_links, raw_addrs, raw_routes, raw_rules, raw_vlans = read()
        known = {m["index"] for m in raw_links}
        used = {m["index"] for m in raw_addrs} | {m.get_attr("RTA_OIF") for m in raw_routes}
        if not (used - known - {None, 0}):
            break
    names = {m["index"]: m.get_attr("IFLA_IFNAME") for m in raw_links}

    def name(index: int | None) -> str | None:
        return None if not index else names.get(index, f"if{index}")

    links = tuple(sorted((_link(m, name) for m in raw_links), key=lambda r: r.key))
    addresses = {a for m in raw_addrs if (a := _address(m, name))}
    routes = {r for m in raw_routes if (r := _route(m, name))}
    rules = {_rule(m) for m in raw_rules}
    return (links, tuple(sorted(addresses, key=lambda r: r.key)),
            tuple(sorted(routes, key=lambda r: r.key)), tuple(sorted(rules, key=lambda r: r.key)),
            _bridges(links, raw_vlans, name))


def _link(m: Any, name: Callable[[int | None], str | None]) -> Link:
    kind = m.get_nested("IFLA_LINKINFO", "IFLA_INFO_KIND") or ""
    data = m.get_nested("IFLA_LINKINFO", "IFLA_INFO_DATA")
    info = []
    for attr in _LINK_INFO.get(kind, ()):
        value = data.get_attr(attr) if data is not None else None
        if value is not None:
            short = attr.split("_", 2)[2].lower()          # IFLA_BR_STP_STATE -> stp_state
            info.append((short, (name(value) or "") if short == "link" else str(value)))
    if m.get_attr("IFLA_LINK_NETNSID") is not None and m.get_attr("IFLA_LINK"):
        lower = "(other netns)"      # its ifindex means nothing here
    else:
        lower = name(m.get_attr("IFLA_LINK")) if m.get_attr("IFLA_LINK") != m["index"] else None
    return Link(
        name=m.get_attr("IFLA_IFNAME"), kind=kind, mtu=m.get_attr("IFLA_MTU"),
        flags=tuple(n for bit, n in _LINK_FLAGS.items() if m["flags"] & bit),
        operstate=m.get_attr("IFLA_OPERSTATE") or "", master=name(m.get_attr("IFLA_MASTER")),
        mac=m.get_attr("IFLA_ADDRESS"), lower=lower, info=tuple(sorted(info)))


def _address(m: Any, name: Callable[[int | None], str | None]) -> Address | None:
    flags = m.get_attr("IFA_FLAGS")
    if (m["flags"] if flags is None else flags) & _IFA_F_TEMPORARY:
        return None
    local, address = m.get_attr("IFA_LOCAL"), m.get_attr("IFA_ADDRESS")
    return Address(dev=name(m["index"]) or "", family=_FAMILY.get(m["family"], str(m["family"])),
                   address=local or address, prefixlen=m["prefixlen"],
                   peer=address if local and address and address != local else None)


def _route(m: Any, name: Callable[[int | None], str | None]) -> Route | None:
    if m["flags"] & 0x200:           # RTM_F_CLONED: a cache entry, not configuration
        return None
    dst = m.get_attr("RTA_DST")
    src = m.get_attr("RTA_SRC")
    table = m.get_attr("RTA_TABLE") or m["table"]
    nexthops = []
    for nh in m.get_attr("RTA_MULTIPATH") or ():
        via = nh.get_attr("RTA_GATEWAY")
        nexthops.append(" ".join(filter(None, [f"via {via}" if via else "",
                                               f"dev {name(nh['oif'])}" if nh["oif"] else "",
                                               f"weight {nh['hops'] + 1}"])))
    if m.get_attr("RTA_NH_ID") is not None:
        nexthops.append(f"id {m.get_attr('RTA_NH_ID')}")
    metrics = m.get_attr("RTA_METRICS")
    return Route(
        family=_FAMILY.get(m["family"], str(m["family"])), table=_TABLE.get(table, str(table)),
        type=_RTYPE.get(m["type"], str(m["type"])),
        dst=f"{dst}/{m['dst_len']}" if dst else "default",
        src=f"{src}/{m['src_len']}" if src else None, gateway=m.get_attr("RTA_GATEWAY"),
        dev=name(m.get_attr("RTA_OIF")), proto=_PROTO.get(m["proto"], str(m["proto"])),
        scope=_SCOPE.get(m["scope"], str(m["scope"])), metric=m.get_attr("RTA_PRIORITY"),
        prefsrc=m.get_attr("RTA_PREFSRC"), nexthops=tuple(nexthops),
        metrics=tuple(sorted((k[5:].lower(), str(v)) for k, v in metrics["attrs"]
                             if k.startswith("RTAX_"))) if metrics else ())


def _rule(m: Any) -> Rule:
    selector: list[tuple[str, str]] = []
    if m["flags"] & _FIB_RULE_INVERT:
        selector.append(("not", ""))
    for word, attr, length in (("from", "FRA_SRC", "src_len"), ("to", "FRA_DST", "dst_len")):
        if m.get_attr(attr):
            selector.append((word, f"{m.get_attr(attr)}/{m[length]}"))
    if m["tos"]:
        selector.append(("tos", str(m["tos"])))
    for attr, value in m["attrs"]:
        if attr in ("FRA_SRC", "FRA_DST", "FRA_TABLE", "FRA_PRIORITY", "UNKNOWN"):
            continue
        if attr == "FRA_SUPPRESS_PREFIXLEN" and value in (0xFFFFFFFF, -1):    # "not set"
            continue
        if attr == "FRA_PROTOCOL":
            value = _PROTO.get(value, value)
        selector.append((_RULE_WORDS.get(attr, attr[4:].lower()), str(value)))
    table = m.get_attr("FRA_TABLE") or m["table"]
    return Rule(family=_FAMILY.get(m["family"], str(m["family"])),
                priority=m.get_attr("FRA_PRIORITY") or 0, selector=tuple(selector),
                action=_RULE_ACTION.get(m["action"], str(m["action"])),
                table=_TABLE.get(table, str(table)))


def _bridges(links: Sequence[Link], raw_vlans: Iterable[Any],
             name: Callable[[int | None], str | None]) -> tuple[Bridge, ...]:
    vlans: dict[str, list[str]] = {}
    for m in raw_vlans:
        # In the AF_BRIDGE dump a port's master is its bridge and a bridge is its own master.
        port, bridge = m.get_attr("IFLA_IFNAME"), name(m.get_attr("IFLA_MASTER"))
        spec = m.get_attr("IFLA_AF_SPEC")
        if not bridge or spec is None:
            continue
        for info in spec.get_attrs("IFLA_BRIDGE_VLAN_INFO"):
            words = [n for bit, n in _BRIDGE_VLAN_FLAGS.items() if info["flags"] & bit]
            vlans.setdefault(bridge, []).append(
                " ".join(["self" if port == bridge else port, str(info["vid"]), *words]))
    return tuple(
        Bridge(name=b.name, ports=tuple(sorted(p.name for p in links if p.master == b.name)),
               vlans=tuple(sorted(vlans.get(b.name, []))))
        for b in links if b.kind == "bridge")


# --------------------------------------------------------------------------- sysctls

def _sysctl_key(path: str) -> str:
    # sysctl(8)'s spelling: dots between levels, and a dot inside a level (eth0.100) as '/'.
    rel = os.path.relpath(path, "/proc/sys")
    return ".".join(part.replace(".", "/") for part in rel.split(os.sep))


def read_sysctls() -> tuple[tuple[str, str], ...]:
    """Every readable net sysctl as (key, value), for the namespace of the calling process."""
    found = []
    for dirpath, _dirs, files in os.walk(SYSCTL_DIR):
        for leaf in files:
            path = os.path.join(dirpath, leaf)
            key = _sysctl_key(path)
            if key in SKIP_SYSCTLS or leaf in SKIP_SYSCTL_LEAVES:
                continue
            try:
                with open(path) as f:
                    value = f.read()
            except OSError:          # write-only (EACCES) or refusing reads (EIO, EINVAL)
                continue
            found.append((key, " ".join(value.split())))    # tabs in tcp_rmem etc.
    return tuple(sorted(found))


def _sysctls_in(netns: str) -> tuple[tuple[str, str], ...]:
    # /proc/sys/net shows the namespace of the process reading it, so the reader runs inside
    # (a child, never a setns of this process). PYTHONPATH and -P make it import this very
    # module rather than whatever a `testbed` in the current directory would be.
    package_root = str(Path(testbed.__file__).resolve().parents[1])
    path = os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))
    out = proc.run([sys.executable, "-P", "-m", "testbed.host.snapshot", "sysctls"], netns=netns,
                   env={"PYTHONPATH": path}, timeout=30).stdout
    return tuple((k, v) for k, v in json.loads(out))


# --------------------------------------------------------------------------- OVS

def _ovs(db: str | None) -> tuple[OvsRow, ...] | Literal["unavailable"]:
    argv = ["ovs-vsctl", *([f"--db={db}"] if db else []), "--timeout=5", "--format=json"]
    for table, columns in _OVS_COLUMNS.items():
        argv += ["--", f"--columns=_uuid,{','.join(columns)}", "list", table]
    try:
        out = proc.run(argv, timeout=15).stdout
    except CommandError as e:        # no ovs-vsctl, or no ovsdb-server answering
        log.info("snapshot: OVS unavailable: %s", e)
        return UNAVAILABLE
    tables = [json.loads(line) for line in out.splitlines() if line.strip()]
    uuid_names = {}
    for t in tables:
        if "name" in t["headings"]:
            i = t["headings"].index("name")
            uuid_names.update({row[0][1]: row[i] for row in t["data"]})
    rows = []
    for table, t in zip(_OVS_COLUMNS, tables):
        for row in t["data"]:
            cols = dict(zip(t["headings"], row))
            name = cols.pop("name", ".")
            values = ((k, _ovs_value(v, uuid_names)) for k, v in cols.items() if k != "_uuid")
            # Empty sets and maps left out, so a row reads "type=vxlan options=..." only.
            rows.append(OvsRow(table=table, name=name, columns=tuple(kv for kv in values if kv[1])))
    return tuple(sorted(rows, key=lambda r: r.key))


def _ovs_value(v: Any, uuid_names: dict[str, str]) -> str:
    """One OVSDB JSON datum as a canonical string: sets and maps sorted, uuids as row names."""
    if isinstance(v, list) and v and v[0] in ("uuid", "named-uuid"):
        return uuid_names.get(v[1], v[1])
    if isinstance(v, list) and v and v[0] == "set":
        return ",".join(sorted(_ovs_value(x, uuid_names) for x in v[1]))
    if isinstance(v, list) and v and v[0] == "map":
        return ",".join(sorted(f"{_ovs_value(k, uuid_names)}={_ovs_value(x, uuid_names)}"
                               for k, x in v[1]))
    if isinstance(v, bool):
        return str(v).lower()
    return str(v)


# --------------------------------------------------------------------------- diff

def diff(before: Snapshot, after: Snapshot) -> list[str]:
    """What changed from ``before`` to ``after``, one readable line each; [] when equal."""
    if before.netns != after.netns:
        raise ValueError(f"snapshots of different namespaces: {before.netns!r}, {after.netns!r}")
    lines: list[str] = []
    for what, field in (("link", "links"), ("address", "addresses"), ("route", "routes"),
                        ("rule", "rules"), ("bridge", "bridges")):
        lines += _diff_records(what, getattr(before, field), getattr(after, field))
    if before.netns_names is not None and after.netns_names is not None:
        old, new = set(before.netns_names), set(after.netns_names)
        lines += [f"netns removed: {n}" for n in sorted(old - new)]
        lines += [f"netns added: {n}" for n in sorted(new - old)]
    if isinstance(before.ovs, tuple) and isinstance(after.ovs, tuple):
        lines += _diff_records("ovs", before.ovs, after.ovs)
    elif before.ovs != after.ovs:
        lines.append(f"ovs: {_summary(before.ovs)} -> {_summary(after.ovs)}")
    for what in ("iptables", "ip6tables", "nftables"):
        lines += _diff_text(what, getattr(before, what), getattr(after, what))
    return lines + _diff_sysctls(before.sysctls, after.sysctls)


def _summary(value: tuple[Any, ...] | str | None, unit: str = "entries") -> str:
    if value is None:
        return "not recorded"
    return value if isinstance(value, str) else f"{len(value)} {unit}"


def _describe(record: Any) -> str:
    """What a record's key leaves out; only name-keyed records leave anything out."""
    if not isinstance(record, (Link, Bridge, OvsRow)):
        return ""
    words = []
    for f in dataclasses.fields(record):
        value = getattr(record, f.name)
        if f.name in ("name", "table") or value in (None, "", ()):
            continue
        words.append(_fmt(value) if _pairs(value) else f"{f.name} {_fmt(value)}")
    return " ".join(words)


def _pairs(value: Any) -> bool:
    return (isinstance(value, tuple) and bool(value)
            and all(isinstance(v, tuple) and len(v) == 2 for v in value))


def _fmt(value: Any) -> str:
    if _pairs(value):
        return " ".join(f"{k}={v}" for k, v in value)
    if isinstance(value, tuple):
        return ",".join(map(str, value)) or "-"
    return "-" if value is None or value == "" else str(value)


def _diff_records(what: str, before: Sequence[Any], after: Sequence[Any]) -> list[str]:
    # Links, bridges and OVS rows have an identity (their name) and report field changes;
    # addresses, routes and rules are keyed by every field, so they are only added or removed.
    b, a = {r.key: r for r in before}, {r.key: r for r in after}
    lines = [f"{what} removed: {' '.join(filter(None, [k, _describe(b[k])]))}"
             for k in sorted(b.keys() - a.keys())]
    lines += [f"{what} added: {' '.join(filter(None, [k, _describe(a[k])]))}"
              for k in sorted(a.keys() - b.keys())]
    for k in sorted(a.keys() & b.keys()):
        for f in dataclasses.fields(a[k]):
            old, new = getattr(b[k], f.name), getattr(a[k], f.name)
            if old == new:
                continue
            if isinstance(old, tuple) and _pairs(old + new):      # info, OVS columns: per key
                o, n = dict(old), dict(new)
                lines += [f"{what} {k}: {pk} {_fmt(o.get(pk))} -> {_fmt(n.get(pk))}"
                          for pk in sorted(o.keys() | n.keys()) if o.get(pk) != n.get(pk)]
            elif isinstance(old, tuple) and isinstance(new, tuple):   # flags, ports: +/-
                change = ([f"+{x}" for x in new if x not in old]
                          + [f"-{x}" for x in old if x not in new])
                lines.append(f"{what} {k}: {f.name} {' '.join(change)}")
            else:
                lines.append(f"{what} {k}: {f.name} {_fmt(old)} -> {_fmt(new)}")
    return lines


def _diff_text(what: str, before: Ruleset, after: Ruleset) -> list[str]:
    if isinstance(before, str) or isinstance(after, str):
        if before == after:
            return []
        return [f"{what}: {_summary(before, 'lines')} -> {_summary(after, 'lines')}"]
    lines = []
    for line in difflib.unified_diff(before, after, n=0, lineterm=""):
        if line.startswith(("---", "+++", "@@")):
            continue
        lines.append(f"{what}: {line[0]} {line[1:].strip()}")
    return lines


def _diff_sysctls(before: Sequence[tuple[str, str]], after: Sequence[tuple[str, str]]) -> list[str]:
    b, a = dict(before), dict(after)
    lines = [f"sysctl {k}: {b[k]} -> {a[k]}" for k in sorted(a.keys() & b.keys()) if a[k] != b[k]]
    lines += _sysctl_subtrees("removed", sorted(b.keys() - a.keys()), b, a)
    lines += _sysctl_subtrees("added", sorted(a.keys() - b.keys()), a, b)
    return lines


def _sysctl_subtrees(what: str, keys: list[str], values: dict[str, str],
                     other: dict[str, str]) -> list[str]:
    # A new interface brings ~100 sysctls (ipv4/ipv6 conf, neigh); report the new directory
    # once, at the highest level the other snapshot lacks, instead of key by key.
    known = {".".join(k.split(".")[:i]) for k in other for i in range(1, k.count(".") + 1)}
    groups: dict[str, list[str]] = {}
    for key in keys:
        parts = key.split(".")
        top = next((".".join(parts[:i]) for i in range(1, len(parts))
                    if ".".join(parts[:i]) not in known), key)
        groups.setdefault(top, []).append(key)
    return [f"sysctl {what}: {top} = {values[top]}" if members == [top]
            else f"sysctl {what}: {top}.* ({len(members)} keys)"
            for top, members in groups.items()]


if __name__ == "__main__":
    # `python -m testbed.host.snapshot sysctls` is the reader _sysctls_in() runs inside a namespace;
    # `python -m testbed.host.snapshot take [NETNS]` prints a snapshot for a person to look at.
    if sys.argv[1:] == ["sysctls"]:
        json.dump(read_sysctls(), sys.stdout)
    elif sys.argv[1:2] == ["take"] and len(sys.argv) <= 3:
        print(take(sys.argv[2] if len(sys.argv) == 3 else None).to_json())
    else:
        raise SystemExit("usage: python -m testbed.host.snapshot sysctls | take [NETNS]")
