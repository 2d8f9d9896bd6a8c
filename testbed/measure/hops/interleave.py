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
from testbed.errors import CommandError, GuestError, TestbedError
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


def twin_of(cell: Cell, left: list[Cell]) -> Cell | None:
    """The traced twin that follows ``cell`` in ``left``, taken out of it; else None."""
    if left and traced(left[0]) and not traced(cell) and left[0].profile == cell.profile \
            and dataclasses.replace(left[0], context=cell.context) == cell:
        return left.pop(0)
    return None


def _live(cells: Sequence[Cell], path: measure.TestPath, writer: results.RunWriter,
          placement: Mapping[str, str]) -> bool:
    """The MTU set and checked once for both (they share the path); False: both failed."""
    c = cells[0]
    try:
        measure.set_mtu(path, c.mtu)
        why = measure.check_mtu(path, c.mtu)
    except (CommandError, GuestError, TestbedError) as e:
        why = f"could not set MTU {c.mtu}: {e}"
    if why:
        for x in cells:
            measure.fail_cell(x, writer, why, placement)
        return False
    return True


def measure_pair(plain: Cell, twin: Cell, paths: Sequence[measure.TestPath], writer: results.RunWriter,
                 rule: stats.StoppingRule, warmup: int, qemu_pids: Mapping[str, int],
                 placement: Mapping[str, str], clock_ghz: float | None, watch: window_mod.Watch | None,
                 spec: HopSpec, progress: Callable[[str], None] = lambda s: None) -> dict:
    """Both cells' samples, interleaved; returns the cost record written to run.json."""
    path = paths[0]
    watch = watch or window_mod.Watch()
    watch.begin_cell()
    if not _live((plain, twin), path, writer, placement):
        return {}
    with tempfile.TemporaryDirectory(prefix="tb-hops-") as tmp:
        session = HopSession(twin, path, spec, tmp, lambda name, text: writer.write_raw(twin.id, name, text))
        with session.prepared():
            ACTIVE[twin.hash] = session
            try:
                rec = _rounds(plain, twin, path, writer, rule, warmup, qemu_pids, placement, clock_ghz,
                              watch, spec)
            finally:
                ACTIVE.pop(twin.hash, None)
            rec["tracers"] = session.describe()
    hops = dict(writer.record.get("hops") or {})
    hops[twin.id] = {"untraced": plain.id, **rec}
    writer.update(hops=hops)
    progress(f"{twin.id}: {rec.get('note') or 'tracing cost not measured'}")
    return rec


def _rounds(plain: Cell, twin: Cell, path: measure.TestPath, writer: results.RunWriter,
            rule: stats.StoppingRule, warmup: int, qemu_pids: Mapping[str, int],
            placement: Mapping[str, str], clock_ghz: float | None, watch: window_mod.Watch,
            spec: HopSpec) -> dict:
    def sample(c: Cell, rep: int, warm: bool):  # noqa: ANN202
        return measure.sample_paths(c, [path], writer, rep, warm, qemu_pids, placement, clock_ghz, watch,
                                    by_pair=False)
    for w in range(warmup):
        for c in round_order((plain, twin), w):
            writer.add_sample(sample(c, w, True))
    counted = {c: measure.CellSamples(c, rule) for c in (plain, twin)}
    more = {plain: True, twin: True}
    pairs: list[dict] = []
    rnd = 0
    while any(more.values()):
        got = {}
        for c in round_order((plain, twin), rnd):
            while True:
                s = sample(c, len(counted[c].samples), False)
                writer.add_sample(s)
                if s.status != "noisy":
                    break
                watch.settle(qemu_pids)
            got[c] = s
            # both keep going while either needs more, so every round has its pair
            more[c] = counted[c].add(s) and len(counted[c].samples) < rule.repetitions.max_samples
        if got[plain].ok and got[twin].ok:
            pairs.append(overhead.pair(rnd, got[plain], got[twin]))
        rnd += 1
    for c in (plain, twin):
        counted[c].finish(writer)
    return overhead.summary(pairs, spec.overhead_bound)


__all__ = ["expand", "measure_pair", "traced", "twin_of"]
