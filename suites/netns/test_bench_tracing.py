"""`testbed bench tracing` for real: on a namespace bridge, the untraced cell, the hop
tracer's probes with empty programs, the hop tracer, and the hop tracer counting BPF's run
time, interleaved. The counted arm's probe hits per transaction are a second source for
what the tracer saw: a 1-byte request/response over a bridge crosses seven points each way
(the send, four device points, the socket's data-ready and the receive)."""
from __future__ import annotations


import pytest

from testbed._suite_plugin import leftover_tracers, skip_unless_namespace_tracing
from testbed.bench import tracing
from testbed.host import bpftrace, shareduse

pytestmark = [pytest.mark.netns, pytest.mark.attach("netns")]


def test_the_bench_measures_each_arm_and_the_probes_see_every_point_of_a_transaction():
    skip_unless_namespace_tracing()
    flavour, _ = bpftrace.host_flavour()
    r = tracing.run(rounds=1, duration=2)
    assert not r["failures"], r["failures"]
    s = r["summary"]
    assert [s[a]["n"] for a in tracing.ARMS] == [1, 1, 1, 1]
    assert all(s[a]["tps"] > 1000 for a in tracing.ARMS), s
    counted = s["counted"]
    points = 14 if flavour.send_probe else 8        # without socket probes: the device points only
    # at least every point of every transaction; more on a host with other traffic (the
    # probes fire for every packet of the host: CI's other workers read 23 a transaction)
    assert counted["hits_per_transaction"] >= points - 0.5, counted
    assert counted["bpf_ns_per_event"] > 0 and counted["bpf_cores"] > 0, counted
    # the arms that did not count BPF's run time have no such figures
    assert s["hops"]["bpf_ns_per_event"] is None and s["probes"]["hits_per_transaction"] is None
    # nothing left: no tracer running, tracefs as it was
    assert not leftover_tracers()
    # tracefs as the host had it: mounted by a testbed process only while one still uses it
    # (tests on other workers may), never left mounted by the last one out
    assert not shareduse.left("tracefs")
