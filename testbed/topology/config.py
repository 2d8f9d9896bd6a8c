"""YAML topology + matrix -> model, validated before anything is created.

Every error names the file, the field path and the line, e.g.
``topo.yaml:12: guests[1].mtu: not an integer: 'jumbo'``. Values that end up in XML,
interface names or argv are held to a safe alphabet here, so nothing downstream has to
wonder whether a name can inject markup or shell syntax.
"""
from __future__ import annotations

import contextvars
import dataclasses
import ipaddress
import json
import math
import os
import re
from collections.abc import Iterable
from pathlib import Path

import yaml

from testbed import attachments, tools
from testbed.errors import CapabilityError, CommandError, ConfigError, one_line
from testbed.tools import pacing
from testbed.topology.config_placement import (
    HOST_KEYS,
    check_placements,
    guest_placement,
    hop_profiles,
    hop_spec,
    host_placement,
    noise,
)
from testbed.topology.model import (
    NAME_RE,
    Attachment,
    Backend,
    GuestSpec,
    HostSpec,
    Matrix,
    Offloads,
    Pattern,
    Profile,
    Protocol,
    RateSearch,
    Repetitions,
    Tool,
    Topology,
    TunnelSpec,
    Variant,
    clone_name,
)
from testbed.topology.yamlnode import IFNAME_RE, Node, compose, ifname, oserror, read_text, show

BENCHMARK_NET = ipaddress.ip_network("198.18.0.0/15")
# Every pattern here is applied with fullmatch: with re.match a '$' also matches before a
# final newline, so "g1\n" would pass.
# libvirt URIs: driver[+transport]://[user@][host][:port]/path[?query]; no quotes,
# spaces, angle brackets, '%' escapes or shell metacharacters. The query is checked
# parameter by parameter in _check_uri.
URI_RE = re.compile(r"[a-z][a-z0-9]*(\+[a-z][a-z0-9]*)?://([A-Za-z0-9._-]+@)?[A-Za-z0-9._:\[\]-]*"
                    r"/[A-Za-z0-9._/-]*(\?[A-Za-z0-9._=&/-]*)?")
#: libvirt transports a topology may name. Not 'ext': its ?command= runs a local program.
URI_TRANSPORTS = {"unix", "ssh", "libssh2", "libssh", "tls", "tcp"}
#: libvirt URI parameters a topology may set (libvirt matches their names in any case).
#: Not no_verify (turns host-key checking off), command/netcat (name programs to run).
URI_PARAMS = {"keyfile", "known_hosts", "known_hosts_verify", "mode", "name", "pkipath", "proxy", "socket",
              "sshauth", "tls_priority"}
# ssh targets: user@host, neither part starting with '-' (ssh would read it as an option,
# e.g. "-oProxyCommand=...") or '.'.
SSH_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*@[A-Za-z0-9_][A-Za-z0-9._-]*")
PROFILE_NAME_RE = re.compile(r"[a-z][a-z0-9_]{0,23}")
MTU_MIN, MTU_MAX = 68, 65535
MAX_CONNECTIONS = 1024
MAX_QUEUES = 256            # virtio-net's limit on queue pairs
# A Linux interface name, the kernel's dev_valid_name(): 1..15 bytes, not '.' or '..', no
# '/', ':' or whitespace; held here to a safe ASCII alphabet and no leading '-' (tools such as
# ethtool would take it as an option). '.' and '..' are refused in _ifname.
#: Endpoints the runner places in `subnet`: the client at network+1, the server at network+2
#: (testpaths.plug, host.net.netns endpoints). With the network and broadcast
#: addresses that needs 4 addresses: a /30 at most.
SUBNET_ENDPOINTS = 2
SUBNET_MAX_PREFIX = 32 - math.ceil(math.log2(SUBNET_ENDPOINTS + 2))
#: Caps on a matrix, overridable with the topology's `limits` (up to the hard ceilings):
#: a few bytes of YAML must not plan a million cells or a year of measuring.
DEFAULT_MAX_CELLS, HARD_MAX_CELLS = 2000, 100_000
DEFAULT_MAX_HOURS, HARD_MAX_HOURS = 48, 8760
MATRIX_KEYS = {"attachments", "backends", "queues", "mtus", "connections", "profiles", "repetitions",
               "variants", "pairs", "percentiles",
               "randomize", "seed"}
PROFILE_KEYS = {"name", "tool", "protocol", "pattern", "message_size", "response_size", "duration",
                "rate_bps", "rate", "confidence", "iterations", "kind", "search", "rates", "hops"}
#: outer Ethernet 14 + IPv4 20 + UDP 8 + VXLAN 8 (host/net/vxlan.py)
VXLAN_OVERHEAD = 50


def _attachment(n: Node) -> Attachment:
    """A mode name, validated against the registry (the model knows no modes)."""
    v = n.scalar()
    if not isinstance(v, str) or v not in attachments.names():
        raise n.error(f"unknown value {show(v)} (one of: {', '.join(attachments.names())})")
    return Attachment(v)


def _unique(items: list[Node], names: list[str], what: str) -> None:
    seen: set[str] = set()
    for node, name in zip(items, names):
        if name in seen:
            raise node.error(f"duplicate {what} name {name!r}")
        seen.add(name)


def _host(n: Node, base: Path) -> HostSpec:
    m = n.mapping({"name", "uri", "transport", "ssh", "ssh_port", "known_hosts", "identity", "underlay"},
                  required=("name",))
    name = m["name"].str(NAME_RE, "host name")
    uri = _check_uri(m["uri"]) if "uri" in m else "qemu:///system"
    transport = m["transport"].str(re.compile(r"local|ssh|netns"), "transport (local|ssh|netns)") \
        if "transport" in m else ("ssh" if re.match(r"^[a-z0-9]+\+(ssh|libssh2?)://", uri) else "local")
    if transport == "netns" and not uri.startswith("qemu:///"):
        # An emulated host is a namespace on this machine; its guests run in the local libvirt.
        raise (m.get("uri") or n).error("transport netns (a host emulated on this machine) needs a local "
                                        "libvirt URI such as qemu:///system")
    if transport == "netns" and "ssh" in m:
        raise m["ssh"].error("transport netns runs on this machine; 'ssh' is for transport ssh")
    ssh = _ssh_target(m["ssh"]) if "ssh" in m else None
    if transport == "ssh" and not ssh:
        raise n.error("transport ssh needs 'ssh: user@host'")
    for key in ("ssh_port", "known_hosts", "identity"):
        if key in m and transport != "ssh":
            raise m[key].error(f"'{key}' is for transport ssh")
    if transport == "ssh" and not uri.startswith(("qemu+ssh://", "qemu+libssh2://")):
        # qemu+libssh:// (libvirt 9.0 with libssh 0.10, Debian 12) stalls for good on the
        # first large reply, a domain's XML (measured); libssh2 and the ssh binary do not.
        raise (m.get("uri") or n).error("transport ssh needs a libvirt URI over ssh: qemu+ssh://root@hostb/system, "
                                        "or qemu+libssh2://...?known_hosts=FILE (qemu+libssh:// stalls on "
                                        "large replies with Debian 12's libssh)")
    if "underlay" in m and transport == "netns":
        raise m["underlay"].error("an emulated host's underlay is the testbed's own wire")
    return HostSpec(name=name, uri=uri, transport=transport, ssh_target=ssh,
                    ssh_port=m["ssh_port"].int(1, 65535, "ssh_port") if "ssh_port" in m else 22,
                    known_hosts=_readable_file(m["known_hosts"], base) if "known_hosts" in m else None,
                    identity=_readable_file(m["identity"], base) if "identity" in m else None,
                    underlay=_ifname(m["underlay"]) if "underlay" in m else None)


def _check_uri(n: Node) -> str:
    """A libvirt URI in its plain form, whose parameters cannot turn host-key checking off
    or run a program. libvirt matches parameter names case-insensitively (No_Verify=1 is
    no_verify=1), so they are compared lower-cased here."""
    uri = n.str(URI_RE, "libvirt URI")
    scheme, _, rest = uri.partition("://")
    transport = scheme.partition("+")[2]
    if transport and transport not in URI_TRANSPORTS:
        raise n.error(f"libvirt transport {transport!r} is not allowed (one of: {', '.join(sorted(URI_TRANSPORTS))})")
    user, _, host = rest.split("/", 1)[0].rpartition("@")
    for part, what in ((user, "user"), (host, "host")):
        if part.startswith("-"):
            raise n.error(f"{what} {show(part)} begins with '-' (ssh would read it as an option)")
    hostname, colon, port = host.rpartition(":") if not host.endswith("]") else (host, "", "")
    if colon and not (port.isdigit() and 1 <= int(port) <= 65535 and hostname):
        raise n.error(f"invalid host:port {show(host)} in the libvirt URI (port 1..65535)")
    query = rest.partition("?")[2]
    for param in filter(None, query.split("&")):
        key, _, value = param.partition("=")
        key = key.lower()
        if key == "no_verify":
            # ssh transports must check the remote host key; no_verify turns that off.
            raise n.error(f"{show(param)}: no_verify is not allowed: remote SSH host keys must be checked")
        if key == "known_hosts_verify" and value.lower() != "normal":
            # 'ignore' skips the check, 'auto' accepts a new key on first use
            raise n.error(f"{show(param)}: known_hosts_verify must be 'normal': remote SSH host keys "
                          "must be checked")
        if key not in URI_PARAMS:
            raise n.error(f"URI parameter {show(key)} is not allowed (allowed: {', '.join(sorted(URI_PARAMS))})")
    return uri


def _ssh_target(n: Node) -> str:
    v = n.str()
    if v.startswith("-"):
        raise n.error(f"ssh target {show(v)} begins with '-': ssh would read it as an option")
    if not SSH_RE.fullmatch(v):
        raise n.error(f"invalid ssh target user@host {show(v)} (letters, digits, '.', '_', '-')")
    return v


#: kept for callers of the old name (yamlnode.ifname is the one implementation)
_ifname = ifname


def _file_path(n: Node, base: Path) -> Path:
    raw = n.str()
    if not raw or "\0" in raw:
        raise n.error(f"invalid path {show(raw)}")
    return (base / raw) if not os.path.isabs(raw) else Path(raw)


def _readable_file(n: Node, base: Path) -> str:
    p = _file_path(n, base)
    try:
        if not p.is_file() or not os.access(p, os.R_OK):
            raise n.error(f"not a readable file: {show(str(p))}")
        return str(p.resolve())
    except (OSError, RuntimeError) as e:     # a symlink loop, a name too long
        raise n.error(f"cannot read {show(str(p))}: {oserror(e)}") from None


def _tunnel(n: Node) -> TunnelSpec:
    m = n.mapping({"vni", "udp_port", "underlay", "underlay_mtu"})
    return TunnelSpec(
        vni=m["vni"].int(1, (1 << 24) - 1, "vni") if "vni" in m else 42,
        udp_port=m["udp_port"].int(1, 65535, "udp_port") if "udp_port" in m else 4789,
        underlay=_ifname(m["underlay"]) if "underlay" in m else None,
        underlay_mtu=m["underlay_mtu"].int(MTU_MIN + VXLAN_OVERHEAD, MTU_MAX, "underlay_mtu")
        if "underlay_mtu" in m else 1500)


def _check_tunnel(m: dict[str, Node], doc: Node, matrix: Matrix, tunnel: TunnelSpec,
                  hosts: list[HostSpec]) -> None:
    """Modes across two hosts: the inner MTU must fit the underlay with the mode's overhead
    (VXLAN's), and the underlay interface is the testbed's own wire on emulated hosts, the
    operator's on real ones. Checked here so a bad tunnel is refused before anything is created."""
    two = len({h.name for h in hosts}) > 1
    crossing = [m for m in map(attachments.get, matrix.attachments)
                if m.placement == "two" or (m.placement == "any" and two)]
    if not crossing:
        return
    mnode = m["matrix"].mapping(MATRIX_KEYS)
    mtu_nodes = mnode["mtus"].seq() if "mtus" in mnode else []
    worst = max(crossing, key=lambda mode: mode.overhead)
    oh = worst.overhead
    for i, mtu in enumerate(matrix.mtus):
        if oh and mtu + oh > tunnel.underlay_mtu:
            node = mtu_nodes[i] if mtu_nodes else m["matrix"]
            raise node.error(
                f"inner MTU {mtu} + {oh} bytes of {worst.overhead_label} = "
                f"{mtu + oh} does not fit the underlay MTU {tunnel.underlay_mtu}; raise "
                f"tunnel.underlay_mtu to at least {mtu + oh} or lower the MTU")
    tn = m.get("tunnel")
    if any(h.emulated for h in hosts) and tunnel.underlay:
        raise tn.mapping({"vni", "udp_port", "underlay", "underlay_mtu"})["underlay"].error(  # type: ignore[union-attr]
            "hosts emulated on this machine (transport netns) use the testbed's own veth wire; "
            "underlay names a real host's interface")
    if any(h.emulated for h in hosts) and not all(h.emulated for h in hosts):
        raise (m.get("hosts") or doc).error(
            "the client's and server's hosts must both be emulated (transport netns) or both real; "
            f"got {', '.join(f'{h.name}: {h.transport}' for h in hosts)}")
    for h in hosts:
        if not h.emulated and not (h.underlay or tunnel.underlay):
            raise (tn or m.get("hosts") or doc).error(
                f"host {h.name}: a mode across real hosts needs the underlay interface "
                "(tunnel.underlay, or 'underlay' on the host)")


def _image_path(n: Node, base: Path) -> str:
    p = _file_path(n, base)
    try:
        if not p.is_file():
            raise n.error(f"image not found: {show(str(p))}")
        if not os.access(p, os.R_OK):
            raise n.error(f"image not readable: {show(str(p))}")
        resolved = str(p.resolve())
    except (OSError, RuntimeError) as e:
        raise n.error(f"cannot read image {show(str(p))}: {oserror(e)}") from None
    try:
        st = os.stat(resolved)
        key = (resolved, st.st_ino, st.st_size, st.st_mtime_ns)
    except OSError:
        key = None
    # one qemu-img per image file and parse: a topology that names one image for many
    # guests (or aliases one guest a thousand times) is read once, not once per guest
    seen = _QCOW2_SEEN.get(None)
    if key is None or seen is None or key not in seen:
        _check_qcow2(n, resolved)
        if key is not None and seen is not None:
            seen.add(key)
    return resolved


#: profiles a matrix may expand to (each of a profile's ``rates`` is one)
MAX_PROFILES = 4096
#: images found to be standalone qcow2 during the current parse (reset per parse)
_QCOW2_SEEN: contextvars.ContextVar[set] = contextvars.ContextVar("qcow2_seen")


def _check_qcow2(n: Node, path: str) -> None:
    """The image is a standalone qcow2, as qemu-img reads it (reading only: -U takes no lock,
    nothing is created). A text file is 'raw' to QEMU and would boot nothing; a backing file
    would let the image name any file on the host as the guest's disk."""
    from testbed.host import proc
    try:
        out = proc.run(["qemu-img", "info", "-U", "--output=json", "--", path], timeout=60).stdout
    except CommandError as e:
        if e.rc == 127:
            raise CapabilityError(f"{n.file}: {n.path}: qemu-img is needed to check the image "
                                  "(install qemu-utils)") from None
        raise n.error(f"qemu-img cannot read the image {show(path)}: {one_line(e.stderr_tail)}") from None
    try:
        info = json.loads(out)
        fmt, backing = info.get("format"), info.get("backing-filename")
        # qcow2's external data file (data_file=...) names another host file the same way
        data_file = ((info.get("format-specific") or {}).get("data") or {}).get("data-file")
    except (ValueError, AttributeError):
        raise n.error(f"qemu-img info printed no JSON for {show(path)}") from None
    if fmt != "qcow2":
        raise n.error(f"not a qcow2 image: qemu-img reads {show(path)} as {show(fmt)}")
    if backing or data_file:
        raise n.error(f"the image has a {'backing' if backing else 'data'} file {show(backing or data_file)}; "
                      "give a standalone qcow2 (qemu-img convert -O qcow2)")


def _guest(n: Node, hosts: dict[str, HostSpec], base: Path) -> GuestSpec:
    m = n.mapping({"name", "host", "memory_mib", "vcpus", "image", "placement"}, required=("name",))
    name = m["name"].str(NAME_RE, "guest name (lowercase letters, digits, '-', at most 10)")
    if "host" in m:
        host = m["host"].str(NAME_RE, "host name")
        if host not in hosts:
            raise m["host"].error(f"no host named {host!r}")
    else:
        host = next(iter(hosts))
    vcpus = m["vcpus"].int(1, 64, "vcpus") if "vcpus" in m else 1
    return GuestSpec(name=name, host=host,
                     memory_mib=m["memory_mib"].int(256, 1 << 20, "memory_mib") if "memory_mib" in m else 1024,
                     vcpus=vcpus,
                     image=_image_path(m["image"], base) if "image" in m else None,
                     **({"placement": guest_placement(m["placement"], vcpus, hosts[host])}
                        if "placement" in m else {}))


def _profile(n: Node) -> Profile:
    m = n.mapping(PROFILE_KEYS, required=("name",))
    p = Profile(
        name=m["name"].str(PROFILE_NAME_RE, "profile name (lowercase, digits, '_')"),
        tool=_tool(m["tool"]) if "tool" in m else Profile.tool,
        protocol=m["protocol"].enum(Protocol) if "protocol" in m else Protocol.TCP,
        pattern=m["pattern"].enum(Pattern) if "pattern" in m else Pattern.STREAM,
        message_size=m["message_size"].int(1, 1 << 20, "message_size") if "message_size" in m else None,
        response_size=m["response_size"].int(1, 1 << 20, "response_size") if "response_size" in m else None,
        duration_s=m["duration"].int(1, 3600, "duration") if "duration" in m else 10,
        rate_bps=m["rate_bps"].int(1, 10**12, "rate_bps") if "rate_bps" in m else None,
        confidence=_pair(m["confidence"], (50, 99), (1, 50)) if "confidence" in m else None,
        iterations=_pair(m["iterations"], (1, 30), (1, 30)) if "iterations" in m else None,
    )
    if "rate" in m:
        p = _rate(m, p)
    p = _kind(n, m, p)
    for opt in ("confidence", "iterations"):
        if getattr(p, opt) and opt not in tools.get_tool(p.tool).options:
            have = [d.name.value for d in tools.drivers() if opt in d.options]
            raise m[opt].error(f"{opt} is not a {p.tool.value} option (it is {' and '.join(have) or 'no tool'}'s)")
    if p.iterations and p.iterations[0] < p.iterations[1]:
        raise m["iterations"].error(f"max {p.iterations[0]} is below min {p.iterations[1]}")
    _check_tool(n, m, p)
    if "hops" in m and m["hops"].bool():
        if not p.pattern.is_transactional or p.search is not None:
            raise m["hops"].error("per-hop latency is traced for request/response profiles only "
                                  "(pattern rr or crr)")
        p = dataclasses.replace(p, hops=True)
    return p


def _tool(n: Node) -> Tool:
    """A tool name, validated against the tool registry (the model knows no tools)."""
    v = n.scalar()
    if not isinstance(v, str) or v not in tools.names():
        raise n.error(f"unknown value {show(v)} (one of: {', '.join(tools.names())})")
    return Tool(v)


def _kind(n: Node, m: dict[str, Node], p: Profile) -> Profile:
    """``kind: udp_ndr``: a loss-bounded rate search over a UDP stream (testbed.measure.ratesearch),
    its parameters under ``search``; the default kind measures at a given rate or flat out."""
    kind = m["kind"].str(re.compile(r"measure|udp_ndr"), "kind (measure or udp_ndr)") if "kind" in m else "measure"
    if kind != "udp_ndr":
        if "search" in m:
            raise m["search"].error("search is for profiles of kind udp_ndr")
        return p
    node = m["kind"]
    if "protocol" in m and p.protocol is not Protocol.UDP:
        raise m["protocol"].error("kind udp_ndr searches a UDP rate: protocol must be udp")
    if "pattern" in m and p.pattern is not Pattern.STREAM:
        raise m["pattern"].error("kind udp_ndr searches a stream's rate: pattern must be stream")
    for k in ("rate", "rate_bps", "confidence", "iterations", "duration"):
        if k in m:
            raise m[k].error(f"kind udp_ndr chooses its own rates and trial durations (see search); "
                             f"{k} does not apply")
    tool = p.tool if "tool" in m else Tool(tools.search_default())
    why = tools.get_tool(tool).search_unsupported
    if why:
        raise (m.get("tool") or node).error(f"kind udp_ndr cannot drive {tool.value}: {why}")
    s = _search(m["search"]) if "search" in m else RateSearch()
    return dataclasses.replace(p, tool=tool, protocol=Protocol.UDP, pattern=Pattern.STREAM,
                               duration_s=s.trial_s[1], search=s)


def _search(n: Node) -> RateSearch:
    m = n.mapping({"pdr_loss", "trial", "precision", "max_search", "min_rate", "max_rate",
                   "exceed_ratio", "duration_sum"})
    d = RateSearch()

    def rate(k: str, default: int) -> int:
        if k not in m:
            return default
        try:
            r = pacing.parse_rate(m[k].scalar())
        except ValueError as e:
            raise m[k].error(str(e)) from None
        if r.bps is None:
            raise m[k].error(f"{k} is a bit rate (e.g. 100mbit), not {r.text}")
        return r.bps
    trial = _pair(m["trial"], (1, 600), (1, 600)) if "trial" in m else d.trial_s
    if trial[1] < trial[0]:
        raise m["trial"].error(f"the final trial ({trial[1]} s) is shorter than the first ({trial[0]} s)")
    lo, hi = rate("min_rate", d.min_rate_bps), rate("max_rate", d.max_rate_bps)
    if lo >= hi:
        raise (m.get("min_rate") or m.get("max_rate") or n).error(
            f"min_rate ({lo} bit/s) must lie below max_rate ({hi} bit/s)")
    dsum = m["duration_sum"].int(1, 3600, "duration_sum") if "duration_sum" in m else None
    if dsum is not None and dsum < trial[1]:
        raise m["duration_sum"].error(f"duration_sum {dsum} s is shorter than the final trial ({trial[1]} s)")
    return RateSearch(
        pdr_loss=m["pdr_loss"].float(1e-9, 0.5) if "pdr_loss" in m else d.pdr_loss,
        trial_s=trial,
        precision=m["precision"].float(0.001, 0.5) if "precision" in m else d.precision,
        max_search_s=m["max_search"].int(10, 86400, "max_search") if "max_search" in m else d.max_search_s,
        min_rate_bps=lo, max_rate_bps=hi,
        exceed_ratio=m["exceed_ratio"].float(0.0, 0.9) if "exceed_ratio" in m else d.exceed_ratio,
        duration_sum_s=dsum)


def _with_rates(n: Node, p: Profile) -> list[Profile]:
    """``rates: [1000tps, 4000tps, 8000tps]``: the profile at each paced load, named
    ``<name>_<rate>`` (tcp_rr_4000tps), for a latency-against-load curve per cell (the report
    joins them by that name). Without ``rates``: the profile itself."""
    m = n.mapping(PROFILE_KEYS)
    if "rates" not in m:
        return [p]
    node = m["rates"]
    for k in ("rate", "rate_bps", "kind"):
        if k in m:
            raise m[k].error(f"give either rates or {k}, not both")
    out: list[Profile] = []
    items = node.seq(2)
    fractions = [i for i in items if isinstance(i.scalar(), str) and str(i.scalar()).strip().endswith("max")]
    if fractions:
        if not p.pattern.is_transactional:
            raise fractions[0].error("fractions of the measured maximum pace request/response only; "
                                     "give a stream bit rates (e.g. 1gbit)")
        out.append(p)                       # the maximum the fractions are of, measured first
    for item in items:
        if item in fractions:
            m = re.fullmatch(r"(0(?:\.\d{1,3})?|1(?:\.0+)?)max", str(item.scalar()).strip())
            f = float(m.group(1)) if m else 0.0
            if not 0 < f <= 1:
                raise item.error(f"{show(item.scalar())}: a fraction of the maximum lies in 0.001max..1max")
            text = f"{f:g}max"
            one = dataclasses.replace(p, rate=text, rate_fraction=f, rate_of=p.name)
        else:
            one = _rate({"rate": item}, p)
        name = f"{p.name}_{one.rate}".replace(".", "_")
        if not PROFILE_NAME_RE.fullmatch(name):
            raise item.error(f"profile name {name!r} (name_rate) longer than 24 characters: shorten the name")
        if name in (q.name for q in out):
            raise item.error(f"rate {one.rate} given twice")
        out.append(dataclasses.replace(one, name=name))
    return out


def _percentiles(n: Node) -> tuple[float, ...]:
    """``percentiles: [50, 90, 99, 99.9, 99.99]``: percent, each in 1..99.999 with at most
    three decimals (a metric name holds them: latency_p99_99_us), no repeats."""
    items = n.seq(1)
    out: list[float] = []
    for item in items:
        v = item.float(1, 99.999)
        if round(v, 3) != v:
            raise item.error(f"{v:g}: a percentile has at most three decimals")
        if v in out:
            raise item.error(f"percentile {v:g} given twice")
        out.append(v)
    return tuple(sorted(out))


def _rate(m: dict[str, Node], p: Profile) -> Profile:
    """`rate: 2gbit` / `rate: 5000tps`: a paced target per pair (testbed.tools.pacing); a bit rate
    is the profile's rate_bps, the one figure iperf3's -b already took for UDP."""
    node = m["rate"]
    if "rate_bps" in m:
        raise node.error("give either rate or rate_bps, not both")
    try:
        r = pacing.parse_rate(node.scalar())
    except ValueError as e:
        raise node.error(str(e)) from None
    why = pacing.express_reason(tools.get_tool(p.tool), p.protocol, p.pattern, r)
    if why:
        raise node.error(f"{p.tool.value} cannot pace {p.protocol.value} {p.pattern.value} at {r.text}: {why}")
    return dataclasses.replace(p, rate=r.text, rate_bps=r.bps, rate_tps=r.tps)


def _check_tool(n: Node, m: dict[str, Node], p: Profile) -> None:
    """Each tool driver says what it can run (ToolDriver.unsupported_reason); asked here so a
    profile no tool can run is bad input, refused with the field, before anything is created."""
    from testbed.tools import get_tool
    reason = get_tool(p.tool).unsupported_reason(p)
    if not reason:
        return
    # Name the field that makes the difference: the rate if the profile runs without it, a
    # size the reason names (sockperf's header and largest message), else the pattern,
    # protocol or tool the user wrote.
    named = sorted((reason.find(k), k) for k in ("message_size", "response_size") if k in m and k in reason)
    sized = m[named[0][1]] if named else None
    if p.rate_bps is not None and not get_tool(p.tool).unsupported_reason(
            dataclasses.replace(p, rate_bps=None, rate_tps=None, rate=None)):
        field = m.get("rate_bps") or m["rate"]
    elif sized is not None:
        field = sized
    else:
        field = m.get("pattern") or m.get("protocol") or m.get("tool") or n
    raise field.error(f"{p.tool.value} cannot run {p.protocol.value} {p.pattern.value}"
                      f"{' at a bit rate' if field in (m.get('rate_bps'), m.get('rate')) else ''}: {reason}")


def _pair(n: Node, first: tuple[int, int], second: tuple[int, int]) -> tuple[int, int]:
    items = n.seq(2)
    if len(items) != 2:
        raise n.error("expected two numbers, e.g. [99, 5]")
    return items[0].int(*first), items[1].int(*second)


#: `repetitions: gate`: enough samples for `testbed compare` to carry a verdict (it needs 5
#: ok samples a side), more when the spread stays above 3 %
GATE_REPETITIONS = Repetitions(warmup=1, min_samples=5, max_samples=10, rsd_target=0.03)


def not_gateable(t: Topology) -> str | None:
    """Why a topology's runs cannot pass a `testbed compare` gate, or None."""
    r, need = t.matrix.repetitions, stats_min_samples()
    if r.max_samples < need:
        return (f"{t.source}: at most {r.max_samples} sample(s) per cell; `testbed compare` "
                f"needs {need} a side for a verdict. Use `repetitions: gate` (warm-up 1, "
                f"min 5, max 10, rsd target 0.03) for a nightly gate.")
    return None


def stats_min_samples() -> int:
    from testbed.analysis.stats import MIN_SAMPLES
    return MIN_SAMPLES


def _repetitions(n: Node) -> Repetitions:
    if isinstance(n.node, yaml.ScalarNode):
        if n.node.value != "gate":
            raise n.error("expected a mapping {warmup, min, max, rsd_target} or the preset 'gate'")
        return GATE_REPETITIONS
    m = n.mapping({"warmup", "min", "max", "rsd_target"})
    r = Repetitions(warmup=m["warmup"].int(0, 100, "warmup") if "warmup" in m else 0,
                    min_samples=m["min"].int(1, 1000, "min") if "min" in m else 1,
                    max_samples=m["max"].int(1, 1000, "max") if "max" in m else 1,
                    rsd_target=m["rsd_target"].float(0, 1) if "rsd_target" in m else 0.05)
    if r.max_samples < r.min_samples:
        raise (m.get("max") or n).error(f"max ({r.max_samples}) is below min ({r.min_samples})")
    return r


def _distinct(m: dict[str, Node], key: str, read, default: tuple) -> tuple:
    """A matrix axis: its values, each once (a repeated value would plan the same cell twice,
    with the same cell id; YAML aliases make that cheap to write a million times)."""
    if key not in m:
        return default
    items = m[key].seq(1)
    values = tuple(read(x) for x in items)
    seen: set = set()
    for node, v in zip(items, values):
        if v in seen:
            raise node.error(f"duplicate value {show(getattr(v, 'value', v))} (each cell would run twice "
                             "under one cell id)")
        seen.add(v)
    return values


#: virtio-net ring sizes QEMU accepts (powers of two, 256..1024)
RING_SIZES = (256, 512, 1024)


def _emulator(n: Node) -> str:
    """An emulator path that exists and answers `--version` as QEMU: tried here, so an
    unusable variant is bad input before anything is created."""
    from testbed.errors import CommandError
    from testbed.host import proc
    path = n.str()
    if not os.path.isabs(path):
        raise n.error(f"emulator must be an absolute path, got {show(path)}")
    if "\0" in path or not os.path.isfile(path) or not os.access(path, os.X_OK):
        raise n.error(f"emulator {show(path)} does not exist or is not executable")
    try:
        out = proc.run([path, "--version"], timeout=20)
    except CommandError as e:
        raise n.error(f"emulator {show(path)} --version failed: {one_line(str(e))}") from None
    if not out.stdout.startswith("QEMU emulator version"):
        raise n.error(f"emulator {show(path)} is not a QEMU (its --version says "
                      f"{show((out.stdout.splitlines() or [''])[0][:60])})")
    return path


def _machine(n: Node, emulator: str | None) -> str:
    """A machine type the emulator lists in `-machine help` (tried, not assumed)."""
    from testbed.errors import CommandError
    from testbed.host import proc
    name = n.str(re.compile(r"^[a-z0-9][a-z0-9.-]{0,40}$"), "machine type")
    binary = emulator or "/usr/bin/qemu-system-x86_64"
    try:
        listed = proc.run([binary, "-machine", "help"], timeout=20).stdout
    except CommandError:
        return name     # no QEMU here: the run's preflight says so (exit 3)
    known = {line.split()[0] for line in listed.splitlines()[1:] if line.strip()}
    if name not in known:
        raise n.error(f"machine type {name!r} not offered by {show(binary)}")
    return name


def _variant(n: Node, base: Path) -> Variant:
    m = n.mapping({"name", "emulator", "machine", "image", "nic"}, required=("name",))
    emulator = _emulator(m["emulator"]) if "emulator" in m else None
    nic: dict[str, str] = {}
    if "nic" in m:
        opts = m["nic"].mapping({"queues", "rx_queue_size", "tx_queue_size", "event_idx"})
        for k, v in opts.items():
            if k == "queues":
                nic[k] = str(v.int(1, MAX_QUEUES, "queues"))
            elif k == "event_idx":
                nic[k] = "on" if v.bool() else "off"
            else:
                size = v.int(1, 1024, k)
                if size not in RING_SIZES:
                    raise v.error(f"{k} must be one of {', '.join(map(str, RING_SIZES))}")
                nic[k] = str(size)
    v = Variant(name=m["name"].str(NAME_RE, "variant name"), emulator=emulator,
                machine=_machine(m["machine"], emulator) if "machine" in m else None,
                image=_image_path(m["image"], base) if "image" in m else None,
                nic=tuple(sorted(nic.items())))
    if len(v.name) > 4:
        raise m["name"].error(f"variant name {v.name!r} longer than 4 characters (it goes "
                              f"into guest and cell names)")
    return v


def _matrix(n: Node, base: Path | None = None) -> Matrix:
    m = n.mapping(MATRIX_KEYS, required=("profiles",))
    profiles_nodes = m["profiles"].seq(1)
    # counted before they are made: aliases of one profile with many rates would make
    # millions of them before the duplicate names were seen
    count = 0
    for node in profiles_nodes:
        rates = None
        if isinstance(node.node, yaml.MappingNode):
            rates = next((v for k, v in node.node.value if getattr(k, "value", None) == "rates"), None)
        count += len(rates.value) + 1 if isinstance(rates, yaml.SequenceNode) else 1
        if count > MAX_PROFILES:
            raise m["profiles"].error(f"expands to more than {MAX_PROFILES} profiles (each rate a profile of its own)")
    expanded = [(node, p) for node in profiles_nodes for p in _with_rates(node, _profile(node))]
    profiles_nodes = [node for node, _ in expanded]
    profiles = tuple(p for _, p in expanded)
    if "percentiles" in m:
        chosen = _percentiles(m["percentiles"])
        profiles = tuple(dataclasses.replace(p, percentiles=chosen) for p in profiles)
    _unique(profiles_nodes, [p.name for p in profiles], "profile")
    mx = Matrix(
        attachments=_distinct(m, "attachments", _attachment, (Attachment("bridge"),)),
        backends=_distinct(m, "backends", lambda b: b.enum(Backend), (Backend.QEMU,)),
        mtus=_distinct(m, "mtus", lambda x: x.int(MTU_MIN, MTU_MAX, "MTU"), (1500,)),
        connections=_distinct(m, "connections", lambda x: x.int(1, MAX_CONNECTIONS, "connections"), (1,)),
        profiles=profiles,
        repetitions=_repetitions(m["repetitions"]) if "repetitions" in m else Repetitions(),
        randomize=m["randomize"].bool() if "randomize" in m else False,
        seed=m["seed"].int(0, 2**31, "seed") if "seed" in m else 0,
        queues=_distinct(m, "queues", lambda x: x.int(1, MAX_QUEUES, "queues"), (1,)),
        variants=_variants(m["variants"], base or Path.cwd()) if "variants" in m else (),
        pairs=_distinct(m, "pairs", lambda x: x.int(1, MAX_PAIRS, "pairs"), (1,)),
    )
    for node, p in zip(profiles_nodes, mx.profiles):
        # a paced target is split among a pair's connections, each sending a whole number a
        # second: one that cannot be split offers another load than the one asked for
        for c in mx.connections if p.rate_tps else ():
            each = pacing.per_stream(p.rate_tps, c)
            if abs(each * c - p.rate_tps) > pacing.SHORTFALL * p.rate_tps:
                raise node.error(f"rate {p.rate or p.rate_tps}: split across {c} connections, each would send "
                                 f"{each}/s, {each * c}/s in all; give a rate of at least "
                                 f"{math.ceil(c / pacing.SHORTFALL)}tps or a multiple of {c}")
    if "pairs" in m and mx.variants:
        raise m["pairs"].error("pairs and variants cannot be combined (each variant boots its own guest pair)")
    if mx.variants and any(not attachments.get(a).variants for a in mx.attachments):
        able = [mode.name for mode in attachments.modes() if mode.variants]
        raise m["variants"].error(f"variants run on the {' and '.join(able)} attachments only (their "
                                  "guest pairs share one segment)")
    return mx


def _variants(n: Node, base: Path) -> tuple[Variant, ...]:
    nodes = n.seq(2)
    if len(nodes) > 4:
        raise n.error("at most 4 variants (each boots its own guest pair)")
    out = tuple(_variant(x, base) for x in nodes)
    _unique(nodes, [v.name for v in out], "variant")
    return out


def cell_count(matrix: Matrix) -> int:
    """How many cells runner.plan makes, without making them: namespace attachments have no
    virtio NIC and are planned once, not per backend and queue count."""
    per = len(matrix.mtus) * len(matrix.connections) * len(matrix.profiles) * len(matrix.pairs)
    return sum(per * (1 if not attachments.get(a).guests else len(matrix.backends) * len(matrix.queues)) for a in matrix.attachments)


def _check_limits(m: dict[str, Node], doc: Node, matrix: Matrix) -> None:
    """Refuse an absurd matrix: more cells, or more measuring time at worst (every cell
    running warmup + max samples of its profile's duration), than the caps. `limits` raises
    the caps, up to hard ceilings."""
    lm = m["limits"].mapping({"max_cells", "max_hours"}) if "limits" in m else {}
    max_cells = lm["max_cells"].int(1, HARD_MAX_CELLS, "max_cells") if "max_cells" in lm else DEFAULT_MAX_CELLS
    max_hours = lm["max_hours"].int(1, HARD_MAX_HOURS, "max_hours") if "max_hours" in lm else DEFAULT_MAX_HOURS
    cells = cell_count(matrix)
    node = m["matrix"]
    if cells > max_cells:
        raise node.error(f"{cells} cells exceed the cap of {max_cells}; trim the matrix or raise "
                         f"limits.max_cells (at most {HARD_MAX_CELLS})")
    per_cell_samples = matrix.repetitions.warmup + matrix.repetitions.max_samples
    per = len(matrix.mtus) * len(matrix.connections) * len(matrix.pairs)
    # netperf's own confidence loop (-i max,min) runs up to max iterations per sample
    by_profile = sum(p.search.max_search_s if p.search else p.duration_s * (p.iterations[0] if p.iterations else 1)
                     for p in matrix.profiles)
    groups = sum(1 if not attachments.get(a).guests else len(matrix.backends) * len(matrix.queues) for a in matrix.attachments)
    seconds = groups * per * by_profile * per_cell_samples
    if seconds > max_hours * 3600:
        raise node.error(f"the matrix may measure for up to {seconds / 3600:.1f} h ({cells} cells x up to "
                         f"{per_cell_samples} samples), over the cap of {max_hours} h; trim it or raise "
                         f"limits.max_hours (at most {HARD_MAX_HOURS})")


#: what one QEMU process may cost beyond its guest's memory, for the `pairs` memory check.
#: A guest can touch all of memory_mib, so that counts in full (an idle 1024 MiB TCG guest
#: restored from its snapshot measured 300-325 MiB RSS here, far below it), plus 256 MiB for
#: QEMU's own heap, TCG translation cache and I/O buffers.
QEMU_OVERHEAD_MIB = 256
#: host memory kept back for the host itself: the larger of 2 GiB and 10 % of MemTotal
HOST_RESERVE_MIB, HOST_RESERVE_FRACTION = 2048, 0.10
MAX_PAIRS = 64


def host_memory_mib() -> int | None:
    """This host's MemTotal in MiB (None when /proc/meminfo cannot be read)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _check_pairs(node: Node, matrix: Matrix, pair: list[GuestSpec], hosts: dict[str, HostSpec],
                 subnet: str, names: list[str]) -> None:
    """`pairs`: N client/server pairs at once. Refused before anything is created when:
    - the subnet cannot hold 2N endpoints (network+1 .. +2N);
    - a guest's host is a real ssh host: its memory and the guests already there are not
      known before the run, so the placement of N pairs cannot be promised; and a two-host
      attachment (ovs-vxlan, bridge-vxlan, macvtap across hosts): its plumbing joins one
      client/server pair today (the N-pair fabric across hosts was never run, so it is refused);
    - this host cannot hold the 2N guests: 2N x (memory_mib + QEMU_OVERHEAD_MIB) above
      MemTotal less the reserve (max(2 GiB, 10 %)).
    The clones' names (<name>-p<k>) must not collide with the topology's other guests."""
    n = max(matrix.pairs)
    net = ipaddress.IPv4Network(subnet)
    if net.num_addresses - 2 < 2 * n:
        raise node.error(f"{n} pairs need {2 * n} addresses in the subnet, {subnet} has {net.num_addresses - 2}")
    vm = [a for a in matrix.attachments if attachments.get(a).guests]
    if not vm:
        return
    placed = {g.host for g in pair}
    remote = sorted(h for h in placed if hosts[h].remote)
    if remote:
        raise node.error(f"{n} pairs with guests on ssh host {', '.join(remote)}: that host's memory and "
                         f"guest count are unknown before the run, so the placement cannot be promised "
                         f"(pairs > 1 runs on this host and on emulated hosts)")
    across = [a.value for a in vm if attachments.get(a).placement == "two" or len(placed) > 1]
    if across:
        raise node.error(f"{n} pairs on {', '.join(across)}: a two-host attachment joins one client/server "
                         f"pair (N pairs across hosts are not placed yet); use pairs on a one-host attachment")
    for g in pair:
        for k in range(1, n):
            clone = clone_name(g.name, k)
            if clone in names:
                raise node.error(f"pair {k + 1}'s guest name {clone} (derived from {g.name}) is taken by "
                                 f"another guest of the topology")
    total = host_memory_mib()
    if total is None:
        return
    avail = total - max(HOST_RESERVE_MIB, int(total * HOST_RESERVE_FRACTION))
    per_pair = sum(g.memory_mib + QEMU_OVERHEAD_MIB for g in pair)
    if per_pair * n > avail:
        fits = avail // per_pair
        raise node.error(f"{n} pairs need {per_pair * n} MiB ({2 * n} guests x (memory_mib + {QEMU_OVERHEAD_MIB} "
                         f"MiB QEMU overhead)) but this host has {avail} MiB (MemTotal {total} MiB less the "
                         f"reserve): at most {fits} pairs fit")


def _offloads(n: Node) -> Offloads:
    """`offloads: off` (or on) for all of tx, tso, gso, gro, lro, or a mapping of some."""
    if isinstance(n.node, yaml.ScalarNode):
        return Offloads.all(n.bool())
    m = n.mapping({"tx", "tso", "gso", "gro", "lro"})
    return Offloads(**{k: v.bool() for k, v in m.items()})


def _node_at(m: dict[str, Node], path: str) -> Node:
    """The node of a dotted field path (``macvtap.lower``) in an already-read document."""
    first, *rest = path.split(".")
    node = m[first]
    for key in rest:
        node = next(node.child(v, key) for k, v in node.node.value if getattr(k, "value", None) == key)
    return node


def parse(text: str, file: str = "<string>", base: Path | None = None) -> Topology:
    root = compose(text, file)
    token = _QCOW2_SEEN.set(set())
    try:
        return _parse(root, file, base)
    except RecursionError:
        raise ConfigError(file, "(top level)", "nested too deeply") from None
    finally:
        _QCOW2_SEEN.reset(token)


def _parse(root: yaml.Node, file: str, base: Path | None) -> Topology:
    doc = Node(file, root, "")
    if base is None:
        try:
            base = Path(file).resolve().parent
        except (OSError, RuntimeError):
            base = Path.cwd()
    # Each mode owns its own top-level fields (macvtap's `macvtap:` block, ...).
    mode_fields = {k: parse for mode in attachments.modes() for k, parse in mode.fields.items()}
    m = doc.mapping({"name", "accelerator", "subnet", "hosts", "guests", "client", "server", "matrix",
                     "ready_timeout", "offloads", "tunnel", "limits", "placement", "noise", "hops",
                     *mode_fields},
                    required=("matrix",))
    host_nodes = m["hosts"].seq(1) if "hosts" in m else []
    hosts = tuple(_host(h, base) for h in host_nodes) or (HostSpec(name="local"),)
    _unique(host_nodes, [h.name for h in hosts], "host")
    host_map = {h.name: h for h in hosts}
    matrix = _matrix(m["matrix"], base)
    _check_limits(m, doc, matrix)
    vm_modes = any(attachments.get(a).guests for a in matrix.attachments)
    if "guests" not in m and vm_modes:
        raise doc.error("missing required key 'guests' (only netns-* attachments run without guests)")
    guest_nodes = m["guests"].seq(2) if "guests" in m else []
    guests = tuple(_guest(g, host_map, base) for g in guest_nodes) or (
        GuestSpec("ns-a", hosts[0].name), GuestSpec("ns-b", hosts[0].name))
    _unique(guest_nodes, [g.name for g in guests], "guest")
    names = [g.name for g in guests]
    client = m["client"].str(NAME_RE, "guest name") if "client" in m else names[0]
    server = m["server"].str(NAME_RE, "guest name") if "server" in m else names[1]
    for key, val in (("client", client), ("server", server)):
        if val not in names:
            raise (m.get(key) or doc).error(f"no guest named {val!r}")
    if client == server:
        raise (m.get("server") or doc).error("client and server must be different guests")
    subnet = "198.18.0.0/24"
    if "subnet" in m:
        raw = m["subnet"].str()
        try:
            net = ipaddress.IPv4Network(raw)
        except ValueError as e:
            raise m["subnet"].error(f"not an IPv4 network: {show(raw)} ({one_line(str(e), 100)})") from None
        if not net.subnet_of(BENCHMARK_NET):
            raise m["subnet"].error(f"{raw} is outside 198.18.0.0/15, the range set aside for benchmarking")
        if net.prefixlen > SUBNET_MAX_PREFIX:
            raise m["subnet"].error(f"{raw} is too small: the runner places {SUBNET_ENDPOINTS} endpoints at "
                                    f"network+1..+{SUBNET_ENDPOINTS}, which needs a /{SUBNET_MAX_PREFIX} or larger")
        subnet = str(net)
    placed = {g.host for g in guests if g.name in (client, server)}
    mnode = m["matrix"].mapping(MATRIX_KEYS)

    def at(i: int) -> Node:
        # the attachment's own item, or matrix itself when the default [bridge] applies
        return mnode["attachments"].seq()[i] if "attachments" in mnode else m["matrix"]

    for i, a in enumerate(matrix.attachments):
        mode = attachments.get(a)
        if mode.placement == "two" and len(placed) < 2:
            node = at(i)
            raise node.error(f"attachment {a.value} needs the client and server on two different hosts")
        if mode.placement == "one" and len(placed) > 1:
            # A bridge without an uplink joins guests of one host only; across hosts the
            # VXLAN modes are the ones that say how the hosts are joined.
            node = at(i)
            instead = f" (use {mode.across_instead})" if mode.across_instead else ""
            raise node.error(f"attachment {a.value} joins guests on one host, but the client and server "
                             f"are on {' and '.join(sorted(placed))}{instead}")
    tunnel = _tunnel(m["tunnel"]) if "tunnel" in m else TunnelSpec()
    _check_tunnel(m, doc, matrix, tunnel, [host_map[t.host] for t in guests if t.name in (client, server)])
    name = m["name"].str(re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}"), "topology name") if "name" in m \
        else _stem(file)
    accel = m["accelerator"].str(re.compile(r"auto|kvm|tcg"), "accelerator (auto|kvm|tcg)") \
        if "accelerator" in m else "auto"
    ready = m["ready_timeout"].int(5, 7200, "ready_timeout") if "ready_timeout" in m else 600
    own = {k: parse(m[k]) for k, parse in mode_fields.items() if k in m}
    off = _offloads(m["offloads"]) if "offloads" in m else None
    harness, overlap, endpoint_pins, switch = host_placement(m["placement"]) if "placement" in m \
        else ((), False, None, ())
    if endpoint_pins is not None and not any(attachments.get(a).netns_kind for a in matrix.attachments):
        raise m["placement"].mapping(HOST_KEYS)["endpoints"].error(
            "pins the tools of namespace endpoints, and no attachment in the matrix has them (a guest's "
            "tools run on its vCPUs: pin those with guests[].placement)")
    t = Topology(name=name, source=file, hosts=hosts, guests=guests, client=client, server=server,
                 matrix=matrix, accelerator=accel, subnet=subnet, ready_timeout_s=ready,
                 offloads=off, tunnel=tunnel, harness_cpus=harness, endpoint_pins=endpoint_pins, switch_cpus=switch,
                 allow_overlap=overlap,
                 **({"noise": noise(m["noise"])} if "noise" in m else {}),
                 **({"hops": hop_spec(m["hops"], matrix)} if "hops" in m else {}), **own)
    hop_profiles(mnode, matrix)
    check_placements(t, m.get("placement"), guest_nodes, mnode.get("pairs"))
    if max(matrix.pairs) > 1:
        _check_pairs(mnode["pairs"], matrix, [g for g in guests if g.name in (client, server)],
                     host_map, subnet, names)
    for a in matrix.attachments:
        attachments.get(a).validate(t, lambda path: _node_at(m, path))
    return t


def _stem(file: str) -> str:
    """The default topology name: the file's stem held to the name alphabet (it goes into
    results and reports)."""
    stem = re.sub(r"[^A-Za-z0-9._-]", "-", Path(file).stem).lstrip(".-")[:64]
    return stem or "topology"


def load(path: str | os.PathLike) -> Topology:
    """Read and parse a topology file. Anything the file system says (no such file, a
    directory, a symlink loop, a FIFO, a huge file, bytes that are not UTF-8) is one
    ConfigError naming the file."""
    p = Path(path)
    file = str(p)
    text = read_text(p, what="topology")
    try:
        base = p.resolve().parent
    except (OSError, RuntimeError) as e:
        # a symlink loop (ELOOP), a name too long
        raise ConfigError(file, "(file)", f"cannot read: {oserror(e) if isinstance(e, OSError) else e}") from None
    return parse(text, file, base)


DEFAULT_TOPOLOGY = """\
# The built-in default: two guests on this host, every single-host attachment mode it supports.
name: default
guests:
  - {name: g1}
  - {name: g2}
matrix:
  attachments: [{attachments}]
  backends: [qemu]
  mtus: [1500]
  connections: [1]
  profiles:
    - {name: tcp_stream, tool: netperf, protocol: tcp, pattern: stream, message_size: 16384, duration: 10}
    - {name: tcp_rr, tool: netperf, protocol: tcp, pattern: rr, message_size: 1, response_size: 1, duration: 10}
  repetitions: {warmup: 0, min: 1, max: 1}
"""


def default(attachments: Iterable[Attachment] = (Attachment("bridge"),)) -> Topology:
    text = DEFAULT_TOPOLOGY.replace("{attachments}", ", ".join(a.value for a in attachments))
    return parse(text, "<builtin default>", Path.cwd())
