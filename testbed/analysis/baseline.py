"""The baseline a nightly gate decides against: BASE pooled with the store's last nights.

Five samples of one night bound a comparison's precision however many NEW samples are
taken: at 3 % noise the change's standard error is at least 1.34 %, and no rule can both
pass a hundred unchanged cells on 19 nights of 20 and pass a true -8 % in at most 1 % of
cells. So `testbed run --decide-against BASE` pools BASE with the last nights beside it
that the gate decided (testbed.measure.decide.baseline_history), each lending the cells
it passed or could not judge for want of BASE samples (:data:`LENDS`), its samples scaled
onto BASE's level by the nights' shared shift (:func:`night_factor`). A BASE cell short
of samples (one old failed sample) heals the same way.

Pure: run records in, a run record out.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Sequence

from testbed.records.records import RunRecord

#: BASE and at most this many other nights the gate decided make the baseline, each night
#: for the cells it passed: five samples of one night bound the precision however many NEW
#: samples are taken (at 3 % noise no cell can be shown within +-5 % often enough for a
#: hundred-cell night to exit 0)
POOL_NIGHTS = 4
#: cell verdicts whose samples a night lends the baseline: those it passed, and those it
#: could not judge for want of BASE samples (a BASE short of samples says nothing against
#: NEW's; lending them is what heals it). A cell that regressed or stayed inconclusive (a
#: step the gate could not call yet) lends nothing.
LENDS = ("unchanged", "not-worse", "improved", "insufficient", "no-baseline")


def _cell_means(rec: RunRecord) -> dict[tuple[str, str], dict[str, float]]:
    """(cell id, definition hash) -> metric -> mean of the run's ok measured samples."""
    acc: dict[tuple[str, str], dict[str, list[float]]] = {}
    for s in rec.samples:
        if s.warmup or not s.ok:
            continue
        d = acc.setdefault((s.cell.id, str(s.cell.hash)), {})
        for k, v in s.metrics.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
                d.setdefault(k, []).append(float(v))
    return {key: {k: sum(v) / len(v) for k, v in d.items()} for key, d in acc.items()}


def night_factor(base: RunRecord, older: RunRecord) -> dict[str, float]:
    """Per metric, the factor that puts ``older``'s samples on BASE's level: the exp of the
    Hodges-Lehmann shift of the cells' log(BASE / older) (the nights' shared drift), for
    metrics with at least shift.MIN_CELLS cells in both runs; the cells' own differences
    stay (they are what pooling averages out)."""
    from testbed.analysis import shift
    mb, mo = _cell_means(base), _cell_means(older)
    ratios: dict[str, list[float]] = {}
    for key in set(mb) & set(mo):
        for k in set(mb[key]) & set(mo[key]):
            ratios.setdefault(k, []).append(math.log(mb[key][k] / mo[key][k]))
    return {k: math.exp(shift.walsh_interval(v, 0.05)[0]) for k, v in ratios.items()
            if len(v) >= shift.MIN_CELLS}


def pooled_base(base: RunRecord, older: Sequence[RunRecord | tuple[RunRecord, Collection[str] | None]]
                ) -> tuple[RunRecord, tuple[str, ...]]:
    """BASE with the measured ok samples of ``older`` nights (newest first) added to the
    cells they share with it (same id and definition hash), each night's samples scaled by
    :func:`night_factor` onto BASE's level; and one line per night pooled. A night given
    with cell ids lends only those (the cells the gate passed that night: a cell it could
    not decide, or that regressed, never becomes baseline). A BASE cell short of ok samples
    (one old failure) is filled this way too: the gate never stays undecided for it."""
    if not older:
        return base, ()
    have = {(s.cell.id, str(s.cell.hash)) for s in base.samples if not s.warmup}
    out = list(base.samples)
    notes = []
    for item in older:
        rec, cells = item if isinstance(item, tuple) else (item, None)
        if rec.run_id == base.run_id:
            continue
        if apart := _not_comparable(base, rec):
            notes.append(f"night {rec.run_id} not pooled: {apart}")
            continue
        f = night_factor(base, rec)
        added, lent = 0, set()
        for s in rec.samples:
            if (s.warmup or not s.ok or (s.cell.id, str(s.cell.hash)) not in have
                    or (cells is not None and s.cell.id not in cells)):
                continue
            metrics = {k: (v * f[k] if k in f and isinstance(v, (int, float)) and not isinstance(v, bool) else v)
                       for k, v in s.metrics.items()}
            out.append(dataclasses.replace(s, run_id=base.run_id, rep=10_000 + len(out), metrics=metrics))
            added += 1
            lent.add(s.cell.id)
        if added:
            drift = ", ".join(f"{k} x{v:.3f}" for k, v in sorted(f.items()) if k in _GATED) or "no shared metric"
            notes.append(f"baseline pooled with night {rec.run_id}: {added} samples of {len(lent)} cells ({drift})")
    return dataclasses.replace(base, samples=tuple(out)), tuple(notes)


_GATED = ("throughput_mbps", "transactions_per_s")


def _not_comparable(base: RunRecord, night: RunRecord) -> str:
    """Why a night's samples cannot stand in BASE's (what `testbed compare` refuses between
    them: another accelerator or comparable class, format, host or CPU model), or ''. A
    night's samples are scaled onto BASE's level only by the drift the two share; a TCG
    night beside a KVM BASE shares no level at all."""
    from testbed.analysis.compare import Severity, differences
    apart = [d for d in differences(base, night)
             if d.severity in (Severity.FORBIDDEN, Severity.HOST) or d.what == "cpu_model"]
    return "; ".join(f"{d.what} {d.base} -> {d.new}" for d in apart)
