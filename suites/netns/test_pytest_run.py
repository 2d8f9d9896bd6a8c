"""pytest runs are runs: a pytest session whose tests measure (a team's test through the
plugin's marker and ``testbed_cell``, or by hand into ``testbed_run``) leaves a run directory
with this host's real environment, finished with its status and counts, that `testbed
report` renders like a `testbed run` directory; a floor the sample does not reach fails its
test with the figure. Proved with a child pytest session of namespace tests (no guests), its
run written under --results."""
from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import testbed
from testbed._suite_plugin import run_cli
from testbed.pytest_plugin import require_root

INNER = '''
import pytest

from testbed.measure import sampling as measure, testpaths
from testbed.analysis import stats
from testbed.topology.model import Attachment, Backend, Cell, Pattern, Profile, Repetitions
from testbed.measure.session import claim_tag


@pytest.mark.testbed(attachments=["netns-veth"], profiles=["tcp_stream"], duration=2)
def test_a_team_test(testbed_cell):
    s = testbed_cell.measure()
    assert s.ok and s.metrics[testbed_cell.metric] > 0
    assert (testbed_cell.run.dir / s.raw[0]).is_file()


def test_measures_the_same_cell_again(testbed_run, tmp_path):
    # another test, same cell id (other conditions in real suites: macvtap modes), by hand
    cell = Cell(Attachment("netns-veth"), Backend.QEMU, 1500, 1,
                Profile("tcp_stream", pattern=Pattern.STREAM, message_size=16384, duration_s=2))
    with testpaths.own_endpoints_path(Attachment("netns-veth"), claim_tag(), "198.18.251.0/30", 1500, str(tmp_path)) as path:
        [s] = measure.measure_cell(cell, path, testbed_run, stats.StoppingRule(Repetitions()), 0, {}, {})
    assert s.status == "ok", s.reason


@pytest.mark.testbed(attachments=["netns-veth"], profiles=["tcp_rr"], duration=2)
@pytest.mark.testbed_floor(tcp_rr=1e12, namespaces=True)
def test_a_floor_no_host_reaches(testbed_cell):
    testbed_cell.measure()          # fails the test: below the floor
'''


def test_a_measuring_pytest_session_writes_a_run_that_report_renders(tmp_path: Path) -> None:
    require_root()
    (tmp_path / "test_inner.py").write_text(INNER)
    results = tmp_path / "results"
    env = {**os.environ, "PYTHONPATH": str(Path(testbed.__file__).parent.parent)}
    env.pop("TESTBED_RESULTS", None)
    p = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                        str(tmp_path / "test_inner.py"), "--results", str(results)],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert p.returncode == 1, p.stdout[-3000:] + p.stderr[-2000:]
    # the floor's test failed with its reason; the others passed
    assert "1 failed, 2 passed" in p.stdout, p.stdout[-2000:]
    assert re.search(r"netns-veth-qemu-mtu1500-conn1-tcp_rr: transactions_per_s \S+ is below the floor 1e\+12 "
                     r"\(testbed_floor, namespaces\)", p.stdout), p.stdout[-3000:]
    # The session says where its run is, and it is under --results.
    m = re.search(r"measurements of this session: (\S+)", p.stdout)
    assert m, p.stdout[-2000:]
    run_dir = Path(m.group(1))
    assert run_dir.parent == results and run_dir.is_dir()
    run = json.loads((run_dir / "run.json").read_text())
    # Finished, with its counts, and this host's environment (no stand-in "test" accelerator).
    assert run["status"] == "complete", run.get("error")
    assert run["counts"]["samples"] == 3 and run["counts"]["failed"] == 0
    envr = run["environment"]
    assert envr["accelerator"] == "none" and envr["comparable_class"] == "host-namespaces"
    assert envr["kernel"] == platform.release() and envr["cpus"] == os.cpu_count() and envr["cpu_model"]
    # The recorded matrix is what was measured, so compare and history read it like a run's.
    assert run["topology"]["matrix"]["attachments"] == ["netns-veth"]
    assert sorted({pr["name"] for pr in run["topology"]["matrix"]["profiles"]}) == ["tcp_rr", "tcp_stream"]
    # One outcome per cell id: the second measurement of the same cell is <id>-t2, its
    # sample too (the index keys cells by run and id).
    cell, again, rr = run["cells"]
    assert cell["id"] == "netns-veth-qemu-mtu1500-conn1-tcp_stream" and cell["status"] == "ok"
    assert again["id"] == cell["id"] + "-t2" and again["status"] == "ok"
    assert cell["summary"]["throughput_mbps"]["mean"] > 0
    samples = [json.loads(x) for x in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert [x["cell"]["id"] for x in samples] == [cell["id"], again["id"], rr["id"]]
    assert rr["status"] == "ok"        # measured well: the floor is the team's test, not the sample's
    # Indexed beside the results like a `testbed run`, and `testbed report` renders it.
    assert "not indexed" not in p.stdout, p.stdout[-2000:]
    assert (results / "index.sqlite").is_file()
    html = tmp_path / "report.html"
    r = run_cli(["report", str(run_dir), "-o", str(html)], timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    page = html.read_text()
    assert run["run_id"] in page and "netns-veth" in page


XDIST_INNER = '''
import pytest


@pytest.mark.testbed(attachments=["netns-veth", "netns-bridge"], profiles=["tcp_stream"], duration=2,
                     repetitions={"warmup": 0, "min": 2, "max": 2, "rsd_target": 0})
def test_x(testbed_cell):
    assert testbed_cell.measure().ok
'''


def test_workers_of_one_session_measure_one_cell_at_a_time(tmp_path: Path) -> None:
    """A team's session under pytest-xdist: each worker writes its own run, and no sample of
    one has the other's traffic beside it (each cell's samples hold the host's measure lock)."""
    require_root()
    (tmp_path / "test_inner.py").write_text(XDIST_INNER)
    results = tmp_path / "results"
    env = {**os.environ, "PYTHONPATH": str(Path(testbed.__file__).parent.parent)}
    env.pop("TESTBED_RESULTS", None)
    p = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-n", "2",
                        str(tmp_path / "test_inner.py"), "--results", str(results)],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert p.returncode == 0 and "2 passed" in p.stdout, p.stdout[-3000:] + p.stderr[-2000:]
    from datetime import datetime
    windows = []
    for run_dir in sorted(d for d in results.iterdir() if d.is_dir()):
        samples = [json.loads(x) for x in (run_dir / "samples.jsonl").read_text().splitlines()]
        if samples:
            windows.append((datetime.fromisoformat(samples[0]["started"]),
                            datetime.fromisoformat(samples[-1]["ended"]), run_dir.name))
    assert len(windows) == 2, windows        # one run a worker, each with its cell's samples
    (a0, a1, _), (b0, b1, _) = sorted(windows)
    assert a1 <= b0, windows                 # the second worker's cell began after the first's ended
