"""The rate search on a real shaper: a namespace veth pair whose sending end is limited by a
tbf qdisc to a known rate. The NDR MLRsearch finds through iperf3 lies within the search's
stated precision of that rate, every trial's loss is cross-checked against both devices, and
the loss the receiver counted over all trials is what the shaper says it dropped.

Every object is tb-<random>-..., addressed in 198.18.0.0/15, and removed on exit."""
from __future__ import annotations

import os
import shutil

import pytest

from testbed import bench

pytestmark = [
    pytest.mark.netns,
    pytest.mark.attach("netns"),
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: creates namespaces, veths and a qdisc"),
    pytest.mark.skipif(shutil.which("iperf3") is None, reason="`iperf3` not found (iperf3)"),
]


def test_ndr_on_a_tbf_limited_veth_is_the_limit_within_the_precision():
    r = bench.ndr(limit_mbit=20, precision=0.05, lock=False)
    s = r["search"]
    assert r["stopped"] is None, r["stopped"]
    expected = r["expected_payload_mbps"]
    ndr = s["ndr"]
    # the bounds bracket the shaper's rate and are no wider than the precision; the queue
    # (10 frames) lets a 1 s trial run a little above the rate without loss, hence the 1 %.
    # Below the rate, a sender descheduled for ~10 ms on a busy host and then catching up
    # loses a few datagrams: the bench's goals (exceed ratio 0.5 over 4 s of trials) let one
    # such trial at a load pass; two at the same load still lower the NDR, hence 10 % below
    # (above the rate stays at 1 %: nothing passes a shaper faster).
    below = 0.90
    assert (r["exceed_ratio"], r["duration_sum_s"]) == (0.5, 4), r
    assert ndr["relative_width"] <= 0.05 + 1e-9, ndr
    assert expected * (1 - 0.05) * below <= ndr["lower_mbps"] <= expected * 1.01, (ndr, expected)
    assert ndr["upper_mbps"] >= expected * below, (ndr, expected)
    assert (1 - 0.05) * below <= r["ndr_ratio"] <= 1.05, r["ndr_ratio"]
    assert s["pdr"]["lower_mbps"] >= ndr["lower_mbps"]
    # every trial checked against the wire, and the search did run into loss
    assert r["wire_verdicts"] and set(r["wire_verdicts"]) == {"ok"}, r["trials"]
    lossy = [t for t in r["trials"] if t["lost"]]
    assert lossy, "no trial lost anything: the shaper was never reached"
    for t in r["trials"]:
        w = t["wire"]
        assert w["sender_datagrams"] >= w["receiver_datagrams"] >= t["received"] - w["slack"], t
    # a second source for the loss: what the receiver counted lost is what tbf dropped
    lost = sum(t["lost"] for t in r["trials"])
    assert abs(lost - r["qdisc_drops"]) <= 3 * len(r["trials"]) + 0.01 * r["qdisc_drops"], (lost, r["qdisc_drops"])
    assert s["trials"] == len(r["trials"]) and s["wall_s"] > s["trial_seconds"] > 0
