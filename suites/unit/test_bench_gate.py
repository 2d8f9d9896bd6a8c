"""`testbed bench gate`: synthetic nights in the run format, replayed through compare (seeded)."""
from __future__ import annotations

import numpy as np
import pytest

from testbed import bench_gate, compare

pytestmark = pytest.mark.unit


def test_night_is_a_run_record_compare_reads(tmp_path):
    tpl = bench_gate.template(10, tmp_path)
    rng = np.random.default_rng(0)
    base = bench_gate.night(tpl, "base", rng, noise=0.03, reps="5")
    new = bench_gate.night(tpl, "new", rng, noise=0.03, reps="5",
                           scale={tpl.samples[0].cell.id: 0.6})
    assert len(base.samples) == 50
    rc = compare.compare_runs(base, new)
    assert rc.exit_status == 1
    assert [c.cell_id for c in rc.failing] == [tpl.samples[0].cell.id]


def test_simulate_counts_detections_and_is_seeded():
    sc = bench_gate.Scenario("drop", drop=0.3, dropped=3)
    a = bench_gate.simulate(sc, nights=2, cells=20, seed=3)
    b = bench_gate.simulate(sc, nights=2, cells=20, seed=3)
    assert a.dropped_total == 6 and a.detected == 6
    assert (a.exit_counts, a.false_cells) == (b.exit_counts, b.false_cells)
    assert "detected" in bench_gate.format_outcomes([a])
