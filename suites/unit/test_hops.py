"""Per-hop latency (testbed.measure.hops): the plan of a path, the rendered program, the
parser and statistics on real recorded tracer output, the closure, the cost of tracing, the
topology option, and the gate naming the hop a regression is in."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from testbed.analysis import hopgate
from testbed.errors import ConfigError
from testbed.measure.hops import bpfstats, closure, overhead, parse, plan, program, twins
from testbed.records.records import SampleRecord
from testbed.topology import config
from testbed.topology.model import Attachment, Backend, Cell, Pattern, Profile

FIX = Path(__file__).parent / "fixtures" / "hops"

BRIDGE = [plan.Device("tb-x-a1", "tb-x-a", "tx"), plan.Device("tb-x-a0", None, "rx"),
          plan.Device("tb-x-b0", None, "tx"), plan.Device("tb-x-b1", "tb-x-b", "rx")]


def test_a_bridge_path_crosses_its_devices_both_ways_in_order():
    p = plan.namespace_plan(BRIDGE, "linux-bridge")
    assert [h.id for h in p.hops] == [
        "req.client_stack", "req.1.wire", "req.2.switch", "req.3.wire", "req.server_stack", "server_app",
        "resp.server_stack", "resp.1.wire", "resp.2.switch", "resp.3.wire", "resp.client_stack", "client_app"]
    names = p.tracers[0].point_names()
    hop = {h.id: h for h in p.hops}
    # the request leaves a1, enters the bridge at a0, leaves it at b0 and arrives on b1
    assert (names[hop["req.1.wire"].start], names[hop["req.1.wire"].end]) == ("tb-x-a1 transmit", "tb-x-a0 receive")
    assert (names[hop["req.2.switch"].start], names[hop["req.2.switch"].end]) == \
        ("tb-x-a0 receive", "tb-x-b0 transmit")
    assert (names[hop["resp.2.switch"].start], names[hop["resp.2.switch"].end]) == \
        ("tb-x-b0 receive", "tb-x-a0 transmit")
    assert "linux-bridge" in hop["req.2.switch"].label
    # every point of a chain is the start of the next hop: the hops tile the round trip
    for a, b in zip(p.hops, p.hops[1:]):
        assert a.end == b.start


def test_a_veth_pair_has_one_wire_named_by_its_datapath():
    p = plan.namespace_plan([plan.Device("tb-x-a1", "tb-x-a", "tx"), plan.Device("tb-x-b1", "tb-x-b", "rx")], "veth")
    assert [h.id for h in p.hops if h.leg == "request"] == ["req.client_stack", "req.1.wire", "req.server_stack"]
    assert "(veth)" in next(h.label for h in p.hops if h.id == "req.1.wire")


def test_guests_get_their_stacks_in_their_own_tracers_and_hand_offs_from_spans():
    p = plan.guest_plan([plan.Device("tb-x-t0", None, "rx"), plan.Device("tb-x-t1", None, "tx")],
                        "linux-bridge", "g1", "eth1", "g2", "eth1")
    by = {h.id: h for h in p.hops}
    assert by["req.client_stack"].tracer == "g1" and by["req.server_stack"].tracer == "g2"
    assert by["req.1.switch"].tracer == "host"
    # both clocks' offsets cancel: the guest's span less the host's (and the reverse)
    assert by["client.handoff"].spans == (("g1", 3, 1), ("host", 1, -1))
    assert by["server.handoff"].spans == (("host", 2, 1), ("g2", 3, -1))
    assert {t.name for t in p.tracers} == {"host", "g1", "g2"}


def test_one_kernel_follows_fewer_transactions_than_several():
    # a namespace path is seen whole by one tracer at tens of thousands of transactions a
    # second: one in 32 is followed; guests' kernels follow one in 8 of their fewer
    ns = plan.namespace_plan(BRIDGE, "linux-bridge")
    guests = plan.guest_plan([plan.Device("tb-x-t0", None, "rx"), plan.Device("tb-x-t1", None, "tx")],
                             "linux-bridge", "g1", "eth1", "g2", "eth1")
    assert program.sample_for(ns) == 32 and program.sample_for(guests) == 8
    t = ns.tracers[0]
    assert "nsecs % 32 == 0" in program.render(t, _where(t), "198.18.0.0/24", program.TRACEPOINTS,
                                               program.sample_for(ns))


def _where(t: plan.TracerPlan) -> program.Where:
    return program.Where({(d.device.name, d.device.netns): 10 + i for i, d in enumerate(t.devices)},
                         {None: 4026531840, "tb-x-a": 4026532001, "tb-x-b": 4026532002})


def test_the_program_matches_the_plans_devices_and_subnet():
    t = plan.namespace_plan(BRIDGE, "linux-bridge").tracers[0]
    text = program.render(t, _where(t), "198.18.0.0/24", program.TRACEPOINTS)
    assert "tracepoint:net:net_dev_queue" in text and "tracepoint:net:netif_receive_skb" in text
    assert "if ($ifi == 10 && $ns == 4026532001) { $p = 2; }" in text
    assert "tracepoint:tcp:tcp_sendmsg_locked" in text and "sock_recv_length" in text
    # a bridge hands the same buffer on: no header is read, one transaction in 8 is drawn
    assert "@hdr" not in text and "nsecs % 8 == 0" in text
    ovs = plan.namespace_plan(BRIDGE, "ovs-netdev", copies=True).tracers[0]
    copied = program.render(ovs, _where(ovs), "198.18.0.0/24", program.TRACEPOINTS, sample=16)
    # 198.18.0.0/24 read as bpftrace reads the header's bytes: little-endian
    assert "@hdr" in copied and "== 4806" in copied and "& 16777215" in copied and "nsecs % 16" in copied
    bare = program.render(t, _where(t), "198.18.0.0/24", program.DEVICES_ONLY)
    # no socket probes: the packets are drawn from their headers where they enter
    assert "sendmsg" not in bare and "@fl" not in bare and "$ack % 8 == 0" in bare


def test_percentiles_land_in_the_right_bucket():
    st = parse.stats({1200: 50, 1300: 40, 5000: 10})
    assert st.n == 100
    assert st.p50_us == 1.25          # 1200..1299: its middle
    assert st.p90_us == 1.35
    assert st.p99_us == 5.05
    assert parse.bucket_width(99) == 1 and parse.bucket_width(100) == 10 and parse.bucket_width(25000) == 1000
    assert parse.stats({}) is None


def test_output_that_is_not_the_programs_is_refused():
    with pytest.raises(parse.TracerOutputError, match="not understood"):
        parse.parse("@h[1, 2]: x\n")
    with pytest.raises(parse.TracerOutputError, match="without from, to"):
        parse.parse("@h[1, 2]: 3\n")


def test_a_tracer_that_could_not_run_gives_not_observed_with_its_reason():
    p = plan.guest_plan([plan.Device("tb-x-t0", None, "rx"), plan.Device("tb-x-t1", None, "tx")],
                        "linux-bridge", "g1", "eth1", "g2", "eth1")
    rec = closure.hops_record(p, {"host": closure.TracerResult("host", parse.Output({}, {}, True)),
                                  "g1": closure.TracerResult("g1", None, "g1 cannot trace: bpftrace not installed"),
                                  "g2": closure.TracerResult("g2", None, "g2 cannot trace: bpftrace not installed")},
                              {"latency_p50_us": 900.0}, 0.1)
    reasons = {r["hop"]: r["reason"] for r in rec["not_observed"]}
    assert reasons["req.client_stack"] == "g1 cannot trace: bpftrace not installed"
    assert reasons["client.handoff"].startswith("g1: g1 cannot trace")
    assert reasons["req.1.switch"] == "no packet seen between its points"
    assert rec["closure"]["unexplained_us"] == 900.0 and not rec["closure"]["within"]


def _sample(rep: int, tps: float, p50: float, busy: float, hops: dict | None = None) -> SampleRecord:
    return SampleRecord.new("r", {"id": "c", "attachment": "netns-bridge"}, rep, False, "ok", None,
                            {"transactions_per_s": tps, "latency_p50_us": p50, **(hops or {})},
                            {"host": {"busy": busy}}, "t0", "t1")


def test_the_cost_of_tracing_is_the_median_of_its_rounds_against_its_bound():
    pairs = [overhead.pair(i, _sample(i, 20000, 30, 1.0), _sample(i, t, 31, 1.05))
             for i, t in enumerate((19500, 19400, 19800))]
    assert pairs[0]["tps_cost_pct"] == 2.5 and pairs[0]["p50_added_us"] == 1
    ok = overhead.summary(pairs, 0.05)
    assert ok["tps_cost_pct"] == 2.5 and ok["within_bound"] and "within the 5% bound" in ok["note"]
    over = overhead.summary(pairs, 0.02)
    assert not over["within_bound"] and "beyond the 2% bound" in over["note"]
    assert overhead.summary([], 0.05)["within_bound"] is None
    assert "saturated" not in ok["note"] and "saturated_rounds" not in overhead.summary(pairs, 0.05, 2)


def test_the_round_that_counted_bpf_run_time_is_left_out_of_the_cost():
    # counting BPF's run time costs a clock read per program run: the round whose traced
    # sample counted it is slower for that, and is not the tracer's cost
    def traced(rep: int, tps: float, counted: bool) -> SampleRecord:
        bpf = {"cores": 0.14, "ns_per_run": 69.0, "run_cnt": 10, "run_time_ns": 690} if counted else \
            {"not_counted": "counted in the cell's first sample only"}
        s = _sample(rep, tps, 31, 1.0)
        return SampleRecord.new("r", {"id": "c", "attachment": "netns-bridge"}, rep, False, "ok", None,
                                s.metrics, {"host": {"busy": 1.0}}, "t0", "t1",
                                extra={"hops": {"tracers": {"host": {"bpf": bpf}}}})
    pairs = [overhead.pair(i, _sample(i, 20000, 30, 1.0), traced(i, t, i == 0))
             for i, t in enumerate((16000, 19000, 19200))]
    assert [p["bpf_counted"] for p in pairs] == [True, False, False]
    got = overhead.summary(pairs, 0.05)
    assert got["tps_cost_pct"] == 4.5 and got["within_bound"], got        # rounds 1 and 2 only
    assert got["bpf_ns_per_run"] == 69.0 and got["bpf_cores"] == 0.14     # from the round that counted
    assert "did not count BPF's run time" in got["note"]
    # without a round that did not count, every round is judged
    assert overhead.summary(pairs[:1], 0.05)["tps_cost_pct"] == 20.0


def test_a_cost_measured_on_a_saturated_host_says_so():
    # a 2-core host busy on both cores in two rounds (as on a shared CI machine)
    pairs = [overhead.pair(i, _sample(i, 10000, 30, b), _sample(i, 5000, 45, b))
             for i, b in enumerate((2.0, 1.99, 1.2))]
    got = overhead.summary(pairs, 0.05, 2)
    assert got["saturated_rounds"] == 2 and "saturated in 2 of 3 rounds" in got["note"]
    assert got["tps_cost_pct"] == 50.0 and got["within_bound"] is False


def test_bpf_run_time_is_read_from_the_tracers_fdinfo():
    st = bpfstats.parse_fdinfo((FIX / "fdinfo.txt").read_text().split("\n\n"))
    assert st.programs == 3 and st.run_cnt > 0 and st.ns_per_run and st.ns_per_run > 10


def _rr(hops: bool = True) -> Profile:
    return Profile("rr", pattern=Pattern.RR, hops=hops)


def test_a_traced_twin_follows_its_cell_and_keeps_the_untraced_hash():
    plain = Cell(Attachment("netns-bridge"), Backend.QEMU, 1500, 1, _rr())
    cells = twins.expand([plain, Cell(Attachment("netns-veth"), Backend.QEMU, 1500, 1, _rr(False))])
    assert [c.id for c in cells] == ["netns-bridge-qemu-mtu1500-conn1-rr", "netns-bridge-qemu-mtu1500-conn1-rr-hops",
                                     "netns-veth-qemu-mtu1500-conn1-rr"]
    assert cells[0].hash == Cell(Attachment("netns-bridge"), Backend.QEMU, 1500, 1, _rr(False)).hash
    assert cells[1].hash != cells[0].hash
    assert twins.traced(cells[1]) and not twins.traced(cells[0])
    assert twins.untraced(cells[1]) == cells[0] and twins.untraced(cells[2]) == cells[2]


def test_a_cell_and_its_traced_twin_are_one_step_of_the_run():
    from testbed.measure.run import Group, Run
    from testbed.topology import config
    t = config.parse(_topology("", "{name: rr, tool: netperf, pattern: rr, hops: true}")
                     .replace("[netns-bridge]", "[netns-bridge]\n  mtus: [1500, 9000]"), "t.yaml")
    cells = __import__("testbed.measure.plan", fromlist=["plan"]).plan(t)
    steps = Run(t).steps(Group(cells[0].attachment, cells[0].backend, 1, tuple(cells)))
    assert [[c.id for c in s] for s in steps] == [
        ["netns-bridge-qemu-mtu1500-conn1-rr", "netns-bridge-qemu-mtu1500-conn1-rr-hops"],
        ["netns-bridge-qemu-mtu9000-conn1-rr", "netns-bridge-qemu-mtu9000-conn1-rr-hops"]]
    # resumed after the untraced cell was measured: the traced one alone
    assert [[c.id for c in s] for s in Run(t).steps(Group(cells[0].attachment, cells[0].backend, 1,
                                                         tuple(cells[1:])))][0] == [cells[1].id]


def test_rounds_pair_the_samples_of_one_repetition():
    plain = [_sample(0, 20000, 30, 1.0), _sample(1, 20000, 30, 1.0), _sample(2, 21000, 30, 1.0)]
    traced = [_sample(0, 19000, 31, 1.1), _sample(1, 19600, 31, 1.1)]
    got = overhead.rounds(plain, traced)
    assert [(p["round"], p["tps_cost_pct"]) for p in got] == [(0, 5.0), (1, 2.0)]
    failed = SampleRecord.new("r", {"id": "c"}, 1, False, "failed", "x", {}, {}, "t0", "t1")
    assert [p["round"] for p in overhead.rounds([plain[0], failed], traced)] == [0]


def _topology(extra: str, profile: str = "{name: rr, tool: netperf, pattern: rr, hops: true}") -> str:
    return f"{extra}\nmatrix:\n  attachments: [netns-bridge]\n  profiles:\n    - {profile}\n"


@pytest.mark.parametrize("text, message", [
    (_topology("", "{name: st, tool: netperf, pattern: stream, hops: true}"), "request/response profiles only"),
    (_topology("hops: {overhead_bound_pct: 500}"), "hops.overhead_bound_pct"),
    (_topology("hops: {closure: 10}"), "hops.closure: unknown key"),
    (_topology("hops: {overhead_bound_pct: 5}", "{name: rr, tool: netperf, pattern: rr}"), "no profile asks"),
])
def test_bad_hop_settings_are_refused_naming_the_field(text, message):
    with pytest.raises(ConfigError, match=message):
        config.parse(text, "t.yaml")


def test_hop_settings_are_read():
    t = config.parse(_topology("hops: {overhead_bound_pct: 3, closure_tolerance_pct: 20}"), "t.yaml")
    assert t.matrix.profiles[0].hops and t.hops.overhead_bound == 0.03 and t.hops.closure_tolerance == 0.2


def test_run_json_cost_record_is_plain_json():
    pairs = [overhead.pair(0, _sample(0, 20000, 30, 1.0), _sample(0, 19000, 33, 1.1))]
    json.dumps(overhead.summary(pairs, 0.05))


def test_history_reads_a_slower_hop_as_a_regression():
    from testbed.analysis import history
    pts = [history.Point(f"r{i}", f"2026-01-{i + 1:02d}", v, 6, 0.05, ())
           for i, v in enumerate([10.0, 10.1, 9.9, 10.0, 10.1, 9.9, 14.0, 14.1, 13.9, 14.0])]
    s = history.judge("c-hops", "h", "hop_p50_us.req.2.switch", "env", pts)
    assert s.change_points and all(c.regression for c in s.change_points)


def _hop_samples(slow: str | None, n: int = 6) -> list[dict]:
    """Per sample, hop figures with run-to-run jitter; ``slow`` 50 us slower."""
    base = {"hop_p50_us.req.1.wire": 2.1, "hop_p50_us.req.2.switch": 3.4, "hop_p99_us.req.2.switch": 9.0,
            "hop_p50_us.server_app": 6.0, "hop_p50_us.unexplained": 1.2}
    return [{k: v * (1 + 0.02 * ((i * 7) % 5 - 2)) + (50.0 if slow and k.endswith("." + slow) else 0.0)
             for k, v in base.items()} for i in range(n)]


def test_the_gate_names_the_hop_a_regression_is_in():
    from testbed.analysis import compare
    comps = hopgate.comparisons(_hop_samples(None), _hop_samples("req.2.switch"))
    cell = compare.CellResult("c", "netns-bridge", "qemu", 1500, 1, "rr", compare.CellVerdict.INCONCLUSIVE,
                              tuple(compare.MetricResult(k, False, c) for k, c in comps), 6, 0, 6, 0, ())
    cells = compare._finish([cell], 0.05)[0]
    line = hopgate.attribution("c", cells[0].metrics)
    assert line is not None and "regressed in hop req.2.switch" in line
    assert {hopgate.hop_of(m.metric) for m in hopgate.regressed(cells[0].metrics)} == {"req.2.switch"}
    # a scheduling tail elsewhere moves a p99 far more than the seeded hop's median moves:
    # the note still names the hop whose median moved first
    tail = [{**m, "hop_p99_us.req.2.switch": m["hop_p99_us.req.2.switch"] + 1700.0}
            for m in _hop_samples("req.1.wire")]
    comps = hopgate.comparisons(_hop_samples(None), tail)
    cell = compare.CellResult("c", "netns-bridge", "qemu", 1500, 1, "rr", compare.CellVerdict.INCONCLUSIVE,
                              tuple(compare.MetricResult(k, False, c) for k, c in comps), 6, 0, 6, 0, ())
    metrics = compare._finish([cell], 0.05)[0][0].metrics
    assert [m.metric for m in hopgate.regressed(metrics)][:2] == ["hop_p50_us.req.1.wire", "hop_p99_us.req.2.switch"]
    assert "regressed in hop req.1.wire p50" in hopgate.attribution("c", metrics)
    quiet = hopgate.comparisons(_hop_samples(None), _hop_samples(None))
    assert not [k for k, c in quiet if c.verdict.value == "regressed"]


def test_the_tracing_bench_floor_attaches_the_tracers_probes_with_empty_bodies():
    from testbed.bench import tracing
    from testbed.host.bpftrace import DEVICES_ONLY, TRACEPOINTS
    text = tracing.floor_program(TRACEPOINTS)
    probes = [ln.split(" {")[0] for ln in text.splitlines() if ln.endswith("{ }")]
    assert probes == ["tracepoint:net:net_dev_queue", "tracepoint:net:netif_receive_skb",
                      TRACEPOINTS.send_probe, TRACEPOINTS.ready_probe, TRACEPOINTS.recv_probe]
    assert "tb-hops ready" in text and "tb-hops end" in text
    assert tracing.floor_program(DEVICES_ONLY).count("{ }") == 2


def test_the_tracing_bench_pairs_each_arm_with_its_rounds_untraced_sample():
    from testbed.bench import tracing
    rounds = [{"untraced": {"tps": 200.0}, "probes": {"tps": 180.0}, "hops": {"tps": 160.0},
               "counted": {"tps": 150.0, "run_cnt": 1400, "run_time_ns": 70_000, "window_s": 0.001,
                           "transactions": 100.0}},
              {"untraced": {"tps": 100.0}, "probes": {"tps": 92.0}, "hops": {"tps": 84.0}},   # counted failed
              {"untraced": {"tps": 210.0}, "probes": {"tps": 189.0}, "hops": {"tps": 168.0},
               "counted": {"tps": 157.5, "run_cnt": 1500, "run_time_ns": 60_000, "window_s": 0.002,
                           "transactions": 100.0}}]
    s = tracing.summarize(rounds)
    assert s["probes"]["cost_pct"] == 10.0 and s["hops"]["cost_pct"] == 20.0
    assert s["counted"]["n"] == 2 and s["counted"]["cost_pct"] == 25.0
    assert s["counted"]["bpf_ns_per_event"] == 45.0                  # median of 50 and 40
    assert s["counted"]["hits_per_transaction"] == 14.5 and s["counted"]["bpf_cores"] == 0.05   # 0.07 and 0.03 cores
    assert s["program_pct"] == 10.0 and s["counting_pct"] == 5.0
    assert s["untraced"]["tps"] == 200.0 and "cost_pct" not in s["untraced"]


def test_a_tracer_that_will_not_exit_is_described_then_killed(tmp_path):
    # a real process that ignores SIGINT, in the tracer's place: the reason says where it
    # waited and how much CPU it used meanwhile, and nothing is left running
    from testbed.host import proc
    from testbed.measure.hops import tracer
    t = tracer.HostTracer(program="", out_dir=str(tmp_path), name="tb-hops-test")
    t.bg = proc.start(["/bin/sh", "-c", "trap '' INT; exec sleep 60"], out_dir=str(tmp_path), name="tb-hops-test")
    pid = t.bg.popen.pid
    import time
    deadline = time.monotonic() + 10
    while open(f"/proc/{pid}/comm").read().strip() != "sleep" and time.monotonic() < deadline:
        time.sleep(0.02)
    with pytest.raises(tracer.TracerError) as e:
        t.stop(timeout=1)
    reason = str(e.value)
    assert reason.startswith("bpftrace did not exit within 1 s of SIGINT (state S; 0.0 s of CPU in 1 s;"), reason
    assert "nanosleep" in reason, reason                 # the kernel function its thread sleeps in
    assert t.bg is None and t.stop_s is None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_a_tracer_that_exits_on_sigint_gives_its_output_and_how_long_it_took(tmp_path):
    from testbed.host import proc
    from testbed.measure.hops import tracer
    t = tracer.HostTracer(program="", out_dir=str(tmp_path), name="tb-hops-test")
    t.bg = proc.start(["/bin/sh", "-c", "trap 'echo bye; exit 0' INT; echo hi; while :; do sleep 0.05; done"],
                      out_dir=str(tmp_path), name="tb-hops-test")
    import time
    deadline = time.monotonic() + 10
    while "hi" not in t.bg.stdout() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert t.stop(timeout=30) == "hi\nbye\n"
    assert 0 <= t.stop_s < 30
