"""The study-shaped tables and verdicts are pure: checked on made-up cell records, so a
verdict rule that always says 'held' would fail here."""
from testbed.scenarios import b_ovs_chain, d_netns_connect, study

ENV = {"cpus": 2, "cpu_mhz": 2600.0, "cpu_model": "CPU X", "kernel": "6.1", "accelerator": "none",
       "versions": {"ovs": "3.1.0"}}


def cell(mbps=None, reason=None, **more):
    if mbps is None:
        return {"status": "failed", "reason": reason or "boom", "summary": {}}
    summary = {"throughput_mbps": {"mean": mbps}, **{k: {"mean": v} for k, v in more.items()}}
    return {"status": "ok", "reason": None, "summary": summary}


def _d(veth_off):
    got = {}
    for kind, _, _ in d_netns_connect.KINDS:
        got[(kind, True, 1)] = cell(20000)
        got[(kind, True, 2)] = cell(30000)
        got[(kind, False, 1)] = cell(veth_off if kind == "veth" else 3000)
        got[(kind, False, 2)] = cell(veth_off if kind == "veth" else 3000)
    return d_netns_connect.report(got, ENV, True, "run", (1, 2))


def _verdict(rep, prefix):
    return next(f.verdict for f in rep.findings if f.claim.startswith(prefix))


def test_offload_finding_follows_the_numbers():
    assert _verdict(_d(3000), "On the veth pair") is study.Verdict.HELD
    assert _verdict(_d(20000), "On the veth pair") is study.Verdict.NOT_HELD
    assert _verdict(_d(20000), "With offloads off every") is study.Verdict.NOT_HELD
    assert _verdict(_d(3000), "With offloads off every") is study.Verdict.HELD


def test_published_beside_measured_and_efficiency():
    rep = _d(3000)
    t = rep.tables[0]
    row = next(r for r in t.rows if r[0] == "veth pair" and r[1] == "on" and r[2] == "1")
    cols = dict(zip(t.columns, row))
    assert cols["measured Gbit/s"] == "20" and cols["published Gbit/s"] == "37.8"
    assert cols["measured Gbit/s per GHz"] == study.fmt(20 / 5.2)
    assert [a for a, _, _ in rep.environment][:3] == ["hardware", "kernel", "accelerator"]


def test_failed_cell_is_not_measurable_never_zero():
    got = {(k, on, n): cell(reason="no OVS") for k, _, _ in d_netns_connect.KINDS for on in (True, False)
           for n in (1, 2)}
    rep = d_netns_connect.report(got, ENV, True, "run", (1, 2))
    assert all(f.verdict is study.Verdict.NOT_MEASURABLE for f in rep.findings)
    assert all(r[3] == "-" and r[7] == "no OVS" for r in rep.tables[0].rows)


def test_chain_findings_and_both_tables():
    flat = {(l, n, 1): cell(10000, host_cores=1.8) for l in ("patch", "veth") for n in (1, 2, 4)}
    flat[("veth", 2, 1)] = cell(8000)
    rep = b_ovs_chain.report(flat, ENV, True, "run", (1, 2, 4), (1,))
    assert len(rep.tables) == 2
    assert _verdict(rep, "With patch ports") is study.Verdict.HELD
    assert _verdict(rep, "With veth pairs") is study.Verdict.HELD
    assert _verdict(rep, "One stream") is study.Verdict.HELD
    flat[("patch", 4, 1)] = cell(5000)
    assert _verdict(b_ovs_chain.report(flat, ENV, True, "run", (1, 2, 4), (1,)), "With patch ports") \
        is study.Verdict.NOT_HELD


def test_render_text_lists_every_finding():
    rep = _d(3000).to_dict()
    text = study.render_text(rep)
    for f in rep["findings"]:
        assert f"[{f['verdict']}] {f['claim']}" in text


def test_report_page_shows_the_study_table_and_verdicts(tmp_path):
    from html import escape

    from testbed.analysis import report
    from testbed.records import results
    from testbed.scenarios import session
    from testbed.topology.model import Attachment
    topo = session.topology("netns-connect", [Attachment("netns-veth")], [d_netns_connect.profile(True, 3)])
    with results.RunWriter(tmp_path, "20260101T000000Z-abcd", topo, ENV) as w:
        pass
    rep = _d(3000)
    study.write(w.dir, rep)
    html = report.render(report.build([results.read_run(w.dir)], generated="now"))
    assert rep.tables[0].title in html and "37.8" in html
    for f in rep.findings:
        assert escape(f.claim, quote=False) in html and f"<strong>{f.verdict.value}</strong>" in html
    assert "the study</th>" in html and "i5 4 cores" in html


def test_hosts_file_applies_only_where_its_placement_fits():
    from testbed.scenarios import session as ses
    from testbed.topology import config
    one = config.parse("guests: [{name: a1}, {name: a2}]\nmatrix: {attachments: [ovs], profiles: [{name: p}]}\n", "o.yaml")
    emulated = config.parse("hosts: [{name: h1, transport: netns}, {name: h2, transport: netns}]\n"
                            "guests: [{name: g1, host: h1}, {name: g2, host: h2}]\ntunnel: {underlay_mtu: 9050}\n"
                            "matrix: {attachments: [ovs-vxlan], profiles: [{name: p}]}\n", "e.yaml")
    real = config.parse("hosts: [{name: ha}, {name: hb, uri: \"qemu+ssh://root@hb/system\", ssh: root@hb}]\n"
                        "guests: [{name: x1, host: ha}, {name: x2, host: hb}]\ntunnel: {underlay: eth1, underlay_mtu: 9050}\n"
                        "matrix: {attachments: [macvtap], profiles: [{name: p}]}\n", "r.yaml")
    assert ses.placed(one, real, two_hosts=False) is one                 # a two-host file leaves one-host parts alone
    two = ses.placed(emulated, real, two_hosts=True)
    assert [h.name for h in two.hosts] == ["ha", "hb"] and two.client == "x1" and two.tunnel.underlay == "eth1"
    assert two.matrix == emulated.matrix
    assert ses.placed(emulated, one, two_hosts=True) is emulated         # a one-host file leaves two-host parts alone
    assert ses.placed(one, one, two_hosts=False).guests == one.guests
