"""Typed run records: every record type round-trips, older formats load upgraded, keys this
version does not know survive, and the primary metric is decided in one place.

The fixtures under fixtures/runs are real files: ``format1`` is the real TCG run
20261122T030019Z-a0e9 in the version 1 format (no definition hash; the store tier's runs are
written from it), ``format2`` was written by the RunWriter of main 25ea70a, before the records
were typed, with the capacity fields (pairs, rate, extra.pairs, idle, link_gbit), a variant,
a warm-up, a failed sample and keys no version of the testbed knows."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.records import records, results
from testbed.records.records import (
    CellOutcome,
    CellRecord,
    Counts,
    Cpu,
    Crosscheck,
    Environment,
    IdleReading,
    Image,
    PairResult,
    RunRecord,
    SampleRecord,
    Summary,
    Window,
)
from testbed.topology.config import default
from testbed.topology.model import Attachment, Backend, Cell, Pattern, Profile

RUNS = Path(__file__).parent / "fixtures" / "runs"


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in (path / "samples.jsonl").read_text().splitlines() if x.strip()]


# --------------------------------------------------------------------------- round trips

EXAMPLES = [
    Image(name="debian12", digest="abc", kernel="6.1"),
    Environment(accelerator="kvm", comparable_class="kvm", cpu_model="EPYC", cpu_mhz=2600.0,
                cpus=64, memory_bytes=2**37, host="h1", kernel="6.1", versions={"qemu": "8.2"},
                image=Image(name="debian12"), vhost_net=True, testbed="0.1.0",
                testbed_commit="abc", link_gbit=25.0),
    Counts(samples=3, failed=1, boots=2),
    Cpu(window_s=10.0, host={"busy": 1.5, "softirq": 0.1}, guest={"g1": {"busy": 0.5}},
        per_guest={"g1": {"total": 0.7}}, named={"ovs-vswitchd": 0.2}),
    Window(tool_s=10.0, requested_s=10.0, host_s=10.2, guest_s={"g1": 10.1},
           coverage={"host": 1.0}, excess_s={"host": 0.2}),
    PairResult(throughput_mbps=900.0, latency_p99_us=80.0, cpu_cores=0.3, target=1000.0,
               achieved=950.0),
    IdleReading(guests=4, window_s=10.0, host_busy_cores=0.3, host_memory_used_mib=4096.0,
                qemu_rss_mib={"g1": 300.0}, memory_mib=1024, attachment="ovs"),
    Crosscheck(ratio=0.97, expected_ratio=0.96, verdict="ok"),
    CellRecord(id="ovs-qemu-mtu9000-conn8-tcp_rr-q2", attachment="ovs", backend="qemu",
               queues=2, mtu=9000, connections=8, profile="tcp_rr", tool="netperf",
               context={"variant": "a"}, hash="h1", hash_without_variant="h0", pairs=4,
               rate="5000tps"),
    Summary(n=5, mean=1.0, median=1.0, stddev=0.1, ci95=(0.9, 1.1)),
    CellOutcome(cell=CellRecord(id="c", attachment="bridge", backend="qemu", mtu=1500,
                                connections=1, profile="tcp_stream"),
                status="partial", reason="boom", converged=True,
                summary={"throughput_mbps": Summary(n=2, mean=5.0)}),
    SampleRecord(run_id="r", cell=CellRecord(id="c", pairs=2), rep=3, warmup=True, status="failed",
                 reason="timed out", metrics={"throughput_mbps": 1.0},
                 cpu=Cpu(host={"busy": 1.0}), started="t0", ended="t1", raw=("raw/x",),
                 placement={"g1": "h1"}, data={"pairs": [{"throughput_mbps": 1.0}]},
                 crosscheck=Crosscheck(ratio=1.0)),
    RunRecord(run_id="r", status="complete", started="t0", ended="t1",
              topology={"matrix": {"profiles": [{"name": "tcp_rr", "pattern": "rr"}]}},
              environment=Environment(accelerator="tcg", link_gbit=10.0),
              counts=Counts(samples=1), notes=("n",),
              cells=(CellOutcome(cell=CellRecord(id="c"), status="ok"),),
              idle=(IdleReading(guests=2, host_busy_cores=0.1),), error="e", upgraded_from=1),
]


@pytest.mark.parametrize("rec", EXAMPLES, ids=lambda r: type(r).__name__)
def test_every_record_type_round_trips(rec):
    d = rec.to_dict()
    back = type(rec).from_dict(json.loads(json.dumps(d)))
    assert back == rec
    assert back.to_dict() == d


@pytest.mark.parametrize("rec", EXAMPLES, ids=lambda r: type(r).__name__)
def test_unknown_keys_survive_a_read_and_a_write(rec):
    d = {**rec.to_dict(), "from_a_later_version": {"nested": [1, 2]}, "tool_x": "y"}
    back = type(rec).from_dict(d)
    # a cell's entry in run.json is the cell's keys and its outcome's: unknown ones are the cell's
    kept = back.cell.extra if isinstance(back, CellOutcome) else back.extra
    assert kept["from_a_later_version"] == {"nested": [1, 2]}
    assert back.to_dict() == d


def test_a_format_2_file_written_before_the_typed_records_reads_and_writes_back_unchanged():
    rec = results.read_run(RUNS / "format2")
    assert rec.to_dict() == json.loads((RUNS / "format2" / "run.json").read_text())
    assert [s.to_dict() for s in rec.samples] == _lines(RUNS / "format2")
    assert rec.upgraded_from is None and rec.format_version == results.FORMAT_VERSION == 2
    # the keys no version knows are kept where they were
    assert rec.extra["future_run_key"] == [1, 2] and rec.value_of("timing")["measure_wall_s"] == 30.0
    assert rec.environment.extra["future_env_key"] == {"a": 1}
    assert rec.samples[1].cell.extra["future_axis"] == "x"
    assert rec.samples[1].pairs[0].extra["future_pair_key"] == 1
    assert rec.idle[1].extra["future_idle_key"] is True


def test_the_capacity_fields_are_typed():
    rec = results.read_run(RUNS / "format2")
    assert rec.environment.link_gbit == 9.4
    s = next(s for s in rec.samples if s.measured and s.cell.profile == "tcp_rr")
    assert (s.cell.pairs, s.cell.rate, s.cell.variant) == (2, "2gbit", "a")
    assert [(p.transactions_per_s, p.latency_p99_us, p.cpu_cores, p.target, p.achieved)
            for p in s.pairs] == [(1000.0, 700.0, 0.4, 1000.0, 990.0), (900.0, 800.0, 0.5, None, None)]
    assert s.pairs[0].value("transactions_per_s") == 1000.0
    assert s.window is not None and s.window.tool_s == 10.0 and s.window.coverage["host"] == 1.0
    assert s.cpu.host_busy == 1.6 and s.cpu.cores().qemu == pytest.approx(1.6)
    assert s.crosscheck.ratio == 0.97
    assert [(i.guests, i.host_busy_cores, i.attachment) for i in rec.idle] == \
        [(2, 0.2, None), (4, 0.35, "bridge")]
    # a cell written before the pairs axis is one pair, and unpaced
    old = results.read_run(RUNS / "format1").samples[0].cell
    assert (old.pairs, old.rate) == (1, None) and "pairs" not in old.to_dict()


def test_a_format_1_file_loads_upgraded_with_the_hashes_main_computed(tmp_path):
    rec = results.read_run(RUNS / "format1")
    assert rec.format_version == 2 and rec.upgraded_from == 1
    # the hashes main 25ea70a's results.upgrade gave these cells
    want = {"bridge-qemu-mtu1500-conn1-tcp_rr": "14b798b38b58",
            "bridge-qemu-mtu1500-conn1-tcp_stream": "f9983ab5d2f5"}
    assert {s.cell.id: s.cell.hash for s in rec.samples} == want
    assert {c.id: c.cell.hash for c in rec.cells} == want
    assert [s.status for s in rec.samples].count("failed") == 2
    assert sum(s.warmup for s in rec.samples) == 2
    # the file itself is never edited
    assert json.loads((RUNS / "format1" / "run.json").read_text())["format_version"] == 1
    # and the upgraded run compares with itself: same definitions on both sides
    from testbed.analysis import compare
    res = compare.compare_runs(rec, rec, min_samples=2)
    assert res.refused is None and len(res.cells) == 2
    assert {c.verdict for c in res.cells} == {compare.CellVerdict.UNCHANGED}


def test_a_run_upgraded_from_format_1_compares_with_one_written_today(tmp_path):
    """The upgrade is what makes an old baseline usable: an unchanged cell measured before
    and after it has one definition hash on both sides."""
    from testbed.measure import runner
    topo = default()
    cell = next(c for c in runner.plan(topo) if c.profile.name == "tcp_stream")
    with results.RunWriter(tmp_path, "new", topo, {"accelerator": "tcg"}) as w:
        w.add_sample(SampleRecord.new("new", cell.as_dict(), 0, False, "ok", None,
                                    {"throughput_mbps": 1.0}, {}, results.now(), results.now()))
    old = {**json.loads((tmp_path / "new" / "run.json").read_text()), "format_version": 1}
    shutil.copytree(tmp_path / "new", tmp_path / "old")
    (tmp_path / "old" / "run.json").write_text(json.dumps(old))
    lines = _lines(tmp_path / "old")
    for s in lines:
        s["cell"].pop("hash")
    (tmp_path / "old" / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in lines))
    assert results.read_run(tmp_path / "old").samples[0].cell.hash == \
        results.read_run(tmp_path / "new").samples[0].cell.hash == cell.hash


# --------------------------------------------------------------------------- the writer

def test_the_writer_keeps_its_dict_api_and_writes_typed_records(tmp_path):
    topo = default()
    c = Cell(Attachment("bridge"), Backend.QEMU, 1500, 1, Profile("tcp_stream"))
    with results.RunWriter(tmp_path, "w1", topo, {"accelerator": "tcg", "link_gbit": 10.0}) as w:
        w.add_sample(SampleRecord.new("w1", c.as_dict(), 0, False, "ok", None,
                                    {"throughput_mbps": 5.0}, {"host": {"busy": 1.0}},
                                    results.now(), results.now()))
        w.add_cell(c, "ok", None, True, {"throughput_mbps": {"n": 1, "mean": 5.0}})
        w.update(idle=[{"guests": 2, "host_busy_cores": 0.1}], scenario={"name": "x"})
        w.note("a note")
        w.count("boots")
        assert w.record["cells"][-1]["id"] == c.id == w.cells[-1].id      # the old and the typed
        assert w.counts.samples == 1 and w.record["counts"]["boots"] == 1
        assert isinstance(w.run.idle[0], IdleReading)
        with pytest.raises(ValueError, match="status"):
            w.add_sample(SampleRecord(run_id="w1", cell=CellRecord(id=c.id), status="meh"))
        with pytest.raises(ValueError, match="reason"):
            w.add_sample(SampleRecord.new("w1", c.as_dict(), 1, False, "failed", None, {}, {},
                                        results.now(), results.now()))
    rec = results.read_run(tmp_path / "w1")
    assert rec.status == "complete" and rec.counts.samples == 1 and rec.notes == ("a note",)
    assert rec.cells[0].summary_mean("throughput_mbps") == 5.0 and rec.cells[0].converged is True
    assert rec.value_of("scenario") == {"name": "x"} and rec.environment.link_gbit == 10.0
    # a sample's line carries every field, as samples.jsonl lines always have
    assert _lines(tmp_path / "w1")[0] == {
        "run_id": "w1", "cell": c.as_dict(), "rep": 0, "warmup": False, "status": "ok", "reason": None,
        "metrics": {"throughput_mbps": 5.0}, "cpu": {"host": {"busy": 1.0}},
        "started": rec.samples[0].started, "ended": rec.samples[0].ended, "raw": [], "placement": {},
        "extra": {}, "crosscheck": {}}


def test_a_sample_line_has_the_shape_readers_expect(tmp_path):
    """samples.jsonl's line shape, pinned: the keys of a sample, a failed one's too, and
    the file's ``extra`` (not ``data``) holding the tool and scenario data."""
    c = Cell(Attachment("netns-veth"), Backend.QEMU, 1500, 1, Profile("tcp_stream"), pairs=2)
    with results.RunWriter(tmp_path, "w1", default(), {"accelerator": "none"}) as w:
        w.add_sample(SampleRecord.new("w1", c.as_dict(), 0, True, "ok", None, {"throughput_mbps": 5.0}, {},
                                      "t0", "t1", ["raw/x.out"], {"g1": "local"},
                                      {"pairs": [{"throughput_mbps": 2.5}]}, {"verdict": "pass"}))
        w.add_sample(SampleRecord.new("w1", c.as_dict(), 1, False, "failed", "pair 2: boom", {}, {}, "t0", "t1"))
    ok, bad = (json.loads(x) for x in (tmp_path / "w1" / "samples.jsonl").read_text().splitlines())
    keys = ["cell", "cpu", "crosscheck", "ended", "extra", "metrics", "placement", "raw", "reason", "rep",
            "run_id", "started", "status", "warmup"]
    assert sorted(ok) == sorted(bad) == keys
    assert ok["cell"] == {**c.as_dict(), "pairs": 2} and ok["warmup"] is True and ok["raw"] == ["raw/x.out"]
    assert ok["extra"] == {"pairs": [{"throughput_mbps": 2.5}]} and ok["crosscheck"] == {"verdict": "pass"}
    assert bad["extra"] == {} and bad["metrics"] == {} and bad["reason"] == "pair 2: boom"
    line = (tmp_path / "w1" / "samples.jsonl").read_text().splitlines()[0]
    assert line == json.dumps(ok, sort_keys=True)        # one line, keys sorted


def test_a_sample_written_and_read_back_is_equal(tmp_path):
    """The writer serialises the typed record once; the one reader gives back an equal one."""
    c = Cell(Attachment("bridge"), Backend.QEMU, 9000, 4, Profile("tcp_rr", pattern=Pattern.RR),
             context=(("variant", "a"),))
    built = [
        SampleRecord.new("w1", c.as_dict(), 0, False, "ok", None,
                         {"transactions_per_s": 1234.5, "latency_p99_us": 80.0},
                         {"window_s": 3.01, "host": {"busy": 1.25}, "guest": {"g1": {"busy": 0.5, "per_cpu": {}}},
                          "per_guest": {"g1": {"total": 0.75}}, "invariant": {"holds": True}},
                         "t0", "t1", ["raw/a.out", "raw/a.err"], {"g1": "local", "g2": "local"},
                         {"window": {"tool_s": 3.0, "coverage": {"host": 1.0}}, "warnings": [],
                          "percentiles": [{"p": 99, "n": 3000}], "noise": {"noisy": False, "action": None}},
                         {"ratio": 0.97, "expected_ratio": 0.97, "verdict": "ok", "device": "tb-x"}),
        SampleRecord.new("w1", c.as_dict(), 1, False, "noisy", "noisy: 1.5 other cores", {}, {}, "t2", "t3"),
        SampleRecord.new("w1", c.as_dict(), 1, False, "failed", "client timed out", {}, {}, "t4", "t5"),
    ]
    with results.RunWriter(tmp_path, "w1", default(), {"accelerator": "none"}) as w:
        for s in built:
            w.add_sample(s)
    back = results.read_run(tmp_path / "w1").samples
    assert back == tuple(built)
    assert [s.to_json() for s in back] == [s.to_json() for s in built]
    assert back[0].cpu.host_busy == 1.25 and back[0].crosscheck.verdict == "ok" and back[0].cell.variant == "a"


# --------------------------------------------------------------------------- primary metric

@pytest.mark.parametrize("pattern", list(Pattern), ids=str)
def test_the_primary_metric_of_each_pattern(pattern):
    want = {Pattern.STREAM: "throughput_mbps", Pattern.MAERTS: "throughput_mbps",
            Pattern.BIDIRECTIONAL: "throughput_mbps", Pattern.RR: "transactions_per_s",
            Pattern.CRR: "transactions_per_s"}[pattern]
    from testbed.measure import sampling as measure
    assert pattern.primary_metric == want == records.primary_metric(pattern.value)
    assert measure.primary_metric(Profile("p", pattern=pattern)) == want
    # and a run record asks the same place, through the profile its topology recorded
    rec = RunRecord(topology={"matrix": {"profiles": [{"name": "p", "pattern": pattern.value}]}})
    assert rec.primary_metric("p") == want
    assert rec.is_transactional("p") == pattern.is_transactional


def test_a_profile_the_topology_does_not_name_falls_back_on_its_name():
    rec = RunRecord()
    assert rec.primary_metric("udp_rr") == "transactions_per_s"
    assert rec.primary_metric("tcp_crr") == "transactions_per_s"
    assert rec.primary_metric("tcp_stream") == "throughput_mbps"


def test_no_reader_decides_the_primary_metric_itself():
    """The metric names appear as a decision only in model.Pattern; readers ask it."""
    root = Path(__file__).resolve().parents[2] / "testbed"
    offenders = []
    for f in root.rglob("*.py"):
        text = f.read_text()
        if f.name in ("model.py",):
            continue
        for line in text.splitlines():
            if '"transactions_per_s" if' in line or "'transactions_per_s' if" in line:
                offenders.append(f"{f.relative_to(root)}: {line.strip()}")
    assert offenders == []


# --------------------------------------------------------------------------- layering

def test_report_does_not_import_the_scenarios():
    code = ("import sys, testbed.analysis.report; "
            "print([m for m in sys.modules if m.startswith('testbed.scenarios')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[2], check=True)
    assert out.stdout.strip() == "[]"
