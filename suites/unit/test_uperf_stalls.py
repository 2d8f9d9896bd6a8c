"""uperf runs recorded between two TCG guests (fixtures/recorded/SOURCES.md): four paced
threads of which three stalled, named in the failed sample's reason; and a one-thread UDP
stream whose loss is the slave's count against the master's, as uperf's own Difference(%)
row says."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from testbed.tools import get_tool, uperf
from testbed.tools.base import vet
from testbed.topology.model import Pattern, Profile, Protocol, Tool

pytestmark = pytest.mark.unit

RECORDED = Path(__file__).resolve().parent / "fixtures" / "recorded" / "uperf"
REAL = Path(__file__).resolve().parent / "fixtures" / "uperf-real"
STALLED = RECORDED / "uperf-1.0.8_guests_tcp-rr-paced-500tps-4threads_stalled.txt"
UDP = RECORDED / "uperf-1.0.8_guests_udp-stream-1thread.txt"


def paced_rr() -> Profile:
    # what produced the recording: 4 threads at 500 transactions/s each, 10 s
    return Profile("u_tcp_rr_paced", tool=Tool("uperf"), pattern=Pattern.RR, message_size=64, response_size=64,
                   duration_s=10, rate_tps=2000, rate="2000tps")


def test_stalled_threads_are_named_with_their_counts():
    r = get_tool(Tool("uperf")).parse_sample(STALLED.read_text(), "", 0, profile=paced_rr())
    assert not r.ok and not r.metrics
    assert r.reason.startswith("uperf threads stalled: Thr0 127, Thr2 127, Thr3 127 operations against Thr1 2488"), r.reason
    assert f"more than {uperf.STALL_FACTOR:g}x apart" in r.reason
    # the time it measured over is still said, as the duration check said it before
    assert "2.78 s of the requested 10 s" in r.reason
    assert vet(r, paced_rr()) is r


def test_the_counts_are_the_strand_details_uperf_printed():
    text = STALLED.read_text()
    counts = {m[0]: int(m[1]) for m in re.findall(r"name:(Thr\d+) nr_bytes:\d+ nr_ops:(\d+)", text)}
    assert counts == {"Thr0": 127, "Thr1": 2488, "Thr2": 127, "Thr3": 127}
    # a second source in the same output: the master's row in the run statistics counts
    # the threads' operations together
    master = int(re.search(r"^master\s+\S+\s+\S+\s+\S+\s+(\d+)", text, re.M).group(1))
    assert master == sum(counts.values())
    assert "Thr1" not in uperf.stalled_threads({"Thr0": [(0, 0, 127)], "Thr1": [(0, 0, 2488)]}).split("against")[0]


@pytest.mark.parametrize("factor, stalled", [(4.0, True), (20.0, False)])
def test_the_factor_is_a_stated_threshold(factor, stalled):
    raw = {"Thr0": [(0.0, 0, 127)], "Thr1": [(0.0, 0, 2488)]}
    assert (uperf.stalled_threads(raw, factor) is not None) is stalled


def test_no_recorded_unpaced_run_counts_as_stalled():
    """Every real multi-thread capture besides the stalled one: threads up to 1.8x apart."""
    files = [*RECORDED.glob("*.txt"), *REAL.glob("*.client.out")]
    seen = 0
    for f in files:
        if f == STALLED:
            continue
        out = uperf._scan(uperf._lines(f.read_text()))
        if sum(1 for n in out.raw if n.startswith("Thr")) > 1:
            seen += 1
            assert uperf.stalled_threads(out.raw) is None, f.name
    assert seen >= 5


def test_udp_stream_loss_is_the_slaves_count_against_the_masters():
    p = Profile("u_udp_stream", tool=Tool("uperf"), protocol=Protocol.UDP, pattern=Pattern.STREAM,
                message_size=1400, duration_s=10)
    text = UDP.read_text()
    r = vet(get_tool(Tool("uperf")).parse_sample(text, "", 0, profile=p), p)
    assert r.ok, r.reason
    m = r.metrics
    total = int(re.search(r"name:Total nr_bytes:(\d+)", text).group(1))
    assert m["udp_sent_msgs"] == total / 1400 == 585360
    # the slave row's 746.27MB over 1400-byte datagrams
    assert m["udp_recv_msgs"] == round(746.27 * 2**20 / 1400)
    # uperf's own Difference(%) row: the data column is the same loss
    diff = float(re.search(r"Difference\(%\)\s+\S+\s+([\d.]+)%", text).group(1))
    assert m["loss_pct"] == pytest.approx(diff, abs=0.01)
    assert m["bytes"] == pytest.approx(746.27 * 2**20, abs=1)
    assert 9.9 < m["duration_s"] < 10.1
