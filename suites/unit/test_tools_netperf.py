"""netperf driver: every captured output parses to the numbers printed in it; argv is exact;
and (as root) the real netperf 2.7.0 runs between two network namespaces."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from testbed.tools import ToolResult, UnsupportedProfile, get_tool
from testbed.tools.netperf import SELECTORS
from testbed.topology.model import Pattern, Profile, Protocol, Tool

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "recorded"   # see its SOURCES.md
NETPERF = get_tool(Tool("netperf"))
SEL = ",".join(SELECTORS)


def load(path: Path) -> tuple[str, int]:
    """Fixture text and exit status; recorded error runs end with an appended "rc=N" line."""
    text = path.read_bytes().decode()          # keeps \r as the tool wrote it
    m = re.search(r"\nrc=(\d+)\n?$", text)
    return (text[:m.start() + 1], int(m.group(1))) if m else (text, 0)


# Values read off the fixture files themselves.
EXPECTED: dict[str, dict[str, float]] = {
    "netperf_blog_TCP_STREAM_cpu_-c-C_confidence_warning.txt": dict(
        throughput_mbps=9591.78, local_cpu_pct=1.18, remote_cpu_pct=0.93, local_sd_us_per_kb=0.483,
        remote_sd_us_per_kb=0.383, confidence_achieved=0.0, confidence_interval_pct=6.663,
        duration_s=10.0),
    "netperf_crossbar_TCP_CRR_classic_freebsd.txt": dict(transactions_per_s=13206.10, duration_s=60.02),
    "netperf_kep4963_TCP_CRR_-o_latency_csv_-i10.txt": dict(
        transactions_per_s=17730.719, latency_min_us=41, latency_mean_us=56.63, latency_max_us=848,
        latency_stddev_us=11.14),
    "netperf_kep4963_TCP_STREAM_-i10_confidence_met.txt": dict(throughput_mbps=13046.26,
                                                                confidence_achieved=1.0),
    "netperf_kubenetbench_TCP_RR_-k_keyval_latency.txt": dict(
        transactions_per_s=2841.067, latency_p50_us=334, latency_p90_us=391, latency_mean_us=351.66,
        retransmits=0),
    "netperf_pkb_TCP_CRR_-o_csv_confidence.txt": dict(
        transactions_per_s=343.35, confidence_interval_pct=11.837, confidence_achieved=0.0,
        latency_stddev_us=8147.88, latency_p50_us=2048, latency_p90_us=2372, latency_p99_us=30029,
        latency_min_us=2000, latency_max_us=35000),
    "netperf_pkb_TCP_RR_-o_csv_confidence.txt": dict(
        transactions_per_s=1405.50, confidence_interval_pct=2.522, confidence_achieved=1.0,
        latency_p50_us=683, latency_p90_us=735, latency_p99_us=841),
    "netperf_pkb_TCP_STREAM_-o_csv_confidence.txt": dict(
        throughput_mbps=1187.94, confidence_interval_pct=10.100, confidence_achieved=0.0),
    "netperf_pkb_UDP_RR_-o_csv_confidence.txt": dict(
        transactions_per_s=1359.71, confidence_interval_pct=4.911, confidence_achieved=1.0),
    "netperf_pkb_UDP_RR_-o_csv_histogram.txt": dict(
        transactions_per_s=2217.06, latency_p50_us=442, latency_p90_us=487, latency_p99_us=589,
        latency_stddev_us=81.26, latency_min_us=361, latency_max_us=9688),
    "netperf_pkb_UDP_STREAM_-o_csv_confidence.txt": dict(throughput_mbps=1102.42,
                                                          confidence_achieved=0.0),
    "netperf_real_TCP_CRR_-c-C_-k.txt": dict(
        transactions_per_s=10081.76, latency_mean_us=99.10, latency_p99_us=229,
        local_cpu_pct=54.30, remote_cpu_pct=53.27),
    "netperf_real_TCP_MAERTS_classic.txt": dict(throughput_mbps=5489.56, duration_s=3.0),
    "netperf_real_TCP_MAERTS_-c-C-j_-D0.3_-k.txt": dict(throughput_mbps=6008.22, duration_s=1.0,
                                                       latency_p99_us=74),
    "netperf_real_TCP_RR_-o_latency_cpu.txt": dict(
        transactions_per_s=12984.78, latency_mean_us=76.95, latency_p50_us=75, latency_p90_us=90,
        latency_p99_us=127),
    "netperf_real_TCP_STREAM_-c-C_-I99,5_-i5,3.txt": dict(
        throughput_mbps=5468.74, local_cpu_pct=66.30, remote_cpu_pct=66.30,
        local_sd_us_per_kb=1.989, remote_sd_us_per_kb=1.989, confidence_interval_pct=17.067,
        confidence_achieved=0.0),
    "netperf_real_UDP_RR_classic_-c-C.txt": dict(transactions_per_s=13582.40, local_cpu_pct=29.16,
                                                 remote_cpu_pct=29.16, duration_s=3.0),
    "netperf_real_UDP_STREAM_-o.txt": dict(throughput_mbps=2561.22, udp_sent_msgs=693051,
                                           udp_recv_msgs=686063,
                                           loss_pct=100 * (693051 - 686063) / 693051),
    "netperf_texi_TCP_RR_classic.txt": dict(transactions_per_s=29150.15, duration_s=10.0),
    "netperf_texi_TCP_RR_migrated_-k_keyval.txt": dict(transactions_per_s=60074.74),
    "netperf_texi_TCP_RR_migrated_classic.txt": dict(transactions_per_s=59421.52),
    "netperf_texi_TCP_RR_v2_burst_-b6.txt": dict(throughput_mbps=1821.30, transactions_per_s=3473.252,
                                                 latency_mean_us=2015.402),
    "netperf_texi_TCP_RR_v2_histogram.txt": dict(transactions_per_s=3538.82),
    "netperf_texi_TCP_STREAM_confidence_warning_-i3-I99,5.txt": dict(
        throughput_mbps=40.23, confidence_interval_pct=6.8, confidence_achieved=0.0, duration_s=10.01),
    "netperf_texi_TCP_STREAM_default_localhost.txt": dict(throughput_mbps=2997.84),
    "netperf_texi_TCP_STREAM_demo_interim_-D.txt": dict(throughput_mbps=25375.66),
    "netperf_texi_TCP_STREAM_remote.txt": dict(throughput_mbps=80.42),
    "netperf_texi_UDP_RR_cpu_-c-C.txt": dict(transactions_per_s=15262.48, local_cpu_pct=13.90,
                                             remote_cpu_pct=16.11),
    "netperf_texi_UDP_STREAM_classic.txt": dict(
        throughput_mbps=2748.50, udp_sent_msgs=105672, udp_recv_msgs=104844, errors=0,
        loss_pct=100 * (105672 - 104844) / 105672),
    "netperf_texi_UDP_STREAM_remote_zero_recv.txt": dict(throughput_mbps=0.0, udp_sent_msgs=53595,
                                                         udp_recv_msgs=0, loss_pct=100.0),
    "netperf_texi_omni_rr_-O_human.txt": dict(transactions_per_s=60492.57),
    "netperf_texi_omni_rr_-k_keyval.txt": dict(transactions_per_s=59092.65),
    "netperf_texi_omni_rr_-o_csv.txt": dict(transactions_per_s=60999.07),
}
# The JSON fixture: one run per entry, first value of each data row.
PKB_JSON = [("transactions_per_s", 1405.50), ("transactions_per_s", 3545.77),
            ("transactions_per_s", 343.35), ("transactions_per_s", 1078.07),
            ("throughput_mbps", 1187.94), ("throughput_mbps", 1973.37),
            ("transactions_per_s", 1359.71), ("transactions_per_s", 3313.49),
            ("throughput_mbps", 1102.42), ("throughput_mbps", 1802.72)]


def fixture_files() -> list[Path]:
    return sorted(p for p in (FIXTURES / "netperf").iterdir() if p.is_file())


def check(result: ToolResult, expected: dict[str, float]) -> None:
    assert result.ok, result.reason
    assert "throughput_mbps" in result.metrics or "transactions_per_s" in result.metrics
    for name, value in expected.items():
        assert result.metrics.get(name) == pytest.approx(value), name


@pytest.mark.parametrize("path", fixture_files(), ids=lambda p: p.name)
def test_every_fixture_parses(path: Path) -> None:
    if path.suffix == ".json":
        runs = json.loads(path.read_text())
        assert len(runs) == len(PKB_JSON)
        for lines, (name, value) in zip(runs, PKB_JSON):
            check(NETPERF.parse("\n".join(lines) + "\n"), {name: value})
        return
    stdout, rc = load(path)
    result = NETPERF.parse(stdout, "", rc)
    if "error" in path.name:
        assert not result.ok and result.reason and not result.metrics
    else:
        check(result, EXPECTED.get(path.name, {}))


def test_expectations_name_real_files() -> None:
    assert set(EXPECTED) <= {p.name for p in fixture_files()}


def test_error_output_quotes_netperf() -> None:
    stdout, rc = load(FIXTURES / "netperf" / "netperf_real_error_no_server.txt")
    result = NETPERF.parse(stdout, "", rc)
    assert result.reason == ("netperf exited 255: establish control: are you sure there is a "
                             "netserver listening on 192.168.250.9 at port 12865?")
    # the same text without the exit status still is no result
    assert "are you sure" in (NETPERF.parse(stdout).reason or "")


def test_nonzero_exit_fails_even_with_a_table() -> None:
    stdout, _ = load(FIXTURES / "netperf" / "netperf_real_TCP_MAERTS_classic.txt")
    result = NETPERF.parse(stdout, "recv_response: Connection reset by peer", 1)
    assert not result.ok and result.reason == "netperf exited 1: recv_response: Connection reset by peer"


def test_no_output_is_a_failure_not_a_zero() -> None:
    assert NETPERF.parse("").reason == "netperf printed no result: no output"


def test_udp_receiver_zero_is_a_measurement() -> None:
    stdout, _ = load(FIXTURES / "netperf" / "netperf_texi_UDP_STREAM_remote_zero_recv.txt")
    result = NETPERF.parse(stdout)
    assert result.ok and result.metrics["throughput_mbps"] == 0.0
    assert "receiver got 0 of 53595 datagrams sent" in result.warnings


def test_confidence_warning_becomes_a_warning() -> None:
    stdout, _ = load(FIXTURES / "netperf" / "netperf_real_TCP_STREAM_-c-C_-I99,5_-i5,3.txt")
    (warning,) = NETPERF.parse(stdout).warnings
    assert "not achieved" in warning and "Throughput 17.067%" in warning


def test_interim_lines_become_intervals() -> None:
    stdout, _ = load(FIXTURES / "netperf" / "netperf_texi_TCP_STREAM_demo_interim_-D.txt")
    intervals = NETPERF.parse(stdout).intervals
    assert len(intervals) == 7
    assert dict(intervals[0]) == {"throughput_mbps": 25425.52, "duration_s": 1.25,
                                  "timestamp_ms": pytest.approx(1327962078405.0)}
    assert intervals[4]["duration_s"] == 1.27


DEMO = FIXTURES / "netperf" / "netperf_real_TCP_MAERTS_-c-C-j_-D0.3_-k.txt"
CATCHER = "catcher: timer popped with times_up != 0\n"


def test_keyval_interim_lines_become_intervals() -> None:
    stdout, _ = load(DEMO)
    result = NETPERF.parse(stdout)
    assert [iv["throughput_mbps"] for iv in result.intervals] == [6496.19, 5837.50, 5840.20, 4748.56]
    assert result.intervals[3]["duration_s"] == 0.040 and not result.warnings


def test_netperfs_timer_message_inside_an_interim_line_is_taken_out_and_the_line_read_whole() -> None:
    # a starved client: netperf's SIGALRM handler printed this on the same stream while
    # the interim line was half printed, so the figure went to the line after it
    stdout, _ = load(DEMO)
    garbled = stdout.replace("NETPERF_INTERIM_RESULT[3]=", "NETPERF_INTERIM_RESULT[3]=" + CATCHER)
    assert garbled != stdout
    assert NETPERF.parse(garbled) == NETPERF.parse(stdout)
    # at a line's start (where it is printed when it does not interrupt a line) too
    assert NETPERF.parse(stdout.replace("THROUGHPUT=", CATCHER + "THROUGHPUT=")) == NETPERF.parse(stdout)


def test_an_interim_result_that_is_not_a_figure_is_left_out_with_a_warning() -> None:
    stdout, _ = load(DEMO)
    result = NETPERF.parse(stdout.replace("NETPERF_INTERVAL[1]=0.334", "NETPERF_INTERVAL[1]=0.3#4"))
    assert result.ok and result.metrics == NETPERF.parse(stdout).metrics
    assert [iv["throughput_mbps"] for iv in result.intervals] == [6496.19, 5840.20, 4748.56]
    (warning,) = result.warnings
    assert warning.startswith("netperf interim result 1 is not figures (") and "0.3#4" in warning
    assert warning.endswith("left out")


def test_csv_with_more_values_than_headers_warns() -> None:
    stdout, _ = load(FIXTURES / "netperf" / "netperf_pkb_UDP_STREAM_-o_csv_confidence.txt")
    assert any("13 values for 12 header fields" in w for w in NETPERF.parse(stdout).warnings)


def test_missing_units_are_read_as_the_default_with_a_warning() -> None:
    stdout, _ = load(FIXTURES / "netperf" / "netperf_real_TCP_CRR_-c-C_-k.txt")
    assert any("THROUGHPUT_UNITS" in w for w in NETPERF.parse(stdout).warnings)


# -- argv ---------------------------------------------------------------------------------

def prof(protocol: Protocol, pattern: Pattern, **kw) -> Profile:
    return Profile("p", tool=Tool("netperf"), protocol=protocol, pattern=pattern, **kw)


@pytest.mark.parametrize("protocol,pattern,test,size_args", [
    (Protocol.TCP, Pattern.STREAM, "TCP_STREAM", ["-m", "16384"]),
    (Protocol.TCP, Pattern.MAERTS, "TCP_MAERTS", ["-m", ",16384"]),
    (Protocol.TCP, Pattern.RR, "TCP_RR", ["-r", "1,1"]),
    (Protocol.TCP, Pattern.CRR, "TCP_CRR", ["-r", "1,1"]),
    (Protocol.UDP, Pattern.STREAM, "UDP_STREAM", ["-m", "1472"]),
    (Protocol.UDP, Pattern.RR, "UDP_RR", ["-r", "1,1"]),
])
def test_client_argv_defaults(protocol, pattern, test, size_args) -> None:
    assert NETPERF.client_argv(prof(protocol, pattern), "198.18.0.2") == [
        "netperf", "-H", "198.18.0.2", "-t", test, "-l", "10", "-c", "-C", "-j",
        "--", "-k", SEL, *size_args]


def test_client_argv_with_everything() -> None:
    profile = prof(Protocol.TCP, Pattern.RR, message_size=64, response_size=1024, duration_s=30)
    assert NETPERF.client_argv(profile, "198.18.0.2", port=12866, confidence=(99, 5),
                               iterations=(10, 3)) == [
        "netperf", "-H", "198.18.0.2", "-p", "12866", "-t", "TCP_RR", "-l", "30", "-c", "-C", "-j",
        "-I", "99,5", "-i", "10,3", "--", "-k", SEL, "-r", "64,1024"]


def test_keyval_selectors_cover_the_brief() -> None:
    for name in ("THROUGHPUT", "THROUGHPUT_UNITS", "TRANSACTION_RATE", "P99_LATENCY",
                 "LOCAL_SEND_CALLS", "REMOTE_RECV_CALLS", "LOCAL_CPU_UTIL", "THROUGHPUT_CONFID"):
        assert name in SELECTORS


def test_server_argv() -> None:
    profile = prof(Protocol.TCP, Pattern.STREAM)
    assert NETPERF.server_argv(profile) == ["netserver", "-D"]
    assert NETPERF.server_argv(profile, port=12866) == ["netserver", "-D", "-p", "12866"]


@pytest.mark.parametrize("profile,match", [
    (prof(Protocol.TCP, Pattern.BIDIRECTIONAL), "no bidirectional test"),
    (prof(Protocol.UDP, Pattern.MAERTS), "no UDP_MAERTS test"),
    (prof(Protocol.UDP, Pattern.CRR), "no UDP_CRR test"),
    (prof(Protocol.UDP, Pattern.STREAM, rate_bps=10**8), "bit rate"),
    (Profile("p", tool=Tool("iperf3")), "is for iperf3"),
])
def test_unsupported_profiles_raise(profile, match) -> None:
    with pytest.raises(UnsupportedProfile, match=match):
        NETPERF.client_argv(profile, "198.18.0.2")


@pytest.mark.parametrize("kw", [dict(confidence=(90, 5)), dict(iterations=(3, 10)),
                                dict(port=70000)])
def test_bad_options_raise(kw) -> None:
    with pytest.raises(UnsupportedProfile):
        NETPERF.client_argv(prof(Protocol.TCP, Pattern.STREAM), "198.18.0.2", **kw)


def test_server_address_cannot_smuggle_options() -> None:
    with pytest.raises(UnsupportedProfile):
        NETPERF.client_argv(prof(Protocol.TCP, Pattern.STREAM), "-D 1 198.18.0.2")


# -- the result record and aggregation ----------------------------------------------------

def test_result_is_frozen_and_canonical() -> None:
    result = ToolResult(ok=True, metrics={"throughput_mbps": 1})
    with pytest.raises(TypeError):
        result.metrics["throughput_mbps"] = 2.0            # type: ignore[index]
    with pytest.raises(ValueError, match="not canonical"):
        ToolResult(ok=True, metrics={"Mbps": 1.0})
    with pytest.raises(ValueError):
        ToolResult(ok=False, reason="x", metrics={"throughput_mbps": 0.0})
    assert ToolResult.failed("boom") == ToolResult(ok=False, reason="boom")
    assert len({result, ToolResult(ok=True, metrics={"throughput_mbps": 1.0})}) == 1


def test_aggregate_sums_rates_and_weights_latency() -> None:
    a = ToolResult(ok=True, metrics=dict(transactions_per_s=1000, latency_mean_us=100,
                                         latency_p99_us=150, local_cpu_pct=40))
    b = ToolResult(ok=True, metrics=dict(transactions_per_s=3000, latency_mean_us=200,
                                         latency_p99_us=300, local_cpu_pct=50))
    result = NETPERF.aggregate([a, b])
    assert result.metrics["transactions_per_s"] == 4000
    assert result.metrics["latency_mean_us"] == pytest.approx(175)
    assert result.metrics["latency_p99_us"] == 300
    assert result.metrics["local_cpu_pct"] == 45          # whole-host figure: averaged
    assert any("upper bound" in w for w in result.warnings)


def test_aggregate_names_the_failed_instance() -> None:
    ok = ToolResult(ok=True, metrics={"throughput_mbps": 1.0})
    result = NETPERF.aggregate([ok, ToolResult.failed("netperf exited 1: boom"), ok])
    assert result.reason == "instance 2 of 3 failed: netperf exited 1: boom" and not result.metrics


def test_vet_fails_zero_results_and_short_intervals():
    """A run that exited 0 but moved nothing, or measured over less than 0.9 of what was
    asked, is a failed sample naming the figures."""
    from testbed.tools.base import ToolResult as TR
    from testbed.tools.base import vet
    from testbed.topology.model import Pattern as P
    from testbed.topology.model import Profile as Pr
    stream, rr = Pr("s", duration_s=10), Pr("r", pattern=P.RR, duration_s=10)
    zero = vet(TR(ok=True, metrics={"throughput_mbps": 0.0, "duration_s": 10.0}), stream)
    assert not zero.ok and "throughput_mbps 0" in zero.reason
    assert not vet(TR(ok=True, metrics={"transactions_per_s": 0.0, "duration_s": 10.0}), rr).ok
    short = vet(TR(ok=True, metrics={"throughput_mbps": 5.0, "duration_s": 8.5}), stream)
    assert not short.ok and "8.50 s" in short.reason and "10 s" in short.reason
    assert vet(TR(ok=True, metrics={"throughput_mbps": 5.0, "duration_s": 9.2}), stream).ok


def test_timeout_counts_confidence_iterations():
    from testbed.tools.netperf import NetperfDriver
    from testbed.topology.model import Profile as Pr
    d = NetperfDriver()
    assert d.runs(Pr("s")) == 1
    assert d.runs(Pr("s", confidence=(99, 5), iterations=(15, 3))) == 15
    assert d.runs(Pr("s", confidence=(99, 5))) == 10


def test_a_percentile_netperf_printed_as_int_min_is_left_out_not_read() -> None:
    """netperf 2.7.0 prints P50_LATENCY=-2147483648 when the median send of a stream took
    under a microsecond: the figure is left out (never a number), the others are kept."""
    stdout, _ = load(FIXTURES / "netperf" / "netperf_real_TCP_STREAM_-c-C_-k_p50_int_min.txt")
    assert "P50_LATENCY=-2147483648" in stdout
    res = NETPERF.parse(stdout, "", 0)
    m = res.metrics
    assert "latency_p50_us" not in m
    assert "netperf printed P50_LATENCY=-2147483648: not a figure; left out" in res.warnings
    assert m["latency_p99_us"] == 7 and m["throughput_mbps"] == 43137.51


@pytest.mark.parametrize("printed", ["inf", "nan", "-nan"])
def test_a_service_demand_netperf_printed_as_inf_or_nan_is_left_out_not_a_crash(printed: str) -> None:
    """On a busy host netperf can print a service demand of inf or nan (CPU time over a
    figure it read as 0). A scenario run crashed on it ("non-finite values for
    local_sd_us_per_kb"). The sample is kept, without that figure, and the warning names it.
    A throughput printed as inf is no result: the sample fails with a reason."""
    stdout, _ = load(FIXTURES / "netperf" / "netperf_real_TCP_STREAM_-c-C_-k_p50_int_min.txt")
    odd = stdout.replace("LOCAL_SD=0.380", f"LOCAL_SD={printed}").replace("REMOTE_SD=0.380", f"REMOTE_SD={printed}")
    assert odd != stdout
    res = NETPERF.parse(odd, "", 0)
    assert res.ok and res.metrics["throughput_mbps"] == 43137.51
    assert "local_sd_us_per_kb" not in res.metrics and "remote_sd_us_per_kb" not in res.metrics
    assert f"netperf printed LOCAL_SD={printed}: not a figure; left out" in res.warnings
    assert res.metrics["local_cpu_pct"] == 100.0
    none = NETPERF.parse(odd.replace("THROUGHPUT=43137.51", "THROUGHPUT=inf"), "", 0)
    assert not none.ok and "netperf printed no result" in (none.reason or "")
