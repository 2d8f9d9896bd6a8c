"""The README's main command, end to end: `testbed run` with the built-in topology, and a
Ctrl-C in the middle of one. Both must leave no tb- object behind."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed import cleanup

pytestmark = pytest.mark.vm


def _env(tmp_path: Path) -> dict:
    return {**os.environ, "TESTBED_RESULTS": str(tmp_path / "results")}


def _no_leftovers_of(run_dir: Path) -> None:
    tag = run_dir.name.rsplit("-", 1)[1]
    found = cleanup.find(include_live=True)
    mine = [n for group in found.__dict__.values() for n in group if n.startswith(f"tb-{tag}")]
    assert mine == [], f"leftovers of run {run_dir.name}: {mine}"


def test_run_default_topology(accelerator, tmp_path):
    p = subprocess.run([sys.executable, "-m", "testbed.cli", "run"], capture_output=True, text=True,
                       timeout=1200, env=_env(tmp_path))
    assert p.returncode == 0, p.stderr[-3000:]
    run_dir = Path(p.stdout.strip().splitlines()[-1])
    assert run_dir.is_dir() and run_dir.parent == tmp_path / "results"
    run = json.loads((run_dir / "run.json").read_text())
    assert run["format_version"] == 1 and run["status"] == "complete"
    env = run["environment"]
    assert env["accelerator"] == accelerator.value
    for key in ("kernel", "cpu_model", "cpu_mhz", "versions"):
        assert env[key], key
    assert env["versions"]["qemu"] and env["versions"]["libvirt"]
    assert run["counts"]["boots"] == 2
    samples = [json.loads(l) for l in (run_dir / "samples.jsonl").read_text().splitlines()]
    by = {s["cell"]["profile"]: s for s in samples}
    assert by["tcp_stream"]["status"] == "ok" and by["tcp_stream"]["metrics"]["throughput_mbps"] > 0
    assert by["tcp_rr"]["status"] == "ok" and by["tcp_rr"]["metrics"]["transactions_per_s"] > 0
    for s in samples:
        assert set(s["cell"]) >= {"attachment", "backend", "mtu", "connections", "profile"}
        assert (run_dir / s["raw"][0]).read_text().strip()
    _no_leftovers_of(run_dir)


def test_ctrl_c_tears_everything_down(accelerator, tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "testbed.cli", "run"], stderr=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=_env(tmp_path))
    lines = []
    deadline = time.monotonic() + 900
    # Interrupt once guests are up and a cell is being measured: the most objects exist then.
    for line in proc.stderr:
        lines.append(line)
        if line.startswith("[1/"):
            break
        assert time.monotonic() < deadline, "".join(lines)
    time.sleep(2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, "".join(lines) + err
    runs = list((tmp_path / "results").iterdir())
    assert len(runs) == 1
    run = json.loads((runs[0] / "run.json").read_text())
    assert run["status"] == "interrupted"
    _no_leftovers_of(runs[0])
