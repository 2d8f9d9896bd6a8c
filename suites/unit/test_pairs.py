"""Pairs and paced load, the parts that need no host: rate parsing, what each tool can
pace and how, pace detection from what a probe printed (and from the installed binaries),
pair aggregation, clone names, and cell ids/hashes with the pairs axis."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from testbed.measure import pairs, runner
from testbed.measure import sampling as measure
from testbed.tools import get_tool, netperf, pacing
from testbed.tools.base import ToolResult
from testbed.topology import config
from testbed.topology.model import Attachment, Backend, Cell, Pattern, Profile, Protocol, Tool

pytestmark = pytest.mark.unit


# --------------------------------------------------------------------------- rates

@pytest.mark.parametrize("text,bps,tps", [("2gbit", 2 * 10**9, None), ("500mbit", 5 * 10**8, None),
                                          ("1.5gbit", 15 * 10**8, None), ("64kbit", 64000, None),
                                          ("5000tps", None, 5000), (" 10TPS ", None, 10)])
def test_rates_parse_to_bits_or_transactions(text, bps, tps):
    r = pacing.parse_rate(text)
    assert (r.bps, r.tps) == (bps, tps)


@pytest.mark.parametrize("text", ["fast", "2", "2gb", "-1gbit", "0.5tps", "0tps", "1bit", "2000gbit", "1e9bit"])
def test_bad_rates_are_refused(text):
    with pytest.raises(ValueError):
        pacing.parse_rate(text)


def test_what_each_tool_can_express():
    gbit, tps = pacing.parse_rate("1gbit"), pacing.parse_rate("100tps")
    assert pacing.express_reason(get_tool("iperf3"), Protocol.TCP, Pattern.STREAM, gbit) is None
    assert pacing.express_reason(get_tool("iperf3"), Protocol.UDP, Pattern.STREAM, gbit) is None
    assert "bits" in pacing.express_reason(get_tool("iperf3"), Protocol.TCP, Pattern.STREAM, tps)
    assert pacing.express_reason(get_tool("uperf"), Protocol.TCP, Pattern.RR, tps) is None
    assert "uperf paces transactions" in pacing.express_reason(get_tool("uperf"), Protocol.TCP, Pattern.STREAM, gbit)
    assert pacing.express_reason(get_tool("netperf"), Protocol.TCP, Pattern.RR, tps) is None
    assert "CRR" in pacing.express_reason(get_tool("netperf"), Protocol.TCP, Pattern.CRR, tps)
    assert "not bits" in pacing.express_reason(get_tool("netperf"), Protocol.TCP, Pattern.RR, gbit)


def test_config_turns_a_bit_rate_into_rate_bps_so_udp_keeps_working():
    t = config.parse("guests: [{name: g1}, {name: g2}]\nmatrix: {profiles: [\n"
                     "  {name: u, tool: iperf3, protocol: udp, rate: 300mbit},\n"
                     "  {name: legacy, tool: iperf3, protocol: udp, rate_bps: 1000000}]}\n")
    u, legacy = t.matrix.profiles
    assert (u.rate, u.rate_bps, u.paced) == ("300mbit", 300 * 10**6, True)
    assert (legacy.rate, legacy.rate_bps, legacy.paced) == (None, 10**6, False)
    assert "300000000" in get_tool(Tool("iperf3")).client_argv(u, "198.18.0.2")


def test_iperf3_splits_a_pair_target_over_its_streams():
    p = Profile("s", tool=Tool("iperf3"), rate_bps=2 * 10**9, rate="2gbit")
    argv = get_tool(Tool("iperf3")).client_argv(p, "198.18.0.2", streams=4)
    assert argv[argv.index("-b") + 1] == str(5 * 10**8) and "-P" in argv
    # an unpaced rate_bps (UDP's own) stays per stream, as before
    legacy = Profile("u", tool=Tool("iperf3"), protocol=Protocol.UDP, rate_bps=10**6)
    argv = get_tool(Tool("iperf3")).client_argv(legacy, "198.18.0.2", streams=4)
    assert argv[argv.index("-b") + 1] == str(10**6)


def test_uperf_paces_with_the_transaction_rate_attribute_per_thread():
    p = Profile("r", tool=Tool("uperf"), pattern=Pattern.RR, message_size=1, response_size=1,
                rate_tps=5000, rate="5000tps")
    xml = get_tool(Tool("uperf")).profile_xml(p, "198.18.0.2", 2)    # type: ignore[attr-defined]
    assert '<transaction duration="10s" rate="2500">' in xml
    unpaced = get_tool(Tool("uperf")).profile_xml(Profile("r", tool=Tool("uperf"), pattern=Pattern.RR),  # type: ignore[attr-defined]
                                               "198.18.0.2", 1)
    assert "rate=" not in unpaced


def test_netperf_paces_with_interval_and_burst():
    p = Profile("r", pattern=Pattern.RR, message_size=1, response_size=1, rate_tps=5000, rate="5000tps")
    argv = get_tool(Tool("netperf")).client_argv(p, "198.18.0.2")
    assert argv[argv.index("-w") + 1] == "10" and argv[argv.index("-b") + 1] == "50"
    s = Profile("s", message_size=16384, rate_bps=10**9, rate="1gbit")
    assert netperf.burst(s) == round(10**9 / (8 * 16384) / 100)


# --------------------------------------------------------------------------- detection

# What the binaries print (captured on this machine: Debian's netperf 2.7.0, iperf3 3.12)
NETPERF_NO_INTERVALS = ("Packet rate control is not compiled in.\nPacket burst size is not compiled in. \n"
                        "establish control: are you sure there is a netserver listening on 127.0.0.1 at port 9?\n")
NETPERF_INTERVALS = ("establish control: are you sure there is a netserver listening on 127.0.0.1 at port 9?\n"
                     "establish_control could not establish the control connection\n")
IPERF3_PACES = "iperf3: error - unable to connect to server: Connection refused\n"
IPERF3_OLD = "iperf3: unrecognized option '-b'\nUsage: iperf3 [-s|-c host] [options]\n"


def test_probe_verdicts():
    assert "--enable-intervals" in get_tool("netperf").pacing_verdict(NETPERF_NO_INTERVALS, "", 0)
    assert get_tool("netperf").pacing_verdict(NETPERF_INTERVALS, "", 0) is None
    assert get_tool("iperf3").pacing_verdict("", IPERF3_PACES, 1) is None
    assert "refuses -b" in get_tool("iperf3").pacing_verdict("", IPERF3_OLD, 1)
    assert "no recognisable answer" in get_tool("iperf3").pacing_verdict("", "", 127)


def test_detector_asks_once_per_place_and_tool_and_reports_a_probe_that_cannot_run():
    calls = []

    def run(argv):
        calls.append(argv)
        return NETPERF_NO_INTERVALS, "", 0
    d = pacing.Detector()
    assert d.reason("g1", get_tool("netperf"), run) and d.reason("g1", get_tool("netperf"), run)
    assert len(calls) == 1
    d.reason("g2", get_tool("netperf"), run)
    assert len(calls) == 2

    def broken(argv):
        raise FileNotFoundError("netperf")
    assert "could not run" in pacing.Detector().reason("x", get_tool("netperf"), broken)


@pytest.mark.parametrize("tool", [Tool("iperf3"), Tool("netperf")])
def test_detection_by_trying_the_installed_binary(tool):
    if not shutil.which(tool.value):
        pytest.skip(f"{tool.value} is not installed on this host")

    def run(argv):
        r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        return r.stdout, r.stderr, r.returncode
    why = pacing.Detector().reason("host", get_tool(tool), run)
    # Whatever this build can do, the answer is a verdict, never an unrecognised output.
    assert why is None or "no recognisable answer" not in why, why


def test_a_paced_profile_no_tool_can_pace_is_exit_3_naming_the_rate(tmp_path):
    from testbed.errors import CapabilityError
    t = config.parse("matrix: {attachments: [netns-veth], profiles: [{name: r, pattern: rr, rate: 100tps}]}\n",
                     "t.yaml")
    cells = runner.plan(t)
    with pytest.raises(CapabilityError, match=r"t.yaml: matrix.profiles\[0\].rate: .*not compiled in"):
        pairs.require_pacing(t, cells, pacing.Detector(), "here", lambda argv: (NETPERF_NO_INTERVALS, "", 0))
    pairs.require_pacing(t, cells, pacing.Detector(), "here", lambda argv: (NETPERF_INTERVALS, "", 0))


# --------------------------------------------------------------------------- pairs

def _res(mbps: float, p99: float | None = None) -> ToolResult:
    m = {"throughput_mbps": mbps, "duration_s": 3.0}
    if p99 is not None:
        m["latency_p99_us"] = p99
    return ToolResult(ok=True, metrics=m)


def test_pairs_aggregate_as_the_sum_and_keep_each_pair():
    p = Profile("s", tool=Tool("iperf3"), rate_bps=2 * 10**9, rate="2gbit")
    drv = get_tool(Tool("iperf3"))
    agg, bad = pairs.combine(p, [_res(1990.0, 50), _res(1500.0, 80)], drv)
    assert bad is None and agg.metrics["throughput_mbps"] == pytest.approx(3490.0)
    assert agg.metrics["latency_p99_us"] == 80
    ok, short = pairs.pair_record(p, _res(1990.0), 0.5), pairs.pair_record(p, _res(1500.0), None)
    assert ok == {"throughput_mbps": 1990.0, "latency_p99_us": None, "cpu_cores": 0.5, "target": 2000.0,
                  "achieved": 1990.0, "short": False}
    assert short["short"] is True and short["cpu_cores"] is None      # 25 % short: saturated
    unpaced = pairs.pair_record(Profile("s", tool=Tool("iperf3")), _res(10.0), 0.1)
    assert "target" not in unpaced


def test_a_failed_pair_fails_the_aggregate_with_its_reason_never_a_zero():
    agg, bad = pairs.combine(Profile("s"), [_res(10.0), ToolResult.failed("no output")], get_tool(Tool("netperf")))
    assert not agg.ok and "pair 2 failed: no output" in bad and not agg.metrics


def test_pair_cores_and_end_skew():
    per_guest = {"g1": {"total": 0.3}, "g2": {"total": 0.2}, "g1-p2": {"total": 0.1}}
    assert pairs.pair_cores(per_guest, ["g1", "g2"]) == pytest.approx(0.5)
    assert pairs.pair_cores(per_guest, ["g1-p2", "g2-p2"]) is None
    assert measure.end_skew_reason([10.0, 10.4], 3, "2 pairs") is None
    assert "out of step" in measure.end_skew_reason([10.0, 12.5], 3, "2 pairs")
    # seen through a polling agent on a busy host: one end seen 1.5 s late, but its last look
    # found it running before the other had ended: no skew is proven
    assert measure.end_skew_reason([(9.9, 10.0), (10.0, 11.5)], 3, "2 pairs") is None
    # one still running 2.5 s after the other was seen ended: proven
    why = measure.end_skew_reason([(9.9, 10.0), (12.5, 12.8)], 3, "2 pairs")
    assert "ended at least 2.5 s apart" in why


def test_clone_names_stay_within_name_re_and_pairs_share_the_snapshot_slot():
    from testbed.topology.model import NAME_RE
    assert pairs.clone_name("g1", 0) == "g1" and pairs.clone_name("g1", 1) == "g1-p2"
    long = pairs.clone_name("clientvm01", 7)
    assert NAME_RE.match(long) and long.endswith("-p8")
    t = config.parse("guests: [{name: g1, memory_mib: 512}, {name: g2}]\nmatrix: {pairs: [1, 3], profiles: [{name: a}]}\n")
    gp = pairs.guest_pairs(t, 3)
    assert [(c.name, s.name) for c, s in gp] == [("g1", "g2"), ("g1-p2", "g2-p2"), ("g1-p3", "g2-p3")]
    assert all(c.memory_mib == 512 for c, _ in gp)


def test_pairs_axis_ids_and_hashes():
    p = Profile("tcp_stream")
    one, two = Cell(Attachment("bridge"), Backend.QEMU, 1500, 1, p), Cell(Attachment("bridge"), Backend.QEMU, 1500, 1, p, pairs=2)
    assert one.id == "bridge-qemu-mtu1500-conn1-tcp_stream" and two.id == one.id + "-p2"
    assert one.hash != two.hash and "pairs" not in one.as_dict() and two.as_dict()["pairs"] == 2
    # a cell defined before the axis (and the rate fields) hashes as it did then
    assert one.hash == "40e6df7052db"      # main 25ea70a
    t = config.parse("guests: [{name: g1}, {name: g2}]\nmatrix: {pairs: [1, 2], connections: [1, 2], "
                     "profiles: [{name: a}]}\n")
    cells = runner.plan(t)
    assert [c.pairs for c in cells] == [1, 2, 1, 2] and config.cell_count(t.matrix) == len(cells)


# --------------------------------------------------------------------------- one loop's parts

def test_a_cell_is_recorded_by_pair_when_it_has_pairs_or_a_paced_profile():
    stream, paced = Profile("s"), Profile("s", tool=Tool("iperf3"), rate_bps=10**9, rate="1gbit")
    one = Cell(Attachment("bridge"), Backend.QEMU, 1500, 1, stream)
    assert not pairs.by_pair(one) and pairs.label(pairs.by_pair(one), 0) == ""
    assert pairs.by_pair(Cell(Attachment("bridge"), Backend.QEMU, 1500, 1, stream, pairs=2))
    paced_cell = Cell(Attachment("bridge"), Backend.QEMU, 1500, 1, paced)
    assert pairs.by_pair(paced_cell) and pairs.label(pairs.by_pair(paced_cell), 1) == "pair 2: "


def test_the_pairs_extra_and_their_wire_record():
    from testbed.measure import crosscheck
    p = Profile("s", tool=Tool("iperf3"), rate_bps=2 * 10**9, rate="2gbit")
    per_guest = {"g1": {"total": 0.3}, "g2": {"total": 0.2}, "g1-p2": {"total": 0.1}}
    x = pairs.pairs_extra(p, [_res(1990.0), _res(1500.0)], per_guest, [["g1", "g2"], ["g1-p2", "g2-p2"]])
    assert [r["cpu_cores"] for r in x["pairs"]] == [0.5, None]
    assert x["saturated"] is True and x["short_pairs"] == [2] and "latency_loop" not in x
    ok = crosscheck.Check(100, 110, 2, 0.9, 0.91, "ok", "tb-a", "to-endpoint")
    bad = crosscheck.Check(100, 10, 2, 0.9, 10.0, "fail", "tb-b", "to-endpoint", reason="too few")
    assert pairs.wire_record([ok, ok]) == {"pairs": [ok.as_dict(), ok.as_dict()], "verdict": "pass"}
    assert pairs.wire_record([ok, bad])["verdict"] == "fail"


def _sample(cell: Cell, rep: int, value: float | None):
    from testbed.records.records import SampleRecord
    if value is None:
        return SampleRecord.new("r", cell.as_dict(), rep, False, "failed", "boom", {}, {}, "t0", "t1")
    return SampleRecord.new("r", cell.as_dict(), rep, False, "ok", None, {"throughput_mbps": value}, {}, "t0", "t1")


@pytest.mark.parametrize("values,taken,status,converged", [
    ([100.0, 100.5, 99.0, 100.0], 2, "ok", True),                 # rsd met after two: stops
    ([100.0, 150.0, 60.0, 120.0], 4, "ok", False),                # max_samples, not converged
    ([100.0, None, 100.2, 100.0], 3, "partial", True),            # a failure counts, the rule goes on
    ([None, None, None, None], 4, "failed", None),                # no values: no decision
    ([100.0, 150.0, 60.0, None], 4, "partial", False),           # the last one failed at max_samples
])
def test_cell_samples_keep_the_stopping_rule_in_one_place(tmp_path, values, taken, status, converged):
    from testbed.analysis import stats
    from testbed.records import results
    from testbed.topology.model import Repetitions
    cell = Cell(Attachment("bridge"), Backend.QEMU, 1500, 1, Profile("s"))
    rule = stats.StoppingRule(Repetitions(0, 2, 4, 0.05))
    with results.RunWriter(tmp_path, "r", config.default(), {"accelerator": "none"}) as w:
        counted = measure.CellSamples(cell, rule)
        for rep, v in enumerate(values):
            if not counted.add(_sample(cell, rep, v)):
                break
        got = counted.finish(w)
    assert len(got) == taken
    outcome = w.cells[-1]
    assert outcome.status == status and outcome.converged is converged
    if status != "failed":
        assert outcome.summary_mean("throughput_mbps") is not None
