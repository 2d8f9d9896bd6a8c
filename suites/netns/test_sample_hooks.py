"""The cell loop's per-sample hooks on a real namespace cell: a hook's window encloses the
tools' run, its derived figure lands in the sample's metrics and its data under its name, a
hook that applies only to some samples (a tracer interleaving traced and untraced ones) is
asked per sample, and a hook's failure fails that sample with its name and reason."""
from __future__ import annotations

import contextlib
import os
import shutil
import time

import pytest

from testbed import api, bench
from testbed.measure import sampling
from testbed.measure.context import Arm, Context
from testbed.topology.model import Repetitions

pytestmark = [
    pytest.mark.netns,
    pytest.mark.attach("netns"),
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: creates namespaces and veths"),
    *[pytest.mark.skipif(shutil.which(t) is None, reason=f"`{t}` not found (netperf, Debian non-free)")
      for t in ("netperf", "netserver")],
]


class Timed(api.SampleHook):
    """Times its window and derives bytes per second of window from the tool's figure."""

    name = "timed"

    def __init__(self) -> None:
        self.windows: list[tuple[int, float]] = []

    @contextlib.contextmanager
    def window(self, w):
        t0 = time.monotonic()
        yield
        self.windows.append((w.rep, time.monotonic() - t0))

    def finding(self, w, sample):
        secs = self.windows[-1][1]
        return api.Finding(metrics={"timed_mbit": sample.metrics["throughput_mbps"] * secs},
                           data={"window_s": round(secs, 3), "paths": len(w.paths)})


class OddReps(api.SampleHook):
    """Takes part in odd repetitions only, and fails them (a tracer that lost events)."""

    name = "tracer"

    def applies(self, w):
        return w.rep % 2 == 1

    def finding(self, w, sample):
        return api.Finding(failure=f"lost 3 events in rep {w.rep}")


def test_hooks_run_over_each_sample_window_add_figures_and_fail_samples():
    from testbed.analysis import stats
    cell = api.Cell(api.Attachment("netns-veth"), api.Backend.QEMU, 1500, 1,
                    api.Profile("tcp_stream", message_size=16384, duration_s=2))
    timed, tracer = Timed(), OddReps()
    rule = stats.StoppingRule(Repetitions(min_samples=2, max_samples=2, rsd_target=0))
    with bench.netns_bench(api.Attachment("netns-veth"), lock=False) as (_, writer, path):
        ctx = Context(writer, rule=rule, hooks=(timed, tracer))
        [samples] = sampling.measure(ctx, [Arm(cell, (path,))])
    first, second = samples
    assert first.status == "ok", first.reason
    # the window enclosed the tools' 2 s; its figure and data are the sample's
    assert [r for r, _ in timed.windows] == [0, 1] and all(2.0 <= s < 30 for _, s in timed.windows)
    assert first.metrics["timed_mbit"] == pytest.approx(first.metrics["throughput_mbps"] * timed.windows[0][1])
    assert first.data["timed"] == {"window_s": round(timed.windows[0][1], 3), "paths": 1}
    assert "tracer" not in first.data                     # rep 0: the tracer sat it out
    assert second.status == "failed" and second.reason == "tracer: lost 3 events in rep 1"
