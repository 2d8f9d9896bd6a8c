"""What a sample's cost needs beyond the CPU collectors, read over the same window: every
CPU's clock at both ends (/proc/cpuinfo), every device of the host's namespace's packet
counters (/proc/net/dev), and the host's cycles from the performance counters where
`perf stat` counts them here (found by trying, once per process).

The parsers are pure; :func:`window` is the context manager that reads them around a
window, and :class:`CostHook` the per-sample hook (testbed.measure.hooks) that gives every
sample of a run its cost: the probe over the sample's window, then
testbed.analysis.sample_cost.compute on the sample as it would be written.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from testbed.records.records import SampleRecord

from testbed.analysis import sample_cost as cost
from testbed.analysis.sample_cost import Inputs
from testbed.errors import CommandError
from testbed.host import proc
from testbed.measure import hooks

PERF_ARGV = ("perf", "stat", "-a", "-x,", "-e", "cycles")


def parse_cpuinfo_mhz(text: str) -> tuple[float, ...]:
    """Pure: every CPU's "cpu MHz" line of /proc/cpuinfo, in order (none on hosts whose
    /proc/cpuinfo has no clock)."""
    out = []
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "cpu MHz":
            try:
                out.append(float(value))
            except ValueError:
                continue
    return tuple(out)


def parse_netdev(text: str) -> dict[str, int]:
    """Pure: /proc/net/dev -> device -> rx + tx packets."""
    out = {}
    for line in text.splitlines()[2:]:
        name, sep, rest = line.partition(":")
        fields = rest.split()
        if not sep or len(fields) < 10:
            continue
        out[name.strip()] = int(fields[1]) + int(fields[9])
    return out


def packets_delta(before: Mapping[str, int], after: Mapping[str, int]) -> dict[str, int]:
    """Pure: packets each device counted between two readings (devices present at both)."""
    return {d: after[d] - before[d] for d in before if d in after and after[d] >= before[d]}


def parse_perf_cycles(text: str) -> tuple[float | None, str]:
    """Pure: `perf stat -x,` output -> (cycles, "") or (None, why not)."""
    for line in text.splitlines():
        parts = line.split(",")
        if len(parts) >= 3 and parts[2].startswith("cycles"):
            try:
                return float(parts[0]), ""
            except ValueError:
                return None, f"perf stat -e cycles: {parts[0] or 'no count'}"
    last = text.strip().splitlines()[-1:] or ["no output"]
    return None, f"perf stat -e cycles: {last[0][:200]}"


_PERF: list[str] = []      # "" when perf counts cycles here, else why not; found once


def perf_unavailable() -> str:
    """Why the host's cycles cannot be counted (empty when they can): one short
    `perf stat -a -e cycles` tried once per process (a guest without a PMU, a kernel
    without perf events, perf missing, perf_event_paranoid)."""
    if not _PERF:
        try:
            res = proc.run([*PERF_ARGV, "--", "sleep", "0.05"], timeout=20, check=False)
            _, why = parse_perf_cycles(res.stderr) if res.rc == 0 else (None, (
                f"perf stat exited {res.rc}: {(res.stderr.strip().splitlines() or [''])[-1][:200]}"))
        except CommandError as e:
            why = f"perf stat could not run: {e}"
        _PERF.append(why)
    return _PERF[0]


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


@dataclass
class Probe:
    mhz_before: tuple[float, ...] = ()
    mhz_after: tuple[float, ...] = ()
    dev_before: dict[str, int] = field(default_factory=dict)
    dev_after: dict[str, int] = field(default_factory=dict)
    perf_cycles: float | None = None
    perf_note: str = ""

    def inputs(self, devices: tuple[str, ...] = ()) -> Inputs:
        return Inputs(self.mhz_before, self.mhz_after, packets_delta(self.dev_before, self.dev_after),
                      self.perf_cycles, self.perf_note, devices)


def taps(window: hooks.SampleWindow) -> tuple[str, ...]:
    """The host-side devices of the window's paths: each pair's client and server tap (a
    sample of N pairs records no counters of its own to name them)."""
    eps = [ep for p in window.paths for ep in (getattr(p, "client", None), getattr(p, "server", None))]
    return tuple(dict.fromkeys(t for ep in eps if isinstance(t := getattr(ep, "tap", None), str) and t))


@contextlib.contextmanager
def readings() -> Iterator[Probe]:
    """Readings at the start and the end of a sample's window; perf counts cycles in
    between when it can (started here, stopped with SIGINT, which makes it print)."""
    p = Probe(mhz_before=parse_cpuinfo_mhz(_read("/proc/cpuinfo")),
              dev_before=parse_netdev(_read("/proc/net/dev")))
    p.perf_note = perf_unavailable()
    bg = tmp = None
    if not p.perf_note:
        tmp = tempfile.mkdtemp(prefix="tb-perf-")
        try:
            bg = proc.start(PERF_ARGV, out_dir=tmp, name="perf")
        except CommandError as e:
            p.perf_note = f"perf stat could not start: {e}"
    try:
        yield p
    finally:
        p.dev_after = parse_netdev(_read("/proc/net/dev"))
        p.mhz_after = parse_cpuinfo_mhz(_read("/proc/cpuinfo"))
        if bg is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(bg.popen.pid, signal.SIGINT)
            try:
                bg.wait(10)
                p.perf_cycles, p.perf_note = parse_perf_cycles(bg.stderr())
            except CommandError as e:
                p.perf_note = f"perf stat did not stop: {e}"
            bg.stop()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


class CostHook(hooks.SampleHook):
    """Host CPU per packet by role for every sample (testbed.analysis.sample_cost): the probe over
    the sample's window, the cost of the sample as it would be written. Its record goes to
    ``extra.cost``, its figures to the metrics; inputs that disagree fail the sample with
    both figures ("cost: ...")."""

    name = "cost"

    def __init__(self) -> None:
        # the window being measured and its probe: a run measures one sample at a time
        self._last: tuple[hooks.SampleWindow, Probe] | None = None

    @contextlib.contextmanager
    def window(self, window: hooks.SampleWindow) -> Iterator[None]:
        with readings() as probe:
            self._last = (window, probe)
            yield

    def finding(self, window: hooks.SampleWindow, sample: SampleRecord) -> hooks.Finding:
        probe = self._last[1] if self._last is not None and self._last[0] is window else None
        self._last = None
        out = cost.compute(sample, probe.inputs(taps(window)) if probe is not None else Inputs(devices=taps(window)))
        if out is None:
            return hooks.Finding()
        return hooks.Finding(metrics=dict(out.metrics) if out.reason is None else {},
                             data=out.cost.to_dict(), failure=out.reason)
