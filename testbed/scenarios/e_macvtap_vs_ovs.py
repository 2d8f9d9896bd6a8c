"""Study E, macvtap vs OVS for KVM guests: on one host and across two, MTU 1492 and 9000,
stream and request/response at small, medium and large payloads, 1..250 connections, with
client and server CPU. Guests come from the runner (one boot per guest per run).

uperf is the study's tool. It runs when the guest image has it (its manifest's tool list, set
by a recipe's source_tools; this host's uperf is irrelevant, the guests run the tool);
otherwise netperf runs the same patterns, and the table, the environment difference and a
caveat say which tool ran. Across hosts (emulated on this machine unless --hosts names real ones): the
OVS column uses ovs-vxlan and the macvtap column macvtap with the guests on different hosts
(each guest's macvtap on its host's underlay), each when ``attachments.unavailable`` says it is
available; one that is not is listed as not run with the reason, never replaced by a
one-host figure. Their cells are kept apart from the one-host macvtap cells as
``macvtap-across``.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from testbed import attachments
from testbed.guests import images
from testbed.measure import runner
from testbed.records import results
from testbed.records.records import Environment, as_environment
from testbed.scenarios import session as ses
from testbed.scenarios.study import Finding, StudyReport, Table, Verdict, env_difference, fmt, ratio_verdict
from testbed.topology.model import Attachment, Pattern, Profile, Tool

NAME = "macvtap-vs-ovs"
STUDY = "E. MacVTap vs OVS for KVM guests (vendor paper)"
STUDY_ENV = {"hardware": "KVM hosts (vendor lab), physical link between hosts",
             "kernel": "not stated", "accelerator": "KVM"}
SIZES = {"small": 64, "medium": 1024, "large": 16384}

#: how the report names each mode measured across two hosts
ACROSS_LABEL = {Attachment("macvtap"): "macvtap-across"}

#: the tool the study used, and the one that runs the same patterns when the image lacks it
STUDY_TOOL, FALLBACK_TOOL = Tool("uperf"), Tool("netperf")


def guest_tool() -> tuple[str, str | None]:
    """(tool, why not the study's): the study's tool when the guest image records it, else
    the fallback (the report's caveat says which ran and why)."""
    img = images.ensure()
    if img.tools is None:
        return FALLBACK_TOOL, f"guest image {img.name}-{img.digest} records no tool list (built before tools were recorded)"
    if STUDY_TOOL not in img.tools:
        return FALLBACK_TOOL, (f"guest image {img.name}-{img.digest} has no {STUDY_TOOL} (build one with a "
                               "source_tools recipe and select it with TESTBED_IMAGE)")
    return STUDY_TOOL, None


def _profiles(quick: bool, secs: int, tool: str = "netperf") -> list[Profile]:
    sizes = {"large": SIZES["large"]} if quick else SIZES
    rr_sizes = {"small": 1} if quick else {"small": 1, "medium": 1024, "large": 16384}
    out = [Profile(f"stream_{k}", tool=Tool(tool), pattern=Pattern.STREAM, message_size=v, duration_s=secs)
           for k, v in sizes.items()]
    out += [Profile(f"rr_{k}", tool=Tool(tool), pattern=Pattern.RR, message_size=v, response_size=v,
                    duration_s=secs) for k, v in rr_sizes.items()]
    return out


def _topology(name: str, attachments, quick: bool, two_hosts: bool, hosts, tool: str = "netperf"):
    secs = 3 if quick else 30
    # Across hosts: two hosts emulated on this machine (unless --hosts names others), the
    # underlay wide enough for MTU 9000 plus VXLAN's 50 bytes.
    topo = ses.guests_topology(name, f"<scenario {NAME}>", attachments, _profiles(quick, secs, tool),
                               mtus=(1492, 9000), connections=(1,) if quick else (1, 10, 50, 100, 250),
                               two_hosts=two_hosts, underlay_mtu=9050 if two_hosts else 1500)
    return ses.placed(topo, hosts, two_hosts=two_hosts)


@dataclass(frozen=True)
class Measured:
    """One cell of this study: its primary metric's mean and the guests' busy cores."""

    value: float | None
    reason: str | None = None
    client_cpu: float | None = None
    server_cpu: float | None = None


def _cells(run_dir) -> dict[tuple, Measured]:
    """Per (attachment, mtu, connections, profile): primary metric and client/server CPU."""
    rec = results.read_run(run_dir)
    client, server = rec.client, rec.server
    cpu: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for s in rec.samples:
        if s.measured:
            for role, name in (("client", client), ("server", server)):
                if (busy := s.cpu.guest_busy(str(name))) is not None:
                    cpu[s.cell.id][role].append(busy)
    out = {}
    for c in rec.cells:
        metric = rec.primary_metric(c.cell.profile)
        mean = lambda xs: sum(xs) / len(xs) if xs else None  # noqa: E731
        out[(c.cell.attachment, c.cell.mtu, c.cell.connections, c.cell.profile)] = Measured(
            c.summary_mean(metric), c.reason, mean(cpu[c.id]["client"]), mean(cpu[c.id]["server"]))
    return out


def run(quick: bool, progress, hosts=None) -> StudyReport:
    one_host = [a for a in (Attachment("macvtap"), Attachment("ovs")) if attachments.unavailable(a) is None]
    skipped = {a: attachments.unavailable(a) for a in (Attachment("macvtap"), Attachment("ovs")) if a not in one_host}
    if not one_host:
        from testbed.errors import CapabilityError
        raise CapabilityError(f"scenario {NAME}: neither macvtap nor ovs is available: "
                              + "; ".join(f"{a.value}: {w}" for a, w in skipped.items()))
    tool, no_uperf = guest_tool()
    progress(f"scenario {NAME}: one host, {', '.join(a.value for a in one_host)} with {tool} "
             "(guests boot first)")
    out = runner.execute(_topology(f"scenario-{NAME}", one_host, quick, False, hosts, tool), progress=progress)
    cells = _cells(out.run_dir)
    run_id, extra = out.run_dir.name, []
    vx_why = attachments.unavailable(Attachment("ovs-vxlan"))
    mv_why = attachments.unavailable(Attachment("macvtap"))
    across = [a for a, why in ((Attachment("ovs-vxlan"), vx_why), (Attachment("macvtap"), mv_why)) if why is None]
    if across:
        progress(f"scenario {NAME}: two hosts, {', '.join(a.value for a in across)}")
        out2 = runner.execute(_topology(f"scenario-{NAME}-2h", across, quick, True, hosts, tool),
                              progress=progress)
        # the study's labels for the two-host cells: macvtap keeps its mode name across hosts
        cells.update({(ACROSS_LABEL.get(a, a), m, c, p): v
                      for (a, m, c, p), v in _cells(out2.run_dir).items()})
        extra.append(out2.run_dir.name)
    env = results.read_run(out.run_dir).environment
    return report(cells, env, quick, run_id, tuple(extra), skipped, vx_why, mv_why, tool, no_uperf)


def _pct(a: float | None, b: float | None) -> str:
    return f"{(b / a - 1):+.0%}" if a and b else "-"


def report(cells: dict, env: Environment | dict, quick: bool, run_id: str, extra: tuple[str, ...], skipped: dict,
           vx_why: str | None, mv_why: str | None = None, tool: str = "netperf",
           no_uperf: str | None = None) -> StudyReport:
    env = as_environment(env)
    keys = sorted({(m, c, p) for (_, m, c, p) in cells})
    rows = []
    for place, mac_att, ovs_att in (("one host", "macvtap", "ovs"), ("two hosts", "macvtap-across", "ovs-vxlan")):
        for mtu, conns, prof in keys:
            mac = cells.get((mac_att, mtu, conns, prof))
            ovs = cells.get((ovs_att, mtu, conns, prof))
            unit = "txn/s" if prof.startswith("rr") else "Mbit/s"
            why_mac = skipped.get(Attachment("macvtap")) if place == "one host" else mv_why
            why_ovs = skipped.get(Attachment("ovs")) if place == "one host" else vx_why
            rows.append((place, str(mtu), str(conns), prof, unit,
                         fmt(mac.value) if mac else f"not run: {why_mac}" if why_mac else "-",
                         fmt(ovs.value) if ovs else f"not run: {why_ovs}" if why_ovs else "-",
                         _pct(mac and mac.value, ovs and ovs.value),
                         "/".join(fmt(v) for x in (mac,) if x for v in (x.client_cpu, x.server_cpu)) or "-",
                         "/".join(fmt(v) for x in (ovs,) if x for v in (x.client_cpu, x.server_cpu)) or "-",
                         "; ".join(x.reason for x in (mac, ovs) if x and x.reason)))
    table = Table(f"Guest to guest, macvtap vs OVS ({tool} ran; the study used uperf)",
                  ("placement", "MTU", "connections", "profile", "unit", "macvtap", "OVS", "OVS vs macvtap",
                   "macvtap client/server cores", "OVS client/server cores", "failure"), tuple(rows),
                  "published: one host, macvtap ahead; OVS up to 12% behind in transactional tests, more at "
                  "high connection counts; across hosts streaming is link-bound, OVS up to 30% less CPU for "
                  "streaming, macvtap up to 15% better for highly concurrent transactions; a large MTU helps")
    v = lambda a, m, c, p: (cells.get((a, m, c, p)) or Measured(None)).value  # noqa: E731
    one = [(m, c, p) for m, c, p in keys if v("macvtap", m, c, p) and v("ovs", m, c, p)]
    st = [(v("macvtap", *k), v("ovs", *k)) for k in one if k[2].startswith("stream")]
    rr = [(v("macvtap", *k), v("ovs", *k)) for k in one if k[2].startswith("rr")]
    findings = [
        Finding("One host: macvtap has higher streaming throughput than OVS",
                "held if macvtap >= OVS in every one-host stream cell",
                ratio_verdict(all(a >= b for a, b in st) if st else None),
                "; ".join(f"{fmt(a)} vs {fmt(b)} Mbit/s" for a, b in st) or "no pair measured"),
        Finding("One host: OVS costs up to 12% in transactional tests (macvtap has lower latency)",
                "held if OVS transactions/s are below macvtap's in every one-host RR cell",
                ratio_verdict(all(b < a for a, b in rr) if rr else None),
                "; ".join(f"macvtap {fmt(a)} vs OVS {fmt(b)} txn/s ({b / a - 1:+.0%})" for a, b in rr)
                or "no pair measured"),
    ]
    mtu = []
    for att in ("macvtap", "ovs"):
        for _, c, p in {(None, c, p) for _, c, p in keys if p.startswith("stream")}:
            lo, hi = v(att, 1492, c, p), v(att, 9000, c, p)
            if lo and hi:
                mtu.append((att, lo, hi))
    findings.append(Finding("A large MTU helps", "held if MTU 9000 streams faster than MTU 1492 for each attachment",
                            ratio_verdict(all(hi > lo for _, lo, hi in mtu) if mtu else None),
                            "; ".join(f"{a}: 1492 {fmt(lo)}, 9000 {fmt(hi)} Mbit/s" for a, lo, hi in mtu)
                            or "not measured"))
    missing = "; ".join(f"{a}: {w}" for a, w in (("ovs-vxlan", vx_why), ("macvtap across hosts", mv_why)) if w)
    two = [(m, c, p) for m, c, p in keys if v("macvtap-across", m, c, p) and v("ovs-vxlan", m, c, p)]

    def per_gbit(att: str, k: tuple) -> float | None:
        x = cells.get((att, *k)) or Measured(None)
        cores = [x.client_cpu, x.server_cpu]
        if not x.value or any(c is None for c in cores):
            return None
        return sum(cores) / (x.value / 1000)     # guest cores (client + server) per Gbit/s

    cpu2 = [(k, per_gbit("macvtap-across", k), per_gbit("ovs-vxlan", k)) for k in two if k[2].startswith("stream")]
    cpu2 = [(k, a, b) for k, a, b in cpu2 if a and b]
    top = max((c for _, c, _ in two), default=None)
    rr2 = [(v("macvtap-across", *k), v("ovs-vxlan", *k)) for k in two if k[2].startswith("rr") and k[1] == top]
    findings += [
        Finding("Across hosts: streaming is limited by the link", "needs two hosts with a real link",
                Verdict.NOT_MEASURABLE,
                missing or "the testbed does not know the link's line rate (between emulated hosts the "
                "link is a veth wire, which has none)"),
        Finding("Across hosts: OVS uses up to 30% less CPU than macvtap for streaming",
                "held if OVS+VXLAN's guest cores (client + server) per Gbit/s are below macvtap's in every "
                "two-host stream cell",
                ratio_verdict(all(b < a for _, a, b in cpu2) if cpu2 else None),
                "; ".join(f"MTU {k[0]} {k[2]}: macvtap {a:.2f}, OVS {b:.2f} cores per Gbit/s ({b / a - 1:+.0%})"
                          for k, a, b in cpu2) or missing or "no pair measured"),
        Finding("Across hosts: macvtap is up to 15% better for highly concurrent transactions",
                "held if macvtap's transactions/s exceed OVS+VXLAN's in every two-host RR cell at the highest "
                "connection count measured",
                Verdict.NOT_MEASURABLE if quick else ratio_verdict(all(a > b for a, b in rr2) if rr2 else None),
                "--quick runs 1 connection only" if quick else
                ("; ".join(f"{top} connections: macvtap {fmt(a)} vs OVS {fmt(b)} txn/s" for a, b in rr2)
                 or missing or "no pair measured"))]
    if quick:
        findings.append(Finding("OVS costs more at high connection counts (up to 250)",
                                "needs the 10-250 connection cells of a full run", Verdict.NOT_MEASURABLE,
                                "--quick runs 1 connection only"))
    caveats = []
    if env.accelerator == "tcg":
        caveats.append("guests ran under TCG: these figures and verdicts are functional checks only, "
                       "never comparable with KVM")
    if tool != STUDY_TOOL:
        caveats.append(f"{tool} ran the same stream and RR patterns instead of {STUDY_TOOL}: {no_uperf}")
    return StudyReport(NAME, STUDY, quick, env_difference(STUDY_ENV, env, (
        ("tool", "uperf", tool), ("virtio backend", "vhost-net", "QEMU userspace virtio (runner default)"),)),
        (table,), tuple(findings), tuple(caveats), run_id=run_id, extra_runs=extra)
