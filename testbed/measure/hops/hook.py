"""The tracer as a per-sample hook of the cell loop (testbed.measure.hooks): a traced cell's
samples get their tracers around the window and their hops in the record; every other
sample passes through untouched.

Registered in ``hooks.FACTORIES`` when this module is imported (the run's schedule,
testbed.measure.run, imports it through testbed.measure.hops.interleave): a topology whose profiles ask for hops gets one
:class:`HopsHook` for its run. What a cell's tracing needs once (its plan, the probes each
kernel attaches, where the devices are) is found at its first traced sample and kept for
the rest; tracefs is mounted for each window that needs it and unmounted by the last
testbed process using it, when one of them mounted it (testbed.host.tracefs).
"""
from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from typing import Any

from testbed.host import tracefs
from testbed.measure import hooks
from testbed.measure.hooks import Finding, SampleHook, SampleWindow
from testbed.measure.hops import closure
from testbed.measure.hops.twins import traced
from testbed.measure.hops.session import HopSession, SampleHops
from testbed.topology.model import HopSpec, Topology


class HopsHook(SampleHook):
    """Per-hop latency of a traced cell's samples (``extra.hops``, ``hop_p*_us.<hop>``)."""

    name = "hops"

    def __init__(self, spec: HopSpec) -> None:
        self.spec = spec
        self.sessions: dict[tuple[str, int], HopSession] = {}
        self.open: dict[tuple[str, int, int, bool], SampleHops] = {}
        #: the run's writer, when a schedule gives it (testbed.measure.hops.interleave): the
        #: tracers' own output is then kept beside the tool's raw output
        self.writer: Any = None
        #: per traced cell (by hash), the tracers' record of the sample that counted BPF's
        #: run time: its warm-up when it has one, else its first repetition
        self.counted: dict[str, dict] = {}

    def applies(self, window: SampleWindow) -> bool:
        # one pair: a traced cell is measured on one path (the topology refuses pairs > 1)
        return traced(window.cell) and len(window.paths) == 1

    def session(self, window: SampleWindow) -> HopSession:
        path = window.paths[0]
        key = (window.cell.hash, id(path))
        if key not in self.sessions:
            self.sessions[key] = HopSession(window.cell, path, self.spec)
        return self.sessions[key]

    @contextlib.contextmanager
    def window(self, window: SampleWindow) -> Iterator[None]:
        key = (window.cell.hash, window.rep, window.attempt, window.warmup)
        with tracefs.available() as why, tempfile.TemporaryDirectory(prefix="tb-hops-") as tmp:
            session = self.session(window)
            session.prepare(why)
            # BPF's run time is counted in the cell's first traced sample only, its warm-up
            # when it has one (counting costs as much as a probe's own work:
            # HopSession.window); the cost of tracing is judged on samples that did not count
            with session.window(tmp, count_bpf=session.samples == 0) as hops:
                self.open[key] = hops
                yield

    def finding(self, window: SampleWindow, sample) -> Finding:  # noqa: ANN001 (records.SampleRecord)
        hops = self.open.pop((window.cell.hash, window.rep, window.attempt, window.warmup), None)
        if hops is None:
            return Finding()
        record = hops.record(sample.metrics)
        if hops.counted:
            self.counted[window.cell.hash] = record["tracers"]
        if self.writer is not None:
            tag = f"{'warmup' if window.warmup else 'rep'}{window.rep}" + (f"-try{window.attempt}" if window.attempt else "")
            record["raw"] = [str(self.writer.write_raw(window.cell.id, f"{tag}-hops-{name}.out", text)
                                 .relative_to(self.writer.dir)) for name, text in sorted(hops.texts.items())]
        return Finding(metrics=closure.hop_metrics(record), data=record)


def for_topology(t: Topology) -> HopsHook | None:
    """The run's hook when a profile asks for hops (hooks.FACTORIES)."""
    return HopsHook(t.hops) if any(p.hops for p in t.matrix.profiles) else None


hooks.FACTORIES.append(for_topology)


__all__ = ["HopsHook", "for_topology"]
