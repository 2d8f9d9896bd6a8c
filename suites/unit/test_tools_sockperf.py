"""sockperf driver: real recorded output (fixtures/recorded/sockperf, see its SOURCES.md)
parses to the figures in it, its full log gives the percentiles with the messages behind
them, a rate not offered and every failure sockperf exits 0 on are failed results, its
messages agree with the recorded veth counters, and argv is exact."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from testbed import tools
from testbed.measure import crosscheck
from testbed.records import percentiles
from testbed.tools import ToolResult, UnsupportedProfile, get_tool, pacing
from testbed.tools.sockperf import parse
from testbed.topology.model import Pattern, Profile, Protocol, Tool

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "recorded" / "sockperf"
SOCKPERF = get_tool(Tool("sockperf"))


def out(name: str) -> str:
    return (FIXTURES / f"{name}.out").read_text()


def meta(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def prof(pattern=Pattern.RR, protocol=Protocol.UDP, size=64, rate=None, **kw) -> Profile:
    return Profile("p", tool=Tool("sockperf"), protocol=protocol, pattern=pattern, message_size=size,
                   rate_tps=rate, rate=f"{rate}tps" if rate else None, **kw)


# Figures read off the fixtures: [Valid Duration] (messages and seconds), [Total Run] counts,
# sockperf's own percentiles and observations.
LATENCY = {
    "pp-udp-64": dict(valid=(3.550, 134483, 134483), total=(154624, 154623), mean=26.343),
    "pp-tcp-64": dict(valid=(3.550, 97036, 97036), total=(112876, 112875), mean=36.531),
    "pp-udp-4000-mtu1500": dict(valid=(3.548, 90562, 90562), total=(96200, 96199), mean=39.118),
    "ul-udp-64-2000tps": dict(valid=(3.537, 7099, 7099), total=(7997, 7997), mean=877.104),
    "ul-tcp-64-1000tps": dict(valid=(3.549, 3550, 3550), total=(4001, 4001), mean=765.162),
    "pp-udp-64-guests-bridge": dict(valid=(15.553, 26175, 26175), total=(26983, 26982), mean=593.381),
}


def printed(text: str) -> dict[float, float]:
    """sockperf's own "---> percentile P = V" lines."""
    return {float(p): float(v) for p, v in re.findall(r"percentile\s+([\d.]+) =\s+([\d.]+)", text)}


@pytest.mark.parametrize("name", sorted(LATENCY))
def test_latency_output_parses_to_its_figures(name):
    want = LATENCY[name]
    r = SOCKPERF.parse(out(name))
    assert r.ok, r.reason
    m = r.metrics
    secs, sent, got = want["valid"]
    assert m["duration_s"] == secs and m["transactions_per_s"] == pytest.approx(got / secs)
    assert m["offered_per_s"] == pytest.approx(sent / secs)
    assert (m["msgs_sent"], m["msgs_replied"]) == want["total"]
    assert m["latency_mean_us"] == want["mean"]
    size = meta(name)["message_size"]
    assert m["bytes"] == sum(want["total"]) * size          # the whole run: the wire's window
    # every percentile sockperf printed, p25 .. p99.999, under its canonical name
    for p, v in printed(out(name)).items():
        assert m[percentiles.metric_name(p)] == v
    assert m["latency_min_us"] <= m["latency_p50_us"] <= m["latency_p99_9_us"] <= m["latency_max_us"]
    assert ("loss_pct" in m) == (meta(name)["protocol"] == "udp")


@pytest.mark.parametrize("name", sorted(LATENCY))
def test_the_full_log_gives_every_message_and_percentiles_within_a_bucket(name):
    text = out(name)
    hist = SOCKPERF.distribution(text)
    n = sum(c for *_, c in hist)
    observations = int(re.search(r"Total (\d+) observations", text).group(1))
    assert n == observations == LATENCY[name]["valid"][2]
    # buckets a hundredth of a decade wide: where a percentile has the messages it needs,
    # sockperf's exact figure lies in the bucket the histogram's percentile is interpolated
    # in, so they differ by less than 1 % (in a sparse tail the two ranks, sockperf's
    # round(q n) and the histogram's q n, can name neighbouring messages far apart)
    chosen = percentiles.choose((50.0, 90.0, 99.0, 99.9), {}, histogram=hist)
    exact = printed(text)
    for c in chosen:
        assert c.source == "histogram" and c.n == n
        assert c.sufficient == (n >= percentiles.required(c.p))
        if c.sufficient:
            assert c.value_us == pytest.approx(exact[c.p], rel=0.01), c
    assert all(hi - lo <= 0.0101 * hi for lo, hi, _ in hist)


def test_p99_9_rests_on_the_messages_it_needs():
    # 134,483 messages timed: p99.9 is sufficient; 7,099 under load: p99 yes, p99.9 not
    big = percentiles.choose((99.9,), {}, histogram=SOCKPERF.distribution(out("pp-udp-64")))[0]
    assert big.sufficient and big.n == 134483
    small = percentiles.choose((99.0, 99.9), {}, histogram=SOCKPERF.distribution(out("ul-udp-64-2000tps")))
    assert small[0].sufficient and not small[1].sufficient and "7099 transactions" in small[1].note
    # without the full log, sockperf's own p99.9 stands, with its observations behind it
    r = SOCKPERF.parse(out("pp-tcp-64"))
    tool = percentiles.choose((99.9, 99.999), r.metrics)
    assert tool[0].source == "tool" and tool[0].sufficient and tool[0].n == 97036
    assert tool[0].value_us == r.metrics["latency_p99_9_us"]
    assert not tool[1].sufficient        # p99.999 needs 1,000,000


def test_sockperf_3_8_and_later_summary_line_is_read_not_taken_for_an_error():
    # 3.8+ (upstream 3.10's src/client.cpp) adds dispersion figures, "std-error" among them
    newer = out("pp-udp-64").replace(
        "====> avg-rtt=26.343 (std-dev=172.873)",
        "====> avg-rtt=26.343 (std-dev=172.873, mean-ad=4.112, median-ad=2.031, siqr=1.502, cv=6.562, "
        "std-error=0.471, 99.0% ci=[25.130, 27.556])")
    assert newer != out("pp-udp-64")
    r = parse(newer)
    assert r.ok, r.reason
    assert r.metrics["latency_mean_us"] == 26.343 and r.metrics["latency_stddev_us"] == 172.873
    # an error line of sockperf's own still fails the sample
    assert not parse(out("pp-udp-64") + "sockperf: ERROR: something\n").ok


def _buckets(text: str, edit) -> str:  # noqa: ANN001
    lines = text.splitlines(keepends=True)
    return "".join(edit(ln) if ln.startswith("sockperf-full-log-bucket: ") else ln for ln in lines)


def test_a_full_log_that_disagrees_with_sockperfs_summary_fails_with_both_figures():
    text = out("pp-udp-64")

    def scaled(ln: str) -> str:      # the log's times in the wrong unit
        _, lo, hi, c = ln.split()
        return f"sockperf-full-log-bucket: {float(lo) * 1000:g} {float(hi) * 1000:g} {c}\n"
    r = parse(_buckets(text, scaled))
    assert not r.ok and r.reason.startswith("sockperf's p50 is ") and "its full log puts the messages" in r.reason
    # two thirds of the buckets lost, and the rows line with them
    kept = iter(range(10**6))
    cut = _buckets(text, lambda ln: ln if next(kept) % 3 == 0 else "").replace("sockperf-full-log-rows: 134483\n", "")
    r = parse(cut)
    assert not r.ok and r.reason.startswith("sockperf's full log gives ") and "its summary 134483 observations" in r.reason


def test_a_percentile_past_the_answered_share_is_not_given_over_the_answered_requests():
    # an open-loop client whose 1.9 % of requests got no reply (251 of 13,080 in a real run
    # with a lossy path): p99 and p99.9 lie among the lost requests, which have no time
    hist = SOCKPERF.distribution(out("pp-udp-64"))
    lossy = {"offered_per_s": 13080 / 3.5, "transactions_per_s": 12829 / 3.5}
    p50, p99, p999 = percentiles.choose((50.0, 99.0, 99.9), lossy, histogram=hist)
    assert p50.sufficient and not p99.sufficient and not p999.sufficient
    assert p99.note == "1.92% of the requests got no reply: p99 lies among them"
    # without the loss (or from the tool's own figures alike) they stand
    assert all(c.sufficient for c in percentiles.choose((50.0, 99.0, 99.9), {}, histogram=hist))
    r = SOCKPERF.parse(out("pp-tcp-64"))
    assert all(c.sufficient for c in percentiles.choose((50.0, 99.0, 99.9), r.metrics))
    assert not percentiles.choose((99.0,), {**r.metrics, **lossy})[0].sufficient


def test_paced_load_at_its_rate_is_offered_and_open_loop():
    r = SOCKPERF.parse_sample(out("ul-udp-64-2000tps"), profile=prof(rate=2000))
    assert r.ok, r.reason
    assert r.metrics["offered_per_s"] == pytest.approx(2000, rel=0.01)
    assert pacing.loop_label(SOCKPERF) == "open-loop"
    assert SOCKPERF.mode(prof(rate=2000)) == "under-load" and SOCKPERF.mode(prof()) == "ping-pong"


def test_a_rate_not_offered_fails_with_both_figures():
    r = SOCKPERF.parse_sample(out("ul-udp-64-400000tps"), profile=prof(rate=400000))
    assert not r.ok and not r.metrics
    # 246,981 sent in 3.548 s: 69,611 a second of the 400,000 asked
    assert "offered 69611 requests/s of the 400000 asked" in r.reason, r.reason
    assert "rate is too high" in r.reason
    # the same without a profile: the rate asked is read from sockperf's own parameters
    assert not parse(out("ul-udp-64-400000tps")).ok
    # a paced profile whose output carries no parameters cannot be checked: failed, not trusted
    plain = "\n".join(ln for ln in out("ul-udp-64-2000tps").splitlines() if "sockperf-full-log" not in ln)
    r = SOCKPERF.parse_sample(plain, profile=prof(rate=2000))
    assert not r.ok and "cannot be checked" in r.reason


@pytest.mark.parametrize("name,why", [
    ("pp-udp-64-no-server", "No messages were received from the server"),
    ("pp-tcp-64-refused", "ERROR: Can`t connect socket (errno=111 Connection refused)"),
])
def test_failures_sockperf_exits_0_on_are_failed_results(name, why):
    assert meta(name)["rc"] == [0]
    r = SOCKPERF.parse(out(name))
    assert not r.ok and why in r.reason and not r.metrics


def test_other_failures():
    assert "exited 1" in parse(out("pp-udp-64"), rc=1).reason
    assert parse("").reason == "sockperf printed no result ([Total Run], [Valid Duration], observations missing): no output"
    # the usage text it prints (exit 0) for an option it does not know
    assert not parse("Usage: sockperf ping-pong [options] [args]...\n").ok
    # a full log that lost messages against the summary
    cut = out("pp-udp-64").replace("sockperf-full-log-rows: 134483", "sockperf-full-log-rows: 134000")
    assert "full log has 134000 messages" in parse(cut).reason


def test_throughput_output():
    r = SOCKPERF.parse_sample(out("tp-tcp-16384"), profile=prof(Pattern.STREAM, Protocol.TCP, 16384))
    assert r.ok, r.reason
    assert r.metrics["bytes"] == 288540 * 16384 and r.metrics["duration_s"] == 4.0
    assert r.metrics["throughput_mbps"] == pytest.approx(288540 * 16384 * 8 / 4.0 / 1e6)
    # without the profile, sockperf's BandWidth (MiB/s, three decimals, over its unrounded
    # time) gives the same rate
    assert parse(out("tp-tcp-16384")).metrics["throughput_mbps"] == pytest.approx(r.metrics["throughput_mbps"], rel=5e-4)
    paced = SOCKPERF.parse_sample(out("tp-tcp-1472-100mbit"), profile=prof(Pattern.STREAM, Protocol.TCP, 1472))
    assert paced.ok and paced.metrics["throughput_mbps"] == pytest.approx(100, rel=0.01)
    # the same output against a higher rate asked: not offered
    higher = out("tp-tcp-1472-100mbit").replace("mps=8492", "mps=20000")
    assert "sent 8493 messages/s of the 20000 asked" in parse(higher).reason


def test_two_clients_of_a_pair_add_up():
    rs = [SOCKPERF.parse(out(f"ul-udp-64-2x1000tps-{i}")) for i in (0, 1)]
    agg = SOCKPERF.aggregate(rs)
    assert agg.ok
    assert agg.metrics["msgs_sent"] == 8002 and agg.metrics["offered_per_s"] == pytest.approx(2000, rel=0.01)
    # the largest instance's p99 stands for the pair (each rests on its 3,550 messages); its
    # p99.9 would rest on 3,550 where it needs 10,000, though the two add up to 7,101
    assert agg.metrics["latency_p99_us"] == max(r.metrics["latency_p99_us"] for r in rs)
    assert "latency_p99_9_us" not in agg.metrics
    assert any(w.startswith("latency_p99_9_us left out: an instance's own figure rests on 35") for w in agg.warnings)
    merged = percentiles.merge([SOCKPERF.distribution(out(f"ul-udp-64-2x1000tps-{i}")) for i in (0, 1)])
    assert sum(c for *_, c in merged) == 3551 + 3550


@pytest.mark.parametrize("name", [*sorted(LATENCY), "ul-udp-64-400000tps"])
def test_messages_agree_with_the_recorded_wire(name):
    """Requests sent and replies received (sockperf's whole run) against the client veth's
    packets each way over the same window, as recorded."""
    md = meta(name)
    m = parse(out(name)).metrics if name != "ul-udp-64-400000tps" else _counts(out(name))
    dev = md["client_device"]
    proto = Protocol(md["protocol"])
    # a namespace's own veth counts what its endpoint sends as tx
    msg = crosscheck.messages(proto, m, dev["tx_packets"], dev["rx_packets"],
                              message_size=md["message_size"], mtu=md["mtu"], device="tb-spa0")
    if proto is Protocol.TCP:
        assert msg.verdict == "unchecked"
        return
    assert msg.verdict == "ok", msg
    assert msg.frames_per_message == (3 if md["message_size"] == 4000 else 1)
    assert msg.lost == msg.sent - msg.replied
    # a tool that counted more than the wire carried, either way, fails with both figures
    claimed = dev["tx_packets"] // msg.frames_per_message + 1
    more = crosscheck.messages(proto, {**m, "msgs_sent": claimed}, dev["tx_packets"], dev["rx_packets"],
                               message_size=md["message_size"], mtu=md["mtu"])
    assert more.verdict == "fail" and f"counted {claimed} requests sent" in more.reason
    replied = crosscheck.messages(proto, {**m, "msgs_replied": dev["rx_packets"] // msg.frames_per_message + 1},
                                  dev["tx_packets"], dev["rx_packets"], message_size=md["message_size"], mtu=md["mtu"])
    assert replied.verdict == "fail" and "replies" in replied.reason
    slack = crosscheck.MESSAGE_SLACK + math.ceil(crosscheck.MESSAGE_SLACK_SHARE * dev["tx_packets"])
    extra = crosscheck.messages(proto, m, dev["tx_packets"] + slack + 1, dev["rx_packets"],
                                message_size=md["message_size"], mtu=md["mtu"])
    assert extra.verdict == "fail" and "more than the" in extra.reason


def _counts(text: str) -> dict[str, float]:
    sent, got = re.search(r"SentMessages=(\d+); ReceivedMessages=(\d+)", text).groups()
    return {"msgs_sent": float(sent), "msgs_replied": float(got)}


def test_loss_is_split_by_where_the_wire_saw_it():
    md = meta("ul-udp-64-400000tps")
    dev = md["client_device"]
    msg = crosscheck.messages(Protocol.UDP, _counts(out("ul-udp-64-400000tps")), dev["tx_packets"], dev["rx_packets"],
                              message_size=64, mtu=1500)
    # 282,916 requests left the client's device, 170,002 replies came back to it, the tool
    # counted 165,302 of them
    assert (msg.sent, msg.replied, msg.lost) == (282916, 165302, 117614)
    assert (msg.lost_beyond_client, msg.lost_at_client) == (282916 - 170002, 170002 - 165302)
    check = crosscheck.with_messages(crosscheck.check(Protocol.UDP, Pattern.RR, {"bytes": 1.0}, 10, 1, mtu=1500,
                                                      message_size=64), msg)
    assert check.verdict == "ok" and check.messages["lost_at_client"] == 4700


def test_argv():
    assert SOCKPERF.client_argv(prof(), "198.18.0.2", port=11111)[4:] == [
        "sockperf", "ping-pong", "-i", "198.18.0.2", "-p", "11111", "--msg-size", "64", "--time", "11",
        "--full-rtt"]
    argv, n = SOCKPERF.client_plan(prof(Pattern.RR, Protocol.TCP, rate=5000), "198.18.0.2",
                                   port=None, connections=4, write_file=None)
    assert n == 4 and argv[:2] == ["sh", "-c"] and argv[4:] == [
        "sockperf", "under-load", "-i", "198.18.0.2", "-p", "11111", "--msg-size", "64", "--time", "11", "--tcp",
        "--full-rtt", "--mps", "1250", "--reply-every", "1"]
    stream = Profile("s", tool=Tool("sockperf"), pattern=Pattern.STREAM, message_size=1472, rate="100mbit",
                     rate_bps=100_000_000, duration_s=3)
    assert SOCKPERF.client_argv(stream, "198.18.0.2") == [
        "sockperf", "throughput", "-i", "198.18.0.2", "-p", "11111", "--msg-size", "1472", "--time", "4", "--tcp",
        "--mps", "8492"]
    srv = SOCKPERF.server_argv(prof(), port=11112)
    assert srv[:2] == ["sh", "-c"] and srv[3:] == ["sockperf-server", "11112"]
    assert "exec sockperf server -f /proc/self/fd/3 -F epoll" in srv[2]
    with pytest.raises(UnsupportedProfile):
        SOCKPERF.client_argv(prof(), "198.18.0.2; reboot")
    with pytest.raises(UnsupportedProfile, match="confidence"):
        SOCKPERF.client_argv(prof(), "198.18.0.2", confidence=(99, 5))


@pytest.mark.parametrize("profile,reason", [
    (Profile("p", tool=Tool("sockperf"), pattern=Pattern.RR), "set message_size to 14 or more"),
    (prof(size=8), "below sockperf's 14-byte message header"),
    (prof(size=70000), "above sockperf's largest message, 65507 bytes"),
    (prof(response_size=128), "response_size must equal message_size"),
    (prof(Pattern.CRR, Protocol.TCP), "no connect/request/response"),
    (prof(Pattern.MAERTS, Protocol.TCP), "sends from the client only"),
    (prof(Pattern.STREAM, Protocol.UDP), "received rate is unknown"),
])
def test_profiles_it_cannot_run_say_why(profile, reason):
    assert reason in SOCKPERF.unsupported_reason(profile)


def test_version_and_pacing_probe_from_real_output():
    assert re.search(SOCKPERF.version_re, out("version")).group(1) == "3.7"
    assert SOCKPERF.pacing_verdict(out("pacing-probe"), "", 0) is None
    assert "refuses under-load --mps" in SOCKPERF.pacing_verdict("Usage: sockperf under-load [options]\n", "", 0)
    assert "sockperf" in tools.names() and SOCKPERF.search_unsupported


def test_parse_is_total_on_every_fixture():
    for p in sorted(FIXTURES.glob("*.out")):
        assert isinstance(SOCKPERF.parse(p.read_text()), ToolResult)
