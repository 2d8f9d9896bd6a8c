"""Cost across samples: compare, history, capacity and the report's figure, on runs written
by the production RunWriter from samples recorded by `./tb run` (fixtures/cost), their CPU
records scaled to make the changes a gate must see."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from testbed.analysis import compare, costs, history, report, report_cost
from testbed.analysis import sample_cost as cost
from testbed.records import results
from testbed.records.records import SampleRecord
from testbed.topology import config
from testbed.topology.model import Attachment, Backend, Cell

FIX = Path(__file__).parent / "fixtures" / "cost"
ENV = {"accelerator": "tcg", "comparable_class": "tcg", "cpu_model": "recorded", "cpus": 2, "cpu_mhz": 2445.406,
       "host": "vm", "kernel": "6.18", "memory_bytes": 25 * 2**30, "versions": {"qemu": "7.2"}}


def recorded(cid: str) -> SampleRecord:
    for line in (FIX / "samples.jsonl").read_text().splitlines():
        s = SampleRecord.from_dict(json.loads(line))
        if s.cell.id == cid:
            return s
    raise KeyError(cid)


def like(s: SampleRecord, rng: np.random.Generator, *, traffic: float = 1.0, role: str | None = None,
         by: float = 1.0, noise: float = 0.01, mtu: int | None = None, conns: int | None = None,
         pairs: int = 1) -> tuple[dict, dict]:
    """A recorded sample again with its traffic scaled (the tool's figures and the wire's
    packets alike) and one role's CPU scaled by ``by``, each with ``noise``; its cost
    recomputed by the production code. Returns (cell overrides, the sample's dict)."""
    t = traffic * rng.normal(1, noise)
    cpu_d = json.loads(json.dumps(s.cpu.to_dict()))
    k = rng.normal(1, noise)
    for g in cpu_d["per_guest"].values():
        for r in ("vcpu", "emulator"):
            g[r] = g[r] * k * t * (by if r == role else 1.0)
    metrics = {m: v * t if m in ("throughput_mbps", "transactions_per_s", "bytes") else v
               for m, v in s.metrics.items() if not m.startswith("cost_")}
    check = {**s.crosscheck.to_dict(), "wire_packets": int(s.crosscheck.wire_packets * t),
             "tool_bytes": int(s.crosscheck.tool_bytes * t)}
    data = {k: v for k, v in s.data.items() if k != "cost"}
    bare = SampleRecord.new("x", s.cell, 0, False, "ok", None, metrics, cpu_d, "", "", (), {}, data, check)
    out = cost.attach(bare, cost.Inputs.of(s.cost.inputs))
    assert out.ok
    return {"mtu": mtu, "connections": conns, "pairs": pairs}, out.to_dict()


def write(root: Path, run_id: str, cells: list[tuple[SampleRecord, dict, list[dict]]]) -> results.RunRecord:
    """A run of ``cells``: (recorded sample it is like, cell overrides, sample dicts)."""
    t = config.default((Attachment("bridge"), Attachment("ovs"), Attachment("macvtap")))
    profiles = {p.name: p for p in t.matrix.profiles}
    with results.RunWriter(root, run_id, t, ENV) as w:
        for s, over, dicts in cells:
            c = Cell(Attachment(s.cell.attachment), Backend.QEMU, over.get("mtu") or s.cell.mtu,
                     over.get("connections") or s.cell.connections, profiles[s.cell.profile],
                     pairs=over.get("pairs") or 1)
            for rep, d in enumerate(dicts):
                w.add_sample(dataclasses.replace(SampleRecord.from_dict(d), run_id=run_id, rep=rep,
                                                 cell=SampleRecord.new(run_id, c.as_dict(), 0, False, "ok", None,
                                                                       {}, {}, "", "").cell))
            w.add_cell(c, "ok", None, True, {})
    return results.read_run(w.dir)


STREAM, RR = "bridge-qemu-mtu1500-conn1-tcp_stream", "bridge-qemu-mtu1500-conn1-tcp_rr"


def runs_where_only_the_cost_moved(tmp_path: Path, by: float) -> tuple[results.RunRecord, results.RunRecord]:
    rng = np.random.default_rng(7)
    base, new = [], []
    for cid in (STREAM, RR):
        s = recorded(cid)
        base.append((s, {}, [like(s, rng)[1] for _ in range(6)]))
        new.append((s, {}, [like(s, rng, role="emulator", by=by)[1] for _ in range(6)]))
    return write(tmp_path, "base", base), write(tmp_path, "new", new)


def test_compare_calls_a_cost_regression_at_the_same_throughput_and_names_the_role(tmp_path):
    b, n = runs_where_only_the_cost_moved(tmp_path, by=1.5)
    rc = compare.compare_runs(b, n)
    assert rc.exit_status == 1
    for c in rc.cells:
        ms = {m.metric: m for m in c.metrics}
        primary = ms["throughput_mbps" if "stream" in c.cell_id else "transactions_per_s"].comparison
        assert abs(primary.delta_rel) < 0.03 and primary.verdict is not compare.stats.Verdict.REGRESSED
        path = ms[cost.METRIC]
        assert path.decides and path.comparison.verdict is compare.stats.Verdict.REGRESSED
        assert 0.08 < path.comparison.delta_rel < 0.3
        assert not ms[cost.role_metric("emulator")].decides
        assert c.verdict is compare.CellVerdict.REGRESSED
        assert c.cost_role.startswith("emulator +") and "per packet" in c.cost_role
    text = compare.render_text(rc)
    assert "cost regressed: emulator +" in text and "GATE FAILED" in text
    assert "emulator +" in compare.render_junit(rc)


def test_the_nightly_gate_decides_on_the_cost_too(tmp_path):
    from testbed.analysis import sequential
    b, n = runs_where_only_the_cost_moved(tmp_path, by=1.5)
    sq = sequential.decide(b, n, None, sequential.Design())
    assert sq.exit_status == 1
    assert all(c.verdict is compare.CellVerdict.REGRESSED for c in sq.final.cells)
    assert "cost regressed: emulator +" in sequential.render_text(sq)


def test_compare_of_unchanged_costs_passes(tmp_path):
    b, n = runs_where_only_the_cost_moved(tmp_path, by=1.0)
    rc = compare.compare_runs(b, n)
    assert not rc.failing
    assert all({m.metric for m in c.metrics} >= {cost.METRIC, *cost.ROLE_METRICS} for c in rc.cells)


def test_a_new_run_that_lost_its_cost_is_not_passed_on_its_throughput_alone(tmp_path):
    # a cost hook that broke in NEW (every sample without its cost) would hide a cost regression
    rng = np.random.default_rng(8)
    base, new = [], []
    for cid in (STREAM, RR):
        s = recorded(cid)
        base.append((s, {}, [like(s, rng)[1] for _ in range(6)]))
        dicts = [like(s, rng, role="emulator", by=1.5)[1] for _ in range(6)]
        for d in dicts:
            d["metrics"] = {k: v for k, v in d["metrics"].items() if not k.startswith("cost_")}
        new.append((s, {}, dicts))
    rc = compare.compare_runs(write(tmp_path, "base", base), write(tmp_path, "new", new))
    assert [c.verdict for c in rc.cells] == [compare.CellVerdict.INSUFFICIENT] * 2
    assert all(c.note.startswith(f"{cost.METRIC} in 6 BASE ok samples and in no NEW one") for c in rc.cells)
    assert rc.exit_status == 5


def test_history_finds_the_cost_step_and_names_the_role():
    rng = np.random.default_rng(3)
    s = recorded(RR)
    pts = []
    for i in range(12):
        dicts = [like(s, rng, role="emulator", by=1.6 if i >= 6 else 1.0)[1] for _ in range(5)]
        vals = [d["metrics"][cost.METRIC] for d in dicts]
        pts.append(history.Point(f"r{i}", str(i), float(np.mean(vals)), 5, float(np.std(vals, ddof=1)),
                                 (), costs.role_means([d["metrics"] for d in dicts])))
    ser = history.judge(RR, "h", cost.METRIC, "tcg/x", pts)
    (cp,) = ser.change_points
    assert cp.index == 6 and cp.regression and cp.role.startswith("emulator +")
    assert ser.newest_regresses
    assert "REGRESSION" in history.render_text([ser]) and "emulator +" in history.render_text([ser])


def density_run(tmp_path: Path) -> results.RunRecord:
    """Pairs 1, 2, 4 and MTUs 1500, 9000 of the recorded bridge and OVS streams: the cost at
    N pairs is N times one pair's traffic for N times its CPU, plus a little contention; at
    the larger MTU the guests' vCPUs take less a packet."""
    rng = np.random.default_rng(11)
    cells = []
    for cid in (STREAM, "ovs-qemu-mtu1500-conn1-tcp_stream"):
        s = recorded(cid)
        for n in (1, 2, 4):
            cells.append((s, {"pairs": n}, [like(s, rng, traffic=n, role="vcpu", by=1 + 0.1 * (n - 1))[1]
                                            for _ in range(4)]))
        cells.append((s, {"mtu": 9000}, [like(s, rng, role="vcpu", by=0.7)[1] for _ in range(4)]))
    return write(tmp_path, "density", cells)


def test_capacity_in_cost_gives_cores_per_gbit_with_an_interval_and_the_dominant_role(tmp_path):
    rec = density_run(tmp_path)
    p = costs.plan(rec, kind="stream")
    assert {m.mode for m in p.modes} == {"bridge/qemu", "ovs/qemu"}
    for m in p.modes:
        assert m.per_unit.ci_low < m.per_unit.mean < m.per_unit.ci_high
        assert m.dominant == "vcpu" and 0.5 < m.share <= 1
        axes = {e.axis for e in m.effects}
        assert axes == {"mtu", "pairs"}
        mtu = next(e for e in m.effects if e.axis == "mtu")
        assert 0.7 < mtu.points[1][1] / mtu.points[0][1] < 0.9
        pairs = next(e for e in m.effects if e.axis == "pairs")
        assert [x for x, _ in pairs.points] == [1, 2, 4] and pairs.points[2][1] > pairs.points[0][1]
    text = costs.render_plan(p)
    assert "cores per unit" in text and "vcpu" in text and "mtu 1500 -> 9000" in text
    assert json.dumps(costs.plan_dict(p))


def test_the_density_fit_is_made_on_the_same_costed_samples(tmp_path):
    from testbed.analysis import capacity, capacity_plan
    rec = density_run(tmp_path)
    q = capacity_plan.plan(rec, capacity.parse_demand("stream:100mbit"), mtu=1500)
    for mp in q.modes:
        assert all(p.path_cores is not None and p.role == "vcpu" for p in mp.points)
    text = capacity_plan.render_text(q, capacity.TCG_BANNER)
    assert text.count("cost at these points: the path's roles") == 2 and "path cores" in text


def test_report_stacks_the_cost_by_role_beside_what_it_bought(tmp_path):
    rec = density_run(tmp_path)
    plot = report_cost.cost_plot([rec])
    assert plot is not None and 'id="tb-cost"' in plot.html
    for role in ("vcpu", "emulator", "switch", "rest"):
        assert f'"name":"{role}"' in plot.html
    assert '"barmode":"stack"' in plot.html and 'Gbit\\u002fs' in plot.html
    page = report.render(report.build([rec], generated="now"))
    assert page.count("Cost per packet by role") >= 1 and page.count("<script>") >= 1
    assert '<script src="http' not in page and '<script type="text/javascript" src=' not in page


def test_an_axis_whose_first_cost_is_zero_is_described_without_a_ratio():
    e = costs.AxisEffect("mtu", ((1500, 0.0), (9000, 120.0)), "connections 1")
    assert e.describe() == "mtu 1500 -> 9000: 0 -> 120 ns per packet (no ratio to a cost of 0 from mtu 1500 to 9000; connections 1)"
    assert "(x0.50 from" in costs.AxisEffect("mtu", ((1500, 240.0), (9000, 120.0)), "c").describe()
