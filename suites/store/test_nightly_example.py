"""examples/nightly/nightly.sh end to end on real runs, with the CI system's own steps stubbed:
the script measures the first night itself (`testbed run` of a namespace topology, no VMs),
later nights are given as run directories, the index is a real PostgreSQL server, and the
script's exit status must be the gate's.

The regression is real: the second night's run is measured with a token-bucket rate limit
(tc tbf, 2 Gbit/s) on both ends of its namespace pair, which a veth otherwise carries at
~10 Gbit/s here; request/response is barely touched. The limit is put only on the
namespaces of that run's own tag, read from its first progress line."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import testbed
from testbed.admin import cleanup
from testbed.errors import CommandError
from testbed.host import proc
from testbed.records import store

pytestmark = [pytest.mark.store, pytest.mark.attach("netns")]

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "nightly" / "nightly.sh"
ROOT = str(Path(testbed.__file__).parent.parent)

# Short, but gateable: 5 samples a side after one warm-up is what compare needs for a verdict.
TOPOLOGY = """\
name: nightly-netns
matrix:
  attachments: [netns-veth]
  mtus: [1500]
  connections: [1]
  profiles:
    - {name: tcp_stream, pattern: stream, message_size: 16384, duration: 1}
    - {name: tcp_rr, pattern: rr, message_size: 1, response_size: 1, duration: 1}
  repetitions: {warmup: 1, min: 5, max: 5, rsd_target: 0.1}
"""
CELLS = {"netns-veth-qemu-mtu1500-conn1-tcp_stream", "netns-veth-qemu-mtu1500-conn1-tcp_rr"}


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": ROOT, "TESTBED": f"{sys.executable} -m testbed",
            "TESTBED_RESULTS": str(tmp / "results"), "NIGHTLY_OUT": str(tmp / "out"), **extra}


def _limit_rate(tag: str, stop: threading.Event, limited: set) -> None:
    """tbf on every veth in the namespaces tb-<tag>-*, as soon as they appear."""
    while not stop.is_set():
        try:
            names = [line.split()[0] for line in proc.run(["ip", "netns", "list"], timeout=10).stdout.splitlines()
                     if line.startswith(f"tb-{tag}-")]
            for ns in names:
                for line in proc.run(["ip", "-n", ns, "-o", "link", "show", "type", "veth"],
                                     timeout=10).stdout.splitlines():
                    dev = line.split(":")[1].strip().split("@")[0]
                    if (ns, dev) not in limited:
                        proc.run(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate",
                                  "2gbit", "burst", "256kb", "latency", "20ms"], timeout=10)
                        limited.add((ns, dev))
        except CommandError:
            pass        # the namespace went away between listing and use: the run ended
        time.sleep(0.02)


def _measure(tmp: Path, topo: Path, *, rate_limited: bool = False) -> Path:
    """A real `testbed run`; another session's run holding the host (exit 4) is waited for."""
    deadline = time.monotonic() + 300
    while True:
        p = subprocess.Popen([sys.executable, "-m", "testbed", "run", str(topo)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=_env(tmp))
        first = p.stderr.readline()
        stop, limited = threading.Event(), set()
        m = re.match(r"run \S+-([0-9a-f]+):", first)
        watcher = threading.Thread(target=_limit_rate, args=(m.group(1), stop, limited)) \
            if m and rate_limited else None
        if watcher:
            watcher.start()
        try:
            out, err = p.communicate(timeout=600)
        finally:
            stop.set()
            if watcher:
                watcher.join()
        if p.returncode == 4 and "in progress" in first + err:
            # another session's run holds the host: again as soon as it ends
            if not cleanup.wait_host_free(deadline - time.monotonic()):
                pytest.skip("another run held this host for 5 minutes")
            continue
        assert p.returncode == 0, first + err[-3000:]
        if rate_limited:
            assert {ns[-1] for ns, _ in limited} == {"a", "b"}, limited
        return Path(out.strip().splitlines()[-1])


def _nightly(tmp: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=900, cwd=tmp,
                          env=_env(tmp, **env))


def _cli(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "testbed", *args], capture_output=True, text=True,
                          timeout=300, env=_env(tmp))


def _junit(tmp: Path) -> dict[str, ET.Element]:
    root = ET.parse(tmp / "out" / "compare.xml").getroot()        # valid XML, or this raises
    cases = {c.get("name"): c for c in root.iter("testcase")}
    assert set(cases) == CELLS and len(list(root.iter("testcase"))) == len(CELLS)
    return cases


def test_nightly_script_exits_as_the_gate_says(tmp_path, pg_url):
    if os.geteuid() != 0:
        pytest.skip("needs root: measures between network namespaces")
    for tool in ("netperf", "netserver", "tc"):
        if not shutil.which(tool):
            pytest.skip(f"{tool} missing")
    topo = tmp_path / "nightly-netns.yaml"
    topo.write_text(TOPOLOGY)

    # Night 1: the script measures (the CI step not stubbed); no baseline yet, so no
    # verdict: it passes and remembers the run as the baseline.
    first = _nightly(tmp_path, NIGHTLY_TOPOLOGY=str(topo), NIGHTLY_DB_URL=pg_url)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "no baseline yet" in first.stderr and "URL" in first.stderr and pg_url not in first.stderr
    base = Path((tmp_path / "results" / "nightly-baseline").read_text().strip())
    assert (base / "run.json").is_file() and base.parent == tmp_path / "results"
    assert not (tmp_path / "out" / "compare.xml").exists()

    # Night 2: a rate-limited datapath. A regression: exit 1, and the JUnit file fails the
    # stream cell; the baseline stays.
    slow = _measure(tmp_path, topo, rate_limited=True)
    night2 = _nightly(tmp_path, NEW_RUN=str(slow), NIGHTLY_DB_URL=pg_url)
    direct = _cli(tmp_path, "compare", str(base), str(slow))
    assert direct.returncode == 1, direct.stdout
    assert night2.returncode == 1, night2.stderr[-3000:]
    cases = _junit(tmp_path)
    failure = cases["netns-veth-qemu-mtu1500-conn1-tcp_stream"].find("failure")
    assert failure is not None and "regressed" in failure.get("message", ""), ET.tostring(failure or cases[
        "netns-veth-qemu-mtu1500-conn1-tcp_stream"])
    assert Path((tmp_path / "results" / "nightly-baseline").read_text().strip()) == base

    # Night 3: the datapath as on night 1. Whatever compare decides (unchanged, or
    # undecided at 5 samples a side), the script exits with it.
    again = _measure(tmp_path, topo)
    night3 = _nightly(tmp_path, NEW_RUN=str(again), NIGHTLY_DB_URL=pg_url)
    direct = _cli(tmp_path, "compare", str(base), str(again))
    history = subprocess.run([sys.executable, "-m", "testbed", "history", "--db", pg_url], capture_output=True,
                             text=True, timeout=300, env=_env(tmp_path))
    assert direct.returncode in (0, 1, 5), direct.stderr
    # a lasting regression in the history fails the job as a regression does
    want = 1 if direct.returncode == 1 or history.returncode == 1 else direct.returncode
    assert night3.returncode == want, (direct.stdout, history.stdout, night3.stderr[-3000:])
    cases = _junit(tmp_path)
    assert (tmp_path / "out" / "compare.txt").read_text() == direct.stdout
    verdicts = re.findall(r"verdict (\w+)", "".join(c.findtext("system-out") or "" for c in cases.values()))
    assert len(verdicts) == len(CELLS), verdicts

    # The fleet's store holds the three nights; the history page plots both cells.
    with store.open(pg_url) as st:
        ids = [r.run_id for r in st.runs()]
    assert sorted(ids) == sorted([base.name, slow.name, again.name])
    assert (tmp_path / "out" / "history.html").stat().st_size > 10_000
    assert all(c in (tmp_path / "out" / "history.txt").read_text() for c in CELLS)

    # The A/B mode on a run without variants: compare refuses it, the job is an error.
    ab = _nightly(tmp_path, NIGHTLY_MODE="variants", NEW_RUN=str(again), NIGHTLY_DB_URL=pg_url)
    assert ab.returncode == 2, ab.stderr[-2000:]
    assert "the gate exited 2" in ab.stderr


def test_nightly_script_falls_back_to_sqlite(tmp_path):
    """Without NIGHTLY_DB_URL the store is SQLite beside the runs; a recorded run is enough."""
    run = Path(__file__).resolve().parents[1] / "unit" / "fixtures" / "runs" / "format2"
    p = _nightly(tmp_path, NEW_RUN=str(run), NIGHTLY_DB_URL="")
    assert p.returncode == 0, p.stderr[-3000:]
    assert (tmp_path / "results" / "index.sqlite").is_file()
    with store.open(tmp_path / "results" / "index.sqlite") as st:
        assert [r.run_id for r in st.runs()] == [json.loads((run / "run.json").read_text())["run_id"]]
