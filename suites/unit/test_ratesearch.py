"""The loss-bounded rate search: the topology's `udp_ndr` kind, the per-trial loss check
against both devices, MLRsearch driven through the testbed's measurer on a simulated
shaper, and a measured sample turned into a trial."""
from __future__ import annotations

import pytest

from testbed.errors import ConfigError
from testbed.measure import ratesearch, ratesearch_cell
from testbed.measure.crosscheck import Wire
from testbed.records import results
from testbed.tools import get_tool
from testbed.topology import config
from testbed.topology.model import (
    Attachment,
    Backend,
    Cell,
    Pattern,
    Profile,
    Protocol,
    RateSearch,
    Tool,
    definition_hash,
)

BASE = """\
guests: [{name: g1}, {name: g2}]
matrix:
  attachments: [netns-veth]
  profiles:
    - PROFILE
"""


def parse(profile: str):
    return config.parse(BASE.replace("PROFILE", profile), "t.yaml").matrix.profiles[0]


def test_udp_ndr_defaults_to_iperf3_udp_stream_with_the_documented_goals():
    p = parse("{name: ndr, kind: udp_ndr}")
    assert p.kind == "udp_ndr"
    assert (p.tool, p.protocol, p.pattern) == (Tool("iperf3"), Protocol.UDP, Pattern.STREAM)
    assert p.search == RateSearch()
    assert p.search.pdr_loss == 0.005 and p.duration_s == p.search.trial_s[1]


def test_search_fields_are_read():
    p = parse("{name: ndr, kind: udp_ndr, message_size: 512, search: {pdr_loss: 0.001, trial: [1, 3], "
              "precision: 0.02, max_search: 120, min_rate: 10mbit, max_rate: 2gbit, exceed_ratio: 0.25, "
              "duration_sum: 6}}")
    s = p.search
    assert (s.pdr_loss, s.trial_s, s.precision, s.max_search_s) == (0.001, (1, 3), 0.02, 120)
    assert (s.min_rate_bps, s.max_rate_bps, s.exceed_ratio, s.duration_sum_s) == (10**7, 2 * 10**9, 0.25, 6)
    assert p.message_size == 512


@pytest.mark.parametrize("profile, field, words", [
    ("{name: n, kind: udp_ndr, tool: netperf}", "tool", "without pacing"),
    ("{name: n, kind: udp_ndr, tool: uperf}", "tool", "uperf"),
    ("{name: n, kind: udp_ndr, protocol: tcp}", "protocol", "udp"),
    ("{name: n, kind: udp_ndr, pattern: rr}", "pattern", "stream"),
    ("{name: n, kind: udp_ndr, rate: 1gbit}", "rate", "chooses its own rates"),
    ("{name: n, kind: udp_ndr, duration: 5}", "duration", "chooses its own"),
    ("{name: n, search: {precision: 0.1}}", "search", "udp_ndr"),
    ("{name: n, kind: ndr}", "kind", "measure or udp_ndr"),
    ("{name: n, kind: udp_ndr, search: {trial: [5, 1]}}", "trial", "shorter than the first"),
    ("{name: n, kind: udp_ndr, search: {min_rate: 2gbit, max_rate: 1gbit}}", "min_rate", "below max_rate"),
    ("{name: n, kind: udp_ndr, search: {max_rate: 500tps}}", "max_rate", "bit rate"),
    ("{name: n, kind: udp_ndr, search: {pdr_loss: 0.9}}", "pdr_loss", "out of range"),
    ("{name: n, kind: udp_ndr, search: {precision: 0}}", "precision", "out of range"),
    ("{name: n, kind: udp_ndr, search: {trial: [1, 5], duration_sum: 2}}", "duration_sum", "shorter"),
    ("{name: n, kind: udp_ndr, search: {speed: 3}}", "speed", "unknown key"),
])
def test_bad_search_input_names_the_field(profile, field, words):
    with pytest.raises(ConfigError) as e:
        parse(profile)
    text = str(e.value)
    assert text.startswith("t.yaml:") and field in text and words in text, text
    assert "\n" not in text


def test_netperf_reason_says_this_build_cannot_pace():
    why = get_tool("netperf").search_unsupported
    assert "without pacing" in why and "--enable-intervals" in why
    assert get_tool("iperf3").search_unsupported is None


def test_search_enters_the_hash_only_when_set():
    plain = Profile("udp", tool=Tool("iperf3"), protocol=Protocol.UDP)
    c = Cell(Attachment("netns-veth"), Backend.QEMU, 1500, 1, plain)
    assert "search" not in c.definition()["profile"]
    s = Cell(Attachment("netns-veth"), Backend.QEMU, 1500, 1,
             Profile("udp", tool=Tool("iperf3"), protocol=Protocol.UDP, search=RateSearch()))
    assert s.definition()["profile"]["search"]["pdr_loss"] == 0.005
    assert s.hash != c.hash == definition_hash(c.definition())


# -- the per-trial loss check ---------------------------------------------------------------

PER = ratesearch.frame_bytes(1472, 1500)


def dev(out_dg: int = 0, in_dg: int = 0, control: int = 600) -> Wire:
    """A namespace endpoint's own device: sends as tx, receives as rx; ``control`` bytes of
    the tool's control connection each way."""
    return Wire(rx_bytes=in_dg * PER + control, tx_bytes=out_dg * PER + control, rx_packets=in_dg + 8,
                tx_packets=out_dg + 8)


def test_frame_bytes_counts_headers_per_fragment():
    assert PER == 1472 + 8 + 20 + 14
    # 8000 bytes at MTU 1500: 6 fragments, each with Ethernet and IP headers, one UDP header
    assert ratesearch.frame_bytes(8000, 1500) == 8000 + 8 + 6 * 34


def test_loss_at_the_sender_qdisc_agrees_with_the_wire():
    # 1000 sent by sequence number, 100 dropped by the sender's shaper (never on its device)
    c = ratesearch.loss_check(1000, 900, dev(out_dg=900), dev(in_dg=900), message_size=1472, mtu=1500)
    assert c["verdict"] == "ok", c
    assert c["sender_datagrams"] == 900 and c["receiver_datagrams"] == 900
    assert c["lost_before_receiver_device"] == 100 and c["wire_loss_ratio"] == 0.0


def test_a_tool_that_misses_loss_fails():
    c = ratesearch.loss_check(1000, 1000, dev(out_dg=900), dev(in_dg=900), message_size=1472, mtu=1500)
    assert c["verdict"] == "fail" and "more datagrams than reached its device" in c["reason"]
    assert c["lost_before_receiver_device"] == 100


def test_a_few_datagrams_in_flight_are_within_the_slack():
    c = ratesearch.loss_check(100000, 100000, dev(out_dg=99950), dev(in_dg=99950), message_size=1472, mtu=1500)
    assert c["verdict"] == "ok" and c["slack"] == 3 + 100


def test_more_arriving_than_sent_fails():
    c = ratesearch.loss_check(1000, 1000, dev(out_dg=800), dev(in_dg=1000), message_size=1472, mtu=1500)
    assert c["verdict"] == "fail" and "than left the sender's" in c["reason"]


def test_loss_after_the_receivers_device_is_the_tools_to_report():
    # dropped at a full socket buffer: on the device, not counted by the tool, admitted as lost
    c = ratesearch.loss_check(1000, 700, dev(out_dg=1000), dev(in_dg=1000), message_size=1472, mtu=1500)
    assert c["verdict"] == "ok" and c["lost_after_receiver_device"] == 300


def test_guest_taps_count_the_other_way_round():
    sender_tap = Wire(rx_bytes=1000 * PER, tx_bytes=0, rx_packets=1000, tx_packets=0)
    receiver_tap = Wire(rx_bytes=0, tx_bytes=1000 * PER, rx_packets=0, tx_packets=1000)
    c = ratesearch.loss_check(1000, 1000, sender_tap, receiver_tap, message_size=1472, mtu=1500,
                              sender_sends_as_rx=True, receiver_gets_as_tx=True)
    assert c["verdict"] == "ok" and c["receiver_datagrams"] == 1000


# -- MLRsearch through the measurer --------------------------------------------------------

def shaper(cap_pps: float, fail_at: int | None = None):
    def run(i: int, duration: float, load: float) -> ratesearch.Trial:
        if i == fail_at:
            return ratesearch.Trial(i, duration, load, False, "iperf3 exited 1: boom", message_size=1472)
        sent = round(load * duration)
        rec = min(sent, round(cap_pps * duration))
        return ratesearch.Trial(i, duration, load, True, duration_s=duration, wall_s=duration, sent=sent,
                                received=rec, message_size=1472, wire={"verdict": "ok"})
    return run


def test_search_brackets_a_simulated_shaper_within_its_precision():
    spec = RateSearch(min_rate_bps=10**6, max_rate_bps=10**8, trial_s=(1, 2), precision=0.05)
    cap = 20e6 / 8 / PER
    r = ratesearch.search(spec, 1472, shaper(cap))
    assert r.ok and r.stopped is None
    for b in (r.ndr, r.pdr):
        assert b.lower_pps <= cap * 1.001 and b.upper_pps > cap * 0.999, b
        assert (b.upper_pps - b.lower_pps) / b.upper_pps <= 0.05 + 1e-9
    # PDR tolerates 0.5 % loss: never below NDR
    assert r.pdr.lower_pps >= r.ndr.lower_pps
    d = r.as_dict()
    assert d["trials"] == len(r.trials) >= 3 and d["ndr"]["lower_mbps"] == r.ndr.mbps(r.ndr.lower_pps)
    assert "NDR (loss <= 0)" in ratesearch.summary_line(r)


def stalling_shaper(cap_pps: float, band: float = 0.9):
    """A shaper whose sender is descheduled now and then (a busy host): the first trial at
    each load from ``band`` x ``cap_pps`` up to the cap loses a few datagrams; above the cap
    every trial loses."""
    clean, seen = shaper(cap_pps), set()

    def run(i: int, duration: float, load: float) -> ratesearch.Trial:
        t = clean(i, duration, load)
        if band * cap_pps <= load <= cap_pps and load not in seen:
            seen.add(load)
            return ratesearch.Trial(i, duration, load, True, duration_s=duration, wall_s=duration * 1.08,
                                    sent=t.sent, received=t.sent - 6, message_size=1472, wire={"verdict": "ok"})
        return t
    return run


def test_the_bench_goals_outvote_a_stalled_sender_the_strict_goal_does_not():
    """The rate benchmark's goals (exceed ratio 0.5 over 4 s of trials) keep a load whose one
    trial lost a few datagrams to a stalled sender as a lower bound; with an exceed ratio of
    0 the same trials make it an upper bound, and the NDR falls below the shaper."""
    from testbed import bench
    cap = 20e6 / 8 / PER
    base = dict(min_rate_bps=10**6, max_rate_bps=8 * 10**7, trial_s=(1, 1), precision=0.05)
    median = RateSearch(**base, exceed_ratio=bench.NDR_EXCEED_RATIO, duration_sum_s=bench.NDR_DURATION_SUM_S)
    r = ratesearch.search(median, 1472, stalling_shaper(cap))
    assert r.ok and cap * 0.95 <= r.ndr.lower_pps <= cap * 1.001 < r.ndr.upper_pps, (r.ndr, cap)
    # the outvoted trials are there, lossy, at loads it kept as lower bounds
    assert any(t.lost and t.intended_pps <= r.ndr.lower_pps for t in r.trials), r.trials
    strict = ratesearch.search(RateSearch(**base), 1472, stalling_shaper(cap))
    assert strict.ok and strict.ndr.lower_pps < cap * 0.9, (strict.ndr, cap)


def test_a_failed_trial_stops_the_search_with_its_reason_and_keeps_the_trials():
    spec = RateSearch(min_rate_bps=10**6, max_rate_bps=10**8, trial_s=(1, 2), precision=0.05)
    r = ratesearch.search(spec, 1472, shaper(1000.0, fail_at=2))
    assert not r.ok and "trial 2" in r.stopped and "boom" in r.stopped
    assert len(r.trials) == 3 and not r.trials[-1].ok


def test_a_minimum_rate_that_already_loses_gives_no_lower_bound():
    spec = RateSearch(min_rate_bps=10**7, max_rate_bps=10**8, trial_s=(1, 1), precision=0.05)
    r = ratesearch.search(spec, 1472, shaper(10.0))
    assert r.ndr.lower_pps is None and r.ndr.upper_pps is not None


# -- a measured sample as a trial ------------------------------------------------------------

def sample(status="ok", metrics=None, counters=None, reason=None):
    cell = Cell(Attachment("netns-veth"), Backend.QEMU, 1500, 1,
                Profile("ndr", tool=Tool("iperf3"), protocol=Protocol.UDP, search=RateSearch()))
    return results.SampleRecord.new("run", cell.as_dict(), 0, False, status, reason, metrics or {}, {}, "t0", "t1",
                                    extra={"counters": counters or {}})


def test_trial_of_a_sample_checks_loss_on_both_devices():
    counters = {"tb-a1": dev(out_dg=950).__dict__, "tb-b1": dev(in_dg=950).__dict__}
    s = sample(metrics={"udp_sent_msgs": 1000.0, "udp_recv_msgs": 950.0, "duration_s": 1.0}, counters=counters)
    t = ratesearch_cell.trial_of(s, 0, 1.0, 1000.0, size=1472, mtu=1500, sender="tb-a1", receiver="tb-b1",
                                 guest_sends_as_rx=False)
    assert t.ok and t.loss_ratio == 0.05 and t.wire["verdict"] == "ok"
    d = t.as_dict()
    assert d["offered_mbps"] == round(1000 * 8 * 1472 / 1e6, 6) and d["lost"] == 50
    assert d["received_mbps"] == round(950 * 8 * 1472 / 1e6, 6)


def test_trial_of_a_failed_sample_or_a_contradicting_wire_fails():
    t = ratesearch_cell.trial_of(sample("failed", reason="iperf3 exited 1: x"), 0, 1.0, 10.0, size=1472,
                                 mtu=1500, sender="a", receiver="b", guest_sends_as_rx=False)
    assert not t.ok and t.reason == "iperf3 exited 1: x"
    counters = {"tb-a1": dev(out_dg=500).__dict__, "tb-b1": dev(in_dg=500).__dict__}
    s = sample(metrics={"udp_sent_msgs": 1000.0, "udp_recv_msgs": 1000.0, "duration_s": 1.0}, counters=counters)
    t = ratesearch_cell.trial_of(s, 0, 1.0, 1000.0, size=1472, mtu=1500, sender="tb-a1", receiver="tb-b1",
                                 guest_sends_as_rx=False)
    assert not t.ok and t.reason.startswith("wire cross-check:")


def test_a_trial_profile_is_a_paced_udp_stream_of_whole_seconds():
    cell = Cell(Attachment("netns-veth"), Backend.QEMU, 1500, 1,
                Profile("ndr", tool=Tool("iperf3"), protocol=Protocol.UDP, message_size=1472, search=RateSearch()))
    p = ratesearch_cell.trial_profile(cell, 1.4142, 1000.0)
    assert p.duration_s == 2 and p.rate_bps == 1000 * 8 * 1472 and p.search is None and p.paced
    from testbed.tools import get_tool
    argv = get_tool(Tool("iperf3")).client_argv(p, "198.18.0.2")
    assert argv[argv.index("-b") + 1] == str(1000 * 8 * 1472) and "-u" in argv
