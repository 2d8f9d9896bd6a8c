"""testbed.analysis.capacity: VMs per host from measured cost per unit of traffic, with known numbers."""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest

from testbed.analysis import capacity, compare
from testbed.analysis.capacity import CapacityError, Demand, UnitCost, fit, parse_demand
from testbed.cli import results as cli_results
from testbed.records.results import RunWriter, SampleRecord, now
from testbed.topology.model import Attachment, Backend, Cell, GuestSpec, HostSpec, Matrix, Pattern, Profile, Topology

pytestmark = pytest.mark.unit

STREAM = Profile("tcp_stream", message_size=16384)
RR = Profile("tcp_rr", pattern=Pattern.RR, message_size=1, response_size=1)


def cpu(host: float, qemu: float = 0.0, ovs: float = 0.0) -> dict:
    """A CPU record shaped like a real sample's, with chosen totals."""
    return {"host": {"busy": host, "idle": 0.1}, "guest": {"g1": {"busy": 0.5}, "g2": {"busy": 0.25}},
            "per_guest": {"g1": {"vcpu": qemu / 2, "emulator": 0.0, "iothread": 0.0, "vhost": 0.0,
                                 "total": qemu / 2},
                          "g2": {"vcpu": qemu / 2, "emulator": 0.0, "iothread": 0.0, "vhost": 0.0,
                                 "total": qemu / 2}},
            "named": {"ovs-vswitchd": ovs, "ksoftirqd": 0.0}, "window_s": 10.0}


def write(root: Path, run_id: str, cells: list[tuple], **env) -> Path:
    """cells: (attachment, mtu, connections, profile, [(metrics, cpu), ...])."""
    built = [(Cell(Attachment(a), Backend.QEMU, mtu, conn, prof), samples)
             for a, mtu, conn, prof, samples in cells]
    matrix = Matrix(tuple(dict.fromkeys(c.attachment for c, _ in built)), (Backend.QEMU,),
                    tuple(sorted({c.mtu for c, _ in built})),
                    tuple(sorted({c.connections for c, _ in built})), (STREAM, RR))
    topo = Topology("t", "<test>", (HostSpec("local"),),
                    (GuestSpec("g1", "local"), GuestSpec("g2", "local")), "g1", "g2", matrix)
    environment = {"accelerator": "kvm", "comparable_class": "kvm", "cpu_model": "AMD EPYC",
                   "cpus": 2, **env}
    with RunWriter(root, run_id, topo, environment) as w:
        for c, samples in built:
            for rep, (metrics, c_pu) in enumerate(samples):
                w.add_sample(SampleRecord.new(run_id, c.as_dict(), rep, False, "ok", None, metrics, c_pu,
                                              now(), now()))
            w.add_cell(c, "ok", None, None, {})
    return w.dir


def cost(cores_per_unit: float, link: float = 1.0, traffic: float = 10.0, n: int = 5) -> UnitCost:
    return UnitCost("bridge/qemu", "bridge-qemu-mtu1500-conn1-tcp_stream", 1500, 1, "tcp_stream",
                    n, traffic, cores_per_unit * traffic, cores_per_unit, link)


# --------------------------------------------------------------------------- demand

@pytest.mark.parametrize("text, kind, per_vm", [
    ("stream:2gbit", "stream", 2.0), ("stream:500mbit", "stream", 0.5), ("stream:2", "stream", 2.0),
    ("STREAM:1.5Gbps", "stream", 1.5), ("rr:5000tps", "rr", 5000.0), ("rr:5ktps", "rr", 5000.0),
    ("rr:200", "rr", 200.0)])
def test_demand_parses(text, kind, per_vm):
    d = parse_demand(text)
    assert (d.kind, d.per_vm) == (kind, pytest.approx(per_vm))


@pytest.mark.parametrize("text", ["stream:5tps", "rr:2gbit", "udp:1gbit", "stream:0gbit",
                                  "stream:-1gbit", "stream", "2gbit"])
def test_bad_demand_is_a_usage_error(text):
    with pytest.raises(CapacityError) as e:
        parse_demand(text)
    assert e.value.exit_status == 2 and text in str(e.value)


# --------------------------------------------------------------------------- wire

def test_wire_overheads_are_the_textbook_ones():
    # 1500-byte MTU: 1448 payload bytes (IPv4 20 + TCP 20 + timestamps 12) in 1538 on the wire
    assert capacity.stream_wire_factor(1500) == pytest.approx(1538 / 1448)
    assert capacity.stream_wire_factor(9000) == pytest.approx(9038 / 8948)
    assert capacity.stream_wire_factor(1500, "udp") == pytest.approx(1538 / 1472)
    assert capacity.wire_bytes(1, 1500) == 1 + 52 + 38
    assert capacity.wire_bytes(3000, 1500) == 3000 + 3 * 90      # three frames
    assert capacity.wire_bytes(0, 1500, "udp") == 84              # minimum frame


# --------------------------------------------------------------------------- fit

def test_link_runs_out_first():
    # 0.5 cores per Gbit/s, 2 Gbit/s per VM -> 1 core per VM; 16 cores less 25 % -> 12 VMs.
    # 10 Gbit/s less 25 % = 7.5 Gbit/s at 2 Gbit/s per VM -> 3 VMs.
    f = fit(cost(0.5), Demand("stream", 2.0, "stream:2gbit"), host_cores=16, headroom=0.25,
            link_gbit=10)
    assert (f.cores_per_vm, f.usable_cores, f.vms_by_cpu) == (1.0, 12.0, 12)
    assert (f.link_gbit_per_vm, f.usable_link_gbit, f.vms_by_link) == (2.0, 7.5, 3)
    assert (f.vms, f.limit) == (3, "link")


def test_cpu_runs_out_first():
    # 2 cores per Gbit/s x 2 Gbit/s = 4 cores per VM; 16 x 0.8 = 12.8 usable -> 3 VMs.
    f = fit(cost(2.0), Demand("stream", 2.0, "s"), host_cores=16, headroom=0.2, link_gbit=100)
    assert (f.vms_by_cpu, f.vms_by_link, f.vms, f.limit) == (3, 40, 3, "cpu")


def test_a_tie_names_both_and_exact_divisions_are_not_rounded_down():
    # 2 cores x 0.8 = 1.6 usable at 0.4 per VM is exactly 4 (not 3.9999999999999996 -> 3).
    f = fit(cost(0.4), Demand("stream", 1.0, "s"), host_cores=2, headroom=0.2, link_gbit=5)
    assert (f.vms_by_cpu, f.vms_by_link, f.limit) == (4, 4, "cpu+link")


def test_free_cpu_leaves_the_link_as_the_limit():
    f = fit(cost(0.0), Demand("stream", 1.0, "s"), host_cores=2, headroom=0, link_gbit=10)
    assert (f.vms_by_cpu, f.vms, f.limit) == (None, 10, "link")


def test_extrapolation_and_thin_evidence_are_flagged():
    f = fit(cost(0.5, traffic=1.5, n=1), Demand("stream", 2.0, "s"), host_cores=8, headroom=0.2,
            link_gbit=10)
    assert any("above the 1.5 Gbit/s" in w for w in f.warnings)
    assert any("only 1 sample" in w for w in f.warnings)


@pytest.mark.parametrize("kw", [dict(headroom=1.0), dict(headroom=-0.1), dict(host_cores=0),
                                dict(link_gbit=0)])
def test_fit_rejects_impossible_hosts(kw):
    args = dict(host_cores=8, headroom=0.2, link_gbit=10) | kw
    with pytest.raises(CapacityError):
        fit(cost(1.0), Demand("stream", 1.0, "s"), **args)


# --------------------------------------------------------------------------- plan from a run

def stream(mbps: float) -> dict:
    return {"throughput_mbps": mbps}


def two_modes(tmp_path: Path, **env) -> Path:
    return write(tmp_path, "run", [
        # bridge: 2 Gbit/s on 1.0 host core (0.5/Gbit), 4 Gbit/s on 1.6 (0.4/Gbit)
        ("bridge", 1500, 1, STREAM, [(stream(1900), cpu(0.95, 0.8)), (stream(2100), cpu(1.05, 0.8))]),
        ("bridge", 1500, 4, STREAM, [(stream(4000), cpu(1.6, 1.2))] * 2),
        ("bridge", 9000, 1, STREAM, [(stream(5000), cpu(1.0, 0.7))] * 2),
        # ovs: 1 Gbit/s on 1.0 host core; QEMU 0.6 + ovs-vswitchd 0.2
        ("ovs", 1500, 1, STREAM, [(stream(1000), cpu(1.0, 0.6, 0.2))] * 3),
        # rr: 2000 tps on 1.0 core -> 500 µs of host CPU per transaction
        ("bridge", 1500, 1, RR, [({"transactions_per_s": 2000.0}, cpu(1.0, 0.5))] * 3),
    ], **env)


def test_plan_uses_each_modes_most_expensive_cell(tmp_path):
    rec = compare.load(two_modes(tmp_path))
    p = capacity.plan(rec, parse_demand("stream:1gbit"))          # 2 cpus recorded, 20 % headroom
    by_mode = {f.mode: f for f in p.fits}
    b, o = by_mode["bridge/qemu"], by_mode["ovs/qemu"]
    assert b.cost.cell_id == "bridge-qemu-mtu1500-conn1-tcp_stream"
    assert b.cost.cores_per_unit == pytest.approx(0.5) and b.cost.n == 2
    assert (b.vms_by_cpu, b.vms_by_link, b.vms, b.limit) == (3, 7, 3, "cpu")   # 1.6/0.5, 8/1.062
    assert b.link_gbit_per_vm == pytest.approx(1538 / 1448)
    assert o.cost.cores_per_unit == pytest.approx(1.0) and (o.vms, o.limit) == (1, "cpu")


def test_plan_filters_and_qemu_basis(tmp_path):
    rec = compare.load(two_modes(tmp_path))
    p = capacity.plan(rec, parse_demand("stream:1gbit"), mtu=9000, host_cores=32, link_gbit=25)
    (f,) = p.fits
    assert f.cost.cores_per_unit == pytest.approx(0.2)           # 1.0 core / 5 Gbit/s
    assert (f.vms_by_cpu, f.limit) == (128, "link")              # 25.6 / 0.2
    assert f.vms_by_link == math.floor(20 / (9038 / 8948))
    q = capacity.plan(rec, parse_demand("stream:1gbit"), basis="qemu", host_cores=16)
    ovs = next(f for f in q.fits if f.mode == "ovs/qemu")
    assert ovs.cost.cores_per_unit == pytest.approx(0.8)         # QEMU 0.6 + ovs-vswitchd 0.2


def test_plan_for_transactions(tmp_path):
    rec = compare.load(two_modes(tmp_path))
    p = capacity.plan(rec, parse_demand("rr:500tps"), host_cores=10, headroom=0.5)
    (f,) = p.fits
    assert f.cores_per_vm == pytest.approx(0.25)                 # 500 µs x 500 tps
    assert (f.vms_by_cpu, f.limit) == (20, "cpu")                # 5 cores / 0.25
    assert f.link_gbit_per_vm == pytest.approx(500 * 8 * 91 / 1e9)


def test_plan_errors_name_what_is_missing(tmp_path):
    rec = compare.load(two_modes(tmp_path))
    with pytest.raises(CapacityError, match="at MTU 4000"):
        capacity.plan(rec, parse_demand("stream:1gbit"), mtu=4000)
    rec = compare.load(write(tmp_path, "nocpus", [("bridge", 1500, 1, STREAM,
                                                     [(stream(1000), cpu(1.0))])], cpus=None))
    with pytest.raises(CapacityError, match="--host-cores"):
        capacity.plan(rec, parse_demand("stream:1gbit"))


def test_capacity_command_text_json_and_tcg_banner(tmp_path, capsys):
    two_modes(tmp_path, accelerator="tcg", comparable_class="tcg-functional-only")
    parser = argparse.ArgumentParser(prog="testbed")
    cli_results.add_commands(parser.add_subparsers(dest="cmd", required=True))
    args = parser.parse_args(["capacity", "run", "--results", str(tmp_path), "--profile",
                              "stream:1gbit", "--host-cores", "8", "--headroom", "0.25"])
    assert args.func(args) == 0
    out, err = capsys.readouterr()
    assert "TCG run" in out and "TCG run" in err
    row = next(line for line in out.splitlines() if line.startswith("bridge/qemu"))
    assert row.split()[:3] == ["bridge/qemu", "7", "link"]      # cpu 6/0.5=12, link 7.5/1.062=7
    args = parser.parse_args(["capacity", "run", "--results", str(tmp_path), "--profile",
                              "rr:1ktps", "--json"])
    assert args.func(args) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["fits"][0]["limit"] == "cpu" and doc["banner"].startswith("!! TCG")
