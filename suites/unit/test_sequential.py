"""The sequential gate (`testbed run --decide-against`): alpha spending, which cells are
measured again, the final look, and the design replayed on synthetic nights (seeded)."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from testbed.analysis import baseline, compare, sequential, stats
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
    assert t == pytest.approx(sequential.information_fraction(5, 5, 5 + d.extra))
    assert q1 + q2 == pytest.approx(d.q) and 0 < q1 < q2


def test_design_refuses_bad_settings():
    with pytest.raises(ValueError, match="extra"):
        sequential.Design(extra=0)
    with pytest.raises(ValueError, match="threshold"):
        sequential.Design(threshold=0.0)
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


def _at(d: float, se: float) -> stats.Comparison:
    s = stats.summarize([1.0, 1.1, 0.9, 1.0, 1.05])
    c = stats.Comparison(base=s, new=s, delta=d, delta_rel=d, delta_pct=d * 100, p_value=0.2, test="welch",
                         verdict=stats.Verdict.INCONCLUSIVE, higher_is_better=True, threshold=0.05, alpha=0.05)
    return stats.with_evidence(c, stats.Evidence(math.log1p(d), se, 40.0))


def test_last_look_passes_only_what_is_surely_no_worse_than_the_margin():
    # -3 % with a 1.5 % standard error: its 99 % bound (-6.4 %) is within -7.5 %: not worse
    ok = sequential.final_look(_at(-0.03, 0.015), 0.075)
    assert ok.verdict is stats.Verdict.NOT_WORSE and "last look" in ok.note
    # -4 % with 2 %: the bound reaches -8.5 %: still undecided, never unchanged
    assert sequential.final_look(_at(-0.04, 0.02), 0.075).verdict is stats.Verdict.INCONCLUSIVE
    # an estimate beyond the threshold never passes, however tight
    assert sequential.final_look(_at(-0.055, 0.001), 0.075).verdict is not stats.Verdict.NOT_WORSE


def test_a_true_minus_eight_percent_is_passed_in_at_most_one_percent_of_cells():
    """The last look's guarantee, on 2000 cells at -8 % with the precision of a night (BASE
    pooled, 15 + 15 samples at 3 % noise)."""
    rng = np.random.default_rng(3)
    se = 0.03 * math.sqrt(2 / 15)
    passed = sum(sequential.final_look(_at(math.expm1(math.log(0.92) + se * rng.standard_normal()), se),
                                       sequential.FINAL_MARGIN * 0.05).verdict is stats.Verdict.NOT_WORSE
                 for _ in range(2000))
    assert passed <= 20


def test_a_transient_failure_among_200_unchanged_cells_is_measured_again_not_red(tmp_path):
    tpl = bench_gate.template(200, tmp_path)
    tpl_samples = {s.cell.id: s for s in tpl.samples}
    rng = np.random.default_rng(11)
    older = [bench_gate.night(tpl, f"old{k}", rng, noise=0.03, reps="5") for k in range(2)]
    base = bench_gate.night(tpl, "base", rng, noise=0.03, reps="5")
    new = _with_failure(bench_gate.night(tpl, "new", rng, noise=0.03, reps="5"), 12)
    design = sequential.Design()
    pooled, notes = baseline.pooled_base(base, older)
    assert len(notes) == 2 and "baseline pooled with night old0" in notes[0]
    rc1, *_ = sequential.look1(pooled, new, design)
    plan, _ = sequential.plan_remeasure(rc1, design)
    assert tpl.samples[2].cell.id in {r.cell_id for r in plan}
    sc = gate_seq.SeqScenario("x", 1)
    combined = gate_seq.more(tpl_samples, new, plan, rng, sc, {i: 1.0 for i in tpl_samples})
    sq = sequential.decide(pooled, new, combined, design, remeasured=plan)
    assert sq.exit_status == 0, [(c.cell_id, c.verdict.value) for c in sq.final.cells if c.verdict.undecided]
    text = sequential.render_text(sq)
    assert "look 1" in text and "again:" in text and "q2" in text and "night shift" in text
    # every verdict line shows the change, its interval and the mdc
    assert "interval" in text and "mdc" in text and "]%" in text


def test_a_look_one_regression_fails_the_night_only_when_the_samples_measured_again_confirm_it(tmp_path):
    """A spell of a slow host (one cell's first samples at half speed, then at BASE's) is
    not a regression: measured again, it is undecided, never red. A real -15 % cell is
    measured again too, and stays regressed."""
    tpl = bench_gate.template(40, tmp_path)
    tpl_samples = {s.cell.id: s for s in tpl.samples}
    ids = list(tpl_samples)
    spell, real = ids[0], ids[1]
    rng = np.random.default_rng(21)
    base = bench_gate.night(tpl, "base", rng, noise=0.01, reps="5")
    lv = {i: 1.0 for i in ids}
    new = bench_gate.night(tpl, "new", rng, noise=0.01, reps="5", levels={**lv, spell: 0.5, real: 0.85})
    design = sequential.Design()
    rc1, *_ = sequential.look1(base, new, design)
    at1 = {c.cell_id: c.verdict for c in rc1.cells}
    assert at1[spell] is at1[real] is compare.CellVerdict.REGRESSED
    plan, _ = sequential.plan_remeasure(rc1, design)
    by = {r.cell_id: r for r in plan}
    assert by[spell].why == by[real].why == sequential.CONFIRM and plan[0].why == sequential.CONFIRM
    sc = gate_seq.SeqScenario("x", 1, noise=0.01)
    combined = gate_seq.more(tpl_samples, new, plan, rng, sc, {**lv, real: 0.85})
    sq = sequential.decide(base, new, combined, design, remeasured=plan)
    final = {c.cell_id: c for c in sq.final.cells}
    assert final[real].verdict is compare.CellVerdict.REGRESSED and "confirmed" in final[real].note
    assert final[spell].verdict is compare.CellVerdict.INCONCLUSIVE
    assert "not confirmed by the 10 samples measured again" in final[spell].note
    assert sq.exit_status == 1 and [c.cell_id for c in sq.final.failing] == [real]
    # a regression that was not measured again (over the budget) stands as look 1 said
    sq = sequential.decide(base, new, combined, design, remeasured=[by[spell]])
    assert {c.cell_id for c in sq.final.failing} == {real}
    # the spell alone leaves the night undecided, not red
    new_only_spell = bench_gate.night(tpl, "new2", rng, noise=0.01, reps="5", levels={**lv, spell: 0.5})
    rc1, *_ = sequential.look1(base, new_only_spell, design)
    plan, _ = sequential.plan_remeasure(rc1, design)
    sq = sequential.decide(base, new_only_spell, gate_seq.more(tpl_samples, new_only_spell, plan, rng, sc, lv),
                           design, remeasured=plan)
    assert sq.exit_status == compare.UNDECIDED_STATUS and not sq.final.failing
    assert "not confirmed" in sequential.render_text(sq)
    # the old rule, for contrast: look 1's verdict was final
    off = dataclasses.replace(design, confirm=False)
    rc1, *_ = sequential.look1(base, new_only_spell, off)
    assert spell not in {r.cell_id for r in sequential.plan_remeasure(rc1, off)[0]}


def _variant(samples, v):
    return [dataclasses.replace(s, cell=dataclasses.replace(
        s.cell, id=f"{s.cell.id}-v{v}", context={**s.cell.context, "variant": v}, hash=f"{s.cell.hash}{v}",
        hash_without_variant=s.cell.hash)) for s in samples]


def test_an_ab_run_confirms_a_regression_on_both_variants_measured_again(tmp_path):
    """A/B in one run: a cell regressed at look 1 is measured again on both variants and
    judged on the new samples of both alone; a spell at look 1 on b is not confirmed."""
    tpl = bench_gate.template(40, tmp_path)
    tpl_samples = {s.cell.id: s for s in tpl.samples}
    ids = list(tpl_samples)
    spell, real = ids[0], ids[1]
    rng = np.random.default_rng(22)
    lv = {i: 1.0 for i in ids}
    b_lv = {**lv, real: 0.85}
    a1 = bench_gate.night(tpl, "ab", rng, noise=0.01, reps="5", levels=lv)
    b1 = bench_gate.night(tpl, "ab", rng, noise=0.01, reps="5", levels={**b_lv, spell: 0.5})
    run = dataclasses.replace(a1, samples=tuple(_variant(a1.samples, "a") + _variant(b1.samples, "b")))
    design = sequential.Design()
    rc1, *_ = sequential.look1(run, run, design, variants=("a", "b"))
    plan, _ = sequential.plan_remeasure(rc1, design, base_grows=True)
    assert {r.cell_id for r in plan if r.why == sequential.CONFIRM} == {spell, real}
    sc = gate_seq.SeqScenario("x", 1, noise=0.01)
    more_a = gate_seq.more(tpl_samples, a1, plan, rng, sc, lv).samples[len(a1.samples):]
    more_b = gate_seq.more(tpl_samples, b1, plan, rng, sc, b_lv).samples[len(b1.samples):]
    combined = dataclasses.replace(run, samples=run.samples + tuple(_variant(more_a, "a") + _variant(more_b, "b")))
    sq = sequential.decide_ab(run, combined, design, ("a", "b"), remeasured=plan)
    final = {c.cell_id: c for c in sq.final.cells}
    assert final[real].verdict is compare.CellVerdict.REGRESSED and "confirmed" in final[real].note
    assert final[spell].verdict is compare.CellVerdict.INCONCLUSIVE and "not confirmed" in final[spell].note
    # each side judged on its 10 new samples alone
    assert {m.comparison.base.n for m in final[spell].metrics} == {m.comparison.new.n for m in final[spell].metrics} == {10}


def test_a_base_short_of_samples_is_filled_from_the_nights_before_it(tmp_path):
    """One old failure in BASE (4 ok samples) no longer leaves its cell undecided for good:
    the night before BASE fills it, scaled by the nights' shared drift."""
    tpl = bench_gate.template(20, tmp_path)
    rng = np.random.default_rng(2)
    older = bench_gate.night(tpl, "old", rng, noise=0.03, reps="5", factor=1.03)
    base = _with_failure(bench_gate.night(tpl, "base", rng, noise=0.03, reps="5"), 0)
    new = bench_gate.night(tpl, "new", rng, noise=0.03, reps="5")
    cid = tpl.samples[0].cell.id
    alone = compare.compare_runs(base, new, min_samples=5)
    assert next(c for c in alone.cells if c.cell_id == cid).verdict is compare.CellVerdict.INSUFFICIENT
    pooled, _ = baseline.pooled_base(base, [older])
    healed = compare.compare_runs(pooled, new, min_samples=5)
    assert next(c for c in healed.cells if c.cell_id == cid).base_ok == 9
    f = baseline.night_factor(base, older)["throughput_mbps"]
    assert 0.95 < f < 0.99                      # older was 3 % faster: scaled down onto BASE


def test_ab_tops_up_a_short_base_where_decide_against_cannot(tmp_path):
    tpl = bench_gate.template(10, tmp_path)
    rng = np.random.default_rng(1)
    base = _with_failure(_with_failure(bench_gate.night(tpl, "b", rng, noise=0.03, reps="5"), 0), 1)
    new = bench_gate.night(tpl, "n", rng, noise=0.03, reps="5")
    rc = compare.compare_runs(base, new)
    cid = tpl.samples[0].cell.id
    fixed, skipped = sequential.plan_remeasure(rc, sequential.Design())
    assert cid not in {r.cell_id for r in fixed} and any("BASE has 3" in s for s in skipped)
    grows, _ = sequential.plan_remeasure(rc, sequential.Design(), base_grows=True)
    assert {r.cell_id: r.extra for r in grows}[cid] == sequential.EXTRA + 2


def test_the_design_replayed_meets_its_targets_at_small_size():
    """Reduced `testbed bench gate` (40 cells, a few nights each): drift nights pass, a
    uniform -2 % fails no night, -8 % cells are never called unchanged, integer p99s are
    found. The full bench prints the same at 100 cells."""
    sc = {s.name: s for s in gate_seq.scenarios(4, 40)}
    rows = gate_seq.run(4, 40, seed=1, which=[sc["2% shared drift"], sc["uniform -2%"],
                                               sc["-8% in 10 cells"], sc["integer p99 +20% in 1/10 rr"]])
    by = {o.scenario.name: o for o in rows}
    assert by["2% shared drift"].exit_counts.get(1, 0) == 0
    assert by["2% shared drift"].exit_counts.get(5, 0) <= 1
    assert by["uniform -2%"].exit_counts.get(1, 0) == 0
    assert by["-8% in 10 cells"].changed_unchanged == 0 and by["-8% in 10 cells"].false_cells == 0
    p99 = by["integer p99 +20% in 1/10 rr"]
    assert p99.detected >= 0.8 * p99.changed_total
    text = gate_seq.format_outcomes(rows)
    assert "called unch" in text and "shift fail" in text
    assert all(t.endswith("met") for t in gate_seq.targets(rows)), gate_seq.targets(rows)
    again = gate_seq.run(4, 40, seed=1, which=[sc["uniform -2%"]])
    assert again[0].exit_counts == by["uniform -2%"].exit_counts       # seeded


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


def test_the_baseline_history_is_the_last_decided_nights_beside_base(tmp_path):
    """`--decide-against` pools BASE with the last runs beside it that have a decision,
    newest first, each lending the cells it passed or could not judge; runs without a
    decision, A/B decisions and BASE itself are not history."""
    import json
    import shutil

    from testbed.measure import decide
    tpl = bench_gate.template(4, tmp_path / "t")
    ids = [s.cell.id for s in tpl.samples]
    res = tmp_path / "results"
    res.mkdir()
    names = ["20261101T000000Z-0001", "20261102T000000Z-0002", "20261103T000000Z-0003",
             "20261104T000000Z-0004", "20261105T000000Z-0005"]
    for n in names:
        shutil.copytree(tpl.dir, res / n)
    verdicts = {names[1]: ["unchanged", "regressed", "insufficient", "not-worse"],
                names[2]: ["inconclusive"] * 4, names[4]: ["unchanged"] * 4}
    for n, vs in verdicts.items():
        (res / n / "decision.json").write_text(json.dumps(
            {"cells": [{"id": i, "verdict": v} for i, v in zip(ids, vs)],
             "variants": ["a", "b"] if n == names[4] else None}))
    got = decide.baseline_history(res / names[3])
    assert [(r.dir.name, sorted(c)) for r, c in got] == [(names[1], sorted([ids[0], ids[2], ids[3]]))]
    assert decide.baseline_history(res / names[1]) == []


def test_ab_decide_against_names_the_baseline_variant():
    from pathlib import Path

    from testbed.measure import decide
    from testbed.topology import config
    t = config.load(Path(__file__).resolve().parents[2] / "examples" / "nightly" / "gate-ab.yaml")
    assert decide.check(t, "a") == ("a", "b") and decide.check(t, "b") == ("b", "a")
    with pytest.raises(decide.NotDecidable, match="baseline variant"):
        decide.check(t, "results/some-run")
    plain = dataclasses.replace(t, matrix=dataclasses.replace(t.matrix, variants=()))
    assert decide.check(plain, "results/some-run") is None


def test_a_night_compare_would_refuse_beside_base_lends_it_nothing(tmp_path):
    """A night on another accelerator (a TCG functional night beside a KVM BASE) or on
    another machine is never pooled into BASE: no drift factor puts one on the other's level."""
    tpl = bench_gate.template(20, tmp_path)
    rng = np.random.default_rng(4)
    base = _with_failure(bench_gate.night(tpl, "base", rng, noise=0.03, reps="5"), 0)
    other = "kvm" if base.environment.accelerator != "kvm" else "tcg"
    night = bench_gate.night(tpl, "old", rng, noise=0.03, reps="5")
    for env in (dataclasses.replace(night.environment, accelerator=other),
                dataclasses.replace(night.environment, machine_id="f" * 32, host="elsewhere"),
                dataclasses.replace(night.environment, cpu_model="Another CPU")):
        pooled, notes = baseline.pooled_base(base, [dataclasses.replace(night, environment=env)])
        assert pooled.samples == base.samples, notes
        (note,) = notes
        assert note.startswith("night old not pooled: ") or note.startswith(f"night {night.run_id} not pooled: ")
    # the same night as recorded is pooled
    assert len(baseline.pooled_base(base, [night])[0].samples) > len(base.samples)
