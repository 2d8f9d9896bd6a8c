"""testbed.analysis.stats: known answers for summaries, the stopping rule, comparisons and ratios."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from scipy.stats import t as student_t

from testbed.analysis.stats import (
    Comparison,
    Decision,
    StoppingRule,
    Summary,
    Verdict,
    adjust,
    compare,
    cpu_us_per_transaction,
    gbit_per_core,
    gbit_per_ghz,
    randomized_order,
    summarize,
)
from testbed.topology.model import Repetitions

pytestmark = pytest.mark.unit


def noisy(center: float, n: int = 20, sd: float = 1.0, seed: int = 1) -> list[float]:
    return list(np.random.default_rng(seed).normal(center, sd, n))


# --------------------------------------------------------------------------- summarize

def test_summary_of_one_to_five_matches_textbook():
    s = summarize([1, 2, 3, 4, 5])
    sd = math.sqrt(2.5)                       # sum of squares 10 / (n-1)
    half = 2.776 * sd / math.sqrt(5)          # t(0.975, df=4) from the printed table
    assert (s.n, s.mean, s.median, s.min, s.max) == (5, 3.0, 3.0, 1.0, 5.0)
    assert s.stddev == pytest.approx(sd)
    assert s.rsd == pytest.approx(sd / 3)
    assert s.ci_low == pytest.approx(3 - half, abs=1e-3)
    assert s.ci_high == pytest.approx(3 + half, abs=1e-3)


def test_wider_confidence_gives_wider_interval():
    s95, s99 = summarize([1, 2, 3, 4, 5]), summarize([1, 2, 3, 4, 5], confidence=0.99)
    half99 = 4.604 * math.sqrt(2.5) / math.sqrt(5)   # t(0.995, df=4)
    assert s99.ci_high == pytest.approx(3 + half99, abs=1e-3)
    assert s99.ci_high - s99.ci_low > s95.ci_high - s95.ci_low


def test_single_sample_has_no_spread_rather_than_zero_spread():
    s = summarize([42.0])
    assert (s.n, s.mean, s.median) == (1, 42.0, 42.0)
    assert s.stddev is None and s.rsd is None
    assert s.ci_low is None and s.ci_high is None


def test_constant_samples_give_a_point_interval_not_nan():
    s = summarize([0.1, 0.1, 0.1])
    assert s.stddev == 0.0 and s.rsd == 0.0
    assert s.ci_low == s.ci_high == pytest.approx(0.1)


def test_zero_mean_has_no_rsd():
    s = summarize([-1.0, 1.0])
    assert s.mean == 0.0 and s.stddev == pytest.approx(math.sqrt(2))
    assert s.rsd is None


def test_summary_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        summarize([1, 2]).mean = 0  # type: ignore[misc]


@pytest.mark.parametrize("bad", [[], [1.0, float("nan")], [float("inf")]])
def test_summarize_rejects_empty_and_non_finite(bad):
    with pytest.raises(ValueError):
        summarize(bad)


@pytest.mark.parametrize("confidence", [0.0, 1.0, 95])
def test_summarize_rejects_bad_confidence(confidence):
    with pytest.raises(ValueError, match="confidence"):
        summarize([1, 2], confidence=confidence)


# --------------------------------------------------------------------------- stopping rule

def rule(min_samples=3, max_samples=10, rsd_target=0.05, warmup=1) -> StoppingRule:
    return StoppingRule(Repetitions(warmup=warmup, min_samples=min_samples,
                                    max_samples=max_samples, rsd_target=rsd_target))


def test_below_min_samples_asks_for_more_even_when_tight():
    d = rule().decide([100.0, 100.1])
    assert d == Decision(more=True, converged=False, reason=d.reason)
    assert "2 of at least 3" in d.reason


def test_converges_once_min_reached_and_rsd_met():
    d = rule().decide([100.0, 101.0, 99.0])          # rsd = 1 %
    assert (d.more, d.converged) == (False, True)


def test_noisy_samples_continue_until_the_cap():
    noisy_values = [100.0, 150.0, 60.0]              # rsd ~ 42 %
    d = rule().decide(noisy_values)
    assert (d.more, d.converged) == (True, False)
    d = rule().decide(noisy_values * 3 + [100.0])    # 10 = max_samples
    assert (d.more, d.converged) == (False, False)
    assert "max_samples=10" in d.reason


def test_rsd_met_exactly_at_the_cap_counts_as_converged():
    d = rule(min_samples=3, max_samples=3).decide([100.0, 101.0, 99.0])
    assert (d.more, d.converged) == (False, True)


def test_rsd_target_zero_disables_early_stop():
    r = rule(rsd_target=0.0)
    assert r.decide([5.0] * 9).more                  # zero spread, still goes on
    d = r.decide([5.0] * 10)
    assert (d.more, d.converged) == (False, False)
    assert "disabled" in d.reason


def test_single_sample_minimum_still_needs_two_for_rsd():
    r = rule(min_samples=1, max_samples=5)
    assert r.decide([100.0]).more
    assert r.decide([100.0, 100.0]).converged


def test_fixed_single_repetition_stops_after_one():
    d = StoppingRule(Repetitions()).decide([7.0])    # defaults: min = max = 1
    assert (d.more, d.converged) == (False, False)


@pytest.mark.parametrize("kwargs", [dict(min_samples=0), dict(min_samples=5, max_samples=4),
                                    dict(rsd_target=-0.1), dict(warmup=-1)])
def test_stopping_rule_rejects_impossible_repetitions(kwargs):
    with pytest.raises(ValueError):
        rule(**kwargs)


# --------------------------------------------------------------------------- compare

def test_clear_throughput_drop_is_regressed():
    c = compare(noisy(100, seed=1), noisy(80, seed=2), higher_is_better=True)
    assert c.verdict is Verdict.REGRESSED
    assert c.test == "welch" and c.p_value < 1e-10
    assert c.delta == pytest.approx(-20, abs=1.5)
    assert c.delta_rel == pytest.approx(-0.20, abs=0.015)
    assert c.delta_pct == pytest.approx(c.delta_rel * 100)


def test_latency_drop_is_improved():
    c = compare(noisy(100, seed=1), noisy(80, seed=2), higher_is_better=False)
    assert c.verdict is Verdict.IMPROVED


def test_throughput_rise_is_improved_and_latency_rise_regressed():
    base, new = noisy(80, seed=3), noisy(100, seed=4)
    assert compare(base, new, higher_is_better=True).verdict is Verdict.IMPROVED
    assert compare(base, new, higher_is_better=False).verdict is Verdict.REGRESSED


@pytest.mark.parametrize("test", ["welch", "mannwhitney"])
def test_same_distribution_is_unchanged(test):
    c = compare(noisy(100, sd=2, seed=5), noisy(100, sd=2, seed=6), higher_is_better=True,
                test=test)
    assert c.verdict is Verdict.UNCHANGED
    assert c.test == test


def test_welch_p_value_matches_the_welch_satterthwaite_formula():
    base, new = [10, 11, 12, 13, 14], [12, 16, 20, 24, 28, 32, 36, 40]
    vb, vn = 2.5 / 5, 96.0 / 8                         # sample variance / n, by hand
    t = (12.0 - 26.0) / math.sqrt(vb + vn)
    df = (vb + vn) ** 2 / (vb ** 2 / 4 + vn ** 2 / 7)
    expected = 2 * student_t.sf(abs(t), df)           # ~0.0047; pooled Student gives ~0.0098
    c = compare(base, new, higher_is_better=True)
    assert c.p_value == pytest.approx(expected, rel=1e-9)


def test_mannwhitney_sees_a_clear_shift():
    c = compare(noisy(100, seed=1), noisy(80, seed=2), higher_is_better=True,
                test="mannwhitney")
    assert c.verdict is Verdict.REGRESSED and c.p_value < 1e-6


def test_significant_but_small_shift_is_unchanged():
    c = compare(noisy(100, sd=0.2, seed=7), noisy(98, sd=0.2, seed=8), higher_is_better=True,
                threshold=0.05)
    assert c.p_value < 1e-10                           # the 2 % is real ...
    assert c.verdict is Verdict.UNCHANGED              # ... but below the 5 % threshold
    tighter = compare(noisy(100, sd=0.2, seed=7), noisy(98, sd=0.2, seed=8),
                      higher_is_better=True, threshold=0.01)
    assert tighter.verdict is Verdict.REGRESSED


def test_big_but_noisy_change_is_inconclusive_not_unchanged():
    c = compare([100.0, 60.0, 140.0, 90.0, 110.0], [70.0, 40.0, 100.0, 130.0, 60.0],
                higher_is_better=True)
    assert c.delta_rel < -0.05 and c.p_value >= 0.05
    assert c.verdict is Verdict.INCONCLUSIVE
    assert "not credibly" in c.note


@pytest.mark.parametrize("base,new", [([100.0], [80.0]), ([100.0] * 5, [80.0]),
                                      ([100.0, 101.0, 99.0, 100.0], [60.0] * 9)])
def test_fewer_than_five_samples_a_side_are_insufficient(base, new):
    c = compare(base, new, higher_is_better=True)
    assert c.verdict is Verdict.INSUFFICIENT
    assert c.p_value is None and c.test is None
    assert f"{len(base)} BASE and {len(new)} NEW samples" in c.note


def test_identical_constant_samples_are_unchanged_with_p_one():
    c = compare([5.0] * 5, [5.0] * 5, higher_is_better=True)
    assert c.verdict is Verdict.UNCHANGED
    assert c.p_value == 1.0 and c.delta == 0.0 and c.delta_pct == 0.0
    assert "zero variance" in c.note


@pytest.mark.parametrize("test", ["auto", "welch", "permutation"])
def test_different_constant_samples_get_the_exact_permutation_p_never_zero(test):
    # zero variance: the permutation test, whose smallest two-sided p at 5+5 is 2/C(10,5)
    c = compare([50.0] * 5, [40.0] * 5, higher_is_better=True, test=test)
    assert c.test == "permutation"
    assert c.p_value == pytest.approx(2 / math.comb(10, 5))
    assert c.verdict is Verdict.REGRESSED
    for value in (c.p_value, c.delta, c.delta_pct, c.base.ci_low, c.new.ci_high):
        assert not math.isnan(value)


def test_quantised_metric_within_one_quantum_is_unchanged():
    # integer-microsecond p99s: 3 -> 4 us is +33 % but one quantum, not a regression
    c = compare([3.0, 3, 3, 3, 4], [4.0, 4, 4, 3, 4], higher_is_better=False, threshold=0.05)
    # ties go to Welch (the permutation test's floor of 2/252 cannot pass a family's level)
    assert c.quantum == 1.0 and c.test == "welch"
    assert c.verdict is Verdict.UNCHANGED and "one quantum" in c.note


def test_mannwhitney_is_refused_where_it_cannot_reach_alpha():
    c = compare([100.0] * 5, [80.0] * 5, higher_is_better=True, test="mannwhitney",
                alpha=0.005, min_samples=5)
    assert c.verdict is Verdict.INSUFFICIENT and "cannot reach" in c.note
    assert compare([100.0, 99, 101, 100, 102], [80.0, 81, 79, 80, 82], higher_is_better=True,
                   test="mannwhitney").verdict is Verdict.REGRESSED


def test_bootstrap_interval_of_the_ratio_of_means():
    c = compare(noisy(100, seed=1), noisy(80, seed=2), higher_is_better=True, test="bootstrap")
    lo, hi = c.ratio_ci
    assert lo < 0.8 < hi and hi < 1.0
    assert c.verdict is Verdict.REGRESSED and 0 < c.p_value <= 2 / 10000


def test_one_constant_side_uses_welch_both_constant_the_permutation_test():
    # Welch is defined with one constant side (the other's variance carries the error)
    c = compare([100.0] * 5, [80.0, 81.0, 79.0, 80.5, 79.5], higher_is_better=True)
    assert c.test == "welch" and 0 < c.p_value < 0.01
    assert c.verdict is Verdict.REGRESSED
    c = compare([100.0] * 5, [80.0] * 5, higher_is_better=True)
    assert c.test == "permutation" and c.p_value == pytest.approx(2 / 252)


def test_zero_base_mean_is_inconclusive():
    c = compare([0.0] * 5, [1.0, 2.0, 1.5, 1.2, 1.1], higher_is_better=True)
    assert c.delta_rel is None and c.delta_pct is None
    assert c.verdict is Verdict.INCONCLUSIVE


def test_comparison_records_its_parameters():
    c = compare([1.0, 2.0] * 3, [1.0, 2.0] * 3, higher_is_better=False, threshold=0.1, alpha=0.01)
    assert isinstance(c, Comparison) and isinstance(c.base, Summary)
    assert (c.higher_is_better, c.threshold, c.alpha) == (False, 0.1, 0.01)
    assert c.verdict == "unchanged"                    # StrEnum: serialises as its value


def test_benjamini_hochberg_adjusts_a_family():
    rng = np.random.default_rng(11)
    family = [compare(rng.normal(100, 3, 5), rng.normal(100, 3, 5), higher_is_better=True,
                      threshold=0.0) for _ in range(40)]
    adjusted = adjust(family, q=0.05)
    for raw, adj in zip(family, adjusted):
        assert adj.p_adjusted >= raw.p_worse
    assert sum(a.verdict is Verdict.REGRESSED for a in adjusted) <= sum(
        r.verdict is Verdict.REGRESSED for r in family)


@pytest.mark.parametrize("kwargs", [dict(test="ks"), dict(threshold=-0.1), dict(alpha=0.0),
                                    dict(alpha=1.0)])
def test_compare_rejects_bad_parameters(kwargs):
    with pytest.raises(ValueError):
        compare([1.0, 2.0], [1.0, 2.0], higher_is_better=True, **kwargs)


def test_compare_rejects_an_empty_side():
    with pytest.raises(ValueError, match="base"):
        compare([], [1.0], higher_is_better=True)


# --------------------------------------------------------------------------- efficiency

def test_efficiency_known_values():
    assert gbit_per_core(9400.0, 2.0) == pytest.approx(4.7)
    assert gbit_per_ghz(9400.0, 2.0, 2.35) == pytest.approx(2.0)
    assert cpu_us_per_transaction(0.5, 25_000.0) == pytest.approx(20.0)
    assert cpu_us_per_transaction(0.0, 25_000.0) == 0.0   # measured zero CPU is a number


@pytest.mark.parametrize("value", [
    gbit_per_core(9400.0, 0.0), gbit_per_core(9400.0, None), gbit_per_core(None, 1.0),
    gbit_per_core(9400.0, float("nan")),
    gbit_per_ghz(9400.0, 0.0, 2.0), gbit_per_ghz(9400.0, 1.0, 0.0),
    gbit_per_ghz(9400.0, 1.0, None), gbit_per_ghz(9400.0, None, 2.0),
    cpu_us_per_transaction(0.5, 0.0), cpu_us_per_transaction(0.5, None),
    cpu_us_per_transaction(None, 100.0),
])
def test_missing_or_zero_denominators_give_none(value):
    assert value is None


def test_negative_denominator_is_a_bug_not_a_number():
    with pytest.raises(ValueError):
        gbit_per_core(100.0, -1.0)
    with pytest.raises(ValueError):
        gbit_per_ghz(100.0, 1.0, -2.0)


# --------------------------------------------------------------------------- ordering

def test_randomized_order_is_a_deterministic_permutation():
    items = [f"cell{i}" for i in range(20)]
    first = randomized_order(items, seed=42)
    assert first == randomized_order(items, seed=42)
    assert sorted(first) == sorted(items) and first != items
    assert randomized_order(items, seed=43) != first
    assert items == [f"cell{i}" for i in range(20)]    # input untouched


def test_randomized_order_accepts_tuples_and_empty():
    assert randomized_order((), seed=1) == []
    assert sorted(randomized_order((3, 1, 2), seed=1)) == [1, 2, 3]


def test_notes_are_not_repeated_when_the_verdict_is_taken_again():
    c = compare([100.0, 60.0, 140.0, 90.0, 110.0], [70.0, 40.0, 100.0, 130.0, 60.0],
                higher_is_better=True)
    (again,) = adjust([c])
    assert again.note.count("not credibly") == 1


# --------------------------------------------------------------------------- moderated t

from scipy import special as _spx  # noqa: E402

from testbed.analysis.stats import Prior, fit_prior, moderate, trigamma_inverse  # noqa: E402


@pytest.mark.parametrize("y", [1e-7, 0.01, 0.5, 3.0, 40.0, 1e8])
def test_trigamma_inverse_inverts_trigamma(y):
    assert float(_spx.polygamma(1, trigamma_inverse(y))) == pytest.approx(y, rel=1e-5)


def test_fit_prior_recovers_a_scaled_chi_square_prior():
    # limma's model: sigma^2 ~ d0 s0^2 / chi2(d0), s^2 | sigma^2 ~ sigma^2 chi2(d) / d.
    rng = np.random.default_rng(1)
    d0, s0_2, d, k = 12.0, 0.03 ** 2, 8, 4000
    sigma2 = d0 * s0_2 / rng.chisquare(d0, k)
    s2 = sigma2 * rng.chisquare(d, k) / d
    got_d0, got_s0_2 = fit_prior(s2, [d] * k)
    assert got_d0 == pytest.approx(d0, rel=0.25)
    assert got_s0_2 == pytest.approx(s0_2, rel=0.05)


def test_fit_prior_of_one_common_variance_is_infinitely_confident():
    rng = np.random.default_rng(2)
    s2 = 0.03 ** 2 * rng.chisquare(8, 2000) / 8
    d0, s0_2 = fit_prior(s2, [8] * 2000)
    assert d0 > 100 and s0_2 == pytest.approx(0.03 ** 2, rel=0.05)


def _family(k: int, seed: int, noise=0.03, drop=1.0):
    rng = np.random.default_rng(seed)
    return [compare(2000 * rng.normal(1, noise, 5), 2000 * drop * rng.normal(1, noise, 5),
                    higher_is_better=True) for _ in range(k)]


def test_moderated_t_squeezes_variances_and_gains_degrees_of_freedom():
    fam = _family(50, 3) + _family(1, 4, drop=0.9)
    assert all(c.test == "welch" and c.log_spread is not None for c in fam)
    out, prior = moderate(fam)
    assert prior.method == "moderated" and prior.cells == 51 and prior.d0 > 8
    assert 0.02 < math.sqrt(prior.s0_2) < 0.04        # relative noise: log scale
    assert all(c.test == "moderated" for c in out)
    # the real drop: a smaller p than Welch's 8 degrees of freedom give
    assert out[-1].p_value < fam[-1].p_value and out[-1].verdict is Verdict.REGRESSED
    assert "moderated t" in prior.describe()


def test_moderated_t_needs_three_welch_comparisons_else_welch():
    fam = _family(2, 5)
    out, prior = moderate(fam)
    assert prior == Prior("welch", 2, reason="2 Welch comparisons, 3 needed for a variance prior")
    assert out == fam and "per-cell Welch" in prior.describe()


def test_moderated_t_leaves_permutation_and_quantised_comparisons_alone():
    fam = _family(5, 6) + [compare([5, 5, 5, 5, 5], [6, 6, 6, 6, 6], higher_is_better=False)]
    out, prior = moderate(fam)
    assert prior.cells == 5 and out[-1] == fam[-1] and out[-1].test == "permutation"


def test_heterogeneous_variances_fall_back_to_welch():
    # Variances spread far beyond what 8 degrees of freedom explain: no useful prior.
    rng = np.random.default_rng(7)
    fam = [compare(2000 * rng.normal(1, s, 5), 2000 * rng.normal(1, s, 5), higher_is_better=True)
           for s in (0.0005, 0.3, 0.001, 0.2, 0.002, 0.25, 0.0003, 0.4)]
    out, prior = moderate(fam)
    assert prior.method == "welch" and "heterogeneous" in prior.reason
    assert out == fam


# --------------------------------------------------------------------------- against the threshold

def test_a_change_past_the_threshold_regresses_only_when_its_interval_is_beyond_it():
    """-6 % at 3 % noise and 5 + 5 samples: the estimate is past -5 %, the interval is not
    beyond it: not regressed (before, a significant change with an estimate past the
    threshold was). -20 %: beyond, regressed."""
    rng = np.random.default_rng(3)
    b = 1000 * (1 + 0.02 * rng.standard_normal(8))
    six = compare(b, 940 * (1 + 0.02 * rng.standard_normal(8)), higher_is_better=True)
    assert six.delta_rel < -0.05 and six.p_value < 0.05          # significant against 0
    assert six.p_worse > 0.05 and six.verdict is Verdict.INCONCLUSIVE
    far = compare(b, 0.8 * 1000 * (1 + 0.03 * rng.standard_normal(5)), higher_is_better=True)
    assert far.p_worse < 0.01 and far.verdict is Verdict.REGRESSED


def test_unchanged_needs_the_interval_within_and_never_an_estimate_beyond():
    rng = np.random.default_rng(4)
    b = 1000 * (1 + 0.01 * rng.standard_normal(10))
    near = compare(b, b * 1.01, higher_is_better=True)
    assert near.verdict is Verdict.UNCHANGED
    past = compare(b, b * 0.945, higher_is_better=True)
    assert past.verdict is not Verdict.UNCHANGED and past.verdict is not Verdict.NOT_WORSE


def test_not_worse_when_only_the_better_side_reaches_beyond():
    rng = np.random.default_rng(5)
    b = 1000 * (1 + 0.03 * rng.standard_normal(5))
    c = compare(b, b * 1.04, higher_is_better=True)
    lo, hi = c.change_ci
    assert lo > -0.05 and hi > 0.05 and c.verdict is Verdict.NOT_WORSE


def test_equivalence_keeps_its_level_after_benjamini_hochberg():
    """Adjusting a family changes the level of the threshold tests, never the interval the
    equivalence test reads (before, it was taken at q, a wider interval)."""
    rng = np.random.default_rng(6)
    fam = [compare(1000 * (1 + 0.02 * rng.standard_normal(5)), 1000 * (1 + 0.02 * rng.standard_normal(5)),
                   higher_is_better=True) for _ in range(50)]
    adj = adjust(fam, q=0.01)
    assert [a.change_ci for a in adj] == [c.change_ci for c in fam]
    assert [a.verdict is Verdict.UNCHANGED for a in adj] == [c.verdict is Verdict.UNCHANGED for c in fam]


@pytest.mark.parametrize("true", [-0.08])
def test_a_true_minus_eight_is_almost_never_unchanged(true):
    """1000 cells at -8 %, 3 % noise, 5 + 5: unchanged in none, not-worse in none."""
    rng = np.random.default_rng(8)
    out = [compare(1000 * (1 + 0.03 * rng.standard_normal(5)),
                   1000 * (1 + true) * (1 + 0.03 * rng.standard_normal(5)), higher_is_better=True)
           for _ in range(1000)]
    assert sum(c.verdict in (Verdict.UNCHANGED, Verdict.NOT_WORSE) for c in out) <= 10
