"""The sequential gate (`testbed run --decide-against`): alpha spending, which cells are
measured again, the final look, and the design replayed on synthetic nights (seeded)."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from testbed.analysis import compare, sequential, stats
from testbed.bench import gate as bench_gate
from testbed.bench import gate_seq

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("kind", sequential.SPENDING)
def test_spending_spends_all_of_q_at_the_end_and_less_before(kind):
    assert sequential.spent(0.05, 1.0, kind) == pytest.approx(0.05)
    vals = [sequential.spent(0.05, t, kind) for t in (0.2, 0.5, 0.75, 1.0)]
    assert vals == sorted(vals) and vals[0] > 0


def test_obrien_fleming_spends_less_early_than_pocock():
    assert sequential.spent(0.05, 0.5) < sequential.spent(0.05, 0.5, "pocock")
    # Lan-DeMets O'Brien-Fleming type at t = 0.5: 2 - 2 Phi(1.96 / sqrt(0.5))
    assert sequential.spent(0.05, 0.5) == pytest.approx(0.00558, abs=1e-4)


def test_information_fraction_of_a_fixed_base():
    # BASE 5, NEW 5 then 10: variance 1/5 + 1/5 then 1/5 + 1/10
    assert sequential.information_fraction(5, 5, 10) == pytest.approx(0.75)
    d = sequential.Design()
    t, q1, q2 = d.levels(5, 5)
    assert t == pytest.approx(0.75) and q1 + q2 == pytest.approx(d.q) and 0 < q1 < q2


def test_design_refuses_bad_settings():
    with pytest.raises(ValueError, match="extra"):
        sequential.Design(extra=0)
    with pytest.raises(ValueError, match="margin"):
        sequential.Design(threshold=0.05, margin=0.03)
    with pytest.raises(ValueError, match="spending"):
        sequential.Design(spending="haybittle")


def _with_failure(run, index):
    samples = list(run.samples)
    s = samples[index]
    samples[index] = dataclasses.replace(s, status="failed", reason="transient", metrics={})
    return dataclasses.replace(run, samples=tuple(samples))


def test_plan_measures_undecided_and_transient_cells_within_the_budget(tmp_path):
    tpl = bench_gate.template(40, tmp_path)
    rng = np.random.default_rng(4)
    base = bench_gate.night(tpl, "base", rng, noise=0.03, reps="5")
    new = _with_failure(bench_gate.night(tpl, "new", rng, noise=0.03, reps="5"), 0)
    base = _with_failure(base, 5 * 39)          # BASE's last cell: 4 ok samples
    design = sequential.Design()
    rc1, *_ = sequential.look1(base, new, design)
    plan, skipped = sequential.plan_remeasure(rc1, design)
    by = {r.cell_id: r for r in plan}
    first, last = tpl.samples[0].cell.id, tpl.samples[-1].cell.id
    # NEW's transient failure: measured again, with the sample it lacks on top
    assert by[first].extra == design.extra + 1
    # BASE short of samples: more NEW samples cannot help, and it is said
    assert last not in by and any(last in s and "BASE has 4" in s for s in skipped)
    undecided = {c.cell_id for c in rc1.cells if c.verdict.undecided} - {last}
    assert undecided <= set(by)
    tight = sequential.plan_remeasure(rc1, dataclasses.replace(design, budget=design.extra * 2))
    assert sum(r.extra for r in tight[0]) <= design.extra * 2
    assert any("over the budget" in s for s in tight[1])


def test_final_look_calls_unchanged_within_the_margin_only_on_a_tight_interval():
    def cmp(ci):
        s = stats.summarize([1.0, 1.1, 0.9, 1.0, 1.05])
        return stats.Comparison(base=s, new=s, delta=-0.03, delta_rel=-0.03, delta_pct=-3.0,
                                p_value=0.2, test="welch", verdict=stats.Verdict.INCONCLUSIVE,
                                higher_is_better=True, threshold=0.05, alpha=0.05, change_ci=ci)
    assert sequential.widened(cmp((-0.06, 0.0)), alpha=0.05) == pytest.approx((-0.06, 0.0))
    lo, hi = sequential.widened(cmp((-0.06, 0.0)))
    assert lo < -0.06 and hi > 0.0 and (lo + hi) / 2 == pytest.approx(-0.03)
    assert sequential._margin_verdict(cmp((-0.06, 0.0)), 0.10).verdict is stats.Verdict.UNCHANGED
    assert sequential._margin_verdict(cmp((-0.09, 0.03)), 0.10).verdict is stats.Verdict.INCONCLUSIVE


def test_a_transient_failure_among_200_unchanged_cells_is_measured_again_not_red(tmp_path):
    tpl = bench_gate.template(200, tmp_path)
    tpl_samples = {s.cell.id: s for s in tpl.samples}
    rng = np.random.default_rng(11)
    base = bench_gate.night(tpl, "base", rng, noise=0.03, reps="5")
    new = _with_failure(bench_gate.night(tpl, "new", rng, noise=0.03, reps="5"), 12)
    design = sequential.Design()
    rc1, *_ = sequential.look1(base, new, design)
    plan, _ = sequential.plan_remeasure(rc1, design)
    assert tpl.samples[2].cell.id in {r.cell_id for r in plan}
    sc = gate_seq.SeqScenario("x", 1)
    combined = gate_seq._more(tpl_samples, new, plan, rng, sc, {})
    sq = sequential.decide(base, new, combined, design, remeasured=plan)
    assert sq.exit_status == 0, [(c.cell_id, c.verdict.value) for c in sq.final.cells if c.verdict.value != "unchanged"]
    text = sequential.render_text(sq)
    assert "look 1" in text and "again:" in text and "q2" in text
    # every verdict line shows the change, its interval and the mdc
    assert "interval" in text and "mdc" in text and "]%" in text


def test_the_design_replayed_meets_its_targets_at_small_size(tmp_path):
    tpl = bench_gate.template(100, tmp_path)
    design = sequential.Design()
    flat = gate_seq.simulate(gate_seq.SeqScenario("unchanged n=5", 4), tpl, design, seed=1)
    assert flat.exit_counts == {0: 4} and flat.false_regression_nights == 0
    assert flat.look1_exit5 == 4 and flat.remeasured_cells > 0     # look 1 alone: undecided
    drop = gate_seq.simulate(gate_seq.SeqScenario("10% drop in 20 cells", 2, drop=0.10, dropped=10),
                             tpl, design, seed=1)
    assert drop.detected / drop.dropped_total >= 0.95 and drop.dropped_unchanged == 0
    again = gate_seq.simulate(gate_seq.SeqScenario("unchanged n=5", 4), tpl, design, seed=1)
    assert again.exit_counts == flat.exit_counts and again.extra_samples == flat.extra_samples
    text = gate_seq.format_outcomes([flat, drop])
    assert "look1 exit5" in text and "raw p<.05" in text
    assert all("met" in t for t in gate_seq.targets([flat, drop]))


def test_the_variance_of_an_adaptive_run_comes_from_the_samples_the_rule_always_takes(tmp_path):
    tpl = bench_gate.template(2, tmp_path)
    rng = np.random.default_rng(0)
    assert compare.spread_from(bench_gate.night(tpl, "a", rng, noise=0.03, reps="gate")) == 5
    assert compare.spread_from(bench_gate.night(tpl, "b", rng, noise=0.03, reps="5")) is None
    assert compare.spread_from(bench_gate.night(tpl, "c", rng, noise=0.03, reps="gate", declare=False)) is None
    b = np.array([100.0, 101, 99, 100, 100, 130, 70])
    n = np.array([100.0, 100, 100, 101, 99, 100, 100])
    full, first = stats.log_spread(b, n), stats.log_spread(b, n, 5)
    assert first.df == 8 and full.df == 12 and first.s2 < full.s2
    assert first.diff == full.diff and first.scale == full.scale


def test_the_stopping_rule_does_not_inflate_the_moderated_false_alarm_rate():
    # 200 unchanged cells x 10 nights under the gate repetitions (5..10, stop at rsd 3 %):
    # the moderated t with the variance of the first five samples stays near its nominal
    # 0.05; with the variance of every sample it rises above it
    rates = {}
    for sf in (None, 5):
        hits = total = 0
        for k in range(10):
            rng = np.random.default_rng([5, k])
            comps = [stats.compare(bench_gate._draws(rng, 0.03, "gate", 1.0),
                                   bench_gate._draws(rng, 0.03, "gate", 1.0),
                                   higher_is_better=True, spread_from=sf) for _ in range(200)]
            mod, _ = stats.moderate(comps)
            hits += sum(c.p_value < 0.05 for c in mod)
            total += len(mod)
        rates[sf] = hits / total
    assert rates[5] < 0.06 and rates[None] > rates[5]
    assert math.isfinite(rates[None])
