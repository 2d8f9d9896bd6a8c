"""`testbed bench gate`: synthetic nights in the run format, replayed through compare (seeded)."""
from __future__ import annotations

import numpy as np
import pytest

from testbed.analysis import compare
from testbed.bench import gate as bench_gate

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


def test_every_noise_kind_draws_positive_relative_noise_of_its_size():
    rng = np.random.default_rng(0)
    for kind in bench_gate.NOISES:
        x = bench_gate.noise(rng, kind, 0.03, 20000)
        assert x.min() > 0 and abs(np.median(x) - 1) < 0.02 and 0.015 < np.std(x) < 0.06, kind
    with pytest.raises(ValueError):
        bench_gate.noise(rng, "uniform", 0.03, 3)


def test_rr_nights_carry_integer_percentiles_and_a_shared_factor(tmp_path):
    tpl = bench_gate.template(4, tmp_path, rr=2)
    rng = np.random.default_rng(0)
    n = bench_gate.night(tpl, "n", rng, noise=0.0, reps="5", factor=0.9)
    rr = [s for s in n.samples if s.cell.profile == "tcp_rr"]
    assert len(rr) == 10 and all(float(s.metrics["latency_p99_us"]).is_integer() for s in rr)
    st = [s.metrics["throughput_mbps"] for s in n.samples if s.cell.profile == "tcp_stream"]
    assert st == pytest.approx([bench_gate.MBPS * 0.9] * 10)


def test_one_transient_failure_among_200_unchanged_cells_does_not_fail_the_gate(tmp_path):
    tpl = bench_gate.template(200, tmp_path)
    for seed in range(3):
        rng = np.random.default_rng(seed)
        base = bench_gate.night(tpl, "base", rng, noise=0.03, reps="5")
        new = bench_gate.night(tpl, "new", rng, noise=0.03, reps="6")
        # one failed sample in one cell (its other 5 ok): a transient, not a broken cell
        victim = new.samples[7]
        samples = list(new.samples)
        samples[7] = victim.__class__(**{**victim.__dict__, "status": "failed",
                                         "reason": "transient", "metrics": {}})
        new = new.__class__(**{**new.__dict__, "samples": tuple(samples)})
        rc = compare.compare_runs(base, new)
        assert rc.exit_status != 1, [(c.cell_id, c.verdict, c.note) for c in rc.failing]
        (hit,) = [c for c in rc.cells if c.new_failed]
        assert hit.failure_p is not None and hit.verdict is not compare.CellVerdict.BROKEN
        assert "not credibly" in compare.render_text(rc)


def test_a_cell_failing_nine_of_ten_samples_is_broken_among_200(tmp_path):
    tpl = bench_gate.template(200, tmp_path)
    rng = np.random.default_rng(1)
    base = bench_gate.night(tpl, "base", rng, noise=0.03, reps="10")
    new = bench_gate.night(tpl, "new", rng, noise=0.03, reps="10")
    cid = tpl.samples[0].cell.id
    samples = [s if s.cell.id != cid or s.rep < 1 else
               s.__class__(**{**s.__dict__, "status": "failed", "reason": "x", "metrics": {}})
               for s in new.samples]
    new = new.__class__(**{**new.__dict__, "samples": tuple(samples)})
    rc = compare.compare_runs(base, new)
    assert [c.cell_id for c in rc.failing] == [cid]
    assert rc.failing[0].verdict is compare.CellVerdict.BROKEN


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_ten_percent_drop_at_ten_percent_noise_is_never_unchanged(seed):
    """Lognormal 10 % noise, n=5 a side, 100 cells all 10 % down: the point estimate often
    lands within 5 %, the interval never does."""
    from testbed.analysis import stats
    rng = np.random.default_rng(seed)
    comps = [stats.compare(2000 * rng.lognormal(0, 0.1, 5), 1800 * rng.lognormal(0, 0.1, 5),
                           higher_is_better=True) for _ in range(100)]
    mod, _ = stats.moderate(comps)
    for family in (comps, stats.adjust(mod)):
        assert not [c for c in family if c.verdict is stats.Verdict.UNCHANGED]
    assert all(c.change_ci is not None and c.mdc is not None for c in mod)


def test_an_unchanged_verdict_shows_its_interval_and_mdc(tmp_path):
    tpl = bench_gate.template(3, tmp_path)
    rng = np.random.default_rng(0)
    rc = compare.compare_runs(bench_gate.night(tpl, "b", rng, noise=0.005, reps="5"),
                              bench_gate.night(tpl, "n", rng, noise=0.005, reps="5"))
    assert rc.exit_status == 0
    text = compare.render_text(rc)
    assert "interval" in text and "mdc" in text and "]%" in text


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_integer_p99_raised_20pct_in_5_plus_5_of_100_cells_is_regressed(seed):
    """Integer microseconds with ties (netperf's p99): the cell that rose by 20 % is found,
    credibly beyond the threshold."""
    from testbed.analysis import stats
    rng = np.random.default_rng(seed)
    comps = []
    for k in range(100):
        up = 1.2 if k == 0 else 1.0
        b = np.round(rng.normal(100, 3, 5))
        n = np.round(rng.normal(100 * up, 3 * up, 5))
        comps.append(stats.compare(b, n, higher_is_better=False))
    assert stats.quantum_of(np.round(rng.normal(100, 3, 5))) == 1.0
    mod, _ = stats.moderate(comps)
    out = stats.adjust(mod)
    assert out[0].verdict is stats.Verdict.REGRESSED, out[0]
    assert sum(c.verdict is stats.Verdict.REGRESSED for c in out) == 1


def test_bootstrap_is_studentized_and_floored():
    from testbed.analysis import stats
    c = stats.compare([1.0, 2, 3, 4, 5], [1.5, 2.5, 3.5, 4.5, 5.5], higher_is_better=True,
                      test="bootstrap")
    assert c.p_value > 0.3
    b = np.array([100, 101, 99, 100.5, 99.5])
    p = stats.bootstrap_t_p(b, b * 1.3)
    assert p >= 1 / stats.distinct_resamples(5, 5)


def test_history_finds_a_lasting_five_percent_step_within_a_week_and_rarely_alarms():
    """A lasting -5 % step at 2.4 % nightly noise: exit 1 within 7 nights in at least 17 of
    20 seeded sequences (the bench: 46 of 50); unchanged 30-night series at 10 % lognormal
    sample noise with a 2 % drift, replayed night by night, alarm in at most 1 of 40 (the
    bench: 1 of 200)."""
    h = bench_gate.history_sim(sequences=20, seed=0, heavy_sequences=40)
    assert h.step_found >= 17 and h.heavy_alarms <= 1 and h.unchanged_alarms <= 1, h


def test_the_history_targets_say_not_met_past_their_bars():
    """The bench prints the history bars as the gate's: met at 45 of 50 steps and 2 of 200
    alarms, NOT met one below and one above."""
    def h(found: int, alarms: int):
        return bench_gate.HistoryOutcome(50, found, 0, alarms, 200, 0.05, 7)
    assert [x.endswith(" met") and "NOT" not in x for x in bench_gate.history_targets(h(45, 2))] == [True, True]
    assert [x.endswith("NOT met") for x in bench_gate.history_targets(h(44, 3))] == [True, True]


def test_history_judges_a_hosts_cells_after_the_drift_they_share():
    """Hosts of 8 cells a night on a lasting shared drift (AR(1), 2 %): unchanged cells at
    10 % lognormal samples alarm in at most 2 of 48 series and the shared shift in at most
    2 of 6 hosts; one cell's lasting -5 % step is found within 7 nights on at least 5 of 6,
    and every cell's (the whole build) by the shared shift on at least 5 of 6 (the bench,
    seeds 0 and 1: 3 of 200 series, 6 of 25 shifts, 23 of 25 steps, 24 and 22 of 25 builds)."""
    h = bench_gate.history_sim(sequences=0, seed=0, heavy_sequences=0, host_sequences=6)
    assert h.host_step_found >= 5 and h.host_build_found >= 5, h
    assert h.host_alarms <= 2 and h.host_shared_alarms <= 2, h


def test_variants_are_measured_a_b_b_a():
    from testbed.measure import variants
    order = [x for r in range(4) for x in variants.round_order(["A", "B"], r)]
    assert "".join(order) == "ABBAABBA"


@pytest.mark.parametrize("argv", [["--rounds", "nan"], ["--rounds", "inf"], ["--rounds", "-3"],
                                  ["--rounds", "\u0661\u0662"], ["--seed", "\uff11\uff12"], ["--cells", "5"]])
def test_bench_gate_refuses_bad_numbers_in_one_line(argv):
    import subprocess
    import sys
    p = subprocess.run([sys.executable, "-m", "testbed", "bench", "gate", *argv], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2 and p.stdout == "", (p.stdout, p.stderr)
    assert len(p.stderr.strip().splitlines()) == 1 and argv[0] in p.stderr and "Traceback" not in p.stderr
