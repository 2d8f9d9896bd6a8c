"""`testbed run TOPOLOGY --decide-against BASE`: the nightly run and its gate in one step.

1. The topology is measured as `testbed run` does (its own repetitions).
2. Look 1 of the sequential design (:mod:`testbed.analysis.sequential`) compares BASE with
   the run.
3. The cells it leaves undecided (insufficient, inconclusive, or a failure rate that rose
   but not credibly: one transient failure is measured again, never a red night) are
   measured again in the same run directory, through the runner's resume machinery
   (cells matched by definition hash), each for a fixed count of further samples within
   the budget.
4. Look 2 decides them on the combined samples at the spent level.

The run records it: run.json's ``second_stage`` (the cells measured again), and beside it
``decision.json`` (the design, both looks' counts, every cell measured again with its
count and why, the final verdicts) and ``decision.txt`` (what was printed). The exit
status is the gate's: 0 pass, 1 fail, 5 undecided, 2 refused.
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from testbed.analysis import sequential
from testbed.errors import TestbedError
from testbed.host import diskspace
from testbed.measure import runner
from testbed.records import results
from testbed.topology.model import Topology


class NotDecidable(TestbedError):
    """A topology the second stage cannot measure again cell by cell."""

    exit_status = 2


def check(t: Topology) -> None:
    """Refused before anything is measured: variants are measured in rounds of all their
    cells, and a rate search is its own sequence, so neither can add samples to one cell."""
    if t.matrix.variants:
        raise NotDecidable(f"{t.source}: matrix.variants: --decide-against measures cells "
                           f"again one by one; compare variants with `testbed compare RUN --variants A B`")


@dataclass(frozen=True)
class Decided:
    run_dir: Path
    sequential: sequential.Sequential
    text: str

    @property
    def exit_status(self) -> int:
        return self.sequential.exit_status


def run(t: Topology, base_dir: Path, design: sequential.Design,
        progress: Callable[[str], None] = lambda s: None) -> Decided:
    check(t)
    base = results.read_run(base_dir)
    out = runner.execute(t, progress=progress)
    new1 = results.read_run(out.run_dir)
    rc1, _, q1, _ = sequential.look1(base, new1, design)
    plan, _ = sequential.plan_remeasure(rc1, design) if rc1.refused is None else ((), ())
    hashes = {c.id: c.hash for c in runner.plan(t)}
    plan = tuple(r for r in plan if r.cell_id in hashes)
    combined = None
    if plan:
        progress(f"look 1 (q1 {q1:.4f}): {len(plan)} undecided cells measured again, "
                 f"{sum(r.extra for r in plan)} samples: " + ", ".join(f"{r.cell_id} +{r.extra}" for r in plan))
        runner.execute(t, progress=progress, resume=out.run_dir,
                       remeasure={hashes[r.cell_id]: r.extra for r in plan})
        combined = results.read_run(out.run_dir)
    sq = sequential.decide(base, new1, combined, design, remeasured=plan)
    text = sequential.render_text(sq)
    summary = {**sq.summary(), "base": str(base.dir), "run": str(out.run_dir),
               "first_stage_samples": dict(sequential.stage_counts(new1)),
               "cells": [{"id": c.cell_id, "verdict": c.verdict.value} for c in sq.final.cells]}
    # Written whole or not at all, and a full disk is one line (as every run file).
    diskspace.write_file(out.run_dir / "decision.json", json.dumps(summary, indent=1, default=str) + "\n",
                         out.run_dir)
    diskspace.write_file(out.run_dir / "decision.txt", text, out.run_dir)
    return Decided(out.run_dir, sq, text)


def design_from_args(args) -> sequential.Design:
    kw = {}
    for name in ("budget", "extra", "threshold", "spending"):
        v = getattr(args, f"seq_{name}", None)
        if v is not None:
            kw[name] = v
    if getattr(args, "seq_fdr", None) is not None:
        kw["q"] = args.seq_fdr
    return dataclasses.replace(sequential.Design(), **kw)

