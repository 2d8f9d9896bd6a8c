"""Guests lost in the middle of a `testbed run`: g1's domain destroyed from outside (an
operator's `virsh destroy`) during the first cell, and g1's kernel made to panic for real
(`echo c > /proc/sysrq-trigger` through the guest agent) during the second. Each time the
samples it was in fail with the cause named ("guest g1 stopped from outside", "guest g1
crashed: kernel panic; last console lines: ..."), the guest is brought back (restored from
its snapshot where one exists), and the next cells measure normally. Nothing is left."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from testbed.admin import cleanup
from testbed.records import results

pytestmark = pytest.mark.vm

TOPOLOGY = """\
name: guestloss
guests:
  - {name: g1}
  - {name: g2}
matrix:
  attachments: [bridge]
  mtus: [1500, 9000, 4000, 2000]
  connections: [1]
  profiles:
    - {name: tcp_stream, pattern: stream, message_size: 16384, duration: 3}
  repetitions: {warmup: 0, min: 2, max: 2, rsd_target: 0.5}
noise: {action: keep}
"""


def _wait_line(p: subprocess.Popen, prefix: str, lines: list[str], timeout: float = 1500) -> None:
    deadline = time.monotonic() + timeout
    for line in p.stderr:
        lines.append(line)
        if line.startswith(prefix):
            return
        assert time.monotonic() < deadline, "".join(lines)
    raise AssertionError(f"run ended before {prefix!r}: " + "".join(lines[-30:]))


def test_a_destroyed_and_a_panicked_guest_fail_their_samples_and_are_brought_back(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root: libvirt domains")
    topo = tmp_path / "t.yaml"
    topo.write_text(TOPOLOGY)
    env = {**os.environ, "TESTBED_RESULTS": str(tmp_path / "results")}
    lines: list[str] = []
    deadline = time.monotonic() + 1800
    while True:
        p = subprocess.Popen([sys.executable, "-m", "testbed.cli", "run", str(topo)], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        first = p.stderr.readline()
        if "in progress on this host" in first and time.monotonic() < deadline:
            p.wait()
            cleanup.wait_host_free(deadline - time.monotonic())     # another session's run holds the host
            continue
        lines.append(first)
        break
    try:
        _wait_line(p, "[1/", lines)
        (run_dir,) = [d for d in (tmp_path / "results").iterdir() if d.is_dir()]
        dom = f"tb-{run_dir.name.rsplit('-', 1)[1]}-g1"
        time.sleep(2)                       # inside the first sample's stream
        subprocess.run(["virsh", "-c", "qemu:///system", "destroy", dom], check=True, capture_output=True)
        _wait_line(p, "[2/", lines)
        time.sleep(2)
        cmd = {"execute": "guest-exec", "arguments": {"path": "/bin/sh",
                                                       "arg": ["-c", "echo c > /proc/sysrq-trigger"]}}
        subprocess.run(["virsh", "-c", "qemu:///system", "qemu-agent-command", dom, json.dumps(cmd)],
                       check=False, capture_output=True, timeout=60)
        out, err = p.communicate(timeout=1800)
        lines.append(err)
    finally:
        if p.poll() is None:
            p.terminate()
            p.wait(300)
    text = "".join(lines)
    assert p.returncode == 1, text[-4000:]
    rec = results.read_run(run_dir)
    ids = [c.cell.id for c in rec.cells]
    assert len(ids) == 4, text[-3000:]
    by_cell: dict[str, list] = {}
    for s in rec.samples:
        by_cell.setdefault(s.cell.id, []).append(s)
    first = [s.reason for s in by_cell[ids[0]] if s.status == "failed"]
    assert first and "guest g1 stopped from outside" in first[0], [s.reason for s in by_cell[ids[0]]]
    second = [s.reason for s in by_cell[ids[1]] if s.status == "failed"]
    assert second and "guest g1 crashed: kernel panic" in second[0] and "last console lines" in second[0], \
        [s.reason for s in by_cell[ids[1]]]
    for c in ids[2:]:
        assert [s.status for s in by_cell[c]] == ["ok", "ok"], [(s.status, s.reason) for s in by_cell[c]]
    run = rec.run
    assert [x["guest"] for x in run["guest_losses"]] == ["g1", "g1"]
    assert run["counts"]["boots"] == 4
    assert "bringing guest g1 back" in text
    tag = run_dir.name.rsplit("-", 1)[1]
    found = cleanup.find(include_live=True)
    assert not [n for group in found.__dict__.values() for n in group if n.startswith(f"tb-{tag}")]
