"""examples/capacity/capacity.sh end to end without VMs: it measures a density topology of
namespace pairs (1, 2 and 4 pairs at once, each paced at 2 Gbit/s: the same `pairs` axis and
paced profile as the example's guest topology) with `testbed run`, then writes the capacity
table, its JSON and the report with the capacity plot. A second call plans from that run for
another host (CAPACITY_ARGS), where memory is the limit."""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import testbed
from testbed.admin import cleanup

pytestmark = [pytest.mark.netns, pytest.mark.attach("netns")]

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "capacity" / "capacity.sh"
TOPOLOGY = """\
name: density-netns
matrix:
  attachments: [netns-veth]
  pairs: [1, 2, 4]
  profiles:
    - {name: paced, tool: iperf3, duration: 2, rate: 2gbit}
  repetitions: {warmup: 0, min: 2, max: 2}
"""


def _script(tmp: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": str(Path(testbed.__file__).parent.parent),
            "TESTBED": f"{sys.executable} -m testbed", "TESTBED_RESULTS": str(tmp / "results"),
            "CAPACITY_TOPOLOGY": str(tmp / "density.yaml"), "CAPACITY_OUT": str(tmp / "out"), **env}
    deadline = time.monotonic() + 300
    while True:
        p = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=900,
                           cwd=tmp, env=full)
        if p.returncode != 4 or "in progress" not in p.stderr:
            return p
        # another session's `testbed run` holds the host: again as soon as it ends
        if not cleanup.wait_host_free(deadline - time.monotonic()):
            pytest.skip("another run held this host for 5 minutes")


def test_capacity_script_from_a_density_run_to_the_table_and_plot(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root: creates namespaces")
    for tool in ("iperf3", "ping"):
        if not shutil.which(tool):
            pytest.skip(f"{tool} missing")
    (tmp_path / "density.yaml").write_text(TOPOLOGY)
    p = _script(tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    [run] = [d for d in (tmp_path / "results").iterdir() if (d / "run.json").is_file()]
    out = tmp_path / "out"

    plan = json.loads((out / "capacity.json").read_text())
    assert plan["run_id"] == run.name and plan["demand_text"] == "stream:2gbit" and plan["per_vm"] == 2.0
    [mode] = plan["modes"]
    assert mode["mode"] == "netns-veth/qemu"
    points = mode["points"]
    assert sorted({pt["pairs"] for pt in points}) == [1, 2, 4]
    for pt in points:
        # the aggregate is what the pairs carried, each pair paced at the 2 Gbit/s target
        assert len(pt["pair_results"]) == pt["pairs"]
        assert pt["aggregate"] == pytest.approx(sum(r["rate"] for r in pt["pair_results"]), rel=1e-6)
        assert all(r["target"] == 2.0 and 0 < r["achieved"] <= 2.2 for r in pt["pair_results"]), pt
        assert 0 < pt["host_cores"] <= os.cpu_count() + 0.05
    # The limits follow from the stated host and VM: memory and vCPUs by arithmetic alone.
    host = plan["host"]
    assert mode["by"]["memory"] == math.floor((host["memory_mib"] - host["memory_reserve_mib"])
                                              / mode["memory_per_vm_mib"])
    assert mode["by"]["vcpu"] == host["threads"] == os.cpu_count()
    assert mode["vms"] == min(mode["by"].values())
    assert set(mode["limit"].split("+")) == {k for k, v in mode["by"].items() if v == mode["vms"]}

    table = (out / "capacity.txt").read_text()
    assert p.stdout == table
    row = next(line.split() for line in table.splitlines()
               if line.startswith("netns-veth/qemu ") and line.split()[1].isdigit())
    assert row[1:3] == [str(mode["vms"]), mode["limit"]], table
    html = (out / "capacity.html").read_text()
    assert "Capacity at stream:2gbit per VM" in html
    # the interactive plot of rate and CPU against N, under its own heading
    assert '<h2>Capacity, netns-veth/qemu' in html and 'class="plotly-graph-div"' in html

    # The same run planned for a bigger host with 8 GiB VMs: memory runs out first.
    again = _script(tmp_path, str(run), CAPACITY_ARGS="--host-cores 64 --memory-mib 8192")
    assert again.returncode == 0, again.stderr[-3000:]
    big = json.loads((out / "capacity.json").read_text())
    [m] = big["modes"]
    assert big["host"]["cores"] == 64 and m["memory_per_vm_mib"] == 8192
    assert m["limit"] == "memory" and m["vms"] == m["by"]["memory"] < m["by"]["cpu"], m["by"]
    assert "measuring" not in again.stderr          # the run was given: nothing measured again
    assert len([d for d in (tmp_path / "results").iterdir() if d.is_dir()]) == 1
