"""testbed history: series from the results index (SQLite), change points by ruptures,
exit 1 when the newest run starts a regression, and the report's history plot."""
from __future__ import annotations

import numpy as np
import pytest
from test_compare import RR, STREAM, run_cli
from test_gate import synthetic

from testbed.analysis import history
from testbed.bench import gate
from testbed.records import store
from testbed.topology.model import Attachment, Backend, Cell

pytestmark = pytest.mark.unit

S = Cell(Attachment("bridge"), Backend.QEMU, 1500, 1, STREAM)
R = Cell(Attachment("bridge"), Backend.QEMU, 1500, 1, RR)


def indexed_nights(root, cs: list[Cell], drops: list[dict[str, float]], *, seed0: int = 0,
                   start: int = 0) -> list[str]:
    """One run a night of the cells ``cs`` from night ``start``, each cell's level times its
    factor in that night's ``drops``; indexed."""
    ids = []
    for i, drop in enumerate(drops, start=start):
        run_id = f"2026110{i // 10}T{i % 10:02d}0000Z-{i:04x}"
        synthetic(root, run_id, cs, seed=seed0 + i, noise=0.02, drop=drop)
        ids.append(run_id)
    with store.open(root / "index.sqlite") as st:
        for r in ids:
            st.index_run(root / r)
    return ids


def nightly(root, n_runs: int, *, step_at: int | None, factor: float = 0.85, env: dict | None = None,
            start: int = 0) -> list[str]:
    """n_runs runs of the stream cell, which drops by ``factor`` from run ``step_at`` on."""
    return indexed_nights(root, [S], [{S.id: factor} if step_at is not None and i >= step_at else {}
                                      for i in range(start, start + n_runs)], start=start)


def test_a_step_in_one_cell_of_twelve_runs_is_found_at_its_run(tmp_path, capsys):
    ids = nightly(tmp_path, 12, step_at=7)
    with store.open(tmp_path / "index.sqlite") as st:
        (s,) = history.series(st)
    assert [p.run_id for p in s.points] == ids
    (cp,) = s.change_points
    assert cp.run_id == ids[7] and cp.regression and cp.delta_pct == pytest.approx(-15, abs=3)
    # within the newest WINDOW runs and confirmed by the four after it: fails the job
    assert s.newest_regresses
    html = tmp_path / "history.html"
    code, out, _ = run_cli(["history", "--results", str(tmp_path), "-o", str(html)], capsys)
    assert code == 1 and f"last good {ids[6]}, first bad {ids[7]}" in out
    assert "<- CHANGE" in out and ids[7] in out.split("<- CHANGE")[0].splitlines()[-1]
    page = html.read_text()
    assert "History and change points" in page and ids[7] in page and "regression" in page


def test_no_step_no_change_point(tmp_path, capsys):
    nightly(tmp_path, 12, step_at=None)
    code, out, _ = run_cli(["history", "--results", str(tmp_path)], capsys)
    assert code == 0 and "0 change point(s)" in out and "CHANGE" not in out


def test_a_lone_low_newest_run_is_suspect_not_a_regression(tmp_path, capsys):
    ids = nightly(tmp_path, 12, step_at=11)
    code, out, _ = run_cli(["history", "--results", str(tmp_path), "--cell", S.id], capsys)
    assert code == 0 and "\nREGRESSION " not in out
    assert f"SUSPECT {S.id} throughput_mbps: newest run {ids[11]}" in out


def test_a_few_low_nights_are_not_yet_a_step(tmp_path, capsys):
    # unlucky nights in a row happen; a step needs history.CONFIRM runs behind it
    assert history.CONFIRM == 5
    nightly(tmp_path, 12, step_at=8)
    code, out, _ = run_cli(["history", "--results", str(tmp_path), "--cell", S.id], capsys)
    assert code == 0 and "\nREGRESSION " not in out


def test_a_step_confirmed_by_the_runs_after_it_exits_1(tmp_path, capsys):
    ids = nightly(tmp_path, 12, step_at=7)
    code, out, _ = run_cli(["history", "--results", str(tmp_path), "--cell", S.id], capsys)
    assert code == 1 and f"first bad {ids[7]}" in out


def test_an_incomparable_environment_splits_the_series(tmp_path, capsys):
    nightly(tmp_path, 6, step_at=None)
    ids = []
    for i in range(6, 12):
        run_id = f"2026110{i // 10}T{i % 10:02d}0000Z-{i:04x}"
        from test_compare import cpu, stream_metrics, write_run
        rng = np.random.default_rng(i)
        # TCG: two orders of magnitude slower, never one series with KVM
        write_run(tmp_path, run_id, {S: [(stream_metrics(20 * rng.normal(1, 0.02)),
                                          cpu(1.6, 1.4, 1.6)) for _ in range(5)]},
                  accelerator="tcg", comparable_class="tcg")
        ids.append(run_id)
    with store.open(tmp_path / "index.sqlite") as st:
        for r in ids:
            st.index_run(tmp_path / r)
        found = history.series(st)
    assert sorted(len(s.points) for s in found) == [6, 6]
    assert all(not s.change_points for s in found)
    assert {s.environment.split("/")[0] for s in found} == {"kvm", "tcg"}


def test_change_points_need_an_effect_beyond_the_threshold():
    rng = np.random.default_rng(3)
    small = list(rng.normal(100, 0.5, 8)) + list(rng.normal(98, 0.5, 8))
    assert history.change_points(small) == []           # a real 2 %, below the 5 % that counts
    big = list(rng.normal(100, 2, 8)) + list(rng.normal(88, 2, 8))
    assert [i for i, _, _ in history.change_points(big)] == [8]


def test_an_acknowledged_change_no_longer_fails_the_job(tmp_path, capsys):
    ids = nightly(tmp_path, 12, step_at=7)
    assert run_cli(["history", "--results", str(tmp_path)], capsys)[0] == 1
    code, _, err = run_cli(["history", "--results", str(tmp_path), "--ack", f"{S.id}@{ids[7]}"], capsys)
    assert code == 2 and err.count("\n") == 1 and "--who" in err
    code, out, _ = run_cli(["history", "--results", str(tmp_path), "--ack", f"{S.id}@{ids[7]}",
                            "--who", "ana", "--why", "new QEMU default, accepted"], capsys)
    assert code == 0
    (ack,) = history.read_acks(tmp_path)
    assert ack["by"] == "ana" and ack["why"].startswith("new QEMU") and ack["when"]
    code, out, _ = run_cli(["history", "--results", str(tmp_path)], capsys)
    assert code == 0 and f"acknowledged {S.id}" in out


def test_json_output_carries_points_with_spread(tmp_path, capsys):
    import json
    nightly(tmp_path, 6, step_at=None)
    code, out, _ = run_cli(["history", "--results", str(tmp_path), "--json"], capsys)
    (s, *_) = json.loads(out)
    assert code == 0 and s["points"][0]["n"] == 5 and s["points"][0]["spread"] > 0


def test_the_run_to_run_noise_is_the_biweight_robust_to_a_wild_night_and_tighter_than_the_mad():
    """Sigma's second pass: about the true noise on normal nights, with about two thirds of
    the MAD's spread over 25 nights, and one wild night (x20 sigma) moves it by little."""
    rng = np.random.default_rng(3)
    bi, mad = [], []
    for _ in range(2000):
        r = rng.standard_normal(25)
        bi.append(history.robust_sigma(r))
        mad.append(1.4826 * float(np.median(np.abs(r))))
    assert abs(np.mean(bi) - 1.0) < 0.03 and np.std(bi) < 0.7 * np.std(mad)
    r = rng.standard_normal(25)
    wild = r.copy()
    wild[7] = 20.0
    assert history.robust_sigma(wild) < 1.15 * history.robust_sigma(r)
    assert history.robust_sigma(np.zeros(10)) == 0.0


def _nights(pre: int, step: float, seed: int, post: int = 7, noise: float = 0.024) -> tuple[list, list]:
    """Nights of 5 samples each (a night's noise ``noise``), the level ``step`` lower from
    night ``pre`` on: (means, standard errors), what the index gives history."""
    rng = np.random.default_rng(seed)
    means, ses = [], []
    for i in range(pre + post):
        s = 1000 * (1 + step if i >= pre else 1) * (1 + noise * np.sqrt(5) * rng.standard_normal(5))
        means.append(float(s.mean()))
        ses.append(float(s.std(ddof=1)) / np.sqrt(5))
    return means, ses


def test_a_five_percent_step_is_found_after_twenty_nights_and_held_to_more_evidence_early():
    """With each night's spread and count the noise is known to many degrees of freedom: a
    -5 % step at 2.4 % nightly noise (two sigmas) is found at its night within 7 nights in
    most of 60 sequences, an unchanged series almost never has a step; in a series' first
    MIN_BEFORE nights the same step is held to EARLY_ALPHA and mostly waits."""
    def found(pre: int, step: float, seed: int) -> bool:
        v, se = _nights(pre, step, seed)
        cps = history.change_points(v, stderr=se, counts=[5] * len(v))
        return any(abs(i - pre) <= 1 for i, _, _ in cps) if step else bool(cps)

    late = sum(found(20, -0.05, s) for s in range(60))
    early = sum(found(8, -0.05, s) for s in range(60))
    flat = sum(found(20, 0.0, 500 + s) for s in range(60))
    assert late >= 48 and early <= 0.5 * late and flat <= 2, (late, early, flat)
    # a large step early in a series is still found at its night
    v, se = _nights(7, -0.15, 1, noise=0.02)
    assert [i for i, _, _ in history.change_points(v, stderr=se, counts=[5] * len(v))] == [7]


def test_a_step_spends_its_level_over_the_three_nights_that_first_look_at_it():
    """A step is judged again every night until a week has passed, and each look was a fresh
    chance of a false alarm at the full level. Twenty nights at 1000, then nights 3.3 % lower,
    each night's mean known to 2 % over 5 samples (so the noise is exactly 2 % on 100 degrees
    of freedom): the step's t is 3.30 with 5 runs after it, past the full level's 3.17 but not
    the third spent there (3.48); with 6 runs it is 3.54, past the two thirds spent by then."""
    assert [history.step_alpha(k) for k in (5, 6, 7, 12)] == pytest.approx(
        [history.STEP_ALPHA / 3, 2 * history.STEP_ALPHA / 3, history.STEP_ALPHA, history.STEP_ALPHA])

    def cps(after: int) -> list[int]:
        v = [1000.0] * 20 + [1000.0 * np.exp(-0.033)] * after
        return [i for i, _, _ in history.change_points(v, stderr=[0.02 * x for x in v], counts=[5] * len(v))]

    assert cps(5) == []
    assert cps(6) == [20]
    assert cps(7) == [20]


def test_each_nights_shared_shift_is_recovered_and_a_stepped_cell_does_not_move_it():
    from testbed.analysis import history_shift
    rng = np.random.default_rng(5)
    night = {f"r{i:02d}": float(rng.normal(0, 0.03)) for i in range(20)}
    values = {f"c{c}": {r: 1000.0 * (1 + c) * np.exp(s + rng.normal(0, 0.005)) * (0.8 if c == 0 and i >= 10 else 1)
                        for i, (r, s) in enumerate(night.items())} for c in range(6)}
    got = history_shift.take_out(values)
    centre = float(np.median(list(night.values())))
    # each night's shift within 1 % of the drawn one, although one cell of six fell 20 %;
    # the fallen cell's own shifts leave it out
    assert set(got.nights) == set(night) and max(abs(got.nights[r] - (night[r] - centre)) for r in night) < 0.01
    assert max(abs(got.cells["c0"][r] - (night[r] - centre)) for r in night) < 0.01
    # four cells: no shift (one stepped cell would move it)
    assert history_shift.take_out({c: v for c, v in values.items() if c in ("c0", "c1", "c2", "c3")}) is None
    # nights that differ no more than their cells' noise explains: nothing taken out
    flat = {f"c{c}": {r: 1000.0 * np.exp(rng.normal(0, 0.02)) for r in night} for c in range(8)}
    assert history_shift.take_out(flat) is None


def drifting_nights(root, cs, factors, drops=None) -> list[str]:
    """One run a night of the cells ``cs``, every cell times the night's shared factor (a
    host's drift), a cell's ``drops`` (cell id -> (first night, factor)) on top; indexed."""
    drops = drops or {}
    return indexed_nights(root, cs, [{c.id: f * (drops[c.id][1] if c.id in drops and i >= drops[c.id][0] else 1.0)
                                      for c in cs} for i, f in enumerate(factors)], seed0=100)


def test_a_lasting_shift_of_every_cell_is_one_finding_not_a_regression_per_cell(tmp_path, capsys):
    from test_gate import cells
    cs = cells(8)
    rng = np.random.default_rng(11)
    # 30 nights of a host drifting 1 % night to night, every cell 7 % slower from night 23
    factors = [(0.93 if i >= 23 else 1.0) * (1 + 0.01 * rng.standard_normal()) for i in range(30)]
    ids = drifting_nights(tmp_path, cs, factors)
    code, out, _ = run_cli(["history", "--results", str(tmp_path)], capsys)
    regressions = [ln for ln in out.splitlines() if ln.startswith("REGRESSION")]
    # judged cell by cell, the host's step was eight regressions; it is one, of the shared series
    assert code == 1 and len(regressions) == 1, out
    assert regressions[0].startswith(f"REGRESSION {history.SHARED} throughput_mbps -")
    assert "every cell together, 8 cells" in regressions[0] and f"first bad {ids[23]}" in regressions[0]
    # each cell's points show what was measured and the night's shift taken out of it
    assert "(measured " in out and "the night's shared shift" in out
    html = tmp_path / "history.html"
    assert run_cli(["history", "--results", str(tmp_path), "-o", str(html)], capsys)[0] == 1
    assert "the nights' shift shared by 8 cells" in html.read_text()
    with store.open(tmp_path / "index.sqlite") as st:
        found = history.series(st)
    (shared,) = [s for s in found if s.cell_id == history.SHARED]
    assert shared.cells == tuple(sorted(c.id for c in cs)) and len(shared.points) == 30
    assert shared.recent_regressions()[0].delta_pct == pytest.approx(-7, abs=1.5)


def test_a_cell_that_fell_is_found_while_the_host_got_faster(tmp_path, capsys):
    from test_gate import cells
    cs = cells(8)
    rng = np.random.default_rng(12)
    # the host 6 % faster from night 23 on (a neighbour left) and one cell 8 % slower: as
    # measured, that cell moved -2.5 %, below what a step must be; its own change is -8 %
    factors = [(1.06 if i >= 23 else 1.0) * (1 + 0.005 * rng.standard_normal()) for i in range(30)]
    drifting_nights(tmp_path, cs, factors, drops={cs[3].id: (23, 0.92)})
    code, out, _ = run_cli(["history", "--results", str(tmp_path)], capsys)
    regressions = [ln for ln in out.splitlines() if ln.startswith("REGRESSION")]
    assert code == 1 and len(regressions) == 1 and regressions[0].startswith(f"REGRESSION {cs[3].id} "), out
    assert float(regressions[0].split()[3].rstrip("%:")) == pytest.approx(-8, abs=1.5)
    # one cell asked for is judged as in the whole store: after the shift of every cell
    code, one, _ = run_cli(["history", "--results", str(tmp_path), "--cell", cs[3].id], capsys)
    assert code == 1 and [ln for ln in one.splitlines() if ln.startswith("REGRESSION")] == regressions


def test_a_group_of_cells_that_fell_together_is_found_not_taken_for_the_hosts_shift(tmp_path, capsys):
    from test_gate import cells
    cs = cells(12)
    rng = np.random.default_rng(13)
    # a build that slowed one attachment mode: 5 cells of 12 are 7 % slower from night 23,
    # the host drifting 1 % night to night. A Hodges-Lehmann shift followed such a group
    # about halfway: its cells were found at -3 to -5 %, and the shared series was called a
    # -3.2 % step of every cell (the host, or the whole build). The majority's shift does not
    # follow it: the group's cells alone regress, by their own change
    factors = [1 + 0.01 * rng.standard_normal() for _ in range(30)]
    group = {c.id for c in cs[:5]}
    drifting_nights(tmp_path, cs, factors, drops={c: (23, 0.93) for c in group})
    code, out, _ = run_cli(["history", "--results", str(tmp_path)], capsys)
    regressions = [ln for ln in out.splitlines() if ln.startswith("REGRESSION")]
    assert code == 1 and {ln.split()[1] for ln in regressions} == group, out
    for ln in regressions:
        assert float(ln.split()[3].rstrip("%:")) == pytest.approx(-7, abs=1.5), ln


def test_a_series_too_noisy_for_a_threshold_step_is_held_to_a_level_weighted_by_its_power():
    """The step test's level is weighted by the series' power to see a threshold-sized step
    within a week: a quiet series keeps it, a noisy one is held to less. Thirty unchanged
    nights of 5 samples at 10 % lognormal noise with a 2 % drift, one whose chance pattern
    (the nights after the 12th lower) alarmed on night 17 at the full level: no alarm now.
    The same noise with a lasting -15 % step is still found within a week."""
    quiet = history.power_weight(0.02, 20, 0.05, True)
    noisy = history.power_weight(0.049, 20, 0.05, True)
    assert quiet > 0.99 and 0.1 < noisy < 0.4, (quiet, noisy)

    def nights(seed: list[int], step: float = 0.0, at: int = 30) -> tuple[list[float], list[float]]:
        rng = np.random.default_rng(seed)
        out = []
        for i in range(30):
            s = 1000.0 * (1 + step * (i >= at)) * (1 + 0.02 * rng.standard_normal()) * np.exp(0.1 * rng.standard_normal(5))
            out.append((float(s.mean()), float(s.std(ddof=1))))
        return [m for m, _ in out], [sd for _, sd in out]

    v, sd = nights([7, 9219])
    assert gate.history_replay(v, 0, sd) is None
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(history, "power_weight", lambda *a: 1.0)
        assert gate.history_replay(v, 0, sd) == 17
    found = 0
    for k in range(20):
        v, sd = nights([8, k], -0.15, 18)
        t = gate.history_replay(v, 0, sd)
        found += t is not None and 18 <= t < 25
    assert found >= 17, found


def test_a_step_fails_the_job_for_a_week_from_the_first_night_its_runs_could_confirm_it():
    """A step's change point can land a few nights before the step (chance low nights just
    before it pull it back) and is first confirmed CONFIRM runs after that. It fails the job
    while that first confirmable night lies within the newest WINDOW runs; counted from the
    change point itself, a step placed three nights early was already out of the window on
    the night it was first confirmed, and never failed the job (3 of 200 replayed -5 %
    steps)."""
    def series(n: int, at: int) -> history.Series:
        pts = tuple(history.Point(f"r{i:03d}", "", 1000.0 if i < at else 900.0, 5, 10.0) for i in range(n))
        cp = history.ChangePoint(at, f"r{at:03d}", 1000.0, 900.0, -10.0, True)
        return history.Series("c", "h", "throughput_mbps", "e", pts, (cp,))

    at, first = 16, 16 + history.CONFIRM - 1           # confirmable from run 20 (21 runs)
    assert [series(n, at).newest_regresses for n in range(first, first + 2 + history.WINDOW)] == \
        [False] + [True] * history.WINDOW + [False]
