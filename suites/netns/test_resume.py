"""`testbed run --resume RUN`: a run SIGKILLed after its first cells goes on in the same
directory after `testbed cleanup`. Every cell is measured exactly once across both parts, a
torn last line is set aside and its cell measured again, the index and the report cover the
whole run, and a changed topology is refused (exit 2) before anything is created."""
from __future__ import annotations

import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed._suite_plugin import run_cli

# alone: a run killed with SIGKILL leaves its objects until it resumes
pytestmark = [pytest.mark.alone, pytest.mark.netns, pytest.mark.attach("netns")]

TOPOLOGY = """\
name: resume
matrix:
  attachments: [netns-veth]
  mtus: [1500, 9000]
  connections: [1, 2]
  profiles:
    - {name: tcp_stream, pattern: stream, message_size: 16384, duration: 1}
  repetitions: {warmup: 0, min: 2, max: 2, rsd_target: 0.1}
noise: {action: keep}
"""


def finished_cells(run_dir: Path) -> list[str]:
    try:
        return [c["id"] for c in json.loads((run_dir / "run.json").read_text())["cells"]]
    except (OSError, ValueError, KeyError):
        return []


def test_a_killed_run_resumes_and_measures_every_cell_once(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root: creates namespaces")
    for tool in ("netperf", "netserver"):
        if not shutil.which(tool):
            pytest.skip(f"{tool} missing")
    topo = tmp_path / "t.yaml"
    topo.write_text(TOPOLOGY)
    res = tmp_path / "res"
    env = {**os.environ, "TESTBED_RESULTS": str(res)}
    p = subprocess.Popen([sys.executable, "-m", "testbed.cli", "run", str(topo)], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    run_dir = None
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and p.poll() is None:
        dirs = [d for d in res.glob("2*") if (d / "run.json").exists()] if res.exists() else []
        if dirs and finished_cells(dirs[0]):
            run_dir = dirs[0]
            break
        time.sleep(0.2)
    assert run_dir is not None, p.stderr.read() if p.poll() is not None else "no cell finished"
    p.send_signal(signal.SIGKILL)
    p.wait()
    before = finished_cells(run_dir)
    assert 1 <= len(before) < 4
    assert json.loads((run_dir / "run.json").read_text())["status"] == "running"
    with open(run_dir / "samples.jsonl", "a") as f:
        f.write('{"run_id": "torn mid-wri')               # a crash in the middle of a line

    # A changed topology is refused before anything is created.
    other = tmp_path / "other.yaml"
    other.write_text(TOPOLOGY.replace("mtus: [1500, 9000]", "mtus: [1500]"))
    r = run_cli(["run", str(other), "--resume", str(run_dir)], env={"TESTBED_RESULTS": str(res)})
    assert r.returncode == 2 and "differs" in r.stderr and len(r.stderr.strip().splitlines()) == 1

    # The dead run's objects block a new run until `testbed cleanup`, which removes only them.
    for _ in range(50):
        r = run_cli(["cleanup"])
        if "nothing to clean up" not in r.stdout + r.stderr:
            break
        time.sleep(0.2)
    r = run_cli(["run", str(topo), "--resume", str(run_dir)], env={"TESTBED_RESULTS": str(res)})
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == str(run_dir)

    run = json.loads((run_dir / "run.json").read_text())
    ids = [c["id"] for c in run["cells"]]
    assert sorted(ids) == sorted(set(ids)) and len(ids) == 4, ids       # each cell once
    assert ids[:len(before)] == before                                  # the first part kept
    samples = [json.loads(l) for l in (run_dir / "samples.jsonl").read_text().splitlines()]
    per_cell = collections.Counter(s["cell"]["id"] for s in samples)
    assert set(per_cell) == set(ids)
    for cid in ids:
        reps = [s["rep"] for s in samples if s["cell"]["id"] == cid and s["status"] == "ok"]
        assert sorted(reps) == sorted(set(reps)) and len(reps) == 2, (cid, reps)   # none twice
    assert run["status"] == "complete" and run["counts"]["samples"] == len(samples)
    (resume,) = run["resumes"]
    assert set(resume["cells_left"]) == set(ids) - set(before)
    assert resume["torn_line"] and "torn mid-wri" in (run_dir / "samples.jsonl.torn").read_text()

    # The index and the report cover the whole run.
    from testbed.records import store
    with store.open(res / "index.sqlite", readonly=True) as st:
        assert len(st.samples(run["run_id"])) == len(samples)
        assert {c.cell_id for c in st.cells(run["run_id"])} == set(ids)
    assert (run_dir / "report.html").is_file()
