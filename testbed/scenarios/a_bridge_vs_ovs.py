"""Study A, Linux bridge vs OVS with VLANs and bonds: nuttcp UDP at a constant target rate,
loss per one-second interval, sender and receiver CPU.

Two namespaces are the two servers ("tested" ha, "peer" hb), cabled by two veth pairs that
are the bond members. The peer runs an LACP bond with layer3+4 hashing, the same for every
configuration: an OVS balance-tcp bond on its own private switch (with the access port
tagged when the configuration tags), because that needs no kernel bonding or 802.1Q driver
and so runs wherever OVS does. On the tested side:

  1 Linux bond, no bridge        2 bond + VLAN sub-interface   3 Linux bridge + veth + bond
  4 Linux bridge + VLAN          5 OVS bridge + Linux bond     6 OVS LACP bond (balance-tcp)
  7 OVS bond + VLAN tag on the access port

OVS is a private ovs-vswitchd in each namespace (ovsd.private), so its bonds touch nothing
else. A kernel without the bonding or 802.1Q driver cannot build the Linux configurations:
they are failed cells that say so (found by trying), and the findings that need them are
"not measurable here".
The jumbo path is checked first with ``ping -M do -s 8000``; a configuration whose path
fails is a failed cell with the ping output, not a measurement.
"""
from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum

from testbed.errors import CapabilityError, CommandError, TestbedError
from testbed.host import proc
from testbed.host.executor import Netns
from testbed.host.net import ops, ovsd
from testbed.host.offloads import apply_offloads
from testbed.records import results
from testbed.records.records import Environment, as_environment, as_outcome
from testbed.scenarios import session as ses
from testbed.scenarios.study import Finding, StudyReport, Table, env_difference, fmt, ratio_verdict
from testbed.tools import nuttcp
from testbed.topology.model import Attachment, Backend, Cell, Offloads, Profile, Protocol, object_name

NAME = "bridge-vs-ovs"
STUDY = "A. Linux bridge vs OVS, with VLANs and bonds, UDP at constant bit rate (OVS discuss list, 2014)"
STUDY_ENV = {"hardware": "two servers back to back over 2x10G", "kernel": "Linux 3.2, OVS 1.4 (kernel datapath)",
             "accelerator": "none (bare metal)"}
MTU, VLAN, SIZE = 9000, 100, 8000
NET = "198.18.101."


class Switch(Enum):
    """What joins the tested server's bond to its address in study A's configurations."""
    NONE = "none"           # the address sits on the bond (or its VLAN) itself
    LINUX = "linux"         # a Linux bridge, the address on a veth into it
    OVS = "ovs"             # an OVS bridge, the address on an internal port


@dataclass(frozen=True)
class Config:
    number: int
    key: str
    label: str
    attachment: Attachment
    published_mbps: float
    published_loss: float
    published_note: str = ""
    switch: Switch = Switch.NONE
    vlan: bool = False
    #: the bond is OVS's own (LACP, balance-tcp) rather than a Linux bond under the switch
    ovs_bond: bool = False

    @property
    def ovs(self) -> bool:
        return self.switch is Switch.OVS


CONFIGS = (
    Config(1, "bond", "Linux bond, no bridge", Attachment("netns-veth"), 12390, 0),
    Config(2, "vlan", "bond + VLAN sub-interface", Attachment("netns-veth"), 11958, 5, vlan=True),
    Config(3, "bridge", "Linux bridge + veth + bond", Attachment("netns-bridge"), 10499, 0, switch=Switch.LINUX),
    Config(4, "bridge-vlan", "Linux bridge + VLAN", Attachment("netns-bridge"), 10340, 0, switch=Switch.LINUX,
           vlan=True),
    Config(5, "ovs-linux-bond", "OVS bridge + Linux bond", Attachment("netns-ovs-veth"), 12241, 0, switch=Switch.OVS),
    Config(6, "ovs-bond", "OVS bridge + OVS LACP bond (balance-tcp)", Attachment("netns-ovs-veth"), 9921, 5.7,
           "one link carried all the traffic", switch=Switch.OVS, ovs_bond=True),
    Config(7, "ovs-bond-vlan", "OVS bond + OVS VLAN tag on the access port", Attachment("netns-ovs-veth"), 9915, 5.5,
           switch=Switch.OVS, vlan=True, ovs_bond=True),
)


def profile(c: Config, rate: str, secs: int) -> Profile:
    return Profile(f"cbr{c.number}-{c.key}", protocol=Protocol.UDP, message_size=SIZE, duration_s=secs,
                   rate_bps=_bps(rate))


def _bps(rate: str) -> int:
    return int(float(rate[:-1]) * {"G": 1e9, "M": 1e6}[rate[-1]])


def _links(ns: str):
    """Link operations inside ``ns``, through the host layer (netlink)."""
    return ops.on(Netns(ns))


def _up(ns: str, *devs: str) -> None:
    for dev in devs:
        _links(ns).set_mtu(dev, MTU)
        _links(ns).set_up(dev)


@dataclass(frozen=True)
class Wire:
    tested: str          # namespace of the tested server
    peer: str
    members: tuple[str, str]     # bond members on the tested side
    address: str         # tested side's test address
    peer_address: str


@contextlib.contextmanager
def wire(tag: str, c: Config, workdir: str) -> Iterator[Wire]:
    """Both servers, the two cables, the peer's bond and the tested side's configuration."""
    n = lambda kind: object_name(tag, kind)  # noqa: E731
    ha, hb = n("ha"), n("hb")
    with contextlib.ExitStack() as stack:
        for ns in (ha, hb):
            stack.enter_context(ses.namespace(ns))
        members = (n("a0"), n("a1"))
        for i, m in enumerate(members):
            _links(ha).add_veth(m, n(f"p{i}"), mtu=MTU, peer_netns=hb)
        # The tested side first: a configuration this kernel cannot build fails before the
        # peer's switch is started.
        dev = _tested(stack, tag, c, ha, members, workdir)
        _links(ha).add_address(dev, f"{NET}1/24")
        peer_dev = _ovs_side(stack, hb, f"{workdir}-peer", n("pbr"), (n("pbd"), *(n(f"p{i}") for i in (0, 1))),
                             n("pi"), c.vlan)
        _links(hb).add_address(peer_dev, f"{NET}2/24")
        yield Wire(ha, hb, members, f"{NET}1", f"{NET}2")


def _kernel(what: str, ns: str, name: str, kind: str, **kw) -> None:
    """A link of a kernel driver this configuration needs; a kernel without it is a
    capability error that names the driver, found by trying."""
    try:
        _links(ns).add(name, kind, **kw)
    except CommandError as e:
        if "Unknown device type" in str(e) or "not supported" in str(e):
            raise CapabilityError(f"this kernel has no {what} driver ({e.stderr_tail})") from None
        raise


def _bond(ns: str, name: str, members: tuple[str, ...]) -> str:
    # 802.3ad (4), layer3+4 hashing (1), MII link monitoring every 100 ms, fast LACP (1)
    _kernel("bonding", ns, name, "bond", bond_mode=4, bond_xmit_hash_policy=1, bond_miimon=100, bond_lacp_rate=1)
    for m in members:
        _links(ns).set_up(m, False)
        _links(ns).enslave(m, name)
    _up(ns, name)
    return name


def _vlan(ns: str, lower: str, name: str) -> str:
    _kernel("802.1Q VLAN", ns, name, "vlan", link=lower, vlan_id=VLAN)
    _up(ns, name)
    return name


def _ovs_side(stack: contextlib.ExitStack, ns: str, workdir: str, br: str, port: tuple[str, ...],
              internal: str, tagged: bool) -> str:
    """A private OVS in ``ns``: bridge ``br`` with ``port`` (one device, or (bond name,
    member, member) for an LACP balance-tcp bond) and an internal port for the address."""
    sw = stack.enter_context(ovsd.private(ns, workdir))
    if len(port) == 1:
        uplink = ["add-port", br, port[0]]
    else:
        for m in port[1:]:
            _links(ns).set_up(m)
        uplink = ["add-bond", br, *port, "bond_mode=balance-tcp", "lacp=active", "other_config:lacp-time=fast"]
    args = ["add-br", br, "--", "set", "Bridge", br, "datapath_type=netdev", "--", *uplink,
            "--", "add-port", br, internal, "--", "set", "Interface", internal, "type=internal",
            f"mtu_request={MTU}"]
    if tagged:
        args += ["--", "set", "Port", internal, f"tag={VLAN}"]
    sw.vsctl(*args)
    for dev in port[1:] if len(port) > 1 else port:
        sw.vsctl("set", "Interface", dev, f"mtu_request={MTU}")
    # The userspace datapath over AF_PACKET: checksums are filled in by the sender.
    apply_offloads(Netns(ns), internal, Offloads(tx=False))
    _up(ns, internal)
    return internal


def _tested(stack: contextlib.ExitStack, tag: str, c: Config, ns: str, members: tuple[str, str],
            workdir: str) -> str:
    """The tested server's side of configuration ``c``; returns the device for the address."""
    n = lambda kind: object_name(tag, kind)  # noqa: E731
    if not c.ovs_bond:
        bond = _bond(ns, n("ab"), members)
        lower = _vlan(ns, bond, n("av")) if c.vlan else bond
        if c.switch is Switch.NONE:
            return lower
        if c.switch is Switch.LINUX:
            # The "VM" side: a veth pair, one end in the bridge, the address on the other.
            _links(ns).add_bridge(n("br"))
            _links(ns).add_veth(n("e0"), n("e1"))
            for dev in (lower, n("e1")):
                _links(ns).enslave(dev, n("br"))
            _up(ns, n("e1"), n("e0"), n("br"))
            return n("e0")
        return _ovs_side(stack, ns, workdir, n("ob"), (bond,), n("oi"), False)
    return _ovs_side(stack, ns, workdir, n("ob"), (n("ob0"), *members), n("oi"), c.vlan)


def jumbo_check(w: Wire, deadline_s: float = 30.0) -> str | None:
    """The study's ``ping -M do -s 8000``, retried while the bonds negotiate LACP."""
    end = time.monotonic() + deadline_s
    while True:
        res = proc.run(["ping", "-n", "-M", "do", "-s", str(SIZE), "-c", "2", "-i", "0.2", "-W", "2",
                        w.peer_address], netns=w.tested, timeout=30, check=False)
        if res.rc == 0:
            return None
        if time.monotonic() > end:
            out = (res.stdout + res.stderr).strip().splitlines()
            return f"jumbo path check failed (ping -M do -s {SIZE}) after {deadline_s:.0f} s: {' | '.join(out[-2:])}"
        time.sleep(1)


def _lacp_state(workdir: str) -> str:
    """One line of the tested switch's bond state, for a failure reason."""
    out = proc.run(["ovs-appctl", "-t", f"{workdir}/ovs-vswitchd.ctl", "bond/show"], timeout=20,
                   check=False).stdout
    keep = [x.strip() for x in out.splitlines() if x.startswith(("lacp_status", "member"))]
    return "tested bond: " + ", ".join(keep) if keep else "tested bond: no bond/show output"


def _tx_bytes(ns: str, dev: str) -> int:
    return _links(ns).wire(dev).tx_bytes


def _socket_buffers(ns: str) -> str:
    """The study raised net.core.{w,r}mem_max to 4 MiB. Only where that is per-namespace:
    the host's own value is never changed."""
    ok = True
    for k in ("wmem_max", "rmem_max"):
        try:
            Netns(ns).write_file(f"/proc/sys/net/core/{k}", "4194304")
        except (CommandError, OSError):
            ok = False
    return "raised to 4 MiB in the namespaces" if ok else \
        "left at the host's value (net.core.*mem_max is not per-namespace on this kernel)"


def measure(s: ses.Session, c: Config, rate: str, secs: int) -> tuple[dict, str]:
    cell = Cell(c.attachment, Backend.QEMU, MTU, 4, profile(c, rate, secs))
    s.progress(f"  {c.number}. {c.label}")
    started = results.now()
    try:
        with wire(s.tag, c, s.out_dir(f"ovs{c.number}")) as w:
            bufs = "; ".join(sorted({_socket_buffers(ns) for ns in (w.tested, w.peer)}))
            why = jumbo_check(w)
            if why:
                if c.ovs:
                    why += f"; {_lacp_state(s.out_dir(f'ovs{c.number}'))}"
                return s.fail(cell, why), bufs
            with proc.background(nuttcp.server_argv(), out_dir=s.out_dir("nuttcp"), name=f"server{c.number}",
                                 netns=w.peer):
                time.sleep(0.5)
                before = [_tx_bytes(w.tested, m) for m in w.members]
                argv = nuttcp.client_argv(w.peer_address, rate=rate, seconds=secs)
                res = proc.run(argv, netns=w.tested, timeout=secs + 60, check=False)
                after = [_tx_bytes(w.tested, m) for m in w.members]
            # Which members LACP had enabled: "one link carried everything" means something
            # different when the other member was never enabled.
            bond_show = proc.run(["ovs-appctl", "-t", f"{s.out_dir(f'ovs{c.number}')}/ovs-vswitchd.ctl",
                                  "bond/show"], timeout=20, check=False).stdout if c.ovs_bond else ""
    except CapabilityError as e:
        return s.fail(cell, f"not run here: {e}"), ""
    except (TestbedError, OSError) as e:
        return s.fail(cell, f"configuration {c.number} could not be built: {e}"), ""
    raw = s.raw(cell, "nuttcp.out", res.stdout + ("\n# stderr\n" + res.stderr if res.stderr else ""))
    r = nuttcp.parse(res.stdout, res.stderr, res.rc)
    if not r.ok:
        return s.fail(cell, r.reason or "nuttcp failed"), bufs
    enabled = sum(1 for line in bond_show.splitlines() if line.strip().startswith("member") and "enabled" in line
                  and "disabled" not in line)
    if bond_show:
        s.raw(cell, "bond-show.txt", bond_show)
    moved = [a - b for a, b in zip(after, before)]
    share = max(moved) / sum(moved) if sum(moved) else None
    metrics = {"throughput_mbps": r.mbps, "loss_pct": r.loss_pct, "dropped": r.dropped, "packets": r.packets,
               **({"busiest_link_share": round(share, 4)} if share is not None else {}),
               **({"bond_members_enabled": enabled} if bond_show else {}),
               **({"sender_cpu_pct": r.tx_cpu_pct} if r.tx_cpu_pct is not None else {}),
               **({"receiver_cpu_pct": r.rx_cpu_pct} if r.rx_cpu_pct is not None else {})}
    extra = {"intervals": [{"s": i.seconds, "mbps": i.mbps, "dropped": i.dropped, "packets": i.packets,
                            "loss_pct": i.loss_pct} for i in r.intervals],
             "argv": argv, "member_tx_bytes": moved, "socket_buffers": bufs}
    return s.record(cell, metrics, started=started, raw=[raw], extra=extra), bufs


def run(quick: bool, progress, hosts=None) -> StudyReport:
    rate, secs = ("2G", 3) if quick else ("20G", 10)
    topo = ses.topology(NAME, [c.attachment for c in CONFIGS], [profile(c, rate, secs) for c in CONFIGS],
                        mtus=(MTU,), connections=(4,))
    got, bufs = {}, set()
    with ses.session(NAME, topo, quick, progress) as s:
        for c in CONFIGS:
            rec, b = measure(s, c, rate, secs)
            got[c.number] = rec
            bufs.add(b)
        env, run_id = s.writer.run.environment, s.writer.run_id
        samples = {x.cell.id: x for x in results.read_run(s.writer.dir).samples}
    return report(got, samples, env, quick, run_id, rate, secs, "; ".join(sorted(b for b in bufs if b)))


def report(got: dict, samples: dict, env: Environment | dict, quick: bool, run_id: str, rate: str,
           secs: int, bufs: str) -> StudyReport:
    env = as_environment(env)
    m = lambda n, k: ses.summary_mean(got[n], k)  # noqa: E731
    rows, per_interval = [], []
    for c in CONFIGS:
        rec = got[c.number]
        share = m(c.number, "busiest_link_share")
        rows.append((f"{c.number}. {c.label}", fmt(m(c.number, "throughput_mbps")), f"~{c.published_mbps:.0f}",
                     fmt(m(c.number, "loss_pct")), f"{c.published_loss:g}",
                     f"{share:.0%}" if share is not None else "-",
                     fmt(m(c.number, "sender_cpu_pct")), fmt(m(c.number, "receiver_cpu_pct")),
                     c.published_note, ses.reason(rec)))
        sample = samples.get(as_outcome(rec).id)
        for i, iv in enumerate(sample.data.get("intervals", []) if sample else []):
            per_interval.append((f"{c.number}", str(i + 1), fmt(iv["mbps"]), f"{iv['dropped']} / {iv['packets']}",
                                 fmt(iv["loss_pct"])))
    tables = (Table(f"nuttcp UDP, {SIZE}-byte datagrams, 4 streams at a {rate}bit/s target, {secs} s, MTU {MTU}",
                    ("configuration", "measured Mbit/s", "published Mbit/s", "measured loss %",
                     "published loss %", "busiest bond member", "sender CPU %", "receiver CPU %",
                     "published note", "failure"), tuple(rows),
                    f"study target 20 Gbit/s over 2x10G; socket buffers {bufs or '-'}"),
              Table("Loss per one-second interval (nuttcp -i1)",
                    ("configuration", "second", "Mbit/s", "dropped / sent", "loss %"), tuple(per_interval)))
    t = {n: m(n, "throughput_mbps") for n in range(1, 8)}
    loss = {n: m(n, "loss_pct") for n in range(1, 8)}
    share6 = m(6, "busiest_link_share")
    enabled6 = m(6, "bond_members_enabled")
    findings = (
        Finding("OVS is not worse than the Linux bridge (OVS + Linux bond ~12241 vs Linux bridge ~10499 Mbit/s)",
                "held if configuration 5 reaches >= 95% of configuration 3's Mbit/s with no more than 1 point more loss",
                ratio_verdict(t[5] >= 0.95 * t[3] and loss[5] <= loss[3] + 1
                              if None not in (t[5], t[3], loss[5], loss[3]) else None),
                f"OVS + Linux bond {fmt(t[5])} Mbit/s, {fmt(loss[5])}% loss; Linux bridge {fmt(t[3])} Mbit/s, "
                f"{fmt(loss[3])}% loss"),
        Finding("A Linux bridge costs throughput against the bare bond (~10499 vs ~12390 Mbit/s)",
                "held if configuration 3 reaches at most 95% of configuration 1",
                ratio_verdict(t[3] <= 0.95 * t[1] if t[3] and t[1] else None),
                f"bond {fmt(t[1])}, Linux bridge {fmt(t[3])} Mbit/s"),
        Finding("The OVS LACP bond (balance-tcp) put all the traffic on one link",
                "held if one bond member carried >= 90% of the bytes in configuration 6",
                ratio_verdict(share6 >= 0.9 if share6 is not None else None),
                (f"busiest member carried {share6:.0%} of the bytes; LACP had {fmt(enabled6)} of 2 members enabled "
                 "(ovs-appctl bond/show, saved with the run)") if share6 is not None else "not measured"),
        Finding("The OVS bond configurations lose about 5.5-5.7% of the datagrams at the target rate",
                "held if every OVS bond configuration measured here (6, 7) loses 1-15%",
                ratio_verdict(all(1 <= loss[n] <= 15 for n in (6, 7) if loss[n] is not None)
                              if any(loss[n] is not None for n in (6, 7)) else None),
                f"loss % 6: {fmt(loss[6])}, 7: {fmt(loss[7])}"),
        Finding("The OVS bond configurations lose datagrams (5.5-5.7%) where the Linux bridge loses none",
                "held if configurations 6 and 7 lose more than configuration 3 by at least 1 point",
                ratio_verdict(min(loss[6], loss[7]) >= loss[3] + 1
                              if None not in (loss[6], loss[7], loss[3]) else None),
                f"loss % 3: {fmt(loss[3])}, 6: {fmt(loss[6])}, 7: {fmt(loss[7])}"),
    )
    return StudyReport(NAME, STUDY, quick, env_difference(STUDY_ENV, env, (
        ("link", "2x10G back to back", "two veth pairs between two namespaces"),
        ("peer", "Linux layer3+4 LACP bond", "OVS balance-tcp (layer3+4) LACP bond, private switch"),
        ("datapath", "OVS 1.4 kernel datapath", "private OVS, userspace (netdev) datapath over AF_PACKET"),
        ("rate", "20 Gbit/s target, 10 s", f"{rate}bit/s target, {secs} s"))), tables, findings, run_id=run_id)
