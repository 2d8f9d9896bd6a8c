"""The nightly gate's second look: undecided cells (and regressions, to confirm them)
measured again, decided by a two-stage group-sequential design that keeps the error rates
it promises.

Look 1 is `compare` of BASE with the night's run, its Benjamini-Hochberg level lowered to
the share of the false-discovery budget that the alpha-spending function gives the first
look (``q1``). Cells that look 1 decides (regressed, improved, unchanged, broken,
redefined, missing) stop. The others (insufficient, inconclusive, or a failure rate that
rose but not credibly) get up to ``extra`` more NEW samples each, within a total
``budget``. Look 2 compares BASE with the combined NEW samples of those cells at the
*spent* level ``q2 = q - q1``. BASE is the last good build: it cannot be measured again,
so only NEW grows.

Why the error rates hold (docs/gate-statistics.md has the figures):
- False regressions. Under the complete null (an unchanged night) Benjamini-Hochberg at a
  level a rejects anything with probability at most a. Look 1 runs at q1, look 2 at
  q2 over the family *as if every cell had gone on* (cells that stopped count with p = 1,
  which is the Benjamini-Hochberg level q2 k2 / m over the k2 p-values of the cells
  that went on, m those of look 1). Stopped cells' p = 1 is never smaller than their
  hypothetical combined p, and BH is monotone in its p-values, so look 2 rejects with
  probability at most q2. Together at most q1 + q2 = q: the second look at the spent
  level. For a night with real changes the false-discovery proportion of the union is at
  most the sum of the two looks' (V/R <= V1/R1 + V2/R2), so the FDR is at most q too.
  The split ignores the positive correlation of the looks (the exact group-sequential
  boundary would allow a slightly higher q2): conservative, and simple to check.
- Missed changes. Both looks call a cell unchanged only by equivalence within
  +-threshold at alpha (two one-sided tests, never scaled by the family), and not-worse
  only by the worse half of it: a change beyond the threshold is passed with probability
  at most alpha a cell, and one of 8 % (a cell at 3 % noise, 5 + 10 samples) almost never.
  There is no wider "margin" at the last look: a cell it cannot show within the threshold
  stays undecided (exit 5), never passes.
- The night's shift (testbed.analysis.shift) is estimated at each look from every cell of
  the run, so look 2 compares BASE with the combined NEW over *all* cells at q2 (the cells
  that stopped bring the same p-values as at look 1; Benjamini-Hochberg at q2 over the
  whole family rejects with probability at most q2 under the complete null) and takes the
  verdicts of the cells measured again from it.

A cell that look 1 calls regressed is measured again too (first, within the budget) and
fails the night only when its new samples, judged alone against BASE with the night's
shift taken out, show it again: a metric look 1 regressed is credibly worse than the
threshold on them at ``alpha``, one-sided (not scaled by the family: look 1 chose the cell
at the family's level). Otherwise it is undecided, never passed. A false regression then
needs two independent tests to reject: under the complete null a night still fails
falsely with probability at most q (a confirmed regression is one look 1 made at q1), and
far less in practice. A spell of a slow host during a cell's first samples (seen on real
nights: one cell at half its rate for ten samples, then at BASE's) is not a red night. The
price is power near the threshold: a true -8 % has to pass the second test too (found in
22 % of cells instead of 27 %; -10 % unchanged, 93 %).

The spending function (Lan and DeMets 1983) gives q1 from the information fraction
t = I1 / I2 of the planned looks; the variance of the relative change with b BASE and n
NEW samples goes as 1/b + 1/n, so t = (1/b + 1/n2) / (1/b + 1/n1).
O'Brien-Fleming type, q1 = 2 - 2 Phi(z_{1-q/2} / sqrt(t)), is the default: it spends little
at look 1 (where most cells are decided anyway, by large effects or by equivalence), and
keeps most of the budget for the cells that needed more samples. Pocock type,
q1 = q ln(1 + (e - 1) t), is the alternative.

Everything here is pure: run records in, verdicts out.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from testbed.analysis import compare, stats
from testbed.analysis.compare import CellResult, CellVerdict, RunComparison
from testbed.analysis.stats import sps
from testbed.records.records import RunRecord, SampleRecord

SPENDING = ("obrien-fleming", "pocock")
#: more NEW samples a cell gets at most in the second stage (tuned on `testbed bench gate`)
EXTRA = 10
#: the design's false-discovery level, both looks together. Under the complete null it
#: bounds the share of nights with a false regression (see the module's docstring): 0.03,
#: below the nightly target of one night in 30, by construction rather than by luck
NIGHTLY_Q = 0.03
#: the last look's margin, as a multiple of the threshold: a cell measured again that is
#: still not shown within the threshold passes when it is, at FINAL_ALPHA, no worse than
#: this (and its estimate within the threshold). 1.5 x 5 % = 7.5 %: a true -8 % passes in at
#: most 1 % of cells, by construction (the one-sided test at the margin)
FINAL_MARGIN = 1.5
FINAL_ALPHA = 0.01


def spent(q: float, t: float, kind: str = "obrien-fleming") -> float:
    """The share of the level ``q`` spent by information fraction ``t`` (0 < t <= 1):
    Lan-DeMets' O'Brien-Fleming-type or Pocock-type spending function."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"q must be in (0, 1), got {q}")
    if not 0.0 < t <= 1.0:
        raise ValueError(f"information fraction must be in (0, 1], got {t}")
    if kind == "obrien-fleming":
        return float(2.0 - 2.0 * sps.norm.cdf(sps.norm.ppf(1.0 - q / 2.0) / math.sqrt(t)))
    if kind == "pocock":
        return float(q * math.log(1.0 + (math.e - 1.0) * t))
    raise ValueError(f"unknown spending function {kind!r}; expected one of {SPENDING}")


def information_fraction(n_base: int, n1: int, n2: int) -> float:
    """I1 / I2 for a relative change measured with ``n_base`` BASE samples against ``n1``
    NEW samples at look 1 and ``n2`` at look 2 (BASE does not grow)."""
    if min(n_base, n1) < 1 or n2 < n1:
        raise ValueError(f"need n_base, n1 >= 1 and n2 >= n1, got {n_base}, {n1}, {n2}")
    return (1.0 / n_base + 1.0 / n2) / (1.0 / n_base + 1.0 / n1)


@dataclass(frozen=True)
class Design:
    """The two-stage design. ``budget`` is the total of extra NEW samples over all cells
    (None: ``extra`` times half the cells, rounded up)."""

    q: float = NIGHTLY_Q
    threshold: float = 0.05
    alpha: float = 0.05
    extra: int = EXTRA
    budget: int | None = None
    spending: str = "obrien-fleming"
    min_samples: int = stats.MIN_SAMPLES
    test: str = "auto"
    #: a cell regressed at look 1 is measured again and fails the night only when its new
    #: samples, judged alone, regress too (a spell of a slow host is not a regression)
    confirm: bool = True

    def __post_init__(self) -> None:
        if not 0.0 < self.q < 1.0:
            raise ValueError(f"q must be in (0, 1), got {self.q}")
        if self.extra < 1:
            raise ValueError(f"extra samples per cell must be >= 1, got {self.extra}")
        if self.budget is not None and self.budget < 0:
            raise ValueError(f"budget must be >= 0, got {self.budget}")
        if self.spending not in SPENDING:
            raise ValueError(f"unknown spending function {self.spending!r}; expected one of {SPENDING}")
        if not 0.0 < self.threshold < 1.0:
            raise ValueError(f"threshold must be in (0, 1), got {self.threshold}")

    def total_budget(self, cells: int) -> int:
        return self.budget if self.budget is not None else self.extra * math.ceil(cells / 2)

    def levels(self, n_base: int, n1: int) -> tuple[float, float, float]:
        """(t, q1, q2): the planned information fraction and the two looks' levels."""
        t = information_fraction(max(n_base, 1), max(n1, 1), max(n1, 1) + self.extra)
        q1 = spent(self.q, t, self.spending)
        return t, q1, self.q - q1

    def describe(self, t: float, q1: float, q2: float) -> str:
        return (f"two-stage group-sequential design, {self.spending} alpha spending at "
                f"information fraction {t:.2f}: look 1 at Benjamini-Hochberg q1 {q1:.4f}, look 2 at "
                f"the spent level q2 = q - q1 = {q2:.4f} (q {self.q}); up to {self.extra} more NEW "
                f"samples a cell; unchanged only within +-{self.threshold:.0%}; at the last look a cell "
                f"{1 - FINAL_ALPHA:.0%} sure no worse than {-FINAL_MARGIN * self.threshold:+.1%} passes as not-worse")


def look1(base: RunRecord, new: RunRecord, design: Design, **kw) -> tuple[RunComparison, float, float, float]:
    """Look 1: `compare` at the first look's spent level, and (t, q1, q2)."""
    n_base, n1 = typical_n(base), typical_n(new)
    t, q1, q2 = design.levels(n_base, n1)
    rc = compare.compare_runs(base, new, threshold=design.threshold, alpha=design.alpha,
                              test=design.test, q=q1, min_samples=design.min_samples, **kw)
    return rc, t, q1, q2


def typical_n(rec: RunRecord) -> int:
    """The median count of ok measured samples per cell (the planned n of a look)."""
    counts: dict[str, int] = {}
    for s in rec.samples:
        if not s.warmup and s.ok:
            counts[s.cell.id] = counts.get(s.cell.id, 0) + 1
    if not counts:
        return stats.MIN_SAMPLES
    vals = sorted(counts.values())
    return vals[len(vals) // 2]


@dataclass(frozen=True)
class Remeasure:
    cell_id: str
    extra: int          # NEW samples asked for
    why: str


#: the reason a regressed cell is measured again; look 2 judges such a cell on its new samples
CONFIRM = "regressed at look 1: measured again to confirm before the night fails"


def _why_more(c: CellResult, min_samples: int, base_grows: bool = False, confirm: bool = False) -> str | None:
    """Why a look-1 cell needs more samples, or None when it is decided (or more NEW
    samples cannot decide it: BASE itself has too few, and only NEW grows). With
    ``base_grows`` (A/B in one run: both variants are measured again) a BASE short of
    samples is topped up too; with ``confirm`` a regressed cell is measured again."""
    if confirm and c.verdict is CellVerdict.REGRESSED:
        return CONFIRM
    if c.verdict is CellVerdict.NO_BASELINE and not base_grows:
        return None
    if c.base_ok < min_samples and not base_grows:
        return None
    if c.verdict.undecided:
        return c.verdict.value
    if c.failure_p is not None and c.verdict is not CellVerdict.BROKEN:
        return "failure rate rose, not credibly: measured again to see whether it persists"
    return None


def _priority(c: CellResult) -> tuple[int, str]:
    # Regressions to confirm first (the night's verdict hangs on them), then cells that
    # could still fail the gate: a change beyond the threshold without significance, then
    # failures, then cells short of samples, then the rest.
    deciding = [m.comparison for m in c.metrics if m.decides]
    beyond = any(m.delta_rel is not None and abs(m.delta_rel) > m.threshold for m in deciding)
    return (-1 if c.verdict is CellVerdict.REGRESSED else 0 if beyond else 1 if c.failure_p is not None
            else 2 if c.verdict is CellVerdict.INSUFFICIENT else 3, c.cell_id)


def plan_remeasure(rc: RunComparison, design: Design,
                   base_grows: bool = False) -> tuple[tuple[Remeasure, ...], tuple[str, ...]]:
    """The cells to measure again, with their extra NEW samples (and, with ``base_grows``,
    as many of BASE's), within the total budget; and the undecided cells left out (BASE
    short of samples, or over the budget), with why."""
    why = {c.cell_id: _why_more(c, design.min_samples, base_grows, design.confirm) for c in rc.cells}
    wanted = sorted((c for c in rc.cells if why[c.cell_id]), key=_priority)
    left = design.total_budget(len(rc.cells))
    out, skipped = [], []
    for c in wanted:
        reason = why[c.cell_id] or ""
        # A cell short of ok NEW samples gets what it lacks on top of the stage's extra;
        # a regression is confirmed on at least min_samples new ones.
        n = design.extra + max(0, design.min_samples - min(c.new_ok, c.base_ok if base_grows else c.new_ok))
        if reason == CONFIRM:
            n = max(n, design.min_samples)
        if n > left:
            skipped.append(f"{c.cell_id}: over the budget ({left} samples left of "
                           f"{design.total_budget(len(rc.cells))})"
                           + ("; look 1's regression stands unconfirmed" if reason == CONFIRM else ""))
            continue
        left -= n
        out.append(Remeasure(c.cell_id, n, reason))
    skipped += [f"{c.cell_id}: BASE has {c.base_ok} ok samples; more NEW samples cannot decide it"
                for c in rc.cells if c.verdict.undecided and why[c.cell_id] is None]
    return tuple(out), tuple(skipped)


@dataclass(frozen=True)
class Sequential:
    """Both looks and the final comparison (look 1's cells, those measured again replaced
    by their look-2 results)."""

    design: Design
    t: float
    q1: float
    q2: float
    look1: RunComparison
    remeasured: tuple[Remeasure, ...]
    skipped: tuple[str, ...]
    look2: RunComparison | None
    final: RunComparison
    q2_effective: float | None = None   # the level look 2 ran at

    @property
    def exit_status(self) -> int:
        return self.final.exit_status

    def summary(self) -> dict:
        return {"design": dataclasses.asdict(self.design), "information_fraction": self.t,
                "q1": self.q1, "q2": self.q2, "q2_effective": self.q2_effective,
                "look1": {"exit_status": self.look1.exit_status, "counts": self.look1.counts()},
                "remeasured": [dataclasses.asdict(r) for r in self.remeasured],
                "skipped": list(self.skipped),
                "final": {"exit_status": self.final.exit_status, "counts": self.final.counts()}}


def final_look(m: stats.Comparison, margin: float) -> stats.Comparison:
    """An inconclusive comparison at the last look: NOT_WORSE when its change is, at level
    FINAL_ALPHA, no worse than ``margin`` (the one-sided test at the margin) and its
    estimate not beyond the threshold; else as it was. Never UNCHANGED: that stays the
    equivalence test's within the threshold."""
    ev = m.evidence
    if m.verdict is not stats.Verdict.INCONCLUSIVE or ev is None:
        return m
    sign = 1.0 if m.higher_is_better else -1.0
    worse = stats.limits(m)[0]
    far = math.log(max(1e-9, 1.0 - margin)) if m.higher_is_better else math.log1p(margin)
    bound = sign * ev.d - stats.t_ppf(1.0 - FINAL_ALPHA, ev.df) * ev.se
    if sign * ev.d < sign * worse or bound <= sign * far:
        return m
    return dataclasses.replace(m, verdict=stats.Verdict.NOT_WORSE, note="; ".join(filter(None, [
        m.note, f"last look: {1 - FINAL_ALPHA:.0%} sure no worse than {-margin:+.1%} (bound "
                f"{math.expm1(sign * bound):+.1%}), estimate within the threshold: not worse"])))


def finish_cell(c: CellResult, margin: float) -> CellResult:
    """A cell measured again, with :func:`final_look` applied to its deciding metrics."""
    if c.verdict is not CellVerdict.INCONCLUSIVE or not c.metrics:
        return c
    ms = tuple(dataclasses.replace(m, comparison=final_look(m.comparison, margin)) if m.decides else m
               for m in c.metrics)
    deciding = [m.comparison.verdict for m in ms if m.decides]
    worst = next(v for v in compare._WORST if v in deciding)
    return dataclasses.replace(c, metrics=ms, verdict=CellVerdict(worst.value))


def after_look1(rec: RunRecord, counts: Mapping[str, int], ids: Iterable[str]) -> RunRecord:
    """``rec`` with the cells ``ids`` (ids without a variant's suffix) holding only the
    measured samples taken after look 1 (the complement of :func:`first_stage`, warm-ups and
    noisy samples dropped too): the samples that confirm a look-1 regression, alone."""
    ids = set(ids)
    keep = [s for s, k in _in_order(rec)
            if s.cell.plain_id not in ids or (k is not None and k >= counts.get(s.cell.id, 0))]
    return dataclasses.replace(rec, samples=tuple(keep))


def _regressed(c: CellResult) -> dict[str, stats.Comparison]:
    return {m.metric: m.comparison for m in c.metrics
            if m.decides and m.comparison.verdict is stats.Verdict.REGRESSED}


def confirmed(first: CellResult, again: CellResult | None, alpha: float) -> CellResult:
    """A cell regressed at look 1, after it was measured again (``again``: BASE against its
    new samples alone, the night's shift taken out). The regression stands only when the
    new samples show it too: a metric look 1 regressed is, on them alone, credibly worse
    than the threshold at ``alpha`` (its one-sided test against the threshold, not scaled by
    the family: look 1 already chose the cell at the family's level), or the cell fails on
    them (its samples fail). A false regression then needs two independent tests to
    reject, and a spell of a slow host at look 1 is not one. Otherwise the cell is
    undecided (exit 5), never passed."""
    was = _regressed(first)
    at1 = ", ".join(f"{k} {c.delta_pct:+.1f}%" for k, c in was.items() if c.delta_pct is not None)
    at1 = at1 or first.verdict.value
    if again is None or again.new_ok + again.new_failed == 0:
        return dataclasses.replace(first, note="; ".join(filter(None, [
            first.note, "nothing measured again: look 1's regression stands unconfirmed"])))
    n = again.new_ok + again.new_failed
    if again.verdict.fails_gate:
        return dataclasses.replace(again, note="; ".join(filter(None, [
            again.note, f"confirmed: regressed at look 1 ({at1}) and on the {n} samples measured again"])))
    sure = {m.metric for m in again.metrics if m.metric in was and m.comparison.p_worse is not None
            and m.comparison.p_worse < alpha}
    if sure:
        ms = tuple(dataclasses.replace(m, comparison=dataclasses.replace(
            stats.decide(m.comparison, level=alpha), note="; ".join(filter(None, [
                m.comparison.note, f"confirmation: on the samples measured again, p {m.comparison.p_worse:.2g} "
                                   f"that it is no worse than the threshold, below {alpha:g}"]))))
                   if m.metric in sure else m for m in again.metrics)
        return dataclasses.replace(again, metrics=ms, verdict=CellVerdict.REGRESSED, note="; ".join(filter(None, [
            again.note, f"confirmed: regressed at look 1 ({at1}) and on the {n} samples measured again "
                        f"({', '.join(sorted(sure))})"])))
    return dataclasses.replace(again, verdict=CellVerdict.INCONCLUSIVE, note="; ".join(filter(None, [
        again.note, f"regressed at look 1 ({at1}), not confirmed by the {n} samples measured again "
                    f"({again.verdict.value}): undecided"])))


def look2(base: RunRecord, combined: RunRecord, first: RunComparison, remeasured: Sequence[Remeasure],
          design: Design, q2: float, at_look1: Mapping[str, int] | None = None, base_grows: bool = False,
          **kw) -> tuple[RunComparison | None, RunComparison, float | None]:
    """Look 2: BASE against the combined NEW (every cell: the night's shift needs them all)
    at the spent level q2; the final comparison takes the cells measured again from it and
    keeps look 1's verdicts for the others (and look 1's shifts where look 1 decided them).
    A cell measured again to confirm its look-1 regression is judged on its new samples
    alone (``at_look1``: NEW's measured samples per cell at look 1; ``base_grows``: BASE is
    the run itself, its new samples alone too)."""
    if not remeasured:
        return None, first, None
    ids = {r.cell_id for r in remeasured}
    rc2 = compare.compare_runs(base, combined, threshold=design.threshold, alpha=design.alpha,
                               test=design.test, q=q2, min_samples=design.min_samples, **kw)
    if rc2.refused:
        return rc2, first, q2
    second = {c.cell_id: finish_cell(c, FINAL_MARGIN * design.threshold) for c in rc2.cells if c.cell_id in ids}
    again = {r.cell_id for r in remeasured if r.why == CONFIRM}
    if again and at_look1 is not None:
        fresh = after_look1(combined, at_look1, again)
        rc_c = compare.compare_runs(after_look1(base, at_look1, again) if base_grows else base, fresh,
                                    threshold=design.threshold, alpha=design.alpha, test=design.test, q=q2,
                                    min_samples=design.min_samples, **kw)
        judged = {c.cell_id: c for c in rc_c.cells}
        was = {c.cell_id: c for c in first.cells}
        second.update({i: confirmed(was[i], judged.get(i), design.alpha) for i in again if i in was})
    cells = tuple(second.get(c.cell_id, c) for c in first.cells)
    decided = {s.metric: s for s in first.shifts
               if s.comparison.verdict in (stats.Verdict.REGRESSED, stats.Verdict.IMPROVED)}
    shifts = tuple(decided.get(s.metric, s) for s in rc2.shifts)
    final = dataclasses.replace(first, cells=cells, q=design.q, shifts=shifts,
                                tests_used=first.tests_used + tuple(f"{t} (look 2)" for t in rc2.tests_used))
    return rc2, final, q2


def decide(base: RunRecord, new: RunRecord, combined: RunRecord | None, design: Design,
           remeasured: Sequence[Remeasure] | None = None, **kw) -> Sequential:
    """Both looks from run records: ``new`` as it was at look 1, ``combined`` with the
    second stage's samples added (None: no second stage was measured). ``remeasured`` is
    what was asked (default: the plan from look 1)."""
    rc1, t, q1, q2 = look1(base, new, design, **kw)
    plan, skipped = plan_remeasure(rc1, design)
    if remeasured is None:
        remeasured = plan
    if combined is None or not remeasured:
        return Sequential(design, t, q1, q2, rc1, tuple(remeasured), skipped, None, rc1)
    rc2, final, q_eff = look2(base, combined, rc1, remeasured, design, q2, at_look1=stage_counts(new), **kw)
    return Sequential(design, t, q1, q2, rc1, tuple(remeasured), skipped, rc2, final, q_eff)


def decide_ab(run: RunRecord, combined: RunRecord | None, design: Design, pair: tuple[str, str],
              remeasured: Sequence[Remeasure] | None = None) -> Sequential:
    """Both looks of an A/B run: variant ``pair[1]`` against ``pair[0]`` of ``run`` (as it
    was at look 1) and of ``combined`` (both variants of the cells measured again grown).
    BASE grows with NEW here, so a BASE short of samples is topped up, not left undecided."""
    rc1, t, q1, q2 = look1(run, run, design, variants=pair)
    plan, skipped = plan_remeasure(rc1, design, base_grows=True)
    if remeasured is None:
        remeasured = plan
    if combined is None or not remeasured:
        return Sequential(design, t, q1, q2, rc1, tuple(remeasured), skipped, None, rc1)
    rc2, final, q_eff = look2(combined, combined, rc1, remeasured, design, q2, at_look1=stage_counts(run),
                              base_grows=True, variants=pair)
    return Sequential(design, t, q1, q2, rc1, tuple(remeasured), skipped, rc2, final, q_eff)


def render_text(sq: Sequential) -> str:
    lines = [compare.render_text(sq.final).rstrip("\n")]
    lines.append(sq.design.describe(sq.t, sq.q1, sq.q2)
                 + ("" if sq.q2_effective is None else
                    f"; look 2 over every cell at q2 {sq.q2_effective:.4f}, verdicts taken for the "
                    f"{len(sq.remeasured)} measured again"))
    c1 = ", ".join(f"{n} {v}" for v, n in sorted(sq.look1.counts().items()))
    lines.append(f"look 1: {c1}; measured again: {len(sq.remeasured)} cells, "
                 f"{sum(r.extra for r in sq.remeasured)} NEW samples (budget "
                 f"{sq.design.total_budget(len(sq.look1.cells))})")
    lines.extend(f"  again: {r.cell_id} +{r.extra} ({r.why})" for r in sq.remeasured)
    lines.extend(f"  not again: {s}" for s in sq.skipped)
    return "\n".join(lines) + "\n"


def _in_order(rec: RunRecord) -> Iterable[tuple[SampleRecord, int | None]]:
    """Each sample with its place among its cell's measured samples (ok or failed, in the
    order taken), None for a warm-up or a noisy one: the one count that says where look 1's
    samples end (:func:`stage_counts`, :func:`first_stage`, :func:`after_look1`)."""
    seen: dict[str, int] = {}
    for s in rec.samples:
        if s.warmup or s.status == "noisy":
            yield s, None
            continue
        k = seen.get(s.cell.id, 0)
        seen[s.cell.id] = k + 1
        yield s, k


def stage_counts(rec: RunRecord) -> Mapping[str, int]:
    """Measured (non-warm-up) samples per cell, ok or not: where look 1's samples end."""
    out: dict[str, int] = {}
    for s, k in _in_order(rec):
        if k is not None:
            out[s.cell.id] = k + 1
    return out


def first_stage(rec: RunRecord, counts: Mapping[str, int]) -> RunRecord:
    """``rec`` as it was at look 1: each cell's first ``counts[cell]`` measured samples (in
    the order taken) and its warm-ups."""
    keep = [s for s, k in _in_order(rec) if k is None or k < counts.get(s.cell.id, 0)]
    return dataclasses.replace(rec, samples=tuple(keep))
