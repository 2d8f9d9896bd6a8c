"""A team's per-attachment-mode network tests: copy this file into the team's tests folder
and edit the matrix. The testbed's pytest plugin comes with the package (nothing to import,
no conftest.py); docs/tests.md describes every option, marker and fixture.

    pytest tests/ --attach bridge          # one mode (-k bridge would take netns-bridge too)
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
    p50, p99 = s.metrics.get("latency_p50_us"), s.metrics.get("latency_p99_us")
    if p50 and p99:     # a p99 from too few transactions (a busy host, a short RR sample) is
        assert p99 >= p50 > 0   # left out of the metrics, never guessed: test it when present
