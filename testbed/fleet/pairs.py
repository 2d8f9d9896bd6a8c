"""Two-host topologies on a fleet: which hosts are paired, and each pair's topology.

A pair is named in the inventory: the first host of a pair has ``testbed_peer: <the other
host's inventory name>``. Both carry their data plane: ``testbed_data_address`` (the IPv4
address the tunnel and the pair's own ssh use) and ``testbed_data_interface`` (the interface
that holds it, the tunnel's underlay). Data addresses are kept apart from the control
addresses Ansible connects to: a pair whose data address is a control address is refused.

A two-host topology (as examples/two-hosts/emulated.yaml: two hosts, the client's guest on the
first, the server's on the second) runs once per pair, from the pair's first host: its first
host becomes that host (local), its second the peer, reached over ssh at its data address
with a key made for this fleet run and the peer's host keys as the controller trusts them.
Pure, but for config.parse (which reads the files a topology names).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from testbed.fleet import hostvars
from testbed.host.safeio import UserFileError


@dataclass(frozen=True)
class Pair:
    first: str          # inventory names
    second: str

    @property
    def name(self) -> str:
        return f"{self.first}+{self.second}"


def two_host(data: dict[str, Any]) -> bool:
    """Whether a topology's data puts its client and server (``client``/``server``, else the
    first two guests) on two hosts: what runs on a pair. Read from the data, not the parsed
    model: a topology for real hosts is only valid once a pair's hosts are put in."""
    hosts, guests = data.get("hosts"), data.get("guests")
    if not isinstance(hosts, list) or len(hosts) != 2 or not isinstance(guests, list):
        return False
    where = {g.get("name"): g.get("host") for g in guests if isinstance(g, dict)}
    names = [g.get("name") for g in guests if isinstance(g, dict)]
    client = data.get("client", names[0] if names else None)
    server = data.get("server", names[1] if len(names) > 1 else None)
    return where.get(client) is not None and where.get(server) is not None and where.get(client) != where.get(server)


def find(inventory: str, hosts: list, two: bool) -> list[Pair]:
    """The pairs among ``hosts`` (inventory.Host), checked. ``two``: the topology runs across
    two hosts, so every host must be in a pair; else no host may name a peer."""
    by_name = {h.name: h for h in hosts}
    pairs: list[Pair] = []
    taken: dict[str, str] = {}

    def refuse(host: str, var: str, why: str) -> None:
        raise UserFileError(inventory, f"host {host}: {var}: {why}")
    for h in hosts:
        peer = h.peer
        if peer is None:
            continue
        if not two:
            refuse(h.name, "testbed_peer", "names a peer, but the topology runs on one host "
                                           "(a pair runs a two-host topology: hosts ha and hb)")
        try:
            hostvars.check_name(peer)
        except hostvars.VarError as e:
            refuse(h.name, "testbed_peer", f"{peer[:60]!r} {e.why}")
        if peer == h.name:
            refuse(h.name, "testbed_peer", "names the host itself")
        if peer not in by_name:
            refuse(h.name, "testbed_peer", f"{peer} is not a host of this run (not in the inventory, "
                                           f"or left out by --limit)")
        if taken.get(h.name) == f"{peer}+{h.name}":
            continue        # both hosts name each other: the same pair, said twice
        for x in (h.name, peer):
            if x in taken:
                refuse(x, "testbed_peer", f"in two pairs ({taken[x]} and {h.name}+{peer})")
        p = Pair(h.name, peer)
        taken[h.name] = taken[peer] = p.name
        pairs.append(p)
    if two:
        alone = [h.name for h in hosts if h.name not in taken]
        if alone:
            refuse(alone[0], "testbed_peer", "the topology runs across two hosts, and this host is in "
                                             "no pair (give its first host testbed_peer: <other host>)")
    data_of: dict[str, str] = {}
    for p in pairs:
        a, b = by_name[p.first], by_name[p.second]
        for h in (a, b):
            for var in ("testbed_data_address", "testbed_data_interface"):
                if not h.vars.get(var):
                    refuse(h.name, var, f"missing: a host of a pair ({p.name}) needs its data address "
                                        f"and the interface that holds it")
        da, db = a.vars["testbed_data_address"], b.vars["testbed_data_address"]
        for h, d in ((a, da), (b, db)):
            if d in data_of:
                refuse(h.name, "testbed_data_address", f"{d} is also {data_of[d]}'s")
            data_of[d] = h.name
        controls = {x.address for x in hosts}
        for h, d in ((a, da), (b, db)):
            if d in controls:
                refuse(h.name, "testbed_data_address", f"{d} is a control address (an ansible_host): "
                                                       f"the data plane is kept apart from the control plane")
    return pairs


def topology(data: dict[str, Any], first: Any, second: Any, *, known_hosts: str, key: str,
             overrides: dict[str, Any] | None = None, where: str = "topology") -> dict[str, Any]:
    """The pair's topology from the user's two-host one: its hosts become ``first`` (this
    host, local) and ``second`` (over ssh at its data address, its keys in ``known_hosts``,
    logged in with ``key``), each with its data interface as the underlay."""
    from testbed.fleet.inventory import merge
    d = copy.deepcopy(merge(data, overrides or {}))
    hosts = d.get("hosts") or []
    # the shape config.parse would check, looked at first: overrides merged in may break it
    if not isinstance(hosts, list) or len(hosts) != 2:
        raise UserFileError(where, "hosts: a pair runs a topology of two hosts")
    for i, h in enumerate(hosts):
        if not isinstance(h, dict) or not isinstance(h.get("name"), str) or not h["name"]:
            raise UserFileError(where, f"hosts[{i}]: expected a mapping with a name")
    if d.get("tunnel") is not None and not isinstance(d["tunnel"], dict):
        raise UserFileError(where, f"tunnel: must be a mapping, found {type(d['tunnel']).__name__}")
    a, b = (dict(h) for h in hosts)
    addr = second.vars["testbed_data_address"]
    port = second.port
    uri = (f"qemu+libssh2://root@{addr}/system?known_hosts={known_hosts}&keyfile={key}&sshauth=privkey")
    d["hosts"] = [{"name": a["name"], "underlay": first.vars["testbed_data_interface"]},
                  {"name": b["name"], "uri": uri, "ssh": f"root@{addr}", "ssh_port": port,
                   "known_hosts": known_hosts, "identity": key,
                   "underlay": second.vars["testbed_data_interface"]}]
    tunnel = dict(d.get("tunnel") or {})
    tunnel.pop("underlay", None)
    if tunnel:
        d["tunnel"] = tunnel
    return d


def check(topology_file: str | Path, data: dict[str, Any], first: Any, second: Any, scratch: Path) -> None:
    """The pair's topology validated on the controller, with stand-ins for the files the
    first host will hold (they do not exist here)."""
    from testbed.topology import config
    kh, key = scratch / "known_hosts", scratch / "key"
    for f in (kh, key):
        if not f.exists():
            f.write_text("")
    where = (f"{topology_file} (on pair {first.name}+{second.name}"
             + (f", with host {first.name}'s testbed_topology_overrides)" if first.overrides else ")"))
    d = topology(data, first, second, known_hosts=str(kh), key=str(key), overrides=first.overrides, where=where)
    config.parse(yaml.safe_dump(d), where, base=Path(topology_file).absolute().parent)
