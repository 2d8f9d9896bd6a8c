"""The real traffic tools between namespaces on this host: each driver's argv, run by the
tool itself, parses into a result with figures (and a missing server into the tool's own
reason). They create namespaces, so they are in the netns tier (root), not the unit tier."""
from __future__ import annotations

import os
import time

import pytest

from testbed.host import proc
from testbed.measure.session import claim_tag
from testbed.measure.transfer import wait_listening
from testbed.tools import get_tool
from testbed.topology.model import Pattern, Profile, Protocol, Tool

pytestmark = pytest.mark.netns

NETPERF = get_tool(Tool("netperf"))
IPERF3 = get_tool(Tool("iperf3"))
UPERF = get_tool(Tool("uperf"))


def nprof(protocol: Protocol, pattern: Pattern, **kw) -> Profile:
    return Profile("p", tool=Tool("netperf"), protocol=protocol, pattern=pattern, **kw)


def iprof(pattern: Pattern, protocol: Protocol = Protocol.TCP, **kw) -> Profile:
    return Profile("p", tool=Tool("iperf3"), protocol=protocol, pattern=pattern, **kw)


def uprof(pattern: Pattern, protocol: Protocol = Protocol.TCP, **kw) -> Profile:
    return Profile("p", tool=Tool("uperf"), protocol=protocol, pattern=pattern, **kw)


# -- the real netperf between two namespaces --------------------------------------------
# netns_pair comes from testbed.pytest_plugin.

@pytest.mark.netns
@pytest.mark.parametrize("protocol,pattern,extra", [
    (Protocol.TCP, Pattern.STREAM, dict(confidence=(99, 5), iterations=(3, 3))),
    (Protocol.TCP, Pattern.MAERTS, {}),
    (Protocol.TCP, Pattern.RR, {}),
    (Protocol.UDP, Pattern.STREAM, {}),
], ids=["tcp_stream-confidence", "tcp_maerts", "tcp_rr", "udp_stream"])
def test_real_netperf(netns_pair, tmp_path, protocol, pattern, extra) -> None:
    client, server, addr = netns_pair
    profile = nprof(protocol, pattern, duration_s=1)
    with proc.background(NETPERF.server_argv(profile, port=12866), out_dir=str(tmp_path),
                         name="netserver", netns=server) as srv:
        wait_listening(server, 12866, srv)
        argv = NETPERF.client_argv(profile, addr, port=12866, **extra)
        argv[argv.index("--"):argv.index("--")] = ["-D", "0.3"]     # interim keyval lines too
        done = proc.run(argv, netns=client, timeout=60, check=False)
    result = NETPERF.parse(done.stdout, done.stderr, done.rc)
    assert result.ok, f"{result.reason}\n{done.stdout}"
    rate = result.metrics.get("throughput_mbps", 0) + result.metrics.get("transactions_per_s", 0)
    assert rate > 0 and result.metrics["duration_s"] > 0 and result.intervals
    if pattern.is_transactional:
        assert result.metrics["latency_p99_us"] >= result.metrics["latency_p50_us"] > 0
    if protocol is Protocol.UDP:
        assert result.metrics["udp_sent_msgs"] >= result.metrics["udp_recv_msgs"] > 0
    if extra:
        assert "confidence_achieved" in result.metrics


@pytest.mark.netns
def test_real_netperf_without_server_fails(netns_pair) -> None:
    client, _, addr = netns_pair
    done = proc.run(NETPERF.client_argv(nprof(Protocol.TCP, Pattern.STREAM, duration_s=1), addr,
                                        port=12899), netns=client, timeout=60, check=False)
    result = NETPERF.parse(done.stdout, done.stderr, done.rc)
    assert not result.ok and "are you sure there is a netserver listening" in (result.reason or "")


# -- the real iperf3 between two namespaces ---------------------------------------------
# netns_pair comes from testbed.pytest_plugin.

@pytest.mark.netns
@pytest.mark.parametrize("profile", [
    iprof(Pattern.STREAM, duration_s=1), iprof(Pattern.MAERTS, duration_s=1),
    iprof(Pattern.BIDIRECTIONAL, duration_s=1),
    iprof(Pattern.STREAM, Protocol.UDP, duration_s=1, rate_bps=200_000_000),
], ids=["tcp_stream", "tcp_maerts", "tcp_bidir", "udp_stream"])
def test_real_iperf3(netns_pair, tmp_path, profile: Profile) -> None:
    client, server, addr = netns_pair
    with proc.background(IPERF3.server_argv(profile, port=5202), out_dir=str(tmp_path),
                         name="iperf3-s", netns=server) as srv:
        wait_listening(server, 5202, srv)
        done = proc.run(IPERF3.client_argv(profile, addr, port=5202), netns=client, timeout=60,
                        check=False)
        srv.wait(timeout=10)                 # -1: the server leaves after one test
    result = IPERF3.parse(done.stdout, done.stderr, done.rc)
    assert result.ok, result.reason
    assert result.metrics["throughput_mbps"] > 0 and result.intervals
    if profile.protocol is Protocol.UDP:
        assert result.metrics["udp_sent_msgs"] >= result.metrics["udp_recv_msgs"] > 0
        assert "jitter_ms" in result.metrics


@pytest.mark.netns
def test_real_iperf3_without_server_fails(netns_pair) -> None:
    client, _, addr = netns_pair
    done = proc.run(IPERF3.client_argv(iprof(Pattern.STREAM, duration_s=1), addr, port=5299),
                    netns=client, timeout=60, check=False)
    result = IPERF3.parse(done.stdout, done.stderr, done.rc)
    assert not result.ok and "unable to connect to server" in (result.reason or "")


# -- the real uperf, where it is installed --------------------------------------------------

@pytest.mark.netns
def test_real_uperf(tmp_path) -> None:
    if not proc.ok(["uperf", "-V"]):
        pytest.skip("uperf is not installed (not packaged for Debian)")
    if os.geteuid() != 0:
        pytest.skip("needs root to create network namespaces")
    ns = f"tb-{claim_tag()}-u"       # registered: runs beside this test leave it alone
    try:
        if proc.run(["ip", "netns", "add", ns], check=False).rc != 0:
            pytest.skip("`ip netns add` failed")
        proc.run(["ip", "link", "set", "lo", "up"], netns=ns)
        proc.run(["ip", "addr", "add", "198.18.251.1/32", "dev", "lo"], netns=ns)
        profile = uprof(Pattern.RR, duration_s=2)
        path = tmp_path / "rr.xml"
        path.write_text(UPERF.profile_xml(profile, "198.18.251.1", 2))
        with proc.background(UPERF.server_argv(profile, port=20010), out_dir=str(tmp_path),
                             name="uperf-s", netns=ns):
            deadline = time.monotonic() + 10
            while not proc.run(["ss", "-Hltn", "sport = :20010"], netns=ns).stdout.strip():
                assert time.monotonic() < deadline, "uperf -s not listening after 10 s"
                time.sleep(0.1)
            done = proc.run(UPERF.client_argv(profile, "198.18.251.1", port=20010,
                                              profile_path=str(path)),
                            netns=ns, timeout=60, check=False)
        result = UPERF.parse(done.stdout, done.stderr, done.rc)
        assert result.ok, result.reason
        assert result.metrics["transactions_per_s"] > 0 and result.intervals
    finally:
        proc.run(["ip", "netns", "del", ns], check=False)
