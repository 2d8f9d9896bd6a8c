"""examples/pytest-per-mode copied into a team's repository and run there with
`--attach bridge`: a booted guest pair (restored from snapshots), the bridge cells
measured for real into the session's run record with the accelerator it probed.
About 3 minutes under TCG here."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import testbed

pytestmark = [pytest.mark.vm, pytest.mark.attach("bridge")]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "pytest-per-mode"


def test_pytest_example_measures_bridge_cells(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root: boots guests")
    team = tmp_path / "team"
    shutil.copytree(EXAMPLE, team / "tests", ignore=shutil.ignore_patterns("*.md"))
    env = {**os.environ, "PYTHONPATH": str(Path(testbed.__file__).parent.parent)}
    env.pop("TESTBED_RESULTS", None)
    p = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs", "tests",
                        "--attach", "bridge", "--results", str(team / "results")],
                       capture_output=True, text=True, timeout=1800, cwd=team, env=env)
    if re.search(r"SKIPPED.*(no accelerator|unavailable)", p.stdout):
        pytest.skip(p.stdout.splitlines()[-1])
    assert p.returncode == 0, p.stdout[-3000:]
    assert re.search(r"\b2 passed, 6 deselected\b", p.stdout), p.stdout[-1000:]
    m = re.search(r"measurements of this session: (\S+)", p.stdout)
    assert m, p.stdout[-2000:]
    run = json.loads((Path(m.group(1)) / "run.json").read_text())
    assert run["status"] == "complete" and run["counts"]["samples"] == 2 and run["counts"]["failed"] == 0
    assert {c["id"] for c in run["cells"]} == {"bridge-qemu-mtu1500-conn1-tcp_stream",
                                                "bridge-qemu-mtu1500-conn1-tcp_rr"}
    assert run["environment"]["accelerator"] in ("kvm", "tcg")
    assert run["pytest"]["attach"] == "bridge"
