"""`testbed bench gate`: nights replayed through the sequential design as `testbed run
--decide-against BASE` runs it (:mod:`testbed.analysis.sequential`), under real nights'
conditions.

Per night: BASE (pooled with the ``pool`` accepted nights before it, as a nightly chain has
them) and NEW are drawn by :func:`testbed.bench.gate.night`; look 1 compares them; the cells
it leaves undecided get their planned extra NEW samples (the night's same levels, a fixed
count: the second stage has no stopping rule); look 2 decides on the combined samples.
:func:`chain` keeps BASE as `examples/nightly/nightly.sh` does (a passing night becomes the
baseline) through a sequence of nights with a lasting step in one cell. Everything is
seeded.

Targets, each printed with its figure: nights with a 2 % shared drift and nothing changed
exit 1 and exit 5 on at most 1 night in 20 each; a uniform -2 % shift fails no night; a
true -8 % in a cell is called unchanged in at most 1 % of cells; a +20 % integer p99 in 10
of 100 cells is found in at least 80 % of them.
"""
from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from testbed.analysis import baseline, compare, sequential
from testbed.bench import gate
from testbed.records.records import RunRecord

#: nights of each scenario by default; the whole bench stays within a few minutes on 2 cores
NIGHTS = 6
CELLS = 100


@dataclass(frozen=True)
class SeqScenario:
    name: str
    nights: int
    reps: str = "5"
    noise: float = 0.03
    kind: str = "normal"
    fail_p: float = 0.0
    #: the night's shared factor: standard deviation, and its AR(1) coefficient night to night
    drift: float = 0.0
    ar: float = 0.0
    tau: float = 0.0                # each cell's own run-to-run effect (lognormal sd)
    uniform: float = 0.0            # every NEW cell moves by this (a change of the whole build)
    drop: float = 0.0               # relative loss of the dropped cells
    dropped: int = 0
    p99_up: float = 0.0             # rise of the p99 of the first ``p99_cells`` rr cells
    p99_cells: int = 0
    rr: int = 0                     # request/response cells among the night's
    #: a spell of a slow host: ``spells`` cells a night measured ``spell`` slower in their
    #: first stage only (the samples measured again are at the night's level)
    spell: float = 0.0
    spells: int = 0
    pool: int = 2                   # older nights pooled with BASE
    #: False: the run does not record its stopping rule, so the gate cannot allow for it
    declare: bool = True

    @property
    def real_change(self) -> bool:
        """The build changed beyond the threshold somewhere (a failing night is right)."""
        return bool(self.dropped and self.drop > 0.05) or abs(self.uniform) > 0.05 or bool(self.p99_cells)


@dataclass(frozen=True)
class SeqOutcome:
    scenario: SeqScenario
    exit_counts: dict[int, int]
    false_regression_nights: int    # nights failing on cells (or a shift) that did not change
    false_cells: int
    detected: int                   # changed cells called regressed
    changed_total: int
    changed_unchanged: int          # changed cells called unchanged (a missed change)
    changed_passed: int             # ... unchanged, not-worse or improved
    shift_failed: int               # nights whose shared shift failed
    remeasured_cells: int
    extra_samples: int
    first_samples: int
    look1_exit5: int
    seconds: float

    @property
    def nights(self) -> int:
        return self.scenario.nights


def _factors(rng: np.random.Generator, sc: SeqScenario, n: int) -> list[float]:
    """n nights' shared factors, oldest first: AR(1) with stationary sd ``drift``."""
    e, out = rng.standard_normal() * sc.drift, []
    for _ in range(n):
        out.append(max(0.05, 1.0 + e))
        e = sc.ar * e + math.sqrt(1.0 - sc.ar ** 2) * sc.drift * rng.standard_normal()
    return out


def more(tpl_samples: dict, new: RunRecord, plan: Iterable[sequential.Remeasure], rng: np.random.Generator,
         sc: SeqScenario, levels: dict[str, float], p99: dict[str, float] | None = None) -> RunRecord:
    """NEW with each planned cell's extra samples appended at the night's same levels."""
    out = list(new.samples)
    reps: dict[str, int] = {}
    for s in new.samples:
        reps[s.cell.id] = max(reps.get(s.cell.id, 0), s.rep + 1)
    for r in plan:
        s = tpl_samples[r.cell_id]
        vals = levels[r.cell_id] * gate.noise(rng, sc.kind, sc.noise, r.extra)
        out += [gate.sample(s, new.run_id, reps.get(r.cell_id, 0) + k, v, rng, sc.noise, sc.fail_p,
                            (p99 or {}).get(r.cell_id, 1.0)) for k, v in enumerate(vals)]
    return dataclasses.replace(new, samples=tuple(out))


def decide_night(tpl: RunRecord, base: RunRecord, older: Sequence[RunRecord], rng: np.random.Generator,
                 sc: SeqScenario, design: sequential.Design, levels: dict[str, float],
                 p99: dict[str, float] | None = None, run_id: str = "new", first: dict[str, float] | None = None
                 ) -> tuple[sequential.Sequential, RunRecord, RunRecord]:
    """One `--decide-against` night: NEW drawn at ``levels`` (its first stage at ``first``
    when given: a spell), both looks against BASE pooled with ``older``; the decision, NEW
    as look 1 saw it, and NEW with its second stage."""
    tpl_samples = {s.cell.id: s for s in tpl.samples}
    new = gate.night(tpl, run_id, rng, noise=sc.noise, reps=sc.reps, fail_p=sc.fail_p, declare=sc.declare,
                     kind=sc.kind, levels=first or levels, p99=p99)
    pooled, _ = baseline.pooled_base(base, older)
    rc1, *_ = sequential.look1(pooled, new, design)
    plan, _ = sequential.plan_remeasure(rc1, design)
    combined = more(tpl_samples, new, plan, rng, sc, levels, p99) if plan else None
    sq = sequential.decide(pooled, new, combined, design, remeasured=plan)
    return sq, new, combined or new


def simulate(sc: SeqScenario, tpl: RunRecord, design: sequential.Design, seed: int = 0) -> SeqOutcome:
    t0 = time.monotonic()
    ids = [s.cell.id for s in tpl.samples]
    rr_ids = [i for i in ids if i.endswith("tcp_rr")]
    dropped = set(ids[:sc.dropped])
    p99 = {i: 1.0 + sc.p99_up for i in rr_ids[:sc.p99_cells]}
    changed = dropped | set(p99)
    scale = {i: 1.0 - sc.drop for i in dropped}
    if sc.uniform:
        scale = {i: scale.get(i, 1.0) * (1.0 + sc.uniform) for i in ids}
    exits: dict[int, int] = {}
    fr_nights = fr_cells = det = unch = passed = shift_failed = again = extra = first = l1_5 = 0
    passing = (compare.CellVerdict.UNCHANGED, compare.CellVerdict.NOT_WORSE, compare.CellVerdict.IMPROVED)
    for k in range(sc.nights):
        rng = np.random.default_rng([seed, 7, k])
        f = _factors(rng, sc, sc.pool + 2)
        older = [gate.night(tpl, f"old{j}", rng, noise=sc.noise, reps=sc.reps, fail_p=sc.fail_p,
                            declare=sc.declare, kind=sc.kind, factor=f[j], tau=sc.tau) for j in range(sc.pool)]
        base = gate.night(tpl, "base", rng, noise=sc.noise, reps=sc.reps, fail_p=sc.fail_p, declare=sc.declare,
                          kind=sc.kind, factor=f[-2], tau=sc.tau)
        lv = gate.levels(tpl, rng, scale=scale, factor=f[-1], tau=sc.tau)
        slow = rng.choice([i for i in ids if i not in changed], size=sc.spells, replace=False) if sc.spells else ()
        spelled = {**lv, **{i: lv[i] * (1.0 - sc.spell) for i in slow}} if sc.spells else None
        sq, new, _ = decide_night(tpl, base, older[::-1], rng, sc, design, lv, p99, first=spelled)
        exits[sq.exit_status] = exits.get(sq.exit_status, 0) + 1
        l1_5 += sq.look1.exit_status == compare.UNDECIDED_STATUS
        bad = [c for c in sq.final.failing if c.cell_id not in changed]
        shift_bad = bool(sq.final.failing_shifts) and abs(sc.uniform) <= 0.05
        fr_cells += len(bad)
        fr_nights += bool(bad) or shift_bad
        shift_failed += bool(sq.final.failing_shifts)
        for c in sq.final.cells:
            if c.cell_id in changed:
                det += c.verdict is compare.CellVerdict.REGRESSED
                unch += c.verdict is compare.CellVerdict.UNCHANGED
                passed += c.verdict in passing
        again += len(sq.remeasured)
        extra += sum(r.extra for r in sq.remeasured)
        first += sum(1 for s in new.samples if not s.warmup)
    return SeqOutcome(sc, exits, fr_nights, fr_cells, det, len(changed) * sc.nights, unch, passed,
                      shift_failed, again, extra, first, l1_5, time.monotonic() - t0)


def scenarios(nights: int = NIGHTS, cells: int = CELLS) -> tuple[SeqScenario, ...]:
    """The scenarios (a tenth of the cells request/response with integer percentiles; all
    of them in the p99 one, a tenth of those with a p99 20 % higher), ``nights`` each."""
    rr = cells // 10
    n = nights
    return (SeqScenario("unchanged n=5", n, rr=rr),
            SeqScenario("unchanged, BASE alone", n, rr=rr, pool=0),
            SeqScenario("2% shared drift", n, drift=0.02, rr=rr),
            SeqScenario("2% drift AR(1) 0.7", n, drift=0.02, ar=0.7, rr=rr),
            SeqScenario("2% drift, gate reps", n, drift=0.02, reps="gate", rr=rr),
            SeqScenario("1% run-to-run per cell", n, drift=0.02, tau=0.01, rr=rr),
            SeqScenario("lognormal 3%", n, kind="lognormal", rr=rr),
            SeqScenario("heavy tails t3", n, kind="heavy", rr=rr),
            SeqScenario("bimodal", n, kind="bimodal", rr=rr),
            SeqScenario("transient 0.1%/sample", n, fail_p=0.001, drift=0.02, rr=rr),
            # the outer host slows the vCPUs for a while: three cells' first samples 30 % slow
            SeqScenario("slow spell, 3 cells -30%", n, drift=0.02, spell=0.30, spells=3, rr=rr),
            SeqScenario("uniform -2%", n, uniform=-0.02, rr=rr),
            SeqScenario("uniform -3%", n, uniform=-0.03, rr=rr),
            SeqScenario("uniform -8% (whole build)", n, uniform=-0.08, rr=rr),
            SeqScenario("-8% in 10 cells", n, drop=0.08, dropped=10, drift=0.02, rr=rr),
            SeqScenario("-10% in 10 cells", n, drop=0.10, dropped=10, drift=0.02, rr=rr),
            # a build that slows one attachment mode: a third of the night's cells move together
            SeqScenario("-10% in a third (a mode)", n, drop=0.10, dropped=cells * 3 // 10, drift=0.02, rr=rr),
            SeqScenario("integer p99 +20% in 1/10 rr", n, p99_up=0.20, p99_cells=cells // 10, rr=cells))


def run(nights: int = NIGHTS, cells: int = CELLS, seed: int = 0, design: sequential.Design | None = None,
        which: Iterable[SeqScenario] | None = None) -> list[SeqOutcome]:
    design = design or sequential.Design()
    todo = list(which if which is not None else scenarios(nights, cells))
    tpls: dict[int, RunRecord] = {}
    out = []
    for sc in todo:
        if sc.rr not in tpls:
            tpls[sc.rr] = gate.with_template(cells, sc.rr)
        out.append(simulate(sc, tpls[sc.rr], design, seed))
    return out


def _rate(a: int, b: int) -> str:
    return f"{a}/{b} {a / b:.0%}" if b else "-"


def format_outcomes(rows: list[SeqOutcome]) -> str:
    head = (f"{'scenario':<27} {'nights':>6} {'exit0':>5} {'exit1':>5} {'exit5':>5} {'false-regr':>10} "
            f"{'detected':>12} {'called unch':>11} {'passed':>7} {'shift fail':>10} {'again/night':>11} "
            f"{'extra/first':>11} {'s':>4}")
    lines = [head]
    for o in rows:
        n = o.nights
        lines.append(
            f"{o.scenario.name:<27} {n:>6} {o.exit_counts.get(0, 0):>5} {o.exit_counts.get(1, 0):>5} "
            f"{o.exit_counts.get(5, 0):>5} {f'{o.false_regression_nights}n/{o.false_cells}c':>10} "
            f"{_rate(o.detected, o.changed_total):>12} "
            f"{o.changed_unchanged if o.changed_total else '-':>11} {o.changed_passed if o.changed_total else '-':>7} "
            f"{o.shift_failed:>10} {o.remeasured_cells / n:>11.1f} "
            f"{o.extra_samples / max(o.first_samples, 1):>11.0%} {o.seconds:>4.0f}")
    return "\n".join(lines)


def targets(rows: list[SeqOutcome]) -> list[str]:
    """The targets, each with its figure and whether it is met."""
    by = {o.scenario.name: o for o in rows}
    out = []

    def line(what: str, a: int, b: int, ok: bool) -> None:
        out.append(gate.target_line(what, a, b, ok))
    if (d := by.get("2% shared drift")) is not None:
        line("2% drift, unchanged: exit 1 on at most 1 night in 20", d.exit_counts.get(1, 0), d.nights,
             d.exit_counts.get(1, 0) / d.nights <= 1 / 20)
        line("2% drift, unchanged: exit 5 on at most 1 night in 20", d.exit_counts.get(5, 0), d.nights,
             d.exit_counts.get(5, 0) / d.nights <= 1 / 20)
    if (w := by.get("slow spell, 3 cells -30%")) is not None:
        line("a slow spell at look 1 fails no night", w.false_regression_nights, w.nights,
             w.false_regression_nights == 0)
    if (u := by.get("uniform -2%")) is not None:
        line("uniform -2%: no night fails (unless its shift fails)", u.exit_counts.get(1, 0) - u.shift_failed,
             u.nights, u.exit_counts.get(1, 0) == u.shift_failed)
    if (e := by.get("-8% in 10 cells")) is not None and e.changed_total:
        line("-8% called unchanged in at most 1% of cells", e.changed_unchanged, e.changed_total,
             e.changed_unchanged <= 0.01 * e.changed_total)
    if (g := by.get("-10% in a third (a mode)")) is not None and g.changed_total:
        line("-10% in 30% of the cells (one mode) found in at least 80% of them", g.detected, g.changed_total,
             g.detected >= 0.8 * g.changed_total)
    if (p := by.get("integer p99 +20% in 1/10 rr")) is not None and p.changed_total:
        line("+20% integer p99 (a tenth of rr cells) found in at least 80% of them", p.detected, p.changed_total,
             p.detected >= 0.8 * p.changed_total)
    return out


# --------------------------------------------------------------------------- the chain

@dataclass(frozen=True)
class ChainOutcome:
    sequences: int
    nights: int
    exit_counts: dict[int, int]
    false_cells: int                # cells failing that did not change
    step_found: int                 # sequences whose stepped cell regressed within 7 nights
    absorbed: int                   # sequences where a night with the step became the baseline
    step: float
    seconds: float
    traces: tuple[str, ...] = ()    # each sequence's exit statuses, night by night


def chain(sequences: int = 4, nights: int = 10, cells: int = 40, step: float = 0.07, step_at: int = 3,
          seed: int = 0, fail_p: float = 0.001, drift: float = 0.02, reps: str = "gate",
          design: sequential.Design | None = None) -> ChainOutcome:
    """BASE kept as `examples/nightly/nightly.sh` keeps it: the first night passes and is the
    baseline; each night is decided against it, pooled with the last nights decided (each
    for the cells it passed, as `--decide-against` pools them from the results directory);
    a passing night becomes the baseline. From ``step_at`` on, one cell is ``step`` lower
    for good; absorbed: a night with the step passed (and so became the baseline) within 7
    nights of it."""
    t0 = time.monotonic()
    design = design or sequential.Design()
    tpl = gate.with_template(cells, cells // 4)
    sc = SeqScenario("chain", nights, reps=reps, fail_p=fail_p, drift=drift, rr=cells // 4)
    victim = tpl.samples[0].cell.id
    exits: dict[int, int] = {}
    false = found = absorbed = 0
    traces: list[str] = []
    for q in range(sequences):
        rng = np.random.default_rng([seed, 11, q])
        f = _factors(rng, sc, nights)
        base = gate.night(tpl, "n000", rng, noise=sc.noise, reps=reps, fail_p=fail_p, factor=f[0])
        older: list[tuple[RunRecord, frozenset[str]]] = []     # the decided nights, newest first
        hit = took = False
        trace: list[int] = []
        for t in range(1, nights):
            scale = {victim: 1.0 - step} if t >= step_at else {}
            lv = gate.levels(tpl, rng, scale=scale, factor=f[t])
            sq, _, combined = decide_night(tpl, base, older, rng, sc, design, lv, run_id=f"n{t:03d}")
            exits[sq.exit_status] = exits.get(sq.exit_status, 0) + 1
            trace.append(sq.exit_status)
            false += sum(1 for c in sq.final.failing if c.cell_id != victim or t < step_at)
            within = step_at <= t < step_at + 7
            hit |= within and any(c.cell_id == victim and c.verdict is compare.CellVerdict.REGRESSED
                                  for c in sq.final.cells)
            passed = frozenset(c.cell_id for c in sq.final.cells if c.verdict.value in baseline.LENDS)
            older = ([(combined, passed)] + older)[:baseline.POOL_NIGHTS + 1]
            if sq.exit_status == 0:
                took |= within
                base = combined
        found += hit
        absorbed += took
        traces.append("".join(map(str, trace)))
    return ChainOutcome(sequences, nights - 1, exits, false, found, absorbed, step, time.monotonic() - t0,
                        tuple(traces))


def format_chain(c: ChainOutcome) -> str:
    n = c.sequences * c.nights
    step = (f"a lasting {-c.step:+.0%} step in one cell from night 3 found within 7 nights in "
            f"{c.step_found}/{c.sequences}, absorbed into the baseline in {c.absorbed}/{c.sequences}"
            if c.step else "nothing changed")
    return (f"chain (BASE kept as nightly.sh keeps it, gate reps, 0.1% failed samples, 2% drift, {step}): "
            f"{c.sequences} sequences x {c.nights} nights: exit 0 {c.exit_counts.get(0, 0)}/{n}, exit 1 "
            f"{c.exit_counts.get(1, 0)}, exit 5 {c.exit_counts.get(5, 0)}; false regressions {c.false_cells} "
            f"cells; exits night by night {' '.join(c.traces)} ({c.seconds:.0f} s)")


def main(nights: int = NIGHTS, cells: int = CELLS, seed: int = 0, sequences: int = 4) -> int:
    if cells < 20:
        from testbed.host.safeio import UserFileError
        raise UserFileError("--cells", f"{cells}: the gate bench needs at least 20 cells a night "
                                       "(a tenth request/response, ten changed in the drop scenarios)")
    design = sequential.Design()
    rows = run(nights, cells, seed, design=design)
    t, q1, q2 = design.levels(5, 5)
    print(f"sequential gate (`testbed run --decide-against BASE`): {cells} cells a night (a tenth "
          f"request/response with integer P50/P90/P99), 3% noise unless named, BASE pooled with "
          f"{SeqScenario('x', 1).pool} nights before it (as `--decide-against` pools the last nights decided) "
          f"unless 'alone'; {design.describe(t, q1, q2)}")
    print(format_outcomes(rows))
    print("false-regr: nights (n) and cells (c) failing that did not change (a failing shift counts when "
          "the build moved less than the threshold); detected: changed cells regressed; called unch: "
          "changed cells called unchanged; passed: ... unchanged, not-worse or improved; shift fail: "
          "nights whose shared shift failed")
    for line in targets(rows):
        print(line)
    print(format_chain(chain(sequences=sequences, seed=seed, design=design, step=0.0)))
    print(format_chain(chain(sequences=sequences, seed=seed, design=design)))
    h = gate.history_sim(sequences=50, seed=seed, heavy_sequences=200, host_sequences=25)
    print(gate.format_history(h))
    for line in gate.history_targets(h):
        print(line)
    return 0
