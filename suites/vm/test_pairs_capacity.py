"""Pairs and capacity end to end under this machine's accelerator: `testbed run` with `pairs: [1, 2]` on
the bridge, one paced profile whose target (20 Gbit/s per pair) no TCG guest reaches, then
`testbed capacity RUN --profile ...` on the result. Asserts measured facts: per-pair and
aggregate samples, idle readings of 2 and 4 booted guests, the N = 2 cell saturated, the
capacity table with the measured points beside the fit, and memory naming the limit when
the planned guests are large."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.vm

TOPOLOGY = """\
name: pairs-capacity
accelerator: tcg
guests:
  - {name: g1, host: local, memory_mib: 1024, vcpus: 1}
  - {name: g2, host: local, memory_mib: 1024, vcpus: 1}
matrix:
  attachments: [bridge]
  backends: [qemu]
  pairs: [1, 2]
  profiles:
    - {name: paced, tool: iperf3, duration: 10, rate: 20gbit}
  repetitions: {min: 1, max: 3, rsd_target: 0.5}
"""

# Up to three samples a cell: four TCG guests on a two-core host can fail a sample honestly
# (its two pairs ended more than 10 % of the test apart, or a stalled receiver left more
# than the wire tolerance uncounted in its socket buffer). A failed sample is measured again
# as a user's run would be; the test then asserts on the cell's first ok sample.


# 10 s, not 3: iperf3's receiver stops counting at the end of the test, and what a slow TCG
# receiver still holds in its socket buffer then (1-3 MB measured here) crossed the wire
# uncounted; over 3 s that is 5-6 % of the payload and the wire cross-check (3 %) fails the
# sample, over 10 s it is within it.


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TESTBED_RESULTS": str(tmp_path / "results"), "TESTBED_IDLE_WINDOW_S": "2"}
    return subprocess.run([sys.executable, "-m", "testbed.cli", *args], capture_output=True, text=True,
                          timeout=1800, env=env)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("pairs")
    topo = tmp / "pairs.yaml"
    topo.write_text(TOPOLOGY)
    res = _cli(tmp, "run", str(topo))
    runs = [p for p in (tmp / "results").iterdir() if p.is_dir()] if (tmp / "results").is_dir() else []
    assert len(runs) == 1, res.stderr
    return runs[0]


def _samples(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]


def _first_ok(samples: list[dict]) -> dict[int, dict]:
    """The first ok sample of each N (or, where none is ok, its first sample, so that the
    assertion names the reason); every failed sample carries its reason."""
    by_n: dict[int, list[dict]] = {}
    for s in samples:
        by_n.setdefault(s["cell"].get("pairs", 1), []).append(s)
        if s["status"] != "ok":
            assert s["reason"], s
    return {n: next((s for s in ss if s["status"] == "ok"), ss[0]) for n, ss in by_n.items()}


def test_pairs_give_per_pair_and_aggregate_samples_and_n2_is_saturated(run_dir):
    by_n = _first_ok(_samples(run_dir))
    assert set(by_n) == {1, 2}
    two = by_n[2]
    assert two["status"] == "ok", two["reason"]
    prs = two["extra"]["pairs"]
    assert len(prs) == 2
    assert all(p["throughput_mbps"] > 0 and p["cpu_cores"] > 0 for p in prs), prs
    # the aggregate is the sum over the pairs; each pair's QEMU cores lie within the host's busy
    assert two["metrics"]["throughput_mbps"] == pytest.approx(sum(p["throughput_mbps"] for p in prs), rel=1e-6)
    assert sum(p["cpu_cores"] for p in prs) <= two["cpu"]["host"]["busy"] * 1.01 + 0.05
    # 20 Gbit/s per pair is out of a TCG guest's reach: every pair short, the cell saturated
    assert all(p["target"] == 20000.0 and p["short"] for p in prs) and two["extra"]["saturated"]
    assert two["cell"]["rate"] == "20gbit" and two["cell"]["id"].endswith("-p2")
    assert two["extra"]["start_skew_s"] < 2.0
    one = by_n[1]
    if one["status"] == "ok":
        assert len(one["extra"]["pairs"]) == 1 and one["extra"]["pairs"][0]["short"]


def test_idle_readings_of_one_and_all_pairs(run_dir):
    run = json.loads((run_dir / "run.json").read_text())
    idle = {r["guests"]: r for r in run["idle"]}
    assert set(idle) == {2, 4}
    for n, r in idle.items():
        assert len(r["qemu_rss_mib"]) == n and all(v > 50 for v in r["qemu_rss_mib"].values())
        assert r["window_s"] >= 2 and r["host_memory_used_mib"] > 0
        # second source: the guests' own QEMU cores over the window fit in the host's busy cores
        assert sum(r["qemu_cores"].values()) <= r["host_busy_cores"] * 1.01 + 0.05
    # the clones were restored from the first pair's snapshots
    guests = run["guests"]
    assert {"g1-p2", "g2-p2"} <= set(guests)
    assert all(guests[g]["boot"] == "restored" for g in ("g1-p2", "g2-p2")), guests


def test_capacity_table_shows_measured_points_beside_the_fit_and_memory_can_bind(run_dir, tmp_path):
    res = _cli(tmp_path, "capacity", str(run_dir), "--profile", "stream:50mbit")
    out = res.stdout + res.stderr
    assert "source" in out and "fit" in out and "residual" in out, out
    assert "idle" in out and "bridge-qemu-mtu1500-conn1-paced-p2" in out, out
    assert re.search(r"saturated at N=[0-9,]*\b2\b", out), out
    big = _cli(tmp_path, "capacity", str(run_dir), "--profile", "stream:50mbit", "--host-cores", "64",
               "--memory-mib", "8192")
    row = next(line for line in big.stdout.splitlines()
               if line.split()[:1] == ["bridge/qemu"] and line.split()[1].isdigit())
    assert row.split()[2] == "memory", big.stdout
