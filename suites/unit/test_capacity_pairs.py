"""testbed.analysis.capacity_model and capacity_plan: the fitted cost model from N pairs at once, on synthetic run records."""
from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import pytest

from testbed.analysis import capacity_model, capacity_plan, compare
from testbed.analysis.capacity import parse_demand
from testbed.cli import results as cli_results
from testbed.records.results import RunWriter, SampleRecord, now
from testbed.topology.model import Attachment, Backend, Cell, GuestSpec, HostSpec, Matrix, Pattern, Profile, Topology

pytestmark = pytest.mark.unit

STREAM = Profile("tcp_stream", message_size=16384)
RR = Profile("tcp_rr", pattern=Pattern.RR, message_size=1, response_size=1)
IDLE, UNIT = 0.05, 0.3          # cores per idle guest, cores per Gbit/s


def busy(n: int, gbit: float, contention: float = 0.0) -> float:
    return IDLE * 2 * n + UNIT * gbit + contention * gbit * (n - 1)


def write(root: Path, run_id: str, cells: list[tuple], *, memory_mib: int = 1024,
          idle: list[dict] | None = None, profile: Profile = STREAM, **env) -> Path:
    """cells: (attachment, pairs, [(aggregate Mbit/s or tps, host busy, per-pair extras)])."""
    atts = tuple(dict.fromkeys(Attachment(a) for a, _, _ in cells))
    matrix = Matrix(atts, (Backend.QEMU,), (1500,), (1,), (profile,))
    topo = Topology("t", "<test>", (HostSpec("local"),),
                    (GuestSpec("g1", "local", memory_mib), GuestSpec("g2", "local", memory_mib)),
                    "g1", "g2", matrix)
    environment = {"accelerator": "kvm", "comparable_class": "kvm", "cpu_model": "AMD EPYC",
                   "cpus": 16, "memory_bytes": 64 * 2**30, **env}
    with RunWriter(root, run_id, topo, environment) as w:
        if idle is not None:
            w.update(idle=idle)
        for att, n, samples in cells:
            c = Cell(Attachment(att), Backend.QEMU, 1500, 1, profile)
            metric = "throughput_mbps" if profile is STREAM else "transactions_per_s"
            cell = {**c.as_dict(), "pairs": n, "id": f"{c.id}-p{n}"}
            for rep, (mbps, host, pairs) in enumerate(samples):
                extra = {"pairs": pairs} if pairs is not None else {}
                w.add_sample(SampleRecord.new(run_id, cell, rep, False, "ok", None,
                                              {metric: mbps, "latency_p99_us": 100.0},
                                              {"host": {"busy": host, "softirq": 0.1}}, now(), now(),
                                              extra=extra))
            w.add_cell(c, "ok", None, None, {})
    return w.dir


def idle_readings(guests=(2, 4, 8), rss: float = 1100.0) -> list[dict]:
    return [{"guests": g, "window_s": 10.0, "host_busy_cores": IDLE * g,
             "host_memory_used_mib": 1200.0 * g, "memory_mib": 1024,
             "qemu_rss_mib": {f"g{i}": rss for i in range(g)}} for g in guests]


def linear_run(tmp_path: Path, ns=(1, 2, 4), **kw) -> Path:
    """Each pair carries 2 Gbit/s; host cores exactly IDLE x guests + UNIT x Gbit/s."""
    return write(tmp_path, kw.pop("run_id", "run"),
                 [("bridge", n, [(2000.0 * n, busy(n, 2.0 * n), None)] * 2) for n in ns],
                 idle=kw.pop("idle", idle_readings()), **kw)


def plan(path: Path, spec: str = "stream:1gbit", **kw) -> capacity_plan.PairsPlan:
    return capacity_plan.plan(compare.load(path), parse_demand(spec), **kw)


def test_the_fit_recovers_known_idle_and_per_unit_costs(tmp_path):
    (mp,) = plan(linear_run(tmp_path)).modes
    m = mp.model
    assert m.idle_cores_per_vm == pytest.approx(IDLE, rel=1e-6)
    assert m.cores_per_unit == pytest.approx(UNIT, rel=1e-6)
    assert m.contention == 0 and "dropped" in m.note          # exact data: no contention
    assert all(abs(r.residual) < 1e-6 for r in m.residuals)
    assert not any("extrapolated" in w for w in mp.warnings)
    (mp,) = plan(linear_run(tmp_path, run_id="fast"), "stream:3gbit").modes
    assert any("above the 2 per pair measured" in w for w in mp.warnings)
    assert {r.source for r in m.residuals} >= {"idle", "bridge-qemu-mtu1500-conn1-tcp_stream-p4"}


def test_a_host_base_load_is_fitted_apart_when_idle_readings_allow(tmp_path):
    idle = [{**r, "host_busy_cores": r["host_busy_cores"] + 0.2} for r in idle_readings((0, 2, 4))]
    cells = [("bridge", n, [(2000.0 * n, busy(n, 2.0 * n) + 0.2, None)]) for n in (1, 2)]
    (mp,) = plan(write(tmp_path, "base", cells, idle=idle)).modes
    m = mp.model
    assert (m.base_cores, m.idle_cores_per_vm, m.cores_per_unit) == (
        pytest.approx(0.2), pytest.approx(IDLE), pytest.approx(UNIT))
    # One idle guest count cannot separate them: no base, the note says so.
    (mp,) = plan(write(tmp_path, "one", cells, idle=idle[1:2])).modes
    assert mp.model.base_cores == 0 and "charged to the guests" in mp.model.note


def test_contention_is_kept_only_when_the_f_test_supports_it(tmp_path):
    rnd = random.Random(7)
    cells = [("bridge", n, [(2000.0 * n, busy(n, 2.0 * n, 0.05) + rnd.gauss(0, 0.005), None)
                            for _ in range(3)]) for n in (1, 2, 4, 8)]
    (mp,) = plan(write(tmp_path, "cont", cells, idle=idle_readings())).modes
    assert mp.model.contention == pytest.approx(0.05, rel=0.1)
    assert mp.model.contention_p < 0.05 and "kept" in mp.model.note
    # Two N only: the term is not even tried.
    (mp2,) = plan(linear_run(tmp_path, ns=(1, 2), run_id="two")).modes
    assert mp2.model.contention == 0 and "not testable" in mp2.model.note


def test_memory_binds_when_guests_are_large(tmp_path, capsys):
    # 64 GiB less 2 GiB reserve at 16 GiB a guest: 3 VMs; CPU allows 36, vCPUs 16, link 7.
    path = linear_run(tmp_path, memory_mib=16384,
                      idle=idle_readings(rss=16384 + 300.0))
    (mp,) = plan(path).modes
    assert mp.memory_per_vm_mib == pytest.approx(16384 + 300)  # QEMU overhead from RSS
    assert mp.by["memory"] == 3 and mp.by["cpu"] == 36 and mp.by["vcpu"] == 16
    assert (mp.vms, mp.limit) == (3, "memory")
    parser = argparse.ArgumentParser(prog="testbed")
    cli_results.add_commands(parser.add_subparsers(dest="cmd", required=True))
    args = parser.parse_args(["capacity", "run", "--results", str(tmp_path), "--profile",
                              "stream:1gbit"])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    row = [line for line in out.splitlines() if line.startswith("bridge/qemu ")][-1]
    assert row.split()[:3] == ["bridge/qemu", "3", "memory"]      # the table, after the fit
    assert "residual" in out and "idle" in out                # points next to the fit


def test_a_pair_short_of_its_target_marks_the_cell_saturated(tmp_path):
    ok = [{"throughput_mbps": 2000.0, "target": 2000.0, "achieved": 1990.0}]
    short = [{"throughput_mbps": 2000.0, "target": 2000.0, "achieved": 1990.0},
             {"throughput_mbps": 1800.0, "target": 2000.0, "achieved": 1800.0}]  # 10 % short
    path = write(tmp_path, "sat", [("bridge", 1, [(2000.0, busy(1, 2.0), ok)]),
                                   ("bridge", 2, [(3800.0, busy(2, 3.8), short)])],
                 idle=idle_readings(), rate="2gbit")
    (mp,) = plan(path).modes
    assert mp.saturated == (2,)
    assert any("saturated at N=2" in w for w in mp.warnings)
    assert mp.knee is None                  # per-pair 1.9 vs 2.0 Gbit/s: within 10 %


def test_transactions_plan_with_their_own_unit_and_wire_cost(tmp_path):
    # 5000 tps a pair; 20 us of host CPU per transaction, 0.05 cores per idle guest.
    cells = [("bridge", n, [(5000.0 * n, IDLE * 2 * n + 2e-5 * 5000 * n, None)]) for n in (1, 2, 4)]
    path = write(tmp_path, "rr", cells, idle=idle_readings(), profile=RR)
    (mp,) = plan(path, "rr:2000tps", extrapolate=True).modes
    assert mp.model.cores_per_unit == pytest.approx(2e-5)
    assert mp.by["cpu"] == 142                 # 12.8 / (0.05 + 0.04); 16 vCPUs bind first
    assert (mp.vms, mp.limit) == (16, "vcpu")
    assert mp.by["link"] == int(8 / (2000 * 8 * 91 / 1e9))


def test_the_knee_is_where_per_pair_rate_drops_more_than_10_percent(tmp_path):
    cells = [("bridge", 1, [(2000.0, busy(1, 2.0), None)]),
             ("bridge", 2, [(3900.0, busy(2, 3.9), None)]),
             ("bridge", 4, [(6000.0, busy(4, 6.0), None)])]         # 1.5 Gbit/s a pair
    (mp,) = plan(write(tmp_path, "knee", cells, idle=idle_readings())).modes
    assert mp.knee == 4 and "1.5" in mp.knee_why


def test_refuses_to_extrapolate_beyond_twice_the_largest_n(tmp_path):
    path = linear_run(tmp_path)                                    # measured up to N=4
    (mp,) = plan(path, link_gbit=100).modes
    assert mp.by["vcpu"] == 16 and (mp.vms, mp.limit) == (8, "evidence")
    assert any("refused to extrapolate" in w and "--extrapolate" in w for w in mp.warnings)
    (mp,) = plan(path, extrapolate=True, link_gbit=100).modes
    assert (mp.vms, mp.limit) == (16, "vcpu")
    assert any("extrapolated to 16 VMs, 4x the largest measured N=4" in w for w in mp.warnings)
    (mp,) = plan(path, extrapolate=True, link_gbit=100, overcommit=4).modes
    assert (mp.vms, mp.limit) == (36, "cpu")                       # 12.8 / 0.35
    # A link the run measured is the default; a given one overrides it.
    measured = linear_run(tmp_path, run_id="linked", link_gbit=100.0)
    (mp,) = plan(measured, extrapolate=True, overcommit=4).modes
    assert mp.by["link"] == 75 and plan(measured, link_gbit=10).modes[0].by["link"] == 7


def test_old_single_pair_runs_still_plan_with_a_note(tmp_path, capsys):
    path = write(tmp_path, "old", [("bridge", 1, [(2000.0, 1.0, None)] * 2)])
    rec = compare.load(path)
    assert not capacity_model.has_pairs_data(rec)
    parser = argparse.ArgumentParser(prog="testbed")
    cli_results.add_commands(parser.add_subparsers(dest="cmd", required=True))
    args = parser.parse_args(["capacity", "old", "--results", str(tmp_path), "--profile",
                              "stream:1gbit", "--link-gbit", "100"])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("bridge/qemu"))
    assert row.split()[:3] == ["bridge/qemu", "25", "cpu"]         # 12.8 / 0.5, as before
    assert "extrapolation from one pair" in out
    args = parser.parse_args(["capacity", "old", "--results", str(tmp_path), "--profile",
                              "stream:1gbit", "--json"])
    assert args.func(args) == 0
    assert "one pair" in json.loads(capsys.readouterr().out)["note"]


def test_tcg_keeps_its_banner_and_json_has_the_residuals(tmp_path, capsys):
    linear_run(tmp_path, accelerator="tcg", comparable_class="tcg-functional-only")
    parser = argparse.ArgumentParser(prog="testbed")
    cli_results.add_commands(parser.add_subparsers(dest="cmd", required=True))
    args = parser.parse_args(["capacity", "run", "--results", str(tmp_path), "--profile",
                              "stream:1gbit", "--json"])
    assert args.func(args) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert doc["banner"].startswith("!! TCG") and "TCG run" in err
    res = doc["modes"][0]["model"]["residuals"]
    assert res and all("residual" in r for r in res)


def test_the_report_has_one_capacity_plot_per_mode_and_the_table(tmp_path):
    from testbed.analysis import report
    rec = compare.load(write(tmp_path, "rep", [
        (att, n, [(2000.0 * n, busy(n, 2.0 * n), None)]) for att in ("bridge", "ovs")
        for n in (1, 2)], idle=idle_readings(), memory_mib=16384))
    old = compare.load(write(tmp_path, "old", [("bridge", 1, [(2000.0, 1.0, None)])]))
    rep = report.build([rec, old], generated=now(), capacity_profile="stream:1gbit")
    titles = [p.title for p in rep.plots if p.title.startswith("Capacity")]
    assert titles == ["Capacity, bridge/qemu (mtu1500-conn1-q1-tcp_stream), run rep",
                      "Capacity, ovs/qemu (mtu1500-conn1-q1-tcp_stream), run rep"]
    plot = next(p for p in rep.plots if p.title.startswith("Capacity"))
    # per-pair rate (samples, mean) and host CPU (measured, the fitted model), drawn by Plotly
    assert plot.panels == (("bridge/qemu: per-pair Gbit/s", 2), ("bridge/qemu: host CPU", 2))
    assert "Plotly.newPlot" in plot.html
    assert [(c.run_id, c.mode, c.vms, c.limit) for c in rep.capacity] == [
        ("rep", "bridge/qemu", 3, "memory"), ("rep", "ovs/qemu", 3, "memory")]
    html = report.render(rep)
    assert "Capacity at stream:1gbit per VM" in html and "<b>memory</b>" in html
