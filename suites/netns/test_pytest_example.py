"""examples/pytest-per-mode copied into a team's repository and run there with
`--attach netns`: the namespace cells measure for real into the session's run record, the
guest tests are left out (no guest is probed or booted). The guest modes run in the vm tier."""
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

pytestmark = [pytest.mark.netns, pytest.mark.attach("netns")]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "pytest-per-mode"


def run_example(tmp_path: Path, attach: str, timeout: float) -> tuple[subprocess.CompletedProcess, dict]:
    """`pytest tests --attach ATTACH` in a folder of its own, as a team runs it; returns the
    session's outcome and its run.json."""
    team = tmp_path / "team"
    shutil.copytree(EXAMPLE, team / "tests", ignore=shutil.ignore_patterns("*.md"))
    env = {**os.environ, "PYTHONPATH": str(Path(testbed.__file__).parent.parent)}
    env.pop("TESTBED_RESULTS", None)
    p = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs", "tests",
                        "--attach", attach, "--results", str(team / "results")],
                       capture_output=True, text=True, timeout=timeout, cwd=team, env=env)
    m = re.search(r"measurements of this session: (\S+)", p.stdout)
    assert m, p.stdout[-3000:] + p.stderr[-2000:]
    return p, json.loads((Path(m.group(1)) / "run.json").read_text())


def test_pytest_example_measures_namespace_cells(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root: creates namespaces")
    if not shutil.which("netperf"):
        pytest.skip("netperf missing")
    p, run = run_example(tmp_path, "netns", 600)
    assert p.returncode == 0, p.stdout[-3000:]
    assert re.search(r"\b2 passed, 6 deselected\b", p.stdout), p.stdout[-1000:]
    assert run["status"] == "complete" and run["counts"] == {**run["counts"], "samples": 2, "failed": 0}
    assert {c["id"] for c in run["cells"]} == {"netns-veth-qemu-mtu1500-conn1-tcp_stream",
                                                "netns-veth-qemu-mtu1500-conn1-tcp_rr"}
    assert run["environment"]["accelerator"] == "none"       # no guest was probed for
    assert run["pytest"]["attach"] == "netns"
