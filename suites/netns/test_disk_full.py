"""A results folder on a small tmpfs: a run whose matrix does not fit is refused before
anything is created, with the estimate stated; a run whose disk fills mid-run stops with one
clear line (exit 4), leaves run.json valid and no half-written sample or raw output, and
`--resume` completes it once the file system is made larger."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed.admin import cleanup
from testbed._suite_plugin import run_cli
from testbed.records import results

pytestmark = [pytest.mark.netns, pytest.mark.attach("netns")]

TOPOLOGY = """\
name: diskfull
matrix:
  attachments: [netns-veth]
  mtus: [1500, 9000]
  connections: [1, 2]
  profiles:
    - {name: tcp_stream, pattern: stream, message_size: 16384, duration: 1}
  repetitions: {warmup: 0, min: 2, max: 2, rsd_target: 0.1}
noise: {action: keep}
"""


@pytest.fixture
def small_tmpfs(tmp_path, request):
    if os.geteuid() != 0:
        pytest.skip("needs root: mounts a tmpfs")
    for tool in ("netperf", "netserver"):
        if not shutil.which(tool):
            pytest.skip(f"{tool} missing")
    mnt = tmp_path / "res"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tb-diskfull", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    request.addfinalizer(lambda: subprocess.run(["umount", "-l", str(mnt)], check=False))
    return mnt


def cli(args: list[str], env: dict) -> subprocess.CompletedProcess:
    """run_cli, again while another session's run holds the host lock."""
    deadline = time.monotonic() + 600
    while True:
        r = run_cli(args, env=env)
        if "in progress on this host" not in r.stderr or not cleanup.wait_host_free(deadline - time.monotonic()):
            return r


def finished_cells(run_dir: Path) -> list[str]:
    try:
        return [c["id"] for c in json.loads((run_dir / "run.json").read_text())["cells"]]
    except (OSError, ValueError, KeyError):
        return []


def test_a_matrix_that_cannot_fit_is_refused_before_anything_is_created(tmp_path, small_tmpfs):
    topo = tmp_path / "big.yaml"
    topo.write_text(TOPOLOGY.replace("min: 2, max: 2", "min: 2, max: 400"))
    r = cli(["run", str(topo)], env={"TESTBED_RESULTS": str(small_tmpfs)})
    assert r.returncode == 4, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert "not enough space" in line and "1600 samples x 8 KiB" in line and "free on" in line, line
    assert list(small_tmpfs.iterdir()) == []


def test_a_disk_that_fills_stops_the_run_cleanly_and_resume_completes_it(tmp_path, small_tmpfs):
    topo = tmp_path / "t.yaml"
    topo.write_text(TOPOLOGY)
    env = {**os.environ, "TESTBED_RESULTS": str(small_tmpfs)}
    run_dir = None
    deadline = time.monotonic() + 900
    while run_dir is None:
        p = subprocess.Popen([sys.executable, "-m", "testbed.cli", "run", str(topo)], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        while time.monotonic() < deadline and p.poll() is None:
            dirs = [d for d in small_tmpfs.glob("2*") if (d / "run.json").exists()]
            if dirs and finished_cells(dirs[0]):
                run_dir = dirs[0]
                break
            time.sleep(0.05)
        if run_dir is None:
            err = p.stderr.read() if p.poll() is not None else "no cell finished"
            assert "in progress on this host" in err and time.monotonic() < deadline, err
            cleanup.wait_host_free(deadline - time.monotonic())     # another session's run holds the host
    # Someone else fills the disk: a ballast file takes all but a few KiB.
    ballast = small_tmpfs / "ballast"
    free = shutil.disk_usage(small_tmpfs).free
    with open(ballast, "wb") as f:
        try:
            f.write(b"\0" * max(0, free - 3000))
        except OSError:
            pass
    _, err = p.communicate(timeout=600)
    lines = err.strip().splitlines()
    assert p.returncode == 4, err[-3000:]
    assert lines[-1].startswith("testbed: results disk full: writing ") and "needed" in lines[-1] \
        and "free" in lines[-1] and f"--resume {run_dir}" in lines[-1], lines[-1]
    assert sum("disk full" in x or "No space" in x for x in lines) == 1, err[-3000:]
    assert "Traceback" not in err

    # What is on disk is valid: run.json reads, samples.jsonl ends with a whole line, every
    # raw output a sample names is there, and no temporary file is left half-written.
    rec = results.read_run(run_dir)
    data = (run_dir / "samples.jsonl").read_bytes()
    assert not data or data.endswith(b"\n")
    for s in rec.samples:
        for raw in s.raw:
            assert (run_dir / raw).is_file()
    assert not [x for x in run_dir.rglob(".*") if x.is_file()], list(run_dir.rglob(".*"))
    finished = [c.cell.id for c in rec.cells]
    assert 1 <= len(finished) < 4

    # Space freed (the file system made larger), the run goes on and completes.
    subprocess.run(["mount", "-o", "remount,size=64m", str(small_tmpfs)], check=True)
    r = cli(["run", str(topo), "--resume", str(run_dir)], env={"TESTBED_RESULTS": str(small_tmpfs)})
    assert r.returncode == 0, r.stderr[-3000:]
    rec = results.read_run(run_dir)
    ids = [c.cell.id for c in rec.cells]
    assert len(ids) == 4 and len(set(ids)) == 4 and ids[:len(finished)] == finished
    assert rec.run["status"] == "complete"
    per_cell: dict[str, list[int]] = {}
    for s in rec.samples:
        per_cell.setdefault(s.cell.id, []).append(s.rep)
    assert all(sorted(v) == [0, 1] for v in per_cell.values()), per_cell
