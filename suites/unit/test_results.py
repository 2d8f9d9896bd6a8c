from __future__ import annotations

import json

import pytest

from testbed import results
from testbed.config import default
from testbed.model import Attachment, Backend, Cell, Profile


def _sample(run_id: str, rep: int, status: str = "ok") -> results.Sample:
    cell = Cell(Attachment.BRIDGE, Backend.QEMU, 1500, 1, Profile("tcp_stream"))
    return results.Sample(run_id, cell.as_dict(), rep, False, status, None if status == "ok" else "boom",
                          {"throughput_mbps": 100.0 + rep} if status == "ok" else {}, {}, results.now(),
                          results.now())


def test_run_roundtrip_and_status(tmp_path):
    with results.RunWriter(tmp_path, "r1", default(), {"accelerator": "tcg"}) as w:
        w.add_sample(_sample("r1", 0))
        w.add_sample(_sample("r1", 1, "failed"))
    rec = results.read_run(tmp_path / "r1")
    assert rec.run["format_version"] == results.FORMAT_VERSION
    assert rec.run["status"] == "complete-with-failures"
    assert rec.run["counts"] == {"samples": 2, "failed": 1, "boots": 0}
    assert [s["status"] for s in rec.samples] == ["ok", "failed"]
    assert rec.samples[1]["reason"] == "boom"
    assert rec.run["topology"]["guests"][0]["name"] == "g1"


def test_interrupted_run_keeps_completed_samples(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        with results.RunWriter(tmp_path, "r2", default(), {}) as w:
            w.add_sample(_sample("r2", 0))
            raise KeyboardInterrupt
    rec = results.read_run(tmp_path / "r2")
    assert rec.run["status"] == "interrupted" and len(rec.samples) == 1


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
