"""The toy mode `veth-cable` (one module, testbed/attachments/veth_cable.py, plus one registry
line) end to end: `testbed run` on a topology that names it, two guests restored from their
snapshots, one short cell. Asserts what was measured and that nothing of it is left."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from testbed import attachments
from testbed.admin import cleanup
from testbed.topology.model import Attachment

pytestmark = [pytest.mark.vm, pytest.mark.attach("veth-cable")]

TOPOLOGY = """\
name: veth-cable
guests: [{name: g1}, {name: g2}]
matrix:
  attachments: [veth-cable]
  mtus: [1500]
  profiles:
    - {name: tcp_stream, tool: netperf, pattern: stream, message_size: 16384, duration: 3}
  repetitions: {warmup: 0, min: 1, max: 1}
"""


def test_veth_cable_runs_end_to_end(tmp_path, accelerator):
    why = attachments.unavailable(Attachment("veth-cable"))
    if why:
        pytest.skip(f"attachment veth-cable unavailable: {why}")
    topo = tmp_path / "veth-cable.yaml"
    topo.write_text(TOPOLOGY)
    deadline = time.monotonic() + 1200
    while True:
        p = subprocess.run([sys.executable, "-m", "testbed.cli", "run", str(topo)], capture_output=True,
                           text=True, timeout=1500, env={**os.environ, "TESTBED_RESULTS": str(tmp_path / "res")})
        # Another run holding this host (a shared machine) is waited for, not a failure.
        if p.returncode != 4 or "in progress" not in p.stderr or time.monotonic() > deadline:
            break
        cleanup.wait_host_free(deadline - time.monotonic())
    assert p.returncode == 0, p.stderr[-3000:]
    run_dir = tmp_path / "res" / p.stdout.strip().splitlines()[-1].rsplit("/", 1)[1]
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] == "complete", run.get("status")
    [s] = [json.loads(x) for x in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert s["status"] == "ok", s["reason"]
    assert s["cell"]["attachment"] == "veth-cable" and s["extra"]["datapath"] == "veth-cable"
    tput = s["metrics"]["throughput_mbps"]
    assert tput > 0
    # The wire cross-check on the receiving guest's tap, at the far end of the cable: the
    # ratio of bytes on the device to bytes netperf counted is the one headers explain.
    c = s["crosscheck"]
    assert c["verdict"] == "ok" and c["ratio"] > 0, c
    # below it by no more than 3 % and what TCP's retransmissions explain
    room = 1 - c["explained_extra_bytes"] / c["wire_bytes"]
    assert c["expected_ratio"] * room * 0.97 <= c["ratio"] <= c["expected_ratio"] * 1.03, c
    # Both taps carried the stream: it crossed the cable rather than some other path.
    dev = s["extra"]["device_mbps"]
    assert len(dev) == 2 and all(0.6 * tput < max(d.values()) < 1.2 * tput for d in dev.values()), dev
    tag = run_dir.name.rsplit("-", 1)[1]
    found = cleanup.find(include_live=True)
    assert [n for g in found.__dict__.values() for n in g if n.startswith(f"tb-{tag}")] == []
