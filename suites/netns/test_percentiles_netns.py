"""Chosen percentiles on a real netperf TCP_RR between two namespaces: each records the
transactions behind it (the sample's rate x its interval), the ones netperf's selectors give
are metrics, and p99.9, which Debian's netperf cannot give (no histogram in its build), is
recorded as unavailable, never guessed.

Every object is tb-<random>-..., addressed in 198.18.0.0/15, and removed on exit."""
from __future__ import annotations

import os
import shutil

import pytest

from testbed import bench
from testbed.measure import sampling as measure
from testbed.records import percentiles
from testbed.topology.model import Attachment, Backend, Cell, Pattern, Profile

pytestmark = [
    pytest.mark.netns,
    pytest.mark.attach("netns"),
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: creates namespaces and veths"),
    *[pytest.mark.skipif(shutil.which(t) is None, reason=f"`{t}` not found (netperf, Debian non-free)")
      for t in ("netperf", "netserver")],
]


def test_rr_sample_records_each_percentile_with_its_transactions():
    profile = Profile("tcp_rr", pattern=Pattern.RR, message_size=1, response_size=1, duration_s=2,
                      percentiles=(50.0, 99.0, 99.9))
    cell = Cell(Attachment("netns-veth"), Backend.QEMU, 1500, 1, profile)
    with bench.netns_bench(Attachment("netns-veth"), lock=False) as (_, writer, path):
        s = measure.measure_once(cell, path, writer, 0, False, {}, {}, None)
    assert s.status == "ok", s.reason
    by = {p["p"]: p for p in s.data["percentiles"]}
    n = round(s.metrics["transactions_per_s"] * s.metrics["duration_s"])
    assert set(by) == {50.0, 99.0, 99.9}
    for p in by.values():
        assert p["n"] == n and p["required"] == percentiles.required(p["p"])
    # thousands of transactions a second on a veth: p50 and p99 rest on enough
    assert n >= 1000 and by[99.0]["sufficient"] and by[99.0]["source"] == "tool"
    assert s.metrics["latency_p99_us"] == by[99.0]["value_us"] >= s.metrics["latency_p50_us"]
    # netperf's selectors stop at P99 and this build prints no histogram
    assert not by[99.9]["sufficient"] and by[99.9]["value_us"] is None and by[99.9]["source"] == "unavailable"
    assert "latency_p99_9_us" not in s.metrics and "latency_p90_us" not in s.metrics   # p90 not chosen
