"""The nights' shared shift in `testbed history`: what every cell of one host moved by together
on one night, estimated from the cells themselves and taken out before each cell is judged.

A hypervisor's nights differ by a percent or two in every cell at once (thermal state,
firmware, neighbours), and the drift lasts: a warm week, a noisy neighbour that stays. Judged
cell by cell, a drift shared by the night's cells is noise every series carries, and a
lasting one looks like a step in all of them at once. The nightly gate takes such a shift
out of a comparison of two runs (testbed.analysis.shift); this is the same idea over a
series of runs:

- each cell's level is the median of its logs over the runs, and each night's **shift** is
  the location that the majority of the cells' residuals share that night, in a median
  polish (Tukey's robust two-way fit: cell levels, then night shifts, then the levels
  again): first the Hodges-Lehmann location, then, on nights of MAJORITY_CELLS cells or
  more, Tukey's biweight with each cell on its own nightly noise
  (testbed.analysis.shift.majority_location), which a group of cells that fell together
  (one attachment mode) does not move;
- a night with fewer than MIN_CELLS comparable cells has no shift estimated (0: with four,
  one stepped cell would move it);
- the shifts are centred on their median night, so the cells' judged values stay near what
  was measured.

The caller judges each cell on its values divided by the night's factor, and the series of
shifts itself as a series of its own: a lasting step there is every cell slower together (the
host, or the whole build), a finding the job reports, not one regression per cell.

Pure: values in, shifts out.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from testbed.analysis import shift

#: fewer comparable cells than this on a night: no shift estimated (one cell that really
#: stepped among four moves their Hodges-Lehmann location by about a third of its step)
MIN_CELLS = 5
#: rounds of the median polish (levels, then shifts): the third changed no shift by more
#: than 0.01 % on the bench's nights
ROUNDS = 3
#: the shifts are taken out only when they vary from night to night more than their own
#: estimation noise explains, by this factor of variances at least (about two standard
#: errors of a variance ratio over 30 nights): on a host without a shared drift, taking a
#: shift out only adds its noise to every cell
EVIDENT = 1.5
#: below this many cells a night, each cell's own shift leaves the cell out: its own step
#: would otherwise move the shift it is judged after (a -5 % step in one cell of eight lost
#: about a tenth of itself); above it, one cell's weight is small and the leave-one-out
#: estimates cost a Hodges-Lehmann per cell and night
LEAVE_ONE_OUT = 20
#: from this many cells a night, the night's shift is the biweight location of the majority
#: (testbed.analysis.shift.majority_location), as in the nightly gate; with fewer, each
#: cell's nightly noise says too little, and on hosts of 8 cells sharing a lasting drift the
#: biweight alarmed in 5 of 200 unchanged series against the Hodges-Lehmann's 3
MAJORITY_CELLS = shift.MIN_TAU_CELLS


@dataclass(frozen=True)
class Shifts:
    """The nights' shared shifts (log scale, centred on the median night) and each cell's own
    (the night's without that cell: what the cell is judged after)."""

    nights: dict[str, float]
    cells: dict[str, dict[str, float]]
    #: each night's estimation variance of a cell's own shift (log scale): the caller adds it
    #: to the cell's point, whose noise it now is
    noise: dict[str, float]


def _hl(x: list[float]) -> float:
    return shift.walsh_interval(x, 0.05)[0]


def _scales(logs: Mapping[str, Mapping[str, float]], level: Mapping[str, float],
            nights: Mapping[str, float]) -> dict[str, float]:
    """Each cell's nightly noise: the robust spread (1.4826 MAD) of its residuals over the
    runs, floored at a tenth of the cells' median one (a cell measured on few runs)."""
    raw = {}
    for c, by_run in logs.items():
        e = np.array([y - level[c] - nights.get(r, 0.0) for r, y in by_run.items()])
        raw[c] = 1.4826 * float(np.median(np.abs(e - np.median(e)))) if e.size >= 3 else math.nan
    known = [v for v in raw.values() if math.isfinite(v) and v > 0]
    typical = float(np.median(known)) if known else 0.01
    return {c: max(v, typical / 10) if math.isfinite(v) and v > 0 else typical for c, v in raw.items()}


def _mad_noise(e: list[float]) -> float:
    """A night's shift variance from its cells' residual spread, as a Hodges-Lehmann's
    (efficiency 0.955): the noise of a night whose shift is the Hodges-Lehmann, or whose
    biweight gave no standard error of its own."""
    a = np.asarray(e)
    return (1.4826 * float(np.median(np.abs(a)))) ** 2 / (0.955 * a.size)


def _without(c: str, r: str, cs: list[str], logs, level, scale) -> float:
    """Night ``r``'s shift from its cells but ``c``, estimated as the night's was."""
    rest = [o for o in cs if o != c]
    if len(cs) < MAJORITY_CELLS:
        return _hl([logs[o][r] - level[o] for o in rest])
    return shift.majority_location([logs[o][r] - level[o] for o in rest], [scale[o] for o in rest])[0]


def take_out(values: Mapping[str, Mapping[str, float]], min_cells: int = MIN_CELLS) -> Shifts | None:
    """The shifts of ``values`` (cell -> run id -> its value, positive), or None when no
    night has ``min_cells`` cells or the shifts are not evident (EVIDENT)."""
    logs = {c: {r: math.log(v) for r, v in by_run.items() if v > 0} for c, by_run in values.items()}
    logs = {c: by_run for c, by_run in logs.items() if by_run}
    runs: dict[str, list[str]] = {}
    for c, by_run in logs.items():
        for r in by_run:
            runs.setdefault(r, []).append(c)
    runs = {r: cs for r, cs in runs.items() if len(cs) >= min_cells}
    if len(runs) < 3:
        return None
    level = {c: float(np.median(list(by_run.values()))) for c, by_run in logs.items()}
    nights: dict[str, float] = {}
    for _ in range(ROUNDS):
        nights = {r: _hl([logs[c][r] - level[c] for c in cs]) for r, cs in runs.items()}
        level = {c: float(np.median([y - nights.get(r, 0.0) for r, y in by_run.items()]))
                 for c, by_run in logs.items()}
    # Then each night's shift as the location the majority of its cells share (the biweight,
    # each cell on its own nightly noise): a build that slowed a group of cells (one
    # attachment mode) moves the Hodges-Lehmann shift about a third of the way with them
    # (from MAJORITY_CELLS a night, as in the nightly gate; with fewer, the Hodges-Lehmann's)
    scale = _scales(logs, level, nights)
    noise = {r: _mad_noise([logs[c][r] - level[c] - nights[r] for c in cs]) for r, cs in runs.items()}
    big = {r: cs for r, cs in runs.items() if len(cs) >= MAJORITY_CELLS}
    for _ in range(ROUNDS if big else 0):
        for r, cs in big.items():
            nights[r], se, _ = shift.majority_location([logs[c][r] - level[c] for c in cs],
                                                       [scale[c] for c in cs])
            noise[r] = se ** 2 if math.isfinite(se) else _mad_noise([logs[c][r] - level[c] - nights[r] for c in cs])
        level = {c: float(np.median([y - nights.get(r, 0.0) for r, y in by_run.items()]))
                 for c, by_run in logs.items()}
    centre = float(np.median(list(nights.values())))
    spread = 1.4826 * float(np.median(np.abs(np.array(list(nights.values())) - centre)))
    if spread ** 2 < EVIDENT * float(np.mean(list(noise.values()))):
        return None
    own = {}
    for c, by_run in logs.items():
        own[c] = {r: (_without(c, r, runs[r], logs, level, scale)
                      if c in runs[r] and len(runs[r]) < LEAVE_ONE_OUT else nights[r]) - centre
                  for r in by_run if r in runs}
    # a cell's own shift leaves one of the night's cells out
    noise = {r: v * len(runs[r]) / (len(runs[r]) - 1) if len(runs[r]) < LEAVE_ONE_OUT else v
             for r, v in noise.items()}
    return Shifts({r: s - centre for r, s in nights.items()}, own, noise)
