"""A team's per-attachment-mode network tests: copy this file into the team's tests folder
and edit the matrix. The testbed's pytest plugin comes with the package (nothing to import,
no conftest.py); docs/tests.md describes every option, marker and fixture.

    pytest tests/ --attach bridge          # one mode (or -k bridge)
    pytest tests/ --attach bridge,ovs      # two
    pytest tests/ --attach netns           # no VMs: the host's namespace datapath, a reference
"""
import pytest


@pytest.mark.testbed(attachments=["bridge", "ovs", "macvtap", "netns-veth"], mtus=[1500],
                     profiles=["tcp_stream", "tcp_rr"], duration=5)
@pytest.mark.testbed_floor(tcp_stream=5000, tcp_rr=10000)     # Mbit/s, transactions/s; KVM only
def test_mode(testbed_cell):
    s = testbed_cell.measure()      # a failed sample (tool, wire or CPU cross-check) fails the test
    assert s.metrics[testbed_cell.metric] > 0
    if s.metrics.get("latency_p50_us"):
        assert s.metrics["latency_p99_us"] >= s.metrics["latency_p50_us"] > 0
