"""Cost per packet by role, on samples recorded by `./tb run` on a TCG host (fixtures/cost):
the roles from the CPU record, the closure against busy time, the cost's own cross-check,
the inputs read over the window, and the collectors' pure parts."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from testbed.analysis import sample_cost as cost
from testbed.measure import costprobe, cpu, hooks
from testbed.records.records import SampleRecord

FIX = Path(__file__).parent / "fixtures" / "cost"


def recorded() -> dict[str, SampleRecord]:
    """The recorded samples by cell id, their cost as recorded kept in ``cost``."""
    rows = [SampleRecord.from_dict(json.loads(line)) for line in (FIX / "samples.jsonl").read_text().splitlines()]
    return {s.cell.id: s for s in rows}


def bare(s: SampleRecord) -> SampleRecord:
    """The sample as the sampling loop builds it, before its cost: no cost, no cost metrics."""
    return dataclasses.replace(s, data={k: v for k, v in s.data.items() if k != "cost"},
                               metrics={k: v for k, v in s.metrics.items() if not k.startswith("cost_")})


SAMPLES = recorded()
IDS = sorted(SAMPLES)


@pytest.mark.parametrize("cid", IDS)
def test_recorded_cost_is_computed_again_from_the_sample_and_its_inputs(cid):
    s = SAMPLES[cid]
    again = cost.attach(bare(s), cost.Inputs.of(s.cost.inputs))
    assert again.cost.to_dict() == s.cost.to_dict()
    assert {k: v for k, v in again.metrics.items() if k.startswith("cost_")} == \
        {k: v for k, v in s.metrics.items() if k.startswith("cost_")}


@pytest.mark.parametrize("cid", IDS)
def test_roles_come_from_the_threads_columns_and_other_processes(cid):
    s = SAMPLES[cid]
    c = s.cost
    g = s.cpu.per_guest.values()
    assert c.cores["vcpu"] == pytest.approx(sum(x["vcpu"] for x in g), abs=1e-6)
    assert c.cores["emulator"] == pytest.approx(sum(x.get("emulator", 0) + x.get("iothread", 0) for x in g), abs=1e-6)
    assert c.cores["vhost"] == pytest.approx(sum(x.get("vhost", 0) for x in g), abs=1e-6)
    softirq = s.cpu.host["softirq"] + s.cpu.host["irq"] + s.cpu.named["ksoftirqd"]
    assert c.cores["switch"] + c.cores["softirq"] == pytest.approx(
        softirq + (s.cpu.named["ovs-vswitchd"] if "ovs" in s.data["datapath"] else 0), abs=1e-5)
    # the path's cost per packet: its five roles' CPU seconds over the packets the wire counted
    path = sum(c.cores[r] for r in cost.ROLES)
    assert c.ns_per_packet["path"] == pytest.approx(path * s.cpu.window_s / c.packets * 1e9, rel=1e-4)
    assert c.packets == s.crosscheck.wire_packets
    assert s.metrics[cost.METRIC] == c.ns_per_packet["path"]
    # the largest part of a TCG guest's path is its emulated vCPUs
    assert max(cost.ROLES, key=lambda r: c.cores[r]) == "vcpu"


def test_the_switch_is_ovs_vswitchd_on_ovs_and_a_softirq_share_on_a_bridge():
    ovs = SAMPLES["ovs-qemu-mtu1500-conn1-tcp_stream"].cost
    assert ovs.cores["switch"] >= SAMPLES["ovs-qemu-mtu1500-conn1-tcp_stream"].cpu.named["ovs-vswitchd"] > 0
    assert "ovs-vswitchd" in ovs.switch
    br = SAMPLES["bridge-qemu-mtu1500-conn1-tcp_stream"]
    assert "ovs-vswitchd" not in br.cost.switch and "softirq" in br.cost.switch
    share = cost.packet_share(cost.path_devices(br), br.cost.inputs["host_packets"])
    assert 0 < share <= 1
    total = br.cpu.host["softirq"] + br.cpu.host["irq"] + br.cpu.named["ksoftirqd"]
    assert br.cost.cores["switch"] == pytest.approx(total * share, abs=1e-6)


def test_a_sample_of_n_pairs_finds_its_switch_share_through_the_taps_the_hook_saw():
    """A sample of N pairs records no device counters of its own: the bridge's share of
    softirq comes from the taps of the window's paths, which the cost keeps to compute again."""
    br = SAMPLES["bridge-qemu-mtu1500-conn1-tcp_stream"]
    pairs = dataclasses.replace(bare(br), data={k: v for k, v in bare(br).data.items() if k != "counters"})
    inputs = cost.Inputs.of(br.cost.inputs)
    blind = cost.attach(pairs, inputs).cost
    assert blind.cores["switch"] == 0 and any("share of the host's packets is not known" in n for n in blind.notes)
    taps = tuple(br.data["counters"])
    window = hooks.SampleWindow(br.cell, 0, False, [
        SimpleNamespace(client=SimpleNamespace(tap=taps[0]), server=SimpleNamespace(tap=taps[1]))])
    assert costprobe.taps(window) == taps
    seen = cost.attach(pairs, dataclasses.replace(inputs, devices=taps))
    assert br.cost.cores["switch"] > 0 and seen.cost.cores["switch"] == pytest.approx(br.cost.cores["switch"], abs=1e-6)
    again = cost.attach(pairs, cost.Inputs.of(seen.cost.inputs))
    assert again.cost.to_dict() == seen.cost.to_dict()

@pytest.mark.parametrize("cid", IDS)
def test_roles_close_against_busy_time_or_show_the_gap(cid):
    c = SAMPLES[cid].cost.closure
    cores = SAMPLES[cid].cost.cores
    assert c["busy"] == SAMPLES[cid].cpu.host_busy
    assert c["sum"] == pytest.approx(sum(v for k, v in cores.items() if k != "gap"), abs=1e-5)
    assert c["gap"] == pytest.approx(c["busy"] - c["sum"], abs=1e-5)
    if c["within"]:
        assert abs(c["gap"]) <= c["tolerance"] and "gap" not in cores
    else:
        assert abs(c["gap"]) > c["tolerance"] and cores["gap"] == c["gap"]


def test_closure_tolerance_and_gap():
    cores = {"vcpu": 1.0, "emulator": 0.2, "rest": 0.5}
    ok = cost.closure(1.75, cores, 2, 10.0, True)
    assert ok["within"] and ok["gap"] == pytest.approx(0.05)
    assert ok["tolerance"] == pytest.approx(0.05 * 1.75 + 2 * 2 * 0.01 / 10)
    assert "exclusive" in ok["accounting"]
    far = cost.closure(2.0, cores, 2, 10.0, False)
    assert not far["within"] and far["gap"] == pytest.approx(0.3) and "twice" in far["accounting"]
    # a gap is shown as a role of the sample's cost
    s = SAMPLES["bridge-qemu-mtu1500-conn1-tcp_rr"]
    tight = dataclasses.replace(s, cpu=dataclasses.replace(s.cpu, host={**s.cpu.host, "busy": 2.5 * s.cpu.host_busy}))
    out = cost.compute(bare(tight), cost.Inputs.of(s.cost.inputs))
    assert out.cost.closure["within"] is False and out.cost.cores["gap"] == out.cost.closure["gap"] > 0
    assert out.cost.ns_per_packet["gap"] > 0 and out.cost.ns_per_packet["path"] == s.cost.ns_per_packet["path"]


def test_wire_packets_that_cannot_carry_the_tool_bytes_fail_the_sample_with_both_figures():
    s = bare(SAMPLES["bridge-qemu-mtu1500-conn1-tcp_stream"])
    few = dataclasses.replace(s, crosscheck=dataclasses.replace(s.crosscheck, wire_packets=100))
    out = cost.attach(few)
    assert out.status == "failed" and out.metrics == {}
    assert f"tool {s.crosscheck.tool_bytes} payload bytes in 100 wire packets" in out.reason
    assert out.cost.check["verdict"] == "fail" and out.cost.packets == 100


def test_request_response_needs_two_packets_a_transaction():
    s = bare(SAMPLES["macvtap-qemu-mtu1500-conn1-tcp_rr"])
    txn = round(s.metric("transactions_per_s") * s.metric("duration_s"))
    few = dataclasses.replace(s, crosscheck=dataclasses.replace(s.crosscheck, wire_packets=txn))
    out = cost.attach(few)
    assert out.status == "failed"
    assert f"{txn} transactions" in out.reason and f"counted {txn}" in out.reason
    assert cost.attach(s).status == "ok"


def test_failed_samples_and_samples_without_counters_are_left_alone():
    s = bare(SAMPLES["bridge-qemu-mtu1500-conn1-tcp_rr"])
    failed = dataclasses.replace(s, status="failed", reason="client timed out")
    assert cost.attach(failed) is failed
    blind = dataclasses.replace(s, crosscheck=type(s.crosscheck)())
    assert cost.attach(blind) is blind


def test_unattributed_endpoints_get_a_cost_record_but_no_metric_to_judge():
    s = bare(SAMPLES["bridge-qemu-mtu1500-conn1-tcp_rr"])
    far = dataclasses.replace(s, cpu=dataclasses.replace(s.cpu, per_guest={}))
    out = cost.attach(far, cost.Inputs.of(SAMPLES["bridge-qemu-mtu1500-conn1-tcp_rr"].cost.inputs))
    assert out.ok and out.cost.cores["vcpu"] == 0 and out.cost.ns_per_packet["path"] >= 0
    assert not any(k.startswith("cost_") for k in out.metrics)
    assert any("not attributed" in n for n in out.cost.notes)


def test_a_role_that_read_negative_gives_no_cost_per_packet_and_says_why():
    # a QEMU worker thread that ended inside the window takes its time along: the
    # emulator's reading falls below nothing, and no cost is made of it
    rec = SAMPLES["bridge-qemu-mtu1500-conn1-tcp_rr"]
    s = bare(rec)
    cpu_d = json.loads(json.dumps(s.cpu.to_dict()))
    next(iter(cpu_d["per_guest"].values()))["emulator"] = -0.35
    odd = dataclasses.replace(s, cpu=type(s.cpu).from_dict(cpu_d))
    out = cost.attach(odd, cost.Inputs.of(rec.cost.inputs))
    assert out.ok and not any(k.startswith("cost_") for k in out.metrics)
    assert not out.cost.ns_per_packet and out.cost.cores["emulator"] < 0
    assert any(n.startswith("a role's CPU time read negative (emulator -0.") for n in out.cost.notes), out.cost.notes


def test_ovs_vswitchd_beside_a_bridge_does_not_stand_in_for_an_unmeasured_rest():
    rec = SAMPLES["bridge-qemu-mtu1500-conn1-tcp_rr"]
    s = bare(rec)
    cpu_d = json.loads(json.dumps(s.cpu.to_dict()))
    cpu_d["named"]["ovs-vswitchd"] = 0.0001
    for others in ({}, {"cores": -0.8}):
        cpu_d["others"] = others
        out = cost.attach(dataclasses.replace(s, cpu=type(s.cpu).from_dict(cpu_d)), cost.Inputs.of(rec.cost.inputs))
        assert "rest" not in out.cost.cores, out.cost.cores
        assert any("other processes" in n for n in out.cost.notes), out.cost.notes


def test_cycles_from_a_steady_frequency_only():
    s = bare(SAMPLES["bridge-qemu-mtu1500-conn1-tcp_rr"])
    steady = cost.compute(s, cost.Inputs((2445.4, 2445.4), (2445.4, 2446.0)))
    assert steady.cost.cycles_per_packet["path"] == pytest.approx(steady.cost.ns_per_packet["path"] * 2.4456, rel=1e-3)
    assert "time x frequency" in steady.cost.cycles_source
    moving = cost.compute(s, cost.Inputs((2445.4, 2445.4), (1800.0, 2445.4)))
    assert moving.cost.cycles_per_packet == {} and "not steady" in moving.cost.cycles_source
    assert "cost_cycles_per_packet" not in moving.metrics
    none = cost.compute(s, cost.Inputs())
    assert none.cost.cycles_per_packet == {} and "not read" in none.cost.cycles_source
    perf = cost.compute(s, cost.Inputs(perf_cycles=4.0e10))
    assert perf.cost.cycles_per_packet["host_perf"] == pytest.approx(4.0e10 / perf.cost.packets, rel=1e-6)


def test_per_unit_of_traffic():
    rr = SAMPLES["bridge-qemu-mtu1500-conn1-tcp_rr"]
    txn = rr.metric("transactions_per_s") * rr.metric("duration_s")
    path = sum(rr.cost.cores[r] for r in cost.ROLES)
    assert rr.cost.cores_per_ktps["path"] == pytest.approx(path * rr.cpu.window_s / txn * 1e3, rel=1e-4)
    assert rr.cost.cores_per_gbit == {}
    st = SAMPLES["bridge-qemu-mtu1500-conn1-tcp_stream"]
    gbit = st.crosscheck.tool_bytes * 8 / 1e9
    path = sum(st.cost.cores[r] for r in cost.ROLES)
    assert st.cost.cores_per_gbit["path"] == pytest.approx(path * st.cpu.window_s / gbit, rel=1e-4)


def test_packet_share():
    assert cost.packet_share(["t1", "t2"], {"t1": 30, "t2": 30, "eth0": 40, "lo": 999}) == pytest.approx(0.6)
    assert cost.packet_share(["t1"], {"t1": 10, "*": 40}) == pytest.approx(0.25)
    assert cost.packet_share(["ns-dev"], {"eth0": 10}) is None
    assert cost.packet_share(["t1"], {"t1": 0}) is None


def test_frequency():
    assert cost.frequency((2000.0, 2000.0), (2000.0, 2010.0))[0] == pytest.approx(2.0025)
    assert cost.frequency((2000.0, 3000.0), (2000.0, 3000.0))[0] is None        # CPUs apart
    assert cost.frequency((), ())[0] is None


def test_others_delta_counts_processes_born_and_ended_in_between():
    before = {10: (5.0, 1), 11: (100.0, 10), 12: (3.0, 2)}
    # 11 ended (its parent 10 waited: its whole life in 10's reaped time), 12 was a kernel
    # thread that ended (nobody's), 13 was born
    after = {10: (5.5 + 100.0 + 0.25, 1), 13: (0.5, 10)}
    assert cpu.others_delta(before, after) == pytest.approx(0.5 + 0.25 + 0.5)


def test_probe_parsers_on_this_hosts_files():
    text = (FIX / "proc-net-dev.txt").read_text()
    dev = costprobe.parse_netdev(text)
    assert dev["lo"] == 2 * 16792 and dev["eth0"] > 0
    assert costprobe.packets_delta({"a": 5, "b": 9}, {"a": 8, "c": 1, "b": 2}) == {"a": 3}
    assert costprobe.parse_cpuinfo_mhz((FIX / "cpuinfo.txt").read_text()) == (2445.406, 2445.406)
    assert costprobe.parse_perf_cycles((FIX / "perf-stat-not-supported.txt").read_text()) == \
        (None, "perf stat -e cycles: <not supported>")
    assert costprobe.parse_perf_cycles("123456789,,cycles,1000,100.00,,\n") == (123456789.0, "")
