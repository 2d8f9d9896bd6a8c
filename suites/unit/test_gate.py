"""The nightly gate on synthetic runs in the results format (seeded): false alarms over 100
unchanged cells, real drops flagged, too few samples never passing as 0, JUnit output."""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from test_compare import STREAM, cpu, run_cli, stream_metrics, write_run  # noqa: F401

from testbed.analysis import compare
from testbed.records.results import SampleRecord, now
from testbed.topology.model import Attachment, Backend, Cell

pytestmark = pytest.mark.unit


def cells(n: int) -> list[Cell]:
    return [Cell(Attachment("bridge"), Backend.QEMU, 1500, k, STREAM) for k in range(1, n + 1)]


_LINES: dict[tuple[str, str], dict] = {}   # a cell's sample line in a run, drawn again per seed


def synthetic(root, run_id: str, cs: list[Cell], *, seed: int, n: int = 5, noise: float = 0.03,
              drop: dict[str, float] | None = None,
              noises: dict[str, float] | None = None) -> None:
    """A run in the results format: the run.json of the production RunWriter (one sample
    per cell), then every sample appended as samples.jsonl lines without the writer's
    per-sample fsync, which would make 1000 samples take seconds. When the run exists
    already (same cells), only its samples are drawn again: many seeds stay cheap."""
    rng = np.random.default_rng(seed)
    drop, noises = drop or {}, noises or {}
    samples = {c: [(stream_metrics(2000.0 * drop.get(c.id, 1.0)
                                   * rng.normal(1, noises.get(c.id, noise))),
                    cpu(1.6, 1.4, 1.6)) for _ in range(n)] for c in cs}
    d = root / run_id
    if (d / "run.json").exists():
        skip = 0
    else:
        d, skip = write_run(root, run_id, {c: v[:1] for c, v in samples.items()}), 1
    with open(d / "samples.jsonl", "a" if skip else "w") as f:
        for c, items in samples.items():
            key = (str(d), c.hash)
            if key not in _LINES:
                _LINES[key] = json.loads(SampleRecord.new(run_id, c.as_dict(), 0, False, "ok", None,
                                                          items[0][0], items[0][1], now(), now()).to_json())
            line = _LINES[key]
            for rep, (m, _) in enumerate(items[skip:], start=skip):
                f.write(json.dumps({**line, "rep": rep, "metrics": m}) + "\n")


def gate(root, **kw) -> compare.RunComparison:
    return compare.compare_runs(compare.load("base", root), compare.load("new", root), **kw)


@pytest.mark.parametrize("seed", [1, 2])
def test_hundred_unchanged_cells_with_3pct_noise_give_at_most_one_regression(tmp_path, seed):
    cs = cells(100)
    synthetic(tmp_path, "base", cs, seed=seed)
    synthetic(tmp_path, "new", cs, seed=seed + 100)
    rc = gate(tmp_path)
    regressed = [c for c in rc.cells if c.verdict is compare.CellVerdict.REGRESSED]
    assert len(rc.cells) == 100 and len(regressed) <= 1
    assert rc.exit_status in (0, 1, compare.UNDECIDED_STATUS)


def test_five_cells_dropped_by_fifteen_percent_are_all_flagged(tmp_path):
    # Five cells, all down: the night's shift is every cell's change, so the cells are
    # flagged on their own change (shifts=False) and, with the shift, the shift fails
    cs = cells(5)
    synthetic(tmp_path, "base", cs, seed=7)
    synthetic(tmp_path, "new", cs, seed=8, drop={c.id: 0.85 for c in cs})
    rc = gate(tmp_path, shifts=False)
    assert [c.verdict for c in rc.cells] == [compare.CellVerdict.REGRESSED] * 5
    assert rc.exit_status == 1
    for c in rc.cells:
        m = c.metrics[0].comparison
        assert m.p_adjusted is not None and m.p_adjusted >= m.p_worse
    shifted = gate(tmp_path)
    (sh,) = shifted.shifts
    assert shifted.failing_shifts == (sh,) and shifted.exit_status == 1
    assert -0.2 < sh.change < -0.1 and "the host, not the build?" in compare.render_text(shifted)
    assert not shifted.failing            # the cells moved with the night: no cell of its own


def test_a_shared_drift_is_taken_out_and_a_cell_of_its_own_is_still_found(tmp_path):
    """Every cell 4 % slower (the host), one 15 % slower (the build): the shift is printed in
    one line and within the threshold, only the one cell regresses."""
    cs = cells(60)
    synthetic(tmp_path, "base", cs, seed=21)
    synthetic(tmp_path, "new", cs, seed=22, drop={c.id: 0.96 * (0.85 if c is cs[3] else 1.0) for c in cs})
    rc = gate(tmp_path)
    (sh,) = rc.shifts
    assert -0.05 < sh.change < -0.03 and not rc.failing_shifts
    assert regressed(rc) == {cs[3].id} and rc.exit_status == 1
    text = compare.render_text(rc)
    assert "night shift throughput_mbps: every cell -" in text and "taken out" in text
    # without the shift, the same night reads many cells past -5 % at the point estimate
    flat = gate(tmp_path, shifts=False)
    assert regressed(flat) >= {cs[3].id}


@pytest.mark.parametrize("n_cells", [4, 6, 8])
def test_one_of_a_few_cells_that_moved_is_judged_against_the_others_not_its_own_move(tmp_path, n_cells):
    """A small gate (the nightly example has 4 cells a metric): every cell 2 % slower (the
    host), one 15 % slower (the build), at 1 % noise. Below shift.MIN_TAU_CELLS the night's
    shift is a Hodges-Lehmann one whose signed-rank interval reaches out to the outermost
    cells, so the changed cell widened its own yardstick by as much as it moved and stayed
    undecided, night after night. Each cell is judged with the shift's uncertainty as the
    other cells give it: the changed cell regresses, the others do not."""
    cs = cells(n_cells)
    victim = cs[1]
    synthetic(tmp_path, "base", cs, seed=41, n=10, noise=0.01)
    synthetic(tmp_path, "new", cs, seed=42, n=10, noise=0.01,
              drop={c.id: 0.98 * (0.85 if c is victim else 1.0) for c in cs})
    rc = gate(tmp_path)
    (sh,) = rc.shifts
    assert sh.estimator == "hodges-lehmann" and -0.04 < sh.change < 0.0, sh.describe()
    assert regressed(rc) == {victim.id} and rc.exit_status == 1
    ev = next(c for c in rc.cells if c.cell_id == victim.id).metrics[0].comparison.evidence
    assert ev is not None and ev.d < -0.12 and ev.se < 0.02, ev
    assert all(c.verdict in (compare.CellVerdict.UNCHANGED, compare.CellVerdict.NOT_WORSE)
               for c in rc.cells if c.cell_id != victim.id), [c.verdict for c in rc.cells]


def test_a_third_of_the_cells_slower_together_is_found_not_taken_for_the_nights_shift(tmp_path):
    """A build that slows one attachment mode: its 20 cells of 60 12 % slower, the other 40
    as they were. A Hodges-Lehmann shift follows such a group about a third of the way (here to
    about -3 %), which left its cells 9 % worse, too close to the threshold to call; the
    night's shift is the majority's, and the line says how many cells share it."""
    cs = [Cell(Attachment("ovs"), Backend.QEMU, 1500, k, STREAM) for k in range(1, 21)] + cells(40)
    group = {c.id for c in cs[:20]}
    synthetic(tmp_path, "base", cs, seed=31)
    synthetic(tmp_path, "new", cs, seed=32, drop={c: 0.88 for c in group})
    rc = gate(tmp_path)
    (sh,) = rc.shifts
    assert abs(sh.change) < 0.01, sh.describe()
    assert sh.shared == 40 and set(sh.apart) == group, sh.describe()
    assert regressed(rc) == group and rc.exit_status == 1
    # the cells apart from the shift are named by what they share: the mode that changed
    assert "biweight over 60 cells, 40 sharing it; apart: ovs 20" in compare.render_text(rc)


def test_the_majority_location_ignores_a_group_and_states_its_own_precision():
    """Over many draws of 100 cells (2.7 % each, 30 of them 10 % lower): the biweight stays
    within a few tenths of a percent of the majority, the Hodges-Lehmann moves a third of the
    way with the group, and with no group the biweight's stated standard error is the spread
    its estimates really have."""
    from testbed.analysis import shift
    rng = np.random.default_rng(3)
    s = np.full(100, 0.027)
    grouped, hl, clean, stated = [], [], [], []
    for _ in range(300):
        x = s * rng.standard_normal(100)
        clean_m, se, kept = shift.majority_location(x, s)
        clean.append(clean_m)
        stated.append(se)
        x[:30] -= 0.10
        grouped.append(shift.majority_location(x, s)[0])
        hl.append(shift.walsh_interval(x, 0.05)[0])
    assert abs(np.mean(grouped)) < 0.005 and np.mean(hl) < -0.02
    assert np.std(clean) == pytest.approx(np.mean(stated), rel=0.15)
    assert kept.sum() >= 98    # no group: every cell shares it (bar a 3.5-sigma draw)


def regressed(rc: compare.RunComparison) -> set[str]:
    return {c.cell_id for c in rc.cells if c.verdict is compare.CellVerdict.REGRESSED}


def test_five_of_a_hundred_cells_dropped_by_fifteen_percent_at_n5_over_many_seeds(tmp_path):
    # Within a family of 105, Benjamini-Hochberg asks p <~ 0.0024 of each of 5 real drops,
    # of the one-sided test that the change is beyond -5 %: the moderated t (variances
    # squeezed towards a prior from all the cells, tens of degrees of freedom) must catch
    # 15 % drops at n = 5, seed after seed (a 10 % drop is only 5 points beyond the
    # threshold, about 2.6 standard errors at n = 5: see `testbed bench gate` for its power)
    cs = cells(105)
    missed, false, flagged = [], 0, 0
    for seed in range(10):
        rng = np.random.default_rng(1000 + seed)
        drop = {c.id: 0.85 for c in rng.choice(cs, 5, replace=False)}
        synthetic(tmp_path, "base", cs, seed=2 * seed)
        synthetic(tmp_path, "new", cs, seed=2 * seed + 1, drop=drop)
        rc = gate(tmp_path)
        got = regressed(rc)
        missed += [(seed, c) for c in set(drop) - got]
        false += len(got - set(drop))
        flagged += len(got)
        assert rc.exit_status == 1
        assert rc.tests_used[0].startswith("throughput_mbps: moderated t")
        for c in rc.cells:
            if c.cell_id in drop:
                assert c.verdict is not compare.CellVerdict.UNCHANGED
    assert len(missed) <= 2, missed
    assert false == 0, (false, flagged)


def test_hundred_unchanged_cells_over_many_seeds_give_at_most_one_regression(tmp_path):
    cs = cells(100)
    for seed in range(6):
        synthetic(tmp_path, "base", cs, seed=500 + 2 * seed)
        synthetic(tmp_path, "new", cs, seed=501 + 2 * seed)
        assert len(regressed(gate(tmp_path))) <= 1, f"seed {seed}"


def test_heterogeneous_noise_stays_controlled(tmp_path):
    # Half the cells at 1 % noise, half at 6 %: one prior fits neither; d0 fits to about
    # 1.3, below stats.MIN_PRIOR_DF, so the gate falls back to per-cell Welch and says so.
    # The noisy cells must not turn into false regressions; drops in quiet cells are found.
    cs = cells(100)
    noises = {c.id: (0.01 if k % 2 else 0.06) for k, c in enumerate(cs)}
    quiet = [c for c in cs if noises[c.id] == 0.01]
    for seed in range(6):
        rng = np.random.default_rng(2000 + seed)
        drop = {c.id: 0.9 for c in rng.choice(quiet, 3, replace=False)}
        synthetic(tmp_path, "base", cs, seed=900 + 2 * seed, noises=noises)
        synthetic(tmp_path, "new", cs, seed=901 + 2 * seed, noises=noises, drop=drop)
        rc = gate(tmp_path)
        assert "per-cell Welch (variances too heterogeneous" in rc.tests_used[0]
        got = regressed(rc)
        assert set(drop) <= got, f"seed {seed}: missed {sorted(set(drop) - got)}"
        assert len(got - set(drop)) <= 1, f"seed {seed}: false {sorted(got - set(drop))}"


def test_few_cells_fall_back_to_welch_and_say_so(tmp_path, capsys):
    cs = cells(2)
    synthetic(tmp_path, "base", cs, seed=1)
    synthetic(tmp_path, "new", cs, seed=2)
    rc = gate(tmp_path)
    assert {m.comparison.test for c in rc.cells for m in c.metrics if m.decides} == {"welch"}
    assert rc.tests_used == ("throughput_mbps: per-cell Welch (2 Welch comparisons, 3 needed "
                             "for a variance prior)",)
    code, out, _ = run_cli(["compare", "base", "new", "--results", str(tmp_path)], capsys)
    assert "p-values of throughput_mbps: per-cell Welch" in out


def test_an_explicit_welch_is_not_moderated(tmp_path):
    cs = cells(5)
    synthetic(tmp_path, "base", cs, seed=1)
    synthetic(tmp_path, "new", cs, seed=2)
    rc = gate(tmp_path, test="welch")
    assert rc.tests_used == () and {m.comparison.test for c in rc.cells for m in c.metrics
                                     if m.decides} == {"welch"}


def test_five_of_a_hundred_cells_dropped_by_twelve_percent_at_the_gate_preset_max(tmp_path):
    # At n = 10, where `repetitions: gate` stops when the rsd stays above 3 %, the moderated
    # t finds each drop credibly beyond the threshold.
    cs = cells(100)
    drop = {c.id: 0.88 for c in cs[::20]}
    synthetic(tmp_path, "base", cs, seed=3, n=10)
    synthetic(tmp_path, "new", cs, seed=4, n=10, drop=drop)
    rc = gate(tmp_path)
    assert {c.cell_id for c in rc.cells if c.verdict is compare.CellVerdict.REGRESSED} == set(drop)
    assert rc.exit_status == 1


@pytest.mark.parametrize("nb,nn", [(1, 1), (1, 5), (5, 1), (4, 10)])
def test_too_few_samples_give_the_insufficient_status_never_0(tmp_path, capsys, nb, nn):
    cs = cells(3)
    synthetic(tmp_path, "base", cs, seed=1, n=nb)
    synthetic(tmp_path, "new", cs, seed=2, n=nn)
    rc = gate(tmp_path)
    assert {c.verdict for c in rc.cells} == {compare.CellVerdict.INSUFFICIENT}
    assert rc.exit_status == compare.UNDECIDED_STATUS == 5
    code, out, _ = run_cli(["compare", "base", "new", "--results", str(tmp_path)], capsys)
    assert code == 5
    assert f"{nb} BASE and {nn} NEW ok samples" in out and "GATE UNDECIDED" in out


def test_a_changed_definition_is_not_compared_as_the_same_cell(tmp_path, capsys):
    import dataclasses
    (c,) = cells(1)
    longer = dataclasses.replace(c, profile=dataclasses.replace(STREAM, duration_s=30))
    assert longer.id == c.id and longer.hash != c.hash
    synthetic(tmp_path, "base", [c], seed=1)
    synthetic(tmp_path, "new", [longer], seed=2)
    rc = gate(tmp_path)
    assert [x.verdict for x in rc.cells] == [compare.CellVerdict.REDEFINED]
    assert rc.exit_status == 1
    code, out, _ = run_cli(["compare", "base", "new", "--results", str(tmp_path)], capsys)
    assert "definition: profile tcp_stream.duration_s: 10 -> 30" in out


def test_junit_has_one_testcase_per_cell(tmp_path, capsys):
    cs = cells(3)
    synthetic(tmp_path, "base", cs, seed=1)
    synthetic(tmp_path, "new", cs, seed=2, drop={cs[0].id: 0.8})
    junit = tmp_path / "gate.xml"
    code, _, _ = run_cli(["compare", "base", "new", "--results", str(tmp_path),
                          "--junit", str(junit)], capsys)
    assert code == 1
    suite = ET.parse(junit).getroot().find("testsuite")
    cases = {tc.get("name"): tc for tc in suite.findall("testcase")}
    assert set(cases) == {c.id for c in cs}
    assert cases[cs[0].id].find("failure") is not None
    assert cases[cs[1].id].find("failure") is None and cases[cs[1].id].find("skipped") is None
    assert suite.get("tests") == "3" and suite.get("failures") == "1"


def test_junit_marks_insufficient_cells_skipped(tmp_path, capsys):
    cs = cells(2)
    synthetic(tmp_path, "base", cs, seed=1, n=1)
    synthetic(tmp_path, "new", cs, seed=2, n=1)
    junit = tmp_path / "gate.xml"
    code, _, _ = run_cli(["compare", "base", "new", "--results", str(tmp_path),
                          "--junit", str(junit)], capsys)
    assert code == 5
    suite = ET.parse(junit).getroot().find("testsuite")
    assert all(tc.find("skipped") is not None for tc in suite.findall("testcase"))
    assert suite.get("skipped") == "2"


def test_variants_in_one_run_compare_like_two_runs(tmp_path, capsys):
    """`compare RUN --variants a b` gives the verdicts and exit status of two runs."""
    from testbed.measure import variants
    from testbed.topology.model import Variant
    cs = cells(4)
    vs = (Variant("a"), Variant("b", machine="pc"))
    rng = np.random.default_rng(5)
    values = {c.id: ([2000 * rng.normal(1, 0.02) for _ in range(5)],
                     [2000 * (0.8 if i == 0 else 1.0) * rng.normal(1, 0.02) for _ in range(5)])
              for i, c in enumerate(cs)}
    ab = {}
    for vc in variants.expand(cs, vs):
        base_id = vc.id.removesuffix(f"-v{variants.variant_of(vc)}")
        side = 0 if variants.variant_of(vc) == "a" else 1
        ab[vc] = [(stream_metrics(v), cpu(1.6, 1.4, 1.6)) for v in values[base_id][side]]
    write_run(tmp_path, "ab", ab)
    write_run(tmp_path, "base", {c: [(stream_metrics(v), cpu(1.6, 1.4, 1.6)) for v in values[c.id][0]]
                                 for c in cs})
    write_run(tmp_path, "new", {c: [(stream_metrics(v), cpu(1.6, 1.4, 1.6)) for v in values[c.id][1]]
                                for c in cs})
    two = gate(tmp_path)
    rec = compare.load("ab", tmp_path)
    one = compare.compare_runs(rec, rec, variants=("a", "b"))
    assert [(c.cell_id, c.verdict) for c in one.cells] == [(c.cell_id, c.verdict) for c in two.cells]
    assert one.cells[0].verdict is compare.CellVerdict.REGRESSED
    assert one.exit_status == two.exit_status == 1
    code, out, _ = run_cli(["compare", "ab", "--variants", "a", "b", "--results", str(tmp_path)], capsys)
    assert code == 1 and "REGRESSED" in out
    code, _, err = run_cli(["compare", "ab", "--variants", "a", "c", "--results", str(tmp_path)], capsys)
    assert code == 2 and "no variant 'c'" in err
