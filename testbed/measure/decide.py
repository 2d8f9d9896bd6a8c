"""`testbed run TOPOLOGY --decide-against BASE`: the nightly run and its gate in one step.

1. The topology is measured as `testbed run` does (its own repetitions).
2. Look 1 of the sequential design (:mod:`testbed.analysis.sequential`) compares BASE with
   the run.
3. The cells it leaves undecided (insufficient, inconclusive, or a failure rate that rose
   but not credibly: one transient failure is measured again, never a red night) are
   measured again in the same run directory, through the runner's resume machinery
   (cells matched by definition hash), each for a fixed count of further samples within
   the budget.
   A cell look 1 regressed is measured again first, to confirm it.
4. Look 2 decides them on the combined samples at the spent level; a regression to confirm
   on its new samples alone (it stands only when they show it too).

BASE is pooled with the last nights beside it that the gate decided (their decision.json),
each lending the cells it passed: five samples of one night bound the precision however
many NEW samples are taken. With ``matrix.variants`` the run is A/B: ``--decide-against a`` judges variant b
against variant a measured interleaved in the same run, and the undecided cells are
measured again on both variants (the drift of the night falls on both alike).

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

from testbed.analysis import baseline, sequential
from testbed.errors import TestbedError
from testbed.host import diskspace
from testbed.measure import runner
from testbed.records import results
from testbed.topology.model import Topology


class NotDecidable(TestbedError):
    """A topology the second stage cannot measure again cell by cell."""

    exit_status = 2


def check(t: Topology, against: str | None = None) -> tuple[str, str] | None:
    """Refused before anything is measured; for a topology with ``matrix.variants``, the
    variants (BASE, NEW) the gate compares: ``against`` names the baseline variant, the
    other of exactly two is NEW (A/B in one run: the host's drift falls on both alike)."""
    if not t.matrix.variants:
        return None
    names = [v.name for v in t.matrix.variants]
    if len(names) != 2 or against not in names:
        raise NotDecidable(f"{t.source}: matrix.variants: --decide-against names the baseline variant of "
                           f"exactly two (this topology has {', '.join(names)}; got {against!r})")
    return against, next(n for n in names if n != against)


def baseline_history(base_dir: Path, nights: int = baseline.POOL_NIGHTS
                     ) -> list[tuple[results.RunRecord, frozenset[str]]]:
    """The last ``nights`` runs beside BASE (its results directory) that the gate decided
    (they have a decision.json), newest first, each with the cells it passed: the store's
    pooled history of the baseline. A night that regressed or stayed undecided still lends
    the cells it passed; a cell it could not pass lends nothing, so a lasting step that the
    gate keeps undecided never becomes baseline."""
    base_dir = Path(base_dir).resolve()
    out: list[tuple[results.RunRecord, frozenset[str]]] = []
    try:
        runs = sorted((d for d in base_dir.parent.iterdir() if d.is_dir()), reverse=True)
    except OSError:
        return out
    for d in runs:
        if len(out) >= nights:
            break
        if d.resolve() == base_dir or not (d / "decision.json").is_file():
            continue
        try:
            dec = json.loads((d / "decision.json").read_text())
            passed = frozenset(c["id"] for c in dec["cells"] if c["verdict"] in baseline.LENDS)
            if passed and dec.get("variants") is None:
                out.append((results.read_run(d), passed))
        except (OSError, ValueError, KeyError, TypeError, TestbedError):
            continue
    return out


@dataclass(frozen=True)
class Decided:
    run_dir: Path
    sequential: sequential.Sequential
    text: str

    @property
    def exit_status(self) -> int:
        return self.sequential.exit_status


def run(t: Topology, base_ref: Path | str, design: sequential.Design,
        progress: Callable[[str], None] = lambda s: None) -> Decided:
    """The run, both looks and the record. ``base_ref``: BASE's run directory, or, for a
    topology with variants, the name of the baseline variant."""
    pair = check(t, str(base_ref))
    kw = {} if pair is None else {"variants": pair}
    pooled: tuple[str, ...] = ()
    out = runner.execute(t, progress=progress)
    new1 = results.read_run(out.run_dir)
    if pair is None:
        base, pooled = baseline.pooled_base(results.read_run(Path(base_ref)), baseline_history(Path(base_ref)))
    else:
        base = new1
    rc1, _, q1, _ = sequential.look1(base, new1, design, **kw)
    plan, _ = sequential.plan_remeasure(rc1, design, base_grows=pair is not None) if rc1.refused is None else ((), ())
    planned = runner.plan(t)
    suffix = {c.hash: (f"-v{dict(c.context)['variant']}" if pair else "") for c in planned}
    hashes = {c.id.removesuffix(suffix[c.hash]): [] for c in planned}
    for c in planned:
        hashes[c.id.removesuffix(suffix[c.hash])].append(c.hash)
    plan = tuple(r for r in plan if r.cell_id in hashes)
    combined = None
    if plan:
        confirm = sum(r.why == sequential.CONFIRM for r in plan)
        progress(f"look 1 (q1 {q1:.4f}): {len(plan)} cells measured again"
                 + (f" ({confirm} to confirm a regression)" if confirm else "") + ", "
                 f"{sum(r.extra for r in plan)} samples" + (" a variant" if pair else "") + ": "
                 + ", ".join(f"{r.cell_id} +{r.extra}" for r in plan))
        runner.execute(t, progress=progress, resume=out.run_dir,
                       remeasure={h: r.extra for r in plan for h in hashes[r.cell_id]})
        combined = results.read_run(out.run_dir)
    if pair is None:
        sq = sequential.decide(base, new1, combined, design, remeasured=plan)
    else:
        # A/B: BASE is the run itself (variant a), at each look as it was then
        sq = sequential.decide_ab(new1, combined, design, pair, remeasured=plan)
    text = sequential.render_text(sq) + "".join(f"{line}\n" for line in pooled)
    summary = {**sq.summary(), "base": str(base_ref) if pair else str(Path(base_ref).resolve()),
               "variants": list(pair) if pair else None, "pooled": list(pooled), "run": str(out.run_dir),
               "first_stage_samples": dict(sequential.stage_counts(new1)),
               "cells": [{"id": c.cell_id, "verdict": c.verdict.value} for c in sq.final.cells],
               "shifts": [s.describe() for s in sq.final.shifts]}
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

