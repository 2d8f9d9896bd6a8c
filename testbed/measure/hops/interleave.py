"""A traced cell and its untraced self, measured interleaved in one run.

``expand`` puts a traced twin (context ``hops: traced``, id ``...-hops``) right after each
cell whose profile asks for hops; the twin has its own definition hash, so the untraced
cell stays the same test it was before tracing existed. ``measure_pair`` samples them in
A B B A rounds (testbed.measure.variants.round_order) on the same path, each under its own
stopping rule, both until both are done; the traced samples get their tracers around the
window (the sample hook: testbed.measure.hops.window), and each round's cost of tracing
goes into run.json (testbed.measure.hops.overhead).
"""
from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable, Mapping, Sequence

from testbed.analysis import stats
from testbed.measure import sampling as measure
from testbed.measure import window as window_mod
from testbed.measure.hops import overhead
from testbed.measure.hops.hook import ACTIVE
from testbed.measure.hops.session import HopSession
from testbed.measure.variants import round_order
from testbed.records import results
from testbed.topology.model import Cell, HopSpec

def traced(cell: Cell) -> bool:
    return dict(cell.context).get("hops") == "traced"


def expand(cells: Sequence[Cell]) -> list[Cell]:
    """Each cell whose profile asks for hops (one pair), followed by its traced twin."""
    out = []
    for c in cells:
        out.append(c)
        if c.profile.hops and c.pairs == 1 and not traced(c):
            out.append(dataclasses.replace(c, context=tuple(sorted((*c.context, ("hops", "traced"))))))
    return out


def pair_of(cell: Cell, left: list[Cell]) -> tuple[Cell | None, Cell] | None:
    """(untraced, traced) when ``cell`` is measured with tracing: with its traced twin
    (taken out of ``left``, where it follows), or a traced cell alone (its twin was
    measured before a resume: None); else None."""
    if traced(cell):
        return None, cell
    if left and traced(left[0]) and dataclasses.replace(
            left[0], context=tuple(kv for kv in left[0].context if kv[0] != "hops")) == cell:
        return cell, left.pop(0)
    return None


def _live(cells: Sequence[Cell], path: measure.TestPath, writer: results.RunWriter,
          placement: Mapping[str, str]) -> bool:
    """The MTU set and checked once for both (they share the path); False: both failed."""
    why = measure.mtu_reason(path, cells[0].mtu)
    if why:
        for x in cells:
            measure.fail_cell(x, writer, why, placement)
        return False
    return True


def measure_pair(plain: Cell | None, twin: Cell, paths: Sequence[measure.TestPath], writer: results.RunWriter,
                 rule: stats.StoppingRule, warmup: int, qemu_pids: Mapping[str, int],
                 placement: Mapping[str, str], clock_ghz: float | None, watch: window_mod.Watch | None,
                 spec: HopSpec, progress: Callable[[str], None] = lambda s: None) -> dict:
    """Both cells' samples, interleaved; returns the cost record written to run.json.
    Without ``plain`` (measured before a resume), the traced cell alone: no cost then."""
    path = paths[0]
    watch = watch or window_mod.Watch()
    watch.begin_cell()
    cells = (twin,) if plain is None else (plain, twin)
    if not _live(cells, path, writer, placement):
        return {}
    with tempfile.TemporaryDirectory(prefix="tb-hops-") as tmp:
        session = HopSession(twin, path, spec, tmp, lambda name, text: writer.write_raw(twin.id, name, text))
        with session.prepared():
            ACTIVE[twin.hash] = session
            try:
                rec = _rounds(cells, path, writer, rule, warmup, qemu_pids, placement, clock_ghz, watch, spec)
            finally:
                ACTIVE.pop(twin.hash, None)
            rec["tracers"] = session.describe()
    hops = dict(writer.record.get("hops") or {})
    hops[twin.id] = {"untraced": plain.id if plain else None, **rec}
    writer.update(hops=hops)
    progress(f"{twin.id}: {rec.get('note') or 'tracing cost not measured'}")
    return rec


def _rounds(cells: Sequence[Cell], path: measure.TestPath, writer: results.RunWriter,
            rule: stats.StoppingRule, warmup: int, qemu_pids: Mapping[str, int],
            placement: Mapping[str, str], clock_ghz: float | None, watch: window_mod.Watch,
            spec: HopSpec) -> dict:
    def sample(c: Cell, rep: int, warm: bool):  # noqa: ANN202
        return measure.sample_paths(c, [path], writer, rep, warm, qemu_pids, placement, clock_ghz, watch,
                                    by_pair=False)
    for w in range(warmup):
        for c in round_order(cells, w):
            writer.add_sample(sample(c, w, True))
    counted = {c: measure.CellSamples(c, rule) for c in cells}
    more = {c: True for c in cells}
    pairs: list[dict] = []
    rnd = 0
    while any(more.values()):
        got = {}
        for c in round_order(cells, rnd):
            while True:
                s = sample(c, len(counted[c].samples), False)
                writer.add_sample(s)
                if s.status != "noisy":
                    break
                watch.settle(qemu_pids)
            got[c] = s
            # both keep going while either needs more, so every round has its pair
            more[c] = counted[c].add(s) and len(counted[c].samples) < rule.repetitions.max_samples
        if len(cells) == 2 and got[cells[0]].ok and got[cells[1]].ok:
            pairs.append(overhead.pair(rnd, got[cells[0]], got[cells[1]]))
        rnd += 1
    for c in cells:
        counted[c].finish(writer)
    out = overhead.summary(pairs, spec.overhead_bound)
    if len(cells) == 1:
        out["note"] = "the untraced twin was measured before the run was resumed: tracing cost not measured"
    return out


__all__ = ["expand", "measure_pair", "pair_of", "traced"]
