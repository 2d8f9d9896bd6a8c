"""sockperf between the session's guest pair on the Linux bridge: the guest image carries it
(Debian main), and a ping-pong cell gives a p99.9 computed from every message the client
timed, marked sufficient, with its requests and replies agreeing with the taps' packets."""
from __future__ import annotations

import pytest

from testbed import attachments
from testbed.analysis import stats
from testbed.guests import virt
from testbed.measure import sampling as measure
from testbed.measure import testpaths
from testbed.records import percentiles
from testbed.topology.model import Attachment, Backend, Cell, Pattern, Profile, Protocol, Repetitions, Tool

pytestmark = pytest.mark.vm

# 60 s: p99.9 needs 10,000 messages behind it. A TCG guest pair answered about 1,700
# ping-pongs a second on a 2-core host running only the suite, but 300-350 a second while
# the suite's other workers ran beside it (15 s then timed 4,400-5,200 messages: the sample
# was ok and its p99.9 rightly insufficient; 3,530 once, at 235 a second); 60 s times 14,000 at that rate
PING = Profile("udp_rr", tool=Tool("sockperf"), protocol=Protocol.UDP, pattern=Pattern.RR, message_size=64,
               duration_s=60, percentiles=(50.0, 99.0, 99.9))


@pytest.mark.attach("bridge")
def test_sockperf_ping_pong_in_guests_gives_a_sufficient_p99_9(guest_pair, run_writer):
    why = attachments.unavailable(Attachment("bridge"))
    if why:
        pytest.skip(f"attachment bridge unavailable: {why}")
    gp = guest_pair
    cell = Cell(Attachment("bridge"), Backend.QEMU, 1500, 1, PING)
    with testpaths.mode(cell.attachment, cell.backend, gp.tag, gp.client, gp.server, "198.18.0.0/24",
                        cell.mtu) as path:
        pids = {g.spec.name: virt.qemu_pid(g) for g in (gp.client, gp.server)}
        # Measured again once when the first sample failed: over 60 s a TCG guest on a busy
        # 2-core host can stall for seconds (the wire counters then stop and the sample is
        # failed, as it must be); a second failure fails the test with its reason.
        for _ in range(2):
            [s] = measure.measure_cell(cell, path, run_writer, stats.StoppingRule(Repetitions()), 0, pids,
                                       {"g1": "local", "g2": "local"})
            if s.status == "ok":
                break
    assert s.status == "ok", s.reason
    m = s.crosscheck.extra["messages"]
    assert m["verdict"] == "ok", m
    assert m["wire_from_client"] >= m["sent"] > 0 and m["wire_to_client"] >= m["replied"], m
    by = {p["p"]: p for p in s.data["percentiles"]}
    assert by[99.9]["source"] == "histogram", by[99.9]
    if by[99.9]["n"] < percentiles.required(99.9):
        # A host busy with other work slows the TCG guests below what 15 s needs: the figure
        # must then say so (insufficient, never a p99.9 on too few messages)
        assert not by[99.9]["sufficient"] and "latency_p99_9_us" not in s.metrics, by[99.9]
        pytest.skip(f"host too busy for a p99.9 in {PING.duration_s:g} s: {by[99.9]['n']} messages timed, "
                    f"{percentiles.required(99.9)} needed (the sample marked it insufficient, as it must)")
    assert by[99.9]["sufficient"] and s.metrics["latency_p99_9_us"] == by[99.9]["value_us"]
    assert s.metrics["latency_p99_9_us"] >= s.metrics["latency_p50_us"] > 0
