"""Chosen percentiles with the transactions behind them: from netperf's recorded histograms
(the tool's own P50/P90/P99 and its HIST_TOTAL as second sources), from per-transaction
times, from the tool's figures; insufficient ones kept out of the metrics; the topology's
choice parsed and kept out of the cell hash."""
from __future__ import annotations

from pathlib import Path

import pytest

from testbed.errors import ConfigError
from testbed.records import percentiles
from testbed.tools import netperf
from testbed.topology import config
from testbed.topology.model import Attachment, Backend, Cell

pytestmark = pytest.mark.unit

NETPERF = Path(__file__).resolve().parent / "fixtures" / "recorded" / "netperf"


def test_metric_names_round_trip():
    for p, name in ((50, "latency_p50_us"), (99.9, "latency_p99_9_us"), (99.99, "latency_p99_99_us"),
                    (99.999, "latency_p99_999_us")):
        assert percentiles.metric_name(p) == name and percentiles.from_metric(name) == p
    assert percentiles.from_metric("latency_mean_us") is None


def test_required_transactions_is_ten_over_one_minus_q():
    assert [percentiles.required(p) for p in (50, 90, 99, 99.9, 99.99)] == [20, 100, 1000, 10000, 100000]


def test_netperf_histogram_is_read_in_full():
    text = (NETPERF / "netperf_texi_TCP_RR_v2_histogram.txt").read_text()
    h = percentiles.netperf_histogram(text)
    assert sum(c for *_, c in h) == 35391             # netperf's own HIST_TOTAL
    assert (100, 200, 34480) in h and (10000, 20000, 105) in h
    got = {c.p: c for c in percentiles.from_histogram(h, (50, 99, 99.9))}
    assert 100 <= got[50].value_us < 200 and got[50].n == 35391 and got[50].sufficient
    # p99.9 needs 10,000 transactions: 35,391 are enough
    assert got[99.9].sufficient and 1000 <= got[99.9].value_us <= 20000
    # a second source: the test's rate x time is the same count
    assert abs(3538.82 * 10.00 - 35391) < 10


def test_histogram_percentiles_agree_with_netperfs_own_selectors():
    text = (NETPERF / "netperf_pkb_UDP_RR_-o_csv_histogram.txt").read_text()
    h = percentiles.netperf_histogram(text)
    got = {c.p: c.value_us for c in percentiles.from_histogram(h, (50, 90, 99))}
    # netperf printed 442, 487, 589 from the same histogram: within one 100 us bucket
    for p, tool in ((50, 442), (90, 487), (99, 589)):
        assert abs(got[p] - tool) <= 100, (p, got[p], tool)


def test_a_short_run_marks_p99_9_insufficient_and_keeps_it_out_of_the_metrics():
    hist = [(100, 200, 290), (200, 300, 10)]                 # 300 transactions
    chosen = percentiles.choose((50, 99, 99.9), {"latency_p99_9_us": 1.0}, histogram=hist)
    by = {c.p: c for c in chosen}
    assert by[50].sufficient and not by[99].sufficient and not by[99.9].sufficient
    assert by[99.9].n == 300 and by[99.9].value_us is not None
    assert "300 transactions behind p99.9, fewer than the 10000" in by[99.9].note
    m = percentiles.apply({"latency_mean_us": 150.0, "latency_p99_9_us": 1.0, "latency_p90_us": 9.0}, chosen)
    assert m == {"latency_mean_us": 150.0, "latency_p50_us": by[50].value_us}
    assert by[99.9].as_dict()["required"] == 10000
    # given the sample's length, the note says how long a sample at its rate would need
    by = {c.p: c for c in percentiles.choose((50, 99, 99.9), {}, histogram=hist, duration_s=10)}
    assert by[99.9].note.endswith("at 30 transactions/s, a sample of 334 s or more would have it")
    assert by[99].note.endswith("a sample of 34 s or more would have it") and by[50].note is None


def test_per_transaction_times_give_nearest_rank():
    xs = list(range(1, 100001))                              # 1..100000 us
    by = {c.p: c for c in percentiles.from_values(xs, (50, 99.9, 99.99))}
    assert by[50].value_us == 50000 and by[99.9].value_us == 99900 and by[99.99].value_us == 99990
    assert by[99.99].sufficient and by[99.99].source == "transactions"


def test_tool_figures_with_the_count_from_rate_and_time():
    text = (NETPERF / "netperf_real_TCP_RR_-o_latency_cpu.txt").read_text()
    res = netperf.parse(text)
    m = {**res.metrics, "duration_s": 10.0}
    by = {c.p: c for c in percentiles.choose(percentiles.DEFAULT, m, tool="netperf")}
    assert by[50].value_us == 75 and by[99].value_us == 127 and by[99].source == "tool"
    assert by[99].n == round(12984.78 * 10)
    assert by[99.9].value_us is None and by[99.9].source == "unavailable" and not by[99.9].sufficient
    assert "netperf gave no p99.9" in by[99.9].note


def test_merged_histograms_add_up():
    a, b = [(0, 10, 5), (10, 20, 1)], [(0, 10, 3)]
    assert percentiles.merge([a, b]) == [(0, 10, 8), (10, 20, 1)]
    assert percentiles.cdf(percentiles.merge([a, b]))[-1] == (20, 1.0)


BASE = """\
guests: [{name: g1}, {name: g2}]
matrix:
  PCT
  profiles:
    - {name: tcp_rr, pattern: rr}
"""


def test_topology_chooses_percentiles_and_they_stay_out_of_the_hash():
    t = config.parse(BASE.replace("PCT", "percentiles: [99.99, 50, 99.9]"), "t.yaml")
    p = t.matrix.profiles[0]
    assert p.percentiles == (50.0, 99.9, 99.99)
    plain = config.parse(BASE.replace("PCT", ""), "t.yaml").matrix.profiles[0]
    assert plain.percentiles is None
    cell = lambda pr: Cell(Attachment("bridge"), Backend.QEMU, 1500, 1, pr)  # noqa: E731
    assert cell(p).hash == cell(plain).hash


@pytest.mark.parametrize("value, words", [("[100]", "out of range"), ("[99.9, 99.9]", "twice"),
                                          ("[99.9999]", "out of range"), ("[50.0001]", "three decimals"),
                                          ("[]", "")])
def test_bad_percentiles_name_the_field(value, words):
    with pytest.raises(ConfigError) as e:
        config.parse(BASE.replace("PCT", f"percentiles: {value}"), "t.yaml")
    assert "percentiles" in str(e.value) and words in str(e.value)


def test_each_tool_says_whether_its_pacing_is_open_or_closed_loop():
    from testbed import tools
    from testbed.tools import pacing
    assert all(d.pacing_loop in ("open", "closed") for d in tools.drivers())
    assert pacing.loop_label(tools.get_tool("iperf3")) == "open-loop"
    for t in ("uperf", "netperf"):
        assert pacing.loop_label(tools.get_tool(t)).startswith("closed-loop (coordinated omission")


RATES = """\
guests: [{name: g1}, {name: g2}]
matrix:
  profiles:
    - PROFILE
"""


def test_rates_expand_a_profile_into_one_per_paced_load():
    t = config.parse(RATES.replace("PROFILE", "{name: tcp_rr, pattern: rr, tool: uperf, rates: [1000tps, 4000tps]}"),
                     "t.yaml")
    ps = t.matrix.profiles
    assert [(p.name, p.rate, p.rate_tps) for p in ps] == [("tcp_rr_1000tps", "1000tps", 1000),
                                                          ("tcp_rr_4000tps", "4000tps", 4000)]


@pytest.mark.parametrize("profile, words", [
    ("{name: tcp_rr, pattern: rr, rates: [1000tps, 1000tps]}", "twice"),
    ("{name: tcp_rr, pattern: rr, rates: [1000tps], rate: 5tps}", "either rates or rate"),
    ("{name: tcp_rr, pattern: rr, tool: uperf, rates: [1gbit, 2gbit]}", "transactions per second"),
    ("{name: a_very_long_profile_nam, pattern: rr, rates: [1000tps, 2000tps]}", "longer than 24"),
    ("{name: tcp_rr, pattern: rr, rates: [1000tps]}", "at least 2"),
])
def test_bad_rates(profile, words):
    with pytest.raises(ConfigError) as e:
        config.parse(RATES.replace("PROFILE", profile), "t.yaml")
    assert words in str(e.value) and "matrix.profiles[0]" in str(e.value)


def test_fractions_of_the_measured_maximum():
    t = config.parse(RATES.replace("PROFILE", "{name: tcp_rr, pattern: rr, tool: uperf, rates: [0.5max, 0.9max, 2000tps]}"),
                     "t.yaml")
    ps = t.matrix.profiles
    assert [(p.name, p.rate, p.rate_fraction, p.rate_of) for p in ps] == [
        ("tcp_rr", None, None, None), ("tcp_rr_0_5max", "0.5max", 0.5, "tcp_rr"),
        ("tcp_rr_0_9max", "0.9max", 0.9, "tcp_rr"), ("tcp_rr_2000tps", "2000tps", None, None)]
    from testbed.tools import pacing
    cell = Cell(Attachment("bridge"), Backend.QEMU, 1500, 1, ps[1], pairs=2)
    base_id = Cell(Attachment("bridge"), Backend.QEMU, 1500, 1, ps[0], pairs=2).id
    from testbed.records.records import CellOutcome
    got, why = pacing.resolve_fraction(cell, ps, [CellOutcome.from_dict(
        {"id": base_id, "status": "ok", "summary": {"transactions_per_s": {"mean": 9000.0}}})])
    assert why is None and got.profile.rate_tps == 2250 and got.profile.rate == "0.5max"   # half of 4500 per pair
    # the hash holds the fraction, not what this run's maximum made of it
    assert got.hash == cell.hash and got.id == cell.id
    _, why = pacing.resolve_fraction(cell, ps, [CellOutcome.from_dict(
        {"id": base_id, "status": "failed", "reason": "boom", "summary": {}})])
    assert "was not measured in this run (boom)" in why
    _, why = pacing.resolve_fraction(cell, ps, [])
    assert why.startswith("0.5max: the maximum of " + base_id)


@pytest.mark.parametrize("profile, words", [
    ("{name: tcp_rr, pattern: rr, rates: [1.5max, 0.5max]}", "0.001max..1max"),
    ("{name: s, rates: [0.5max, 1gbit]}", "request/response only"),
])
def test_bad_fractions(profile, words):
    with pytest.raises(ConfigError) as e:
        config.parse(RATES.replace("PROFILE", profile), "t.yaml")
    assert words in str(e.value)
