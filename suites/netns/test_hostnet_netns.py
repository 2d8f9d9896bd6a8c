"""testbed.host.net.netns and macvtap on real objects: every connection of studies B and D
carries a real netperf TCP_STREAM between two namespaces, and the interface counters on
the path account for what netperf says arrived.

Every object is tb-<random>-..., addressed in 198.18.0.0/15, and each test checks that
nothing with its tag is left in `ip -o link`, `ip netns list` or `ovs-vsctl list-br`.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from testbed import errors
from testbed.attachments import bridge as bridge_mode
from testbed import attachments as nsconn
from testbed.attachments.macvtap import namespaces as mvns
from testbed.attachments.macvtap import plumbing as macvtap
from testbed.attachments.ovs import namespaces as ovsns
from testbed.guests import render
from testbed.host import proc
from testbed.host.net import links, netns, ovs, ovsd
from testbed.measure import transfer
from testbed.measure.session import claim_tag
from testbed.topology.model import Backend, Profile

pytestmark = [
    pytest.mark.netns,
    pytest.mark.attach("netns"),
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: creates namespaces, veths, bridges"),
    *[pytest.mark.skipif(shutil.which(tool) is None, reason=f"`{tool}` not found ({pkg})")
      for tool, pkg in (("ip", "iproute2"), ("ss", "iproute2"), ("ethtool", "ethtool"),
                        ("netperf", "netperf, Debian non-free"), ("netserver", "netperf, Debian non-free"))],
]

STREAM = Profile(name="tcp_stream", duration_s=2)
ON, OFF = netns.Offloads.all(True), netns.Offloads.all(False)


def new_tag() -> str:
    # tb-<4 hex>-... stays within 15 bytes; registered as this process's, so a concurrent
    # `testbed cleanup` or test session leaves the test's objects alone
    return claim_tag()


def leftovers(tag: str) -> list[str]:
    mark = f"tb-{tag}-"
    found = [f"link {ln.split(':')[1].strip()}"
             for ln in proc.run(["ip", "-o", "link"]).stdout.splitlines() if mark in ln]
    found += [f"netns {ln.split()[0]}" for ln in proc.run(["ip", "netns", "list"]).stdout.splitlines()
              if ln.startswith(mark)]
    res = proc.run(["ovs-vsctl", "--timeout=5", "list-br"], check=False) \
        if shutil.which("ovs-vsctl") else None
    if res is not None and res.rc == 0:
        found += [f"ovs bridge {b}" for b in res.stdout.split() if b.startswith(mark)]
    return found


@pytest.fixture(scope="module")
def switch() -> ovsd.Ovs:
    try:
        return ovsd.ensure_running()
    except (errors.CapabilityError, errors.TestbedError) as e:
        pytest.skip(f"ovs-vswitchd not startable: {e}")


def check_transfer(conn: netns.Connection, tr: transfer.Transfer) -> None:
    assert tr.result.ok, f"{conn.description}: {tr.result.reason}; hop bytes {tr.hop_bytes}"
    m = tr.result.metrics
    assert m["throughput_mbps"] > 0
    # Counters include headers (and retransmissions), so each hop moved at least the payload
    # netserver received.
    for hop, moved in zip(conn.hops, tr.hop_bytes):
        assert moved >= m["bytes"], f"{hop.ifname} {hop.a_to_b} moved {moved} < {m['bytes']} bytes"


def check_offloads(conn: netns.Connection, want: netns.Offloads) -> None:
    if want is OFF:
        for ep in (conn.a, conn.b):
            assert all(state.startswith("off") for _, state in ep.offloads), (ep.ifname, ep.offloads)


def check_shape(conn: netns.Connection, tag: str) -> None:
    assert conn.a.netns == f"tb-{tag}-a" and conn.b.netns == f"tb-{tag}-b"
    for name in [conn.a.ifname, conn.b.ifname, *(h.ifname for h in conn.hops), *conn.bridges]:
        assert name.startswith(f"tb-{tag}-") and len(name) <= 15, name
    import ipaddress
    for ep in (conn.a, conn.b):
        assert ipaddress.ip_address(ep.address) in netns.BENCH_NET


CASES = [
    ("veth", {}),
    ("bridge", {}),
    ("ovs-veth", {}),
    ("ovs-internal", {}),
    *[("ovs-chain", {"chain": n, "link": link}) for link in ("patch", "veth") for n in (1, 2, 4)],
]


def case_id(case) -> str:
    kind, kw = case
    return f"{kind}-{kw['link']}{kw['chain']}" if kw else kind


@pytest.mark.parametrize("offloads", [ON, OFF], ids=["offloads_on", "offloads_off"])
@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_tcp_stream_between_namespaces(case, offloads, tmp_path: Path, request: pytest.FixtureRequest):
    kind, kw = case
    kw = dict(kw)
    if kind.startswith("ovs"):
        sw = request.getfixturevalue("switch")
        if not ovs.userspace_tso(sw):
            if offloads is ON:
                pytest.skip("the running ovs-vswitchd has the userspace datapath without "
                            "userspace-tso-enable: TCP with tx checksum offload on cannot pass")
            kw["tso"] = False
    tag = new_tag()
    with nsconn.connect(kind, tag, offloads=offloads, **kw) as conn:
        check_shape(conn, tag)
        check_offloads(conn, offloads)
        tr = transfer.netperf(conn, STREAM, out_dir=str(tmp_path))
        check_transfer(conn, tr)
    assert leftovers(tag) == []


@pytest.mark.parametrize("mode", list(macvtap.MacvtapMode), ids=[m.value for m in macvtap.MacvtapMode])
def test_tcp_stream_over_the_macvtap_segment(mode, tmp_path: Path):
    """The macvtap segment's wiring, with macvlans (macvtap's forwarding code) standing in for
    guests: bridge mode switches between them, vepa needs the hairpin, passthrough the wire."""
    tag = new_tag()
    with mvns.macvlan(tag, mode) as conn:
        check_shape(conn, tag)
        tr = transfer.netperf(conn, STREAM, out_dir=str(tmp_path))
        check_transfer(conn, tr)
    assert leftovers(tag) == []


def test_offloads_are_set_per_endpoint_and_recorded():
    tag = new_tag()
    with netns.veth_pair(tag, offloads=(OFF, netns.Offloads(gro=True))) as conn:
        assert conn.a.offload("tx") == "off" and conn.a.offload("tso") == "off"
        assert conn.b.offload("gro") == "on" and conn.b.offload("tx") == "on"
        # lro cannot be switched on a veth: the request is recorded as the kernel answered it
        assert conn.a.offload("lro").startswith("off")
        assert netns.read_offloads(conn.b.ifname, conn.b.netns) == conn.b.offloads
    assert leftovers(tag) == []


def test_everything_is_removed_when_the_block_fails(switch):
    tag = new_tag()
    tso = ovs.userspace_tso(switch)
    with pytest.raises(RuntimeError, match="boom"):
        with ovsns.ovs_chain(tag, 2, "veth", tso=tso,
                             offloads=None if tso else netns.Offloads(tx=False)) as conn:
            assert leftovers(tag)                  # it was all there
            assert len(conn.bridges) == 2
            raise RuntimeError("boom")
    assert leftovers(tag) == []


def test_a_failed_setup_leaves_nothing():
    tag = new_tag()
    # the second namespace's name is taken, so setup fails half-way
    taken = f"tb-{tag}-b"
    proc.run(["ip", "netns", "add", taken])
    try:
        with pytest.raises(errors.CommandError, match="File exists"):
            with bridge_mode.linux_bridge(tag):
                pass
        assert leftovers(tag) == [f"netns {taken}"]
    finally:
        proc.run(["ip", "netns", "delete", taken], check=False)
    assert leftovers(tag) == []


@pytest.mark.parametrize("subnet", ["10.0.0.0/24", "198.20.0.0/24", "198.18.0.0/31"])
def test_addresses_outside_the_benchmark_range_are_refused(subnet):
    tag = new_tag()
    with pytest.raises(errors.TestbedError, match="198.18.0.0/15"):
        with netns.veth_pair(tag, subnet=subnet):
            pass
    assert leftovers(tag) == []


def test_chain_length_is_checked():
    with pytest.raises(errors.TestbedError, match="1 to 9"):
        with ovsns.ovs_chain(new_tag(), 10):
            pass


# --------------------------------------------------------------------------- macvtap segment

@pytest.mark.parametrize("mode", list(macvtap.MacvtapMode), ids=[m.value for m in macvtap.MacvtapMode])
def test_macvtap_segment_takes_macvtaps_on_its_veth_lower(mode):
    tag = new_tag()
    with macvtap.segment(tag, 1500, mode) as seg:
        assert (seg.lower, seg.peer) == (f"tb-{tag}-lw0", f"tb-{tag}-lw1")
        assert seg.datapath == f"macvtap-{mode.value}"
        assert (seg.hairpin is not None) == (mode is macvtap.MacvtapMode.VEPA)
        taps = [f"tb-{tag}-t0", f"tb-{tag}-t1"]
        # nic() comes before the device, as with libvirt, which creates it on <source dev>
        first = seg.nic(taps[0], "52:54:00:00:00:01", Backend.QEMU, 1500)
        assert (first.kind, first.source, dict(first.options)["mode"]) == ("direct", seg.lower, mode.value)
        with macvtap.macvtap(taps[0], first.source, mode) as t0:
            second = seg.nic(taps[1], "52:54:00:00:00:02", Backend.QEMU, 1500).source
            # passthrough takes the whole lower: the second guest gets the other veth end
            if mode is macvtap.MacvtapMode.PASSTHROUGH:
                assert second == seg.peer
                with pytest.raises(errors.CommandError, match="Invalid argument"):
                    with macvtap.macvtap(f"tb-{tag}-tx", seg.lower, mode):
                        pass
            else:
                assert second == seg.lower
            with macvtap.macvtap(taps[1], second, mode) as t1:
                for t in (t0, t1):
                    idx = int(Path(f"/sys/class/net/{t}/ifindex").read_text())
                    assert Path(f"/dev/tap{idx}").exists(), f"/dev/tap{idx} for {t}"
                seg.set_mtu(9000, taps)
                assert [links.mtu_of(d) for d in (seg.lower, *taps)] == [9000] * 3
                seg.set_mtu(1400, taps)
                assert [links.mtu_of(d) for d in (seg.lower, seg.peer, *taps)] == [1400] * 4
                expected = taps if mode is macvtap.MacvtapMode.BRIDGE else [*taps, seg.lower, seg.peer]
                assert seg.hops(taps) == expected
        xml = render.interface_xml(first)
        assert "<interface type='direct'>" in xml
        assert f"<source dev='{seg.lower}' mode='{mode.value}'/>" in xml
        assert f"<target dev='{taps[0]}'/>" in xml
    assert leftovers(tag) == []


def test_macvtap_targets_must_be_testbed_names():
    tag = new_tag()
    with macvtap.segment(tag, 1500) as seg:
        for bad in ("macvtap0", "vnet3", "eth1"):
            with pytest.raises(errors.TestbedError):
                seg.nic(bad, "52:54:00:00:00:01", Backend.QEMU, 1500)
    assert leftovers(tag) == []
