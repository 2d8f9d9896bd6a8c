"""Study C, OVS performance analysis: 64-byte UDP packet rate through OVS against a Linux
bridge; TCP_RR/UDP_RR latency per path; throughput against the number of flows with the
datapath flow cache on and disabled; OVS with and without a ct() flow; and the
VM-OVS-VXLAN-OVS-VM table, which needs the two-host attachment (run only when
``attachments.unavailable`` says it is available, otherwise each row says why it was not run).

The flow-cache and ct() parts use a private OVS (ovsd.private) in a tb- namespace, so
changing its flow limit or flow table touches nothing but this run's switch.
"""
from __future__ import annotations

import json
import sys
import time

from testbed import attachments
from testbed import attachments as nsconn
from testbed.attachments.ovs import namespaces as ovsns
from testbed.errors import TestbedError
from testbed.host import proc
from testbed.host.net import ovsd
from testbed.records import results
from testbed.records.records import Environment, as_environment, pattern_from_name, primary_metric
from testbed.scenarios import session as ses
from testbed.scenarios.study import Finding, StudyReport, Table, Verdict, env_difference, fmt, ratio_verdict
from testbed.topology.model import Attachment, Backend, Cell, Pattern, Profile, Protocol

NAME = "ovs-analysis"
STUDY = "C. OVS performance analysis (conference talk, 2014)"
STUDY_ENV = {"hardware": "Xeon E5-2643 3.5 GHz, 82599 / XL710 NICs (NIC-OVS-NIC)",
             "kernel": "Linux 3.17, kernel OVS and OVS-DPDK", "accelerator": "none (bare metal); VMs on KVM + vhost-net"}
#: 64-byte payload frame: 14 Ethernet + 20 IP + 8 UDP + 18 payload + 4 FCS
UDP_PAYLOAD = 18
FRAME = 64
PUB_PPS = {"ovs-veth": (1.159, 1.72), "bridge": (1.04, 1.55)}          # Gbit/s, Mpps
PUB_LAT = {"veth": (27, 26.2), "bridge": (43, 44), "ovs-veth": (46, 51)}  # TCP, UDP µs
LABEL = {"veth": "no switch (veth pair; study: NIC-NIC)", "bridge": "Linux bridge",
         "ovs-veth": "OVS (study: kernel OVS)"}
ATT = {"veth": Attachment("netns-veth"), "bridge": Attachment("netns-bridge"), "ovs-veth": Attachment("netns-ovs-veth")}
VXLAN_COLS = ("TCP_STREAM", "UDP_STREAM", "TCP_MAERTS", "TCP_RR", "UDP_RR")
# The study's "VXLAN offload" is a physical NIC segmenting and checksumming encapsulated
# frames; the emulated hosts' wire is a veth, which has nothing to offload to.
NO_NIC_OFFLOAD = "needs a physical NIC with VXLAN (UDP tunnel) segmentation offload on the underlay"
PUB_VXLAN = {"default": (6752, 6433, 5474, 13736, 13694), "VXLAN offload": (4766, 9284, 5224, 13783, 15062)}
CT_FLOWS = ("table=0,priority=100,ip,ct_state=-trk,actions=ct(table=1)",
            "table=1,priority=100,ip,ct_state=+trk+new,actions=ct(commit),NORMAL",
            "table=1,priority=100,ip,ct_state=+trk+est,actions=NORMAL",
            "table=1,priority=10,actions=NORMAL")


def _p(name: str, proto: Protocol, pattern: Pattern, size: int | None, seconds: int) -> Profile:
    return Profile(name, protocol=proto, pattern=pattern, message_size=size,
                   response_size=size if pattern is Pattern.RR else None, duration_s=seconds)


def run(quick: bool, progress, hosts=None) -> StudyReport:
    secs = 2 if quick else 10
    pps_p = _p("udp64-pps", Protocol.UDP, Pattern.STREAM, UDP_PAYLOAD, secs)
    rr = [_p("tcp_rr", Protocol.TCP, Pattern.RR, 1, secs), _p("udp_rr", Protocol.UDP, Pattern.RR, 1, secs)]
    flows = (1, 2048) if quick else (1, 2, 8, 32, 128, 512, 1024, 2048)
    stream = _p("tcp_stream", Protocol.TCP, Pattern.STREAM, 16384, secs)
    flow_profiles = [Profile(f"udp64-flows{n}-cache-{c}", protocol=Protocol.UDP, message_size=UDP_PAYLOAD,
                             duration_s=secs) for n in flows for c in ("on", "off")]
    ct_profiles = [Profile(f"tcp_stream-ct-{c}", message_size=16384, duration_s=secs) for c in ("off", "on")]
    topo = ses.topology(NAME, list(ATT.values()), [pps_p, *rr, *flow_profiles, *ct_profiles])
    got: dict = {}
    with ses.session(NAME, topo, quick, progress) as s:
        for kind in ("bridge", "ovs-veth"):
            got[("pps", kind)] = _measure(s, kind, Cell(ATT[kind], Backend.QEMU, 1500, 1, pps_p))
        for kind in ("veth", "bridge", "ovs-veth"):
            for p in rr:
                got[(p.name, kind)] = _measure(s, kind, Cell(ATT[kind], Backend.QEMU, 1500, 1, p))
        with ses.namespace(f"tb-{s.tag}-s") as sw_ns, \
                ovsd.private(sw_ns, s.out_dir("ovs")) as sw:
            for cache in ("on", "off"):
                _flow_cache(sw, cache == "on")
                for n in flows:
                    cell = Cell(Attachment("netns-ovs-veth"), Backend.QEMU, 1500, n,
                                next(p for p in flow_profiles if p.name == f"udp64-flows{n}-cache-{cache}"))
                    got[("flows", cache, n)] = _flows(s, sw, cell, n, secs)
            _flow_cache(sw, True)
            for ct in ("off", "on"):
                cell = Cell(Attachment("netns-ovs-veth"), Backend.QEMU, 1500, 1,
                            next(p for p in ct_profiles if p.name == f"tcp_stream-ct-{ct}"))
                try:
                    with ovsns.ovs_veth(s.tag, switch=sw) as conn:
                        if ct == "on":
                            _ofctl(sw, conn.bridges[0], "add-flows", "-", input="\n".join(CT_FLOWS) + "\n")
                        got[("ct", ct)] = s.measure(cell, conn)
                except (TestbedError, OSError) as e:  # the path could not be built: a failed cell
                    got[("ct", ct)] = s.fail(cell, f"ct {ct}: {e}")
        env, run_id = s.writer.run.environment, s.writer.run_id
    vx_why = attachments.unavailable(Attachment("ovs-vxlan"))
    vx_runs: list[str] = []
    if vx_why is None:
        # The study's "default" row, and the same path with the guests' NIC offloads off (not
        # with --quick: a second pair of guests on two hosts for a row no finding reads)
        for cond, off in (("default", False),) + ((("offloads off", True),) if not quick else ()):
            run, vx = _vxlan(quick, progress, hosts, offloads_off=off)
            got[("vxlan", cond)] = vx
            vx_runs.append(run)
    vx_run = ", ".join(vx_runs) or None
    return report(got, env, quick, run_id, flows, vx_why, vx_run, stream)


def _measure(s: ses.Session, kind: str, cell: Cell) -> dict:
    try:
        with nsconn.connect(kind, s.tag) as conn:
            return s.measure(cell, conn)
    except (TestbedError, OSError) as e:  # the path could not be built: a failed cell
        return s.fail(cell, f"{kind}: {e}")


def _appctl(sw: ovsd.Ovs, *args: str, check: bool = True) -> str:
    return proc.run(["ovs-appctl", "-t", f"{sw.rundir}/ovs-vswitchd.ctl", *args], timeout=20,
                    check=check).stdout


def _ofctl(sw: ovsd.Ovs, br: str, *args: str, input: str | None = None) -> str:
    return proc.run(["ovs-ofctl", args[0], f"unix:{sw.rundir}/{br}.mgmt", *args[1:]], timeout=20,
                    input=input).stdout


def _flow_cache(sw: ovsd.Ovs, on: bool, timeout_s: float = 10.0) -> None:
    """Cache off: the datapath may hold no flows (``other_config:flow-limit=0``; the appctl
    ``upcall/set-flow-limit`` is undone by every bridge reconfiguration) and the userspace
    datapath's exact-match cache takes no entries, so every packet goes up to ofproto.
    Waits until the revalidators report the new limit; a switch that never does is an error
    (no measurement is labelled "cache off" unless the cache was off)."""
    sw.vsctl("set", "Open_vSwitch", ".", f"other_config:flow-limit={200000 if on else 0}",
             f"other_config:emc-insert-inv-prob={100 if on else 0}")
    # Flows cached under the previous setting go; before the first bridge there is no datapath.
    _appctl(sw, "dpctl/del-flows", check=False)
    deadline = time.monotonic() + timeout_s
    while True:
        limit = _flow_limit(sw)
        if limit is None or (limit == 0) == (not on):
            return
        if time.monotonic() > deadline:
            raise TestbedError(f"flow cache {'on' if on else 'off'}: ovs-vswitchd still reports a "
                               f"datapath flow limit of {limit} after {timeout_s:.0f} s")
        time.sleep(0.2)


def _flow_limit(sw: ovsd.Ovs) -> int | None:
    """The datapath flow limit `upcall/show` reports (None before the first bridge)."""
    import re
    m = re.search(r"\(limit (\d+)\)", _appctl(sw, "upcall/show", check=False))
    return int(m.group(1)) if m else None


def _rx_packets(ns: str, ifname: str) -> int:
    out = proc.run(["cat", f"/sys/class/net/{ifname}/statistics/rx_packets"], netns=ns, timeout=10).stdout
    return int(out.strip())


def _flows(s: ses.Session, sw: ovsd.Ovs, cell: Cell, n: int, secs: int) -> dict:
    started = results.now()
    py = [sys.executable, "-m", "testbed.scenarios.udpflows"]
    try:
        with ovsns.ovs_veth(s.tag, switch=sw) as conn:
            _flow_cache(sw, cell.profile.name.endswith("-on"))
            # No ICMP port-unreachable storm back through the switch: a bound sink.
            with proc.background([*py, "sink", "9", str(secs + 15)], out_dir=s.out_dir("flows"),
                                 name=f"sink-{n}", netns=conn.b.netns):
                time.sleep(0.3)
                before = _rx_packets(conn.b.netns, conn.b.ifname)
                res = proc.run([*py, "send", conn.b.address, "9", str(n), str(secs), str(UDP_PAYLOAD)],
                               netns=conn.a.netns, timeout=secs + 60)
                time.sleep(0.2)
                delivered = _rx_packets(conn.b.netns, conn.b.ifname) - before
            dp_flows = len([x for x in _appctl(sw, "dpctl/dump-flows").splitlines() if x.strip()])
            limit = _appctl(sw, "upcall/show").strip().splitlines()
            if cell.profile.name.endswith("-off") and _flow_limit(sw) != 0:
                raise TestbedError(f"flow cache was not off during the measurement: {limit[:2]}")
    except (TestbedError, OSError) as e:  # the path could not be built: a failed cell
        return s.fail(cell, f"{n} flows: {e}")
    try:
        out = json.loads(res.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return s.fail(cell, f"{n} flows: the sender printed no result: {res.stdout[-200:]!r} {res.stderr[-200:]!r}")
    if out["sent"] == 0 or delivered <= 0:
        return s.fail(cell, f"{n} flows: nothing delivered (sent {out['sent']}, errors {out['errors']})")
    secs_ = out["seconds"]
    metrics = {"delivered_pps": delivered / secs_, "sent_pps": out["sent"] / secs_,
               "throughput_mbps": delivered * FRAME * 8 / secs_ / 1e6, "datapath_flows": dp_flows}
    raw = s.raw(cell, "sender.json", res.stdout)
    return s.record(cell, metrics, started=started, raw=[raw],
                    extra={"upcall_show": limit[:6], "tool": "testbed.scenarios.udpflows (python)"})


def _vxlan(quick: bool, progress, hosts, offloads_off: bool = False):
    """VM-OVS-VXLAN-OVS-VM through the runner: guests on two hosts (emulated on this machine
    unless --hosts names others), MTU 1600 inside the tunnel as in the study."""
    from testbed.measure import runner
    from testbed.topology.model import Offloads
    secs = 3 if quick else 10
    profiles = [Profile("tcp_stream", pattern=Pattern.STREAM, message_size=16384, duration_s=secs),
                Profile("udp_stream", protocol=Protocol.UDP, pattern=Pattern.STREAM, message_size=1400,
                        duration_s=secs),
                Profile("tcp_maerts", pattern=Pattern.MAERTS, message_size=16384, duration_s=secs),
                Profile("tcp_rr", pattern=Pattern.RR, message_size=1, response_size=1, duration_s=secs),
                Profile("udp_rr", protocol=Protocol.UDP, pattern=Pattern.RR, message_size=1, response_size=1,
                        duration_s=secs)]
    topo = ses.guests_topology(f"scenario-ovs-analysis-vxlan{'-offloads-off' if offloads_off else ''}",
                               "<scenario ovs-analysis vxlan>", [Attachment("ovs-vxlan")], profiles,
                               mtus=[1600], two_hosts=True, underlay_mtu=1650,
                               offloads=Offloads.all(False) if offloads_off else None)
    topo = ses.placed(topo, hosts, two_hosts=True)
    out = runner.execute(topo, progress=progress)
    return out.run_dir.name, {c.cell.profile: c for c in results.read_run(out.run_dir).cells}


def report(got: dict, env: Environment | dict, quick: bool, run_id: str, flows, vx_why, vx_run,
           stream) -> StudyReport:
    env = as_environment(env)
    tables, findings = [], []
    # packet rate
    rows, mpps = [], {}
    for kind in ("ovs-veth", "bridge"):
        rec = got[("pps", kind)]
        mbps = ses.summary_mean(rec, "throughput_mbps")
        pps = mbps * 1e6 / (UDP_PAYLOAD * 8) if mbps is not None else None
        mpps[kind] = pps / 1e6 if pps else None
        rows.append((LABEL[kind], fmt(mpps[kind]), fmt(PUB_PPS[kind][1]),
                     fmt(pps * FRAME * 8 / 1e9 if pps else None), fmt(PUB_PPS[kind][0]), ses.reason(rec)))
    tables.append(Table("64-byte UDP, one flow (netperf UDP_STREAM, 18-byte payload)",
                        ("switch", "measured Mpps", "published Mpps", "measured Gbit/s (64 B frames)",
                         "published Gbit/s", "failure"), tuple(rows),
                        "received datagrams per second; published: one core, NIC-OVS-NIC"))
    o, b = mpps.get("ovs-veth"), mpps.get("bridge")
    findings.append(Finding("OVS forwards 64-byte packets at least as fast as the Linux bridge (1.72 vs 1.55 Mpps)",
                            "held if OVS Mpps >= 95% of Linux bridge Mpps", ratio_verdict(o >= 0.95 * b if o and b else None),
                            f"OVS {fmt(o)} Mpps, Linux bridge {fmt(b)} Mpps"))
    # latency
    rows, lat = [], {}
    for kind in ("veth", "bridge", "ovs-veth"):
        vals = []
        for i, name in enumerate(("tcp_rr", "udp_rr")):
            rec = got[(name, kind)]
            tps = ses.summary_mean(rec, "transactions_per_s")
            lat[(kind, name)] = 1e6 / tps if tps else None
            vals += [fmt(lat[(kind, name)]), fmt(PUB_LAT[kind][i])]
        reason = "; ".join(ses.reason(got[(n, kind)]) for n in ("tcp_rr", "udp_rr")).strip("; ")
        rows.append((LABEL[kind], *vals, reason))
    tables.append(Table("Latency per path, µs per transaction (netperf TCP_RR / UDP_RR, 1-byte)",
                        ("path", "TCP measured", "TCP published", "UDP measured", "UDP published", "failure"),
                        tuple(rows), "latency = 1 / transaction rate"))
    tb_, to_ = lat.get(("bridge", "tcp_rr")), lat.get(("ovs-veth", "tcp_rr"))
    findings.append(Finding("Linux bridge and OVS add similar latency (TCP_RR 43 vs 46 µs), both above no switch (27 µs)",
                            "held if OVS TCP_RR latency is within 25% of the Linux bridge's and both exceed the veth pair's",
                            ratio_verdict(abs(to_ - tb_) <= 0.25 * tb_ and min(to_, tb_) > lat[("veth", "tcp_rr")]
                                          if tb_ and to_ and lat.get(("veth", "tcp_rr")) else None),
                            f"veth {fmt(lat.get(('veth', 'tcp_rr')))}, bridge {fmt(tb_)}, OVS {fmt(to_)} µs"))
    # flows
    rows = []
    for n in flows:
        on, off = got[("flows", "on", n)], got[("flows", "off", n)]
        rows.append((str(n), *(fmt((ses.summary_mean(r, "delivered_pps") or 0) / 1e3 if ses.summary_mean(r, "delivered_pps") else None)
                               for r in (on, off)),
                     *(fmt(ses.summary_mean(r, "sent_pps") / 1e3 if ses.summary_mean(r, "sent_pps") else None) for r in (on, off)),
                     *(fmt(ses.summary_mean(r, "datapath_flows")) for r in (on, off)),
                     "; ".join(x for x in (ses.reason(on), ses.reason(off)) if x)))
    tables.append(Table("Flows through one OVS bridge, 64-byte UDP (kpps delivered), datapath flow cache on and off",
                        ("flows", "cache on kpps", "cache off kpps", "sent kpps (on)", "sent kpps (off)",
                         "datapath flows (on)", "datapath flows (off)", "failure"), tuple(rows),
                        "published: about -5% at 2048 flows with the cache; cache disabled about 400 Mbit/s "
                        "(600 kpps), CPU mostly in softirq. Cache off = other_config:flow-limit=0 and "
                        "emc-insert-inv-prob=0 on a private switch. Sender: one Python process, "
                        "so 'sent' bounds what can be delivered"))
    d = lambda c, n: ses.summary_mean(got[("flows", c, n)], "delivered_pps")  # noqa: E731
    lo, hi = flows[0], flows[-1]
    findings.append(Finding("With the flow cache, throughput falls only about 5% at 2048 flows",
                            f"held if {hi} flows deliver at least 85% of {lo} flow's packet rate, cache on",
                            ratio_verdict(d("on", hi) >= 0.85 * d("on", lo) if d("on", hi) and d("on", lo) else None),
                            f"{lo}: {fmt(d('on', lo))} pps, {hi}: {fmt(d('on', hi))} pps"))
    findings.append(Finding("With the flow cache disabled throughput collapses (about 400 Mbit/s against 1.16 Gbit/s)",
                            f"held if cache off delivers at most 60% of cache on at {lo} flow",
                            ratio_verdict(d("off", lo) <= 0.6 * d("on", lo) if d("off", lo) and d("on", lo) else None),
                            f"on {fmt(d('on', lo))} pps, off {fmt(d('off', lo))} pps"))
    # ct
    c_off, c_on = (ses.summary_mean(got[("ct", c)], "throughput_mbps") for c in ("off", "on"))
    tables.append(Table("OVS with and without a ct() connection-tracking flow (netperf TCP_STREAM, private OVS)",
                        ("flow table", "measured Mbit/s", "published cost", "failure"),
                        (("NORMAL only", fmt(c_off), "-", ses.reason(got[("ct", "off")])),
                         ("ct(table=1), ct(commit) then NORMAL", fmt(c_on), "15-20% lower",
                          ses.reason(got[("ct", "on")])))))
    cost = 1 - c_on / c_off if c_on and c_off else None
    findings.append(Finding("Connection tracking costs 15 to 20%",
                            "held if the ct() flow table is 10-25% slower than NORMAL alone",
                            ratio_verdict(0.10 <= cost <= 0.25 if cost is not None else None),
                            f"NORMAL {fmt(c_off)} Mbit/s, ct() {fmt(c_on)} Mbit/s, cost {cost:.0%}" if cost is not None
                            else "not measured"))
    # VXLAN
    rows = []
    for cond, pub in {"default": PUB_VXLAN["default"], "offloads off": ("-",) * 5,
                      "VXLAN offload": PUB_VXLAN["VXLAN offload"]}.items():
        # one "not run" row with its reason: no OVS+VXLAN here, no NIC to offload VXLAN to,
        # or --quick (which measures the default condition only)
        ours = cond in ("default", "offloads off")
        vx = got.get(("vxlan", cond)) if ours else None
        why = vx_why
        if why is None and not ours:
            why = NO_NIC_OFFLOAD
        elif why is None and vx is None:
            why = "--quick measures the default only"
        if why is not None:
            rows.append((cond, f"not run: {why}", *("-",) * 4, *map(str, pub)))
            continue
        vals = []
        for col in VXLAN_COLS:
            rec = vx.get(col.lower()) or {}
            m = primary_metric(pattern_from_name(col))
            vals.append(fmt(ses.summary_mean(rec, m)) if rec else "not run")
        rows.append((cond, *vals, *map(str, pub)))
    tables.append(Table("VM-OVS-VXLAN-OVS-VM (Mbit/s; RR in transactions/s), MTU 1600",
                        ("condition", *(f"{c} measured" for c in VXLAN_COLS), *(f"{c} published" for c in VXLAN_COLS)),
                        tuple(rows), "" if vx_run is None else f"measured in run {vx_run}"))
    findings.append(Finding("VXLAN offload trades TCP_STREAM (6752 -> 4766) for UDP_STREAM (6433 -> 9284)",
                            "needs the VXLAN table with offloads on and off",
                            Verdict.NOT_MEASURABLE,
                            vx_why or NO_NIC_OFFLOAD))
    caveats = ("OVS here is whatever datapath runs on this host; with no kernel module it is the userspace "
               "(netdev) datapath over AF_PACKET, not the kernel datapath the study measured",)
    return StudyReport(NAME, STUDY, quick, env_difference(STUDY_ENV, env, (
        ("datapath", "kernel OVS / OVS-DPDK", f"OVS {env.versions.get('ovs', '?')}, datapath as running here"),
        ("path", "NIC-OVS-NIC between servers", "namespace-veth-switch-veth-namespace on one host"))),
        tuple(tables), tuple(findings), caveats, run_id=run_id,
        extra_runs=tuple(vx_run.split(", ")) if vx_run else ())
