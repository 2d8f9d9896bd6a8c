from __future__ import annotations

import json

import pytest

from testbed.records import results
from testbed.topology.config import default
from testbed.topology.model import Attachment, Backend, Cell, Profile


def _sample(run_id: str, rep: int, status: str = "ok") -> results.SampleRecord:
    cell = Cell(Attachment("bridge"), Backend.QEMU, 1500, 1, Profile("tcp_stream"))
    return results.SampleRecord.new(run_id, cell.as_dict(), rep, False, status, None if status == "ok" else "boom",
                                    {"throughput_mbps": 100.0 + rep} if status == "ok" else {}, {}, results.now(),
                                    results.now())


def test_run_roundtrip_and_status(tmp_path):
    with results.RunWriter(tmp_path, "r1", default(), {"accelerator": "tcg"}) as w:
        w.add_sample(_sample("r1", 0))
        w.add_sample(_sample("r1", 1, "failed"))
    rec = results.read_run(tmp_path / "r1")
    assert rec.format_version == results.FORMAT_VERSION
    assert rec.status == "complete-with-failures"
    assert rec.counts.to_dict() == {"samples": 2, "failed": 1, "boots": 0}
    assert [s.status for s in rec.samples] == ["ok", "failed"]
    assert rec.samples[1].reason == "boom"
    assert rec.guests[0].name == "g1"


def test_interrupted_run_keeps_completed_samples(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        with results.RunWriter(tmp_path, "r2", default(), {}) as w:
            w.add_sample(_sample("r2", 0))
            raise KeyboardInterrupt
    rec = results.read_run(tmp_path / "r2")
    assert rec.status == "interrupted" and len(rec.samples) == 1


def test_partial_last_line_is_ignored(tmp_path):
    with results.RunWriter(tmp_path, "r3", default(), {}) as w:
        w.add_sample(_sample("r3", 0))
    with open(tmp_path / "r3" / "samples.jsonl", "a") as f:
        f.write('{"run_id": "r3", "rep"')       # a write cut by SIGKILL
    assert len(results.read_run(tmp_path / "r3").samples) == 1


def test_run_json_is_replaced_atomically(tmp_path):
    with results.RunWriter(tmp_path, "r4", default(), {}) as w:
        w.note("x")
        # No temp files left beside run.json, and it is always complete JSON.
        assert [p.name for p in (tmp_path / "r4").iterdir() if p.name.startswith(".")] == []
        assert json.loads((tmp_path / "r4" / "run.json").read_text())["notes"] == ["x"]


def test_a_format_1_run_loads_upgraded_with_the_hash_a_new_run_would_have(tmp_path):
    """Old run directories still load: the definition hash is computed from their own
    topology, the way the runner computes it for a new run, so unchanged cells still match."""
    from testbed.measure import runner
    topo = default()
    (cell,) = [c for c in runner.plan(topo) if c.profile.name == "tcp_stream"][:1]
    assert cell.context                                  # guests' size and placement
    with results.RunWriter(tmp_path, "old", topo, {"accelerator": "tcg"}) as w:
        w.add_sample(results.SampleRecord.new("old", cell.as_dict(), 0, False, "ok", None,
                                              {"throughput_mbps": 1.0}, {}, results.now(), results.now()))
        w.add_cell(cell, "ok", None, None, {})
    # rewrite it as format 1 wrote it: no hash, no context
    run = json.loads((tmp_path / "old" / "run.json").read_text())
    run["format_version"] = 1
    for c in run["cells"]:
        c.pop("hash"), c.pop("context")
    (tmp_path / "old" / "run.json").write_text(json.dumps(run))
    lines = [json.loads(x) for x in (tmp_path / "old" / "samples.jsonl").read_text().splitlines()]
    for s in lines:
        s["cell"].pop("hash"), s["cell"].pop("context")
    (tmp_path / "old" / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in lines))
    rec = results.read_run(tmp_path / "old")
    assert rec.format_version == results.FORMAT_VERSION == 2
    assert rec.upgraded_from == 1
    assert rec.samples[0].cell.hash == rec.cells[0].cell.hash == cell.hash


def test_the_definition_hash_follows_everything_that_changes_a_measurement():
    import dataclasses

    from testbed.topology.model import Offloads, Tool
    c = Cell(Attachment("bridge"), Backend.QEMU, 1500, 1, Profile("tcp_stream", message_size=16384))
    changed = [dataclasses.replace(c, profile=dataclasses.replace(c.profile, **kw))
               for kw in (dict(message_size=1024), dict(duration_s=30), dict(tool=Tool("uperf")),
                          dict(response_size=1))]
    changed += [dataclasses.replace(c, queues=2), dataclasses.replace(c, mtu=9000),
                dataclasses.replace(c, context=(("offloads", Offloads(tso=False).label()),)),
                dataclasses.replace(c, context=(("client.size", "2vcpu-2048MiB"),))]
    hashes = {c.hash} | {x.hash for x in changed}
    assert len(hashes) == 1 + len(changed)
    assert c.as_dict()["id"] == dataclasses.replace(c, profile=dataclasses.replace(
        c.profile, duration_s=30)).as_dict()["id"]        # the readable id stays the same


def test_raw_output_written_again_under_the_same_name_keeps_the_earlier_one(tmp_path):
    """The gate's second stage measures a cell again with its repetitions numbered from 0:
    each sample's raw output stays the one its record names, .out and .err as a pair."""
    with results.RunWriter(tmp_path, "r5", default(), {}) as w:
        first = [w.write_raw("c", "rep0-client0.out", "first\n"), w.write_raw("c", "rep0-client0.err", "e1\n")]
        again = [w.write_raw("c", "rep0-client0.out", "again\n"), w.write_raw("c", "rep0-client0.err", "e2\n")]
        third = w.write_raw("c", "rep0-client0.out", "third\n")
        plain = w.write_raw("c", "README", "x")
        assert w.write_raw("c", "README", "y").name == "README.2"
    assert [p.name for p in first] == ["rep0-client0.out", "rep0-client0.err"]
    assert [p.name for p in again] == ["rep0-client0.2.out", "rep0-client0.2.err"]
    assert third.name == "rep0-client0.3.out" and plain.name == "README"
    assert [p.read_text() for p in (*first, *again, third)] == ["first\n", "e1\n", "again\n", "e2\n", "third\n"]
