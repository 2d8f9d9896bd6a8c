"""Study B, chaining OVS bridges: N = 1..9 bridges joined by patch ports or by veth pairs,
two namespaces as source and sink, 1/2/4/8/16 streams (host.net.ovsns.ovs_chain)."""
from __future__ import annotations

from testbed.attachments.ovs import namespaces as ovsns
from testbed.errors import TestbedError
from testbed.records.records import Environment, as_environment
from testbed.scenarios import session as ses
from testbed.scenarios.study import Finding, StudyReport, Table, env_difference, fmt, ratio_verdict
from testbed.topology.model import Attachment, Backend, Cell, Pattern, Profile

NAME = "ovs-chain"
STUDY = "B. Chaining OVS bridges: patch ports vs veth pairs (opencloudblog, 2014)"
STUDY_ENV = {"hardware": "i5 4 cores at 3.3 GHz", "kernel": "Linux 3.13, OVS 2.0.1 (kernel datapath)",
             "accelerator": "none (bare metal, namespaces)"}



def profile(link: ovsns.ChainLink, n: int, seconds: int) -> Profile:
    # The chain is part of the cell's identity: one profile name per (link, length).
    return Profile(f"stream-{link.value}-n{n}", pattern=Pattern.STREAM, message_size=ses.IPERF_WRITE,
                   duration_s=seconds)


def run(quick: bool, progress, hosts=None) -> StudyReport:
    lengths = (1, 2, 4) if quick else tuple(range(1, ovsns.MAX_CHAIN + 1))
    streams = (1,) if quick else (1, 2, 4, 8, 16)
    seconds = 2 if quick else 10
    profiles = [profile(l, n, seconds) for l in ovsns.ChainLink for n in lengths]
    topo = ses.topology(NAME, [Attachment("netns-ovs-veth")], profiles, connections=streams)
    got: dict[tuple[str, int, int], dict] = {}
    with ses.session(NAME, topo, quick, progress) as s:
        for link in ovsns.ChainLink:
            for n in lengths:
                for k in streams:
                    cell = Cell(Attachment("netns-ovs-veth"), Backend.QEMU, 1500, k, profile(link, n, seconds))
                    try:
                        with ovsns.ovs_chain(s.tag, n, link) as conn:
                            got[(link.value, n, k)] = s.measure(cell, conn)
                    except (TestbedError, OSError) as e:  # the path could not be built: a failed cell
                        got[(link.value, n, k)] = s.fail(cell, f"chain {link.value} x{n}: {e}")
        env, run_id = s.writer.run.environment, s.writer.run_id
    return report(got, env, quick, run_id, lengths, streams)


def _gbit(rec) -> float | None:
    v = ses.summary_mean(rec or {}, "throughput_mbps")
    return v / 1000 if v is not None else None


def report(got: dict, env: Environment | dict, quick: bool, run_id: str, lengths, streams) -> StudyReport:
    env = as_environment(env)
    tables = []
    for link in ovsns.ChainLink:
        rows = []
        for n in lengths:
            base = _gbit(got.get((link.value, 1, 1)))
            for k in streams:
                rec = got.get((link.value, n, k))
                g = _gbit(rec)
                cores = ses.summary_mean(rec or {}, "host_cores")
                rows.append((str(n), str(k), fmt(g), f"{g / base:.0%}" if g is not None and base else "-",
                             fmt(cores), ses.reason(rec)))
        pub = ("flat up to 8 bridges" if link is ovsns.ChainLink.PATCH else
               "about -10% at 2 bridges for 1-2 streams, much more with more streams")
        tables.append(Table(f"Chain of OVS bridges joined by {'patch ports' if link is ovsns.ChainLink.PATCH else 'veth pairs'}"
                            f" (netperf TCP_STREAM, 128 KiB writes, MTU 1500); published: {pub}",
                            ("bridges", "streams", "measured Gbit/s", "vs 1 bridge", "host cores busy", "failure"),
                            tuple(rows)))
    findings = []
    patch = {n: _gbit(got.get(("patch", n, 1))) for n in lengths}
    pv = [v for v in patch.values() if v is not None]
    findings.append(Finding("With patch ports, throughput does not depend on chain length (up to 8 bridges)",
                            f"held if every chain length is within 15% of the best (1 stream, lengths "
                            f"{', '.join(map(str, lengths))})",
                            ratio_verdict(min(pv) >= 0.85 * max(pv) if len(pv) == len(lengths) and len(pv) > 1 else None),
                            ", ".join(f"{n} bridges {fmt(v)} Gbit/s" for n, v in patch.items())))
    v1, v2 = _gbit(got.get(("veth", 1, 1))), _gbit(got.get(("veth", 2, 1)))
    findings.append(Finding("With veth pairs, 2 bridges already lose about 10% at 1-2 streams",
                            "held if 2 veth-joined bridges give at most 95% of 1 bridge at 1 stream",
                            ratio_verdict(v2 <= 0.95 * v1 if v1 and v2 else None),
                            f"1 bridge {fmt(v1)}, 2 bridges {fmt(v2)} Gbit/s"
                            + (f" ({v2 / v1:.0%})" if v1 and v2 else "")))
    cores = ses.summary_mean(got.get(("patch", 1, 1)) or {}, "host_cores")
    findings.append(Finding("One stream costs about 1.8 cores (1.0 sender, 0.8 receiver)",
                            "held if one stream through 1 bridge keeps 1.5-2.1 host cores busy",
                            ratio_verdict(1.5 <= cores <= 2.1 if cores is not None else None),
                            f"{fmt(cores)} host cores busy; this machine has {env.cpus} CPUs"))
    return StudyReport(NAME, STUDY, quick, env_difference(STUDY_ENV, env, (
        ("datapath", "OVS kernel datapath", f"OVS {env.versions.get('ovs', '?')} as running here "
                                           "(userspace netdev datapath when there is no kernel module)"),
        ("tool", "iperf threads", "netperf TCP_STREAM processes"))), tuple(tables), tuple(findings),
        run_id=run_id)

