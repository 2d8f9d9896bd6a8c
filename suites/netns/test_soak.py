"""`testbed bench soak` on a few namespace cells: it measures them and prints the harness's
descriptors, threads, child processes and RSS at the start and the end with the growth per
hundred cells (the figures are printed, never judged by a timed test)."""
from __future__ import annotations

import os
import shutil

import pytest

from testbed.bench import soak as bench_soak
from testbed._suite_plugin import run_cli

pytestmark = [pytest.mark.netns, pytest.mark.attach("netns")]


def test_growth_is_per_hundred_cells_after_the_warm_up():
    a = bench_soak.Reading(10, 20, 3, 1, 100 * 2**20, 0.0, 1000)
    b = bench_soak.Reading(210, 22, 3, 1, 110 * 2**20, 0.0, 3000)
    assert bench_soak.growth_per_100(a, b) == {"fds": 1.0, "threads": 0.0, "children": 0.0,
                                               "rss_bytes": 5 * 2**20, "run_json_bytes": 1000}


def test_soak_prints_start_end_and_growth(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root: creates namespaces")
    for tool in ("netperf", "netserver"):
        if not shutil.which(tool):
            pytest.skip(f"{tool} missing")
    r = run_cli(["bench", "soak", "--cells", "12"], timeout=600)
    if r.returncode != 0 and "in progress on this host" in r.stderr:
        pytest.skip("another run holds the host lock")
    assert r.returncode == 0, r.stderr[-2000:] + r.stdout[-2000:]
    lines = r.stdout.splitlines()
    assert any(x.startswith("soak: 12 namespace cells") for x in lines), r.stdout
    for label in ("file descriptors", "threads", "child processes", "RSS (MiB)", "run.json (MiB)"):
        (row,) = [x for x in lines if x.startswith(label)]
        start, end, per100 = (float(v) for v in row[len(label):].split())
        assert end >= 0 and (start > 0 or label in ("child processes", "run.json (MiB)"))
    assert "per 100 cells" in r.stdout
