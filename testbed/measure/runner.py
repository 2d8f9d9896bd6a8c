"""Execute a topology's matrix: plan -> provision -> per cell measure -> results.

:func:`execute` runs the phases of a :class:`~testbed.measure.run.Run` (prepare, open,
boot, per NIC group its fabric and schedule, finish) inside one
:class:`~testbed.measure.session.Session`. The phases, and the one cell loop every
schedule goes through, live in testbed.measure.run and testbed.measure.sampling; the plan
and the checks before anything is created in testbed.measure.plan. The public way to run a
topology from Python is ``testbed.api.run``.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from testbed.measure.hooks import SampleHook
from testbed.measure.plan import (
    guest_tools_check,
    guest_tools_preflight,
    placement_accelerator,
    placement_preflight,
    plan,
    preflight,
)
from testbed.measure.provision import apply_placement, harness_cpus, host_fingerprints
from testbed.measure.run import MAX_REBUILDS, Outcome, Run
from testbed.measure.session import Session, keep_logs
from testbed.topology.model import Topology


def execute(t: Topology, *, progress: Callable[[str], None] = lambda s: None,
            resume: Path | None = None, remeasure: Mapping[str, int] | None = None,
            hooks: Sequence[SampleHook] = ()) -> Outcome:
    """Measure ``t``'s matrix into a new run directory, or, with ``resume``, go on with an
    interrupted run: its finished cells (those with an outcome in run.json, matched by their
    definition hash) are skipped and the rest measured into the same directory.

    ``remeasure`` (with ``resume``, a finished run): the second stage of the sequential gate
    (testbed.measure.decide). Only those cells (by definition hash) are measured again, each
    for exactly its given count of further samples (after the topology's warm-ups; no
    stopping rule, so the count cannot depend on the spread the gate judges), appended to
    the run; their outcome in run.json is replaced by the new one.

    ``hooks``: per-sample hooks (testbed.measure.hooks) run over every sample's window."""
    run = Run(t, progress=progress, resume=resume, remeasure=remeasure, hooks=hooks)
    run.prepare()
    # the session: host lock, leftovers check, owned state folder, then environment and writer
    with Session(t, resume=resume) as ses:
        run.open(ses)
        run.boot()
        for group in run.groups():
            run.measure_group(group)
        run.finish()
    return run.outcome()


#: kept for callers of the old name (testbed.measure.session.keep_logs is the one implementation)
_keep_logs = keep_logs

__all__ = ["MAX_REBUILDS", "Outcome", "Run", "apply_placement", "execute", "guest_tools_check",
           "guest_tools_preflight", "harness_cpus", "host_fingerprints", "placement_accelerator",
           "placement_preflight", "plan", "preflight"]
