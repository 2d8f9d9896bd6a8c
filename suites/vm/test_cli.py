"""The README's main command, end to end: `testbed run` with the built-in topology; a second
run while it is going; Ctrl-C, SIGTERM and SIGKILL in the middle of one. Nothing may be left
behind, and host networking must be exactly as it was."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed.admin import cleanup

pytestmark = pytest.mark.vm


def _env(tmp_path: Path, alone: bool = False) -> dict:
    env = {**os.environ, "TESTBED_RESULTS": str(tmp_path / "results")}
    if alone:
        env.pop("TESTBED_SHARED_HOST", None)    # a run that wants the host to itself, as by default
    return env


def _cli(tmp_path: Path, *args: str, timeout: float = 1200, alone: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "testbed.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=_env(tmp_path, alone))


def _start(tmp_path: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "testbed.cli", "run"], stderr=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=_env(tmp_path))


def _wait_for_measuring(proc: subprocess.Popen) -> list[str]:
    """Read progress until the first cell starts: guests are up and a NIC is plugged, the
    moment when the most objects exist."""
    lines = []
    deadline = time.monotonic() + 900
    for line in proc.stderr:
        lines.append(line)
        if line.startswith("[1/"):
            return lines
        assert time.monotonic() < deadline, "".join(lines)
    raise AssertionError("run ended before measuring: " + "".join(lines))


def _objects_of(tag: str) -> list[str]:
    found = cleanup.find(include_live=True)
    return [n for group in found.__dict__.values() for n in group if n.startswith(f"tb-{tag}")]


def _tag(run_dir: Path) -> str:
    return run_dir.name.rsplit("-", 1)[1]


def _only_run(tmp_path: Path) -> Path:
    runs = [p for p in (tmp_path / "results").iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


def _unchanged(before: cleanup.Baseline) -> None:
    # other tests' runs beside this one come and go with their own objects
    diff = before.changes()
    assert diff == [], "\n".join(diff)


def test_run_default_topology_and_a_second_run_meanwhile(accelerator, tmp_path):
    before = cleanup.Baseline.take()
    first = _start(tmp_path)
    _wait_for_measuring(first)
    # The first run shares the host (the suite's runs do); one that wants it alone is refused.
    second = _cli(tmp_path / "second", "run", timeout=120, alone=True)
    assert second.returncode == 4, second.stderr
    assert "in progress" in second.stderr and len(second.stderr.strip().splitlines()) == 1
    out, err = first.communicate(timeout=1200)
    assert first.returncode == 0, err[-3000:]
    run_dir = Path(out.strip().splitlines()[-1])
    assert run_dir.is_dir() and run_dir.parent == tmp_path / "results"
    run = json.loads((run_dir / "run.json").read_text())
    assert run["format_version"] == 2 and run["status"] == "complete"
    assert out.strip().splitlines()[-2] == str(run_dir / "report.html")
    assert (run_dir / "report.html").is_file()
    env = run["environment"]
    assert env["accelerator"] == accelerator.value
    for key in ("kernel", "cpu_model", "cpu_mhz", "versions"):
        assert env[key], key
    assert env["versions"]["qemu"] and env["versions"]["libvirt"]
    assert run["counts"]["boots"] == 2
    # a sample the noise guard set aside (host busy with other work) was measured again
    samples = [s for s in map(json.loads, (run_dir / "samples.jsonl").read_text().splitlines())
               if s["status"] != "noisy"]
    # Every single-host mode this host supports, each with a stream and an RR cell.
    from testbed import attachments
    modes = {a.value for a in attachments.supported_single_host()}
    assert {s["cell"]["attachment"] for s in samples} == modes
    assert len(samples) == 2 * len(modes)
    for s in samples:
        assert s["status"] == "ok", s["reason"]
        key = "throughput_mbps" if s["cell"]["profile"] == "tcp_stream" else "transactions_per_s"
        assert s["metrics"][key] > 0
    for s in samples:
        assert set(s["cell"]) >= {"attachment", "backend", "mtu", "connections", "profile"}
        assert (run_dir / s["raw"][0]).read_text().strip()
    # The run is indexed in the default SQLite store beside the results.
    from testbed.records import store
    with store.open(tmp_path / "results" / "index.sqlite") as st:
        assert [r.run_id for r in st.runs()] == [run_dir.name]
        # every line of samples.jsonl, the noisy ones measured again included
        lines = (run_dir / "samples.jsonl").read_text().splitlines()
        assert len(st.samples(run_dir.name)) == len(lines)
    assert _objects_of(_tag(run_dir)) == []
    _unchanged(before)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
def test_signal_tears_everything_down(accelerator, tmp_path, sig):
    before = cleanup.Baseline.take()
    proc = _start(tmp_path)
    lines = _wait_for_measuring(proc)
    time.sleep(2)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, "".join(lines) + err
    run_dir = _only_run(tmp_path)
    assert json.loads((run_dir / "run.json").read_text())["status"] == "interrupted"
    assert _objects_of(_tag(run_dir)) == []
    _unchanged(before)


@pytest.mark.alone      # a dead run's objects, which every run beside it would refuse to start by
def test_sigkill_leftovers_block_new_runs_until_cleanup(accelerator, tmp_path):
    before = cleanup.Baseline.take()
    proc = _start(tmp_path)
    _wait_for_measuring(proc)
    proc.kill()
    proc.communicate(timeout=60)
    run_dir = _only_run(tmp_path)
    tag = _tag(run_dir)
    left = _objects_of(tag)
    assert any(n.startswith(f"tb-{tag}-g") for n in left), left   # its domains survived
    # The record still says running: nothing was left to say otherwise.
    assert json.loads((run_dir / "run.json").read_text())["status"] == "running"
    refused = _cli(tmp_path / "again", "run", timeout=120)
    assert refused.returncode == 4, refused.stderr
    assert "testbed cleanup" in refused.stderr
    clean = _cli(tmp_path, "cleanup", timeout=300)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert _objects_of(tag) == []
    # cleanup also says in the record what happened to the run; its samples stay readable.
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "interrupted" and "died" in record["notes"][-1]
    _unchanged(before)
