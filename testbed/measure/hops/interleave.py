"""A traced cell and its untraced self (testbed.measure.hops.twins), measured interleaved in
one run. ``measure`` gives both to the one
cell loop (testbed.measure.sampling.measure) as two arms on the same path, so they are
sampled in A B B A rounds, each under its own stopping rule, with the noise guard, host
guard and checks of every other schedule; the run's hook (testbed.measure.hops.hook) traces
the twin's samples. Afterwards each round's cost of tracing, the untraced sample beside the
traced one of the same round, goes into run.json (testbed.measure.hops.overhead).
"""
from __future__ import annotations

import os
from collections.abc import Sequence

from testbed.measure import sampling
from testbed.measure.context import Arm, Context
from testbed.measure.hops import overhead
from testbed.measure.hops.hook import HopsHook
from testbed.measure.hops.twins import traced
from testbed.topology.model import Cell


def measure(ctx: Context, cells: Sequence[Cell], paths: Sequence[object]) -> dict:
    """``cells`` (a cell and its traced twin, or a traced cell whose twin was measured before
    a resume) through the one cell loop on the first path; returns the cost record written
    to run.json under ``hops`` (the twin's id)."""
    for h in ctx.hooks:
        if isinstance(h, HopsHook):
            h.writer = ctx.writer       # the tracers' own output, kept beside the tool's
    arms = [Arm(c, (paths[0],), by_pair=False) for c in cells]
    got = dict(zip(cells, sampling.measure(ctx, arms)))
    twin = next(c for c in cells if traced(c))
    plain = next((c for c in cells if not traced(c)), None)
    spec = next((h.spec for h in ctx.hooks if isinstance(h, HopsHook)), None)
    bound = spec.overhead_bound if spec is not None else 0.05
    rec = overhead.summary(overhead.rounds(got.get(plain, []) if plain else [], got[twin]), bound,
                           os.cpu_count())
    if plain is None:
        rec["note"] = "the untraced twin was measured before the run was resumed: tracing cost not measured"
    elif spec is None:
        rec["note"] = "no hop tracer in this run: the traced twin was measured untraced"
    traced_ok = [s for s in got[twin] if s.ok and isinstance(s.data.get("hops"), dict)]
    hook = next((h for h in ctx.hooks if isinstance(h, HopsHook)), None)
    counted = hook.counted.get(twin.hash) if hook is not None else None
    if counted is not None:
        # the sample that counted BPF's run time (a warm-up's is in no round's pair)
        rec["tracers"] = counted
        bpf = (counted.get("host") or {}).get("bpf") or {}
        if "bpf_cores" not in rec and isinstance(bpf.get("cores"), (int, float)):
            rec["bpf_cores"], rec["bpf_ns_per_run"] = bpf["cores"], bpf.get("ns_per_run")
    elif traced_ok:
        rec["tracers"] = traced_ok[-1].data["hops"].get("tracers", {})
    ctx.writer.put(overhead.Costs({**(ctx.writer.record.get("hops") or {}),
                                   twin.id: {"untraced": plain.id if plain else None, **rec}}))
    ctx.progress(f"{twin.id}: {rec.get('note') or 'tracing cost not measured'}")
    return rec


__all__ = ["measure"]
