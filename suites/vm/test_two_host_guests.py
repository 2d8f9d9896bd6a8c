"""Guests on two hosts emulated on this machine, joined over VXLAN: the session guest pair
is placed on host ha (g1, client) and hb (g2, server), and netperf TCP_STREAM and TCP_RR run
between them over bridge-vxlan and over ovs-vxlan.

Measured facts: both profiles give ok samples; the taps (inside the host namespaces) carried
what netperf reported; a capture on the wire between the hosts saw only UDP/4789 frames; the
guests' taps never stayed in the root namespace; host networking is as it was afterwards.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from testbed import attachments
from testbed.admin import cleanup
from testbed.analysis import stats
from testbed.guests import guestnic
from testbed.host import proc
from testbed.host.net import vxlan
from testbed.measure import sampling as measure
from testbed.measure import testpaths
from testbed.topology import config
from testbed.topology.model import Attachment, Backend, Cell, Pattern, Profile, Repetitions

pytestmark = [
    pytest.mark.vm,
    pytest.mark.skipif(shutil.which("tcpdump") is None, reason="`tcpdump` not found (tcpdump)"),
]

PLACEMENT = """\
hosts:
  - {name: ha, transport: netns}
  - {name: hb, transport: netns}
guests:
  - {name: g1, host: ha}
  - {name: g2, host: hb}
"""
TOPOLOGY = PLACEMENT + """\
tunnel: {underlay_mtu: 1550}
matrix:
  attachments: [bridge-vxlan, ovs-vxlan]
  profiles: [{name: tcp_stream}]
"""
PROFILES = [Profile("tcp_stream", pattern=Pattern.STREAM, message_size=16384, duration_s=3),
            Profile("tcp_rr", pattern=Pattern.RR, message_size=1, response_size=1, duration_s=5)]
MODES = [pytest.param(a, marks=pytest.mark.attach(a.value), id=a.value)
         for a in (Attachment("bridge-vxlan"), Attachment("ovs-vxlan"))]


@pytest.mark.parametrize("attachment", MODES)
def test_guests_on_two_hosts(guest_pair, attachment, tmp_path, run_writer):
    why = attachments.unavailable(attachment)
    if why:
        pytest.skip(f"attachment {attachment.value} unavailable: {why}")
    topo = config.parse(TOPOLOGY, "two-hosts.yaml", Path.cwd())
    gp = guest_pair
    tag = gp.tag
    before = cleanup.Baseline.take()      # other tests' runs beside this one are left out
    placement = {"g1": "ha", "g2": "hb"}
    writer = run_writer       # the session's run record (pytest_plugin.run_writer)
    with testpaths.mode(attachment, Backend.QEMU, tag, gp.client, gp.server, topo.subnet, 1500, topology=topo,
                     workdir=tmp_path) as path:
        # The taps live in their hosts' namespaces, not in the root one.
        root = proc.run(["ip", "-o", "link"], timeout=10).stdout
        assert path.client.tap not in root and path.server.tap not in root
        with vxlan.capture(*vxlan.emulated_host(tag, 0), tmp_path / "wire.pcap") as pcap:
            samples = {p.name: measure.measure_cell(Cell(attachment, Backend.QEMU, 1500, 1, p), path, writer,
                                                    stats.StoppingRule(Repetitions()), 0, {}, placement)
                       for p in PROFILES}
    for name, ss in samples.items():
        assert len(ss) == 1 and ss[0].status == "ok", (name, ss[0].reason)
        assert ss[0].placement == placement
    s = samples["tcp_stream"][0]
    tput = s.metrics["throughput_mbps"]
    assert tput > 0
    dev = s.data["device_mbps"]
    assert 0.6 * tput < dev[path.client.tap]["from_guest"] < 1.2 * tput, dev
    assert 0.6 * tput < dev[path.server.tap]["to_guest"] < 1.2 * tput, dev
    # What the guests' NICs report is recorded: on ovs-vxlan the device offers no checksum offload.
    if attachment == Attachment("ovs-vxlan"):
        assert all(s.data["offloads"][g]["tx"].startswith("off") for g in ("g1", "g2")), s.data["offloads"]
    else:
        assert s.data["offloads"]["g1"]["tx"].startswith("on"), s.data["offloads"]
    rr = samples["tcp_rr"][0]
    assert rr.metrics["transactions_per_s"] > 0
    total, other = vxlan.read_capture(pcap, topo.tunnel.udp_port)
    assert total > 100
    assert other == [], other[:5]
    assert before.changes() == []
    assert not [n for n in proc.run(["ip", "netns", "list"], timeout=10).stdout.split() if n.startswith(f"tb-{tag}-h")]


MACVTAP_TOPOLOGY = PLACEMENT + """\
matrix:
  attachments: [macvtap]
  mtus: [1500, 9000]
  profiles: [{name: tcp_stream}]
"""


@pytest.mark.attach("macvtap")
def test_macvtap_across_two_hosts(guest_pair, tmp_path, run_writer):
    """macvtap across hosts: each guest's macvtap sits on its host's end of the wire, so the
    wire carries the guests' own frames (no tunnel), at the cell's MTU; the macvtaps end up
    in the host namespaces and nothing is left anywhere afterwards."""
    why = attachments.unavailable(Attachment("macvtap"))
    if why:
        pytest.skip(f"attachment macvtap unavailable: {why}")
    topo = config.parse(MACVTAP_TOPOLOGY, "two-hosts-macvtap.yaml", Path.cwd())
    assert attachments.get(Attachment("macvtap")).across(topo)
    gp = guest_pair
    tag = gp.tag
    before = cleanup.Baseline.take()      # other tests' runs beside this one are left out
    placement = {"g1": "ha", "g2": "hb"}
    ns_a, wire_a = vxlan.emulated_host(tag, 0)
    profile = Profile("tcp_stream", pattern=Pattern.STREAM, message_size=16384, duration_s=4)
    writer = run_writer       # the session's run record (pytest_plugin.run_writer)
    with testpaths.mode(Attachment("macvtap"), Backend.QEMU, tag, gp.client, gp.server, topo.subnet, 9000,
                     topology=topo, workdir=tmp_path) as path:
        root = proc.run(["ip", "-o", "link"], timeout=10).stdout
        assert path.client.tap not in root and path.server.tap not in root
        host_a = proc.run(["ip", "-d", "-o", "link", "show", "dev", path.client.tap], netns=ns_a,
                          timeout=10).stdout
        assert "macvtap" in host_a and f"@{wire_a}" in host_a, host_a
        samples = {}
        for mtu in (9000, 1500):
            measure.set_mtu(path, mtu)
            with vxlan.capture(ns_a, wire_a, tmp_path / f"wire{mtu}.pcap") as pcap:
                samples[mtu] = measure.measure_cell(Cell(Attachment("macvtap"), Backend.QEMU, mtu, 1, profile),
                                                    path, writer, stats.StoppingRule(Repetitions()), 0, {},
                                                    placement)[0]
            macs = [guestnic.mac(tag, i, 0) for i in (0, 1)]
            frames = proc.run(["tcpdump", "-n", "-e", "-r", str(pcap)], timeout=60).stdout.splitlines()
            strangers = proc.run(["tcpdump", "-n", "-e", "-r", str(pcap),
                                  f"not (ether src {macs[0]} or ether src {macs[1]})"],
                                 timeout=60).stdout.splitlines()
            assert len(frames) > 100 and strangers == [], strangers[:5]
            # The guests' own TCP segments, not encapsulated. (Their sizes say nothing of the
            # MTU: a veth wire passes the guest's TSO frames unsegmented.)
            tcp = [ln for ln in frames if "198.18.0.1." in ln and " > 198.18.0.2." in ln]
            assert len(tcp) > 50 and not [ln for ln in frames if "udp" in ln.lower() and ".4789" in ln]
    for mtu, s in samples.items():
        assert s.status == "ok", (mtu, s.reason)
        assert s.placement == placement
        assert s.data["datapath"] == "macvtap-bridge-wire"
        tput = s.metrics["throughput_mbps"]
        dev = s.data["device_mbps"]
        assert 0.6 * tput < dev[path.client.tap]["from_guest"] < 1.2 * tput, dev
    assert before.changes() == []
    leftovers = [n for n in proc.run(["ip", "netns", "list"], timeout=10).stdout.split()
                 if n.startswith(f"tb-{tag}-")]
    assert leftovers == []
