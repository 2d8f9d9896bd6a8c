"""`testbed bench gate`, second part: nights replayed through the sequential design
(:mod:`testbed.analysis.sequential`) as `testbed run --decide-against BASE` runs it.

Per night: BASE and NEW drawn as in :mod:`testbed.bench.gate`; look 1 compares them; the
cells it leaves undecided get their planned extra NEW samples, drawn at a fixed count (the
second stage has no stopping rule), appended to NEW in the order taken; look 2 decides on
the combined samples. Everything is seeded.

Targets (200 unchanged cells at 3 % noise): exit 5 on at most 1 night in 20, a false
regression on at most 1 night in 30, and a 10 % drop found in at least 95 % of cells.
"""
from __future__ import annotations

import dataclasses
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from testbed.analysis import compare, sequential
from testbed.bench import gate
from testbed.records.records import RunRecord

#: nights of the unchanged n=5 scenario (the targets' yardstick); the others run fewer
NIGHTS = 40


@dataclass(frozen=True)
class SeqScenario:
    name: str
    nights: int
    reps: str = "5"
    noise: float = 0.03
    fail_p: float = 0.0
    drop: float = 0.0
    dropped: int = 0
    #: False: the run does not record its stopping rule, so the gate cannot allow for it
    declare: bool = True


@dataclass(frozen=True)
class SeqOutcome:
    scenario: SeqScenario
    exit_counts: dict[int, int]
    false_regression_nights: int
    detected: int
    dropped_total: int
    dropped_unchanged: int          # dropped cells called unchanged (a missed change)
    remeasured_cells: int
    extra_samples: int
    first_samples: int              # NEW samples at look 1, all nights
    look1_exit5: int                # nights look 1 alone would have left undecided
    raw_false_alarms: int           # unchanged cells with raw look-1 p < 0.05
    raw_tests: int
    seconds: float


def _more(tpl_samples: dict, new: RunRecord, plan: Iterable[sequential.Remeasure],
          rng: np.random.Generator, sc: SeqScenario, scale: dict[str, float]) -> RunRecord:
    """NEW with each planned cell's extra samples appended: a fixed count, no stopping rule."""
    out = list(new.samples)
    reps: dict[str, int] = {}
    for s in new.samples:
        reps[s.cell.id] = max(reps.get(s.cell.id, 0), s.rep + 1)
    for r in plan:
        s = tpl_samples[r.cell_id]
        for k in range(r.extra):
            rep = reps[r.cell_id] + k
            if sc.fail_p and rng.random() < sc.fail_p:
                out.append(dataclasses.replace(s, run_id=new.run_id, rep=rep, status="failed",
                                               reason="synthetic transient failure", metrics={}))
            else:
                v = gate.MBPS * scale.get(r.cell_id, 1.0) * rng.normal(1, sc.noise)
                out.append(dataclasses.replace(s, run_id=new.run_id, rep=rep,
                                               metrics={"throughput_mbps": float(v)}))
    return dataclasses.replace(new, samples=tuple(out))


def _topped_up(tpl_samples: dict, base: RunRecord, rng: np.random.Generator, sc: SeqScenario,
               design: sequential.Design) -> RunRecord:
    """BASE as a nightly chain leaves it: BASE was itself a `--decide-against` night, whose
    cells short of ok samples (a transient failure) were measured again."""
    ok: dict[str, int] = {}
    for s in base.samples:
        ok[s.cell.id] = ok.get(s.cell.id, 0) + (1 if s.ok and not s.warmup else 0)
    plan = [sequential.Remeasure(c, design.extra + design.min_samples - n, "short")
            for c, n in ok.items() if n < design.min_samples]
    return _more(tpl_samples, base, plan, rng, sc, {}) if plan else base


def simulate(sc: SeqScenario, tpl: RunRecord, design: sequential.Design, seed: int = 0) -> SeqOutcome:
    t0 = time.monotonic()
    tpl_samples = {s.cell.id: s for s in tpl.samples}
    ids = list(tpl_samples)
    drop_ids = set(ids[:sc.dropped])
    scale = {i: 1.0 - sc.drop for i in drop_ids}
    exits: dict[int, int] = {}
    false_nights = detected = missed = cells_again = extra = first = look1_5 = raw_fa = raw_n = 0
    for k in range(sc.nights):
        rng = np.random.default_rng([seed, 7, k])
        base = gate.night(tpl, "base", rng, noise=sc.noise, reps=sc.reps, fail_p=sc.fail_p, declare=sc.declare)
        new = gate.night(tpl, "new", rng, noise=sc.noise, reps=sc.reps, fail_p=sc.fail_p, scale=scale,
                         declare=sc.declare)
        if sc.fail_p:
            base = _topped_up(tpl_samples, base, rng, sc, design)
        rc1, t, q1, q2 = sequential.look1(base, new, design)
        plan, _ = sequential.plan_remeasure(rc1, design)
        combined = _more(tpl_samples, new, plan, rng, sc, scale) if plan else None
        sq = sequential.decide(base, new, combined, design, remeasured=plan)
        exits[sq.exit_status] = exits.get(sq.exit_status, 0) + 1
        look1_5 += rc1.exit_status == compare.UNDECIDED_STATUS
        false_nights += any(c.cell_id not in drop_ids for c in sq.final.failing)
        for c in sq.final.cells:
            if c.cell_id in drop_ids:
                detected += c.verdict is compare.CellVerdict.REGRESSED
                missed += c.verdict is compare.CellVerdict.UNCHANGED
        cells_again += len(plan)
        extra += sum(r.extra for r in plan)
        first += sum(1 for s in new.samples if not s.warmup)
        for c in rc1.cells:
            if c.cell_id not in drop_ids:
                for m in c.metrics:
                    if m.decides and m.comparison.p_value is not None:
                        raw_n += 1
                        raw_fa += m.comparison.p_value < 0.05
    return SeqOutcome(sc, exits, false_nights, detected, len(drop_ids) * sc.nights, missed,
                      cells_again, extra, first, look1_5, raw_fa, raw_n, time.monotonic() - t0)


def scenarios(nights: int) -> tuple[SeqScenario, ...]:
    """The scenarios, ``nights`` for the unchanged n=5 one (the targets' yardstick), fewer
    for the others so that the whole bench stays within a few minutes on 2 cores."""
    few = max(5, nights // 2)
    return (SeqScenario("unchanged n=5", nights),
            SeqScenario("unchanged gate reps", few, reps="gate"),
            SeqScenario("gate reps, rule hidden", max(5, nights // 4), reps="gate", declare=False),
            SeqScenario("transient 0.5%/sample", max(5, nights // 4), fail_p=0.005),
            SeqScenario("10% drop in 20 cells", few, drop=0.10, dropped=20),
            SeqScenario("10% drop, 10% noise", max(5, nights // 4), noise=0.10, drop=0.10, dropped=20))


def run(nights: int = NIGHTS, cells: int = 200, seed: int = 0,
        design: sequential.Design | None = None,
        which: Iterable[SeqScenario] | None = None) -> list[SeqOutcome]:
    design = design or sequential.Design()
    with tempfile.TemporaryDirectory(prefix="tb-bench-gate-") as tmp:
        tpl = gate.template(cells, Path(tmp))
    return [simulate(sc, tpl, design, seed) for sc in (which if which is not None else scenarios(nights))]


def format_outcomes(rows: list[SeqOutcome]) -> str:
    head = (f"{'scenario':<24} {'nights':>6} {'exit0':>5} {'exit1':>5} {'exit5':>5} {'look1 exit5':>11} "
            f"{'false-regr':>10} {'detected':>13} {'missed->unch':>12} {'again/night':>11} "
            f"{'extra/first':>11} {'raw p<.05':>9} {'s':>5}")
    lines = [head]
    for o in rows:
        n = o.scenario.nights
        det = f"{o.detected}/{o.dropped_total} {o.detected / o.dropped_total:.1%}" if o.dropped_total else "-"
        lines.append(
            f"{o.scenario.name:<24} {n:>6} {o.exit_counts.get(0, 0):>5} {o.exit_counts.get(1, 0):>5} "
            f"{o.exit_counts.get(5, 0):>5} {o.look1_exit5:>11} {o.false_regression_nights:>10} {det:>13} "
            f"{o.dropped_unchanged if o.dropped_total else '-':>12} {o.remeasured_cells / n:>11.1f} "
            f"{o.extra_samples / max(o.first_samples, 1):>11.0%} "
            f"{o.raw_false_alarms / max(o.raw_tests, 1):>9.3f} {o.seconds:>5.0f}")
    return "\n".join(lines)


def targets(rows: list[SeqOutcome]) -> list[str]:
    """The three targets, each with its figure and whether it is met."""
    by = {o.scenario.name: o for o in rows}
    out = []
    if (u := by.get("unchanged n=5")) is not None:
        n = u.scenario.nights
        e5, fr = u.exit_counts.get(5, 0), u.false_regression_nights
        out.append(f"target exit 5 on at most 1 night in 20: {e5}/{n} = {e5 / n:.3f} "
                   f"{'met' if e5 / n <= 1 / 20 else 'NOT met'}")
        out.append(f"target false regression on at most 1 night in 30: {fr}/{n} = {fr / n:.3f} "
                   f"{'met' if fr / n <= 1 / 30 else 'NOT met'}")
    if (d := by.get("10% drop in 20 cells")) is not None and d.dropped_total:
        r = d.detected / d.dropped_total
        out.append(f"target 10% drop found in at least 95% of cells: {d.detected}/{d.dropped_total} = "
                   f"{r:.3f} {'met' if r >= 0.95 else 'NOT met'}")
    return out


def main(nights: int, cells: int = 200) -> None:
    design = sequential.Design()
    rows = run(nights, cells, design=design)
    t, q1, q2 = design.levels(5, 5)
    print()
    print(f"sequential gate (`testbed run --decide-against BASE`): {cells} cells, look 1 then undecided "
          f"cells measured again; {design.describe(t, q1, q2)} (at n = 5 + 5); budget "
          f"{design.total_budget(cells)} extra samples a night")
    print(format_outcomes(rows))
    print("look1 exit5: nights look 1 alone (one comparison) would have left undecided; again/night: "
          "cells measured again; extra/first: extra NEW samples over look 1's; raw p<.05: unchanged "
          "cells' look-1 p below 0.05 (nominal 0.05): the stopping rule's effect, allowed for "
          "('unchanged gate reps') or not ('rule hidden': the run does not record it)")
    for line in targets(rows):
        print(line)
