"""N client/server pairs measured at once on one datapath, and idle readings.

A cell with ``pairs: N`` runs the first N of the run's test paths (one per pair, all plugged
into the same segment) side by side, through the one sampling loop (measure.sampling.measure_paths):
every pair's clients are started together, their start and end skew are checked like
connection instances are, and each pair keeps its own result (its rate, p99 latency, its two
guests' QEMU + vhost cores, and when paced its target and achieved rate) next to the aggregate
(the sum over the pairs) and the host totals over the same window. A pair that fails fails
the sample with its reason. This module holds the pure parts of that record (:func:`combine`,
:func:`pair_record`, :func:`pairs_extra`, :func:`wire_record`) and the idle readings.

The record is the contract of testbed.analysis.capacity_model: ``cell.pairs``, ``cell.rate``,
``extra.pairs[]``; run.json ``idle`` from :func:`idle_reading`.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence

from testbed.measure import cpu, crosscheck
from testbed.tools import get_tool, pacing
from testbed.tools.base import ToolResult
from testbed.topology.model import Cell, GuestSpec, Profile, Topology, clone_name

log = logging.getLogger(__name__)

#: idle window (s); TESTBED_IDLE_WINDOW_S shortens it for tests (0: no idle readings)
IDLE_WINDOW_S = 10.0


def guest_pairs(t: Topology, n: int) -> list[tuple[GuestSpec, GuestSpec]]:
    """The topology's client/server and their clones for pairs 2..n (same host, size, image)."""
    from dataclasses import replace
    cli, srv = t.guest(t.client), t.guest(t.server)
    return [(replace(cli, name=clone_name(cli.name, i)), replace(srv, name=clone_name(srv.name, i)))
            for i in range(n)]


def idle_counts(max_pairs: int) -> list[int]:
    """The guest counts idle readings are taken at: one pair, and all of them."""
    return sorted({2, 2 * max_pairs})


def idle_window_s() -> float:
    import os
    raw = os.environ.get("TESTBED_IDLE_WINDOW_S")
    try:
        return max(0.0, float(raw)) if raw else IDLE_WINDOW_S
    except ValueError:
        return IDLE_WINDOW_S


def memory_used_mib() -> float:
    import psutil
    vm = psutil.virtual_memory()
    return round((vm.total - vm.available) / 2**20, 1)


def qemu_rss_mib(pids: Mapping[str, int]) -> dict[str, float]:
    import psutil
    out = {}
    for g, pid in pids.items():
        try:
            out[g] = round(psutil.Process(pid).memory_info().rss / 2**20, 1)
        except psutil.Error:
            continue
    return out


def idle_reading(qemu_pids: Mapping[str, int], window_s: float, memory_mib: int,
                 attachment: str | None = None) -> dict:
    """Host busy cores (/proc/stat) over ``window_s`` with these guests booted and no
    traffic, host memory used, and each QEMU's RSS (psutil) at the end of the window. Its
    second source: the guests' own QEMU cores over the same window (``qemu_cores``), which
    cannot exceed the host's busy cores."""
    before = cpu.host_reading(qemu_pids)
    time.sleep(window_s)          # the window itself: nothing to poll, no traffic on purpose
    after = cpu.host_reading(qemu_pids)
    d = cpu.host_delta(before, after)
    rec = {"guests": len(qemu_pids), "window_s": d["window_s"],
           "host_busy_cores": round(d["host"].get("busy", 0.0), 4),
           "host_memory_used_mib": memory_used_mib(), "qemu_rss_mib": qemu_rss_mib(qemu_pids),
           "qemu_cores": {g: v["total"] for g, v in d["per_guest"].items()},
           "memory_mib": memory_mib}
    if attachment:
        rec["attachment"] = attachment
    return rec


# --------------------------------------------------------------------------- pure parts

def by_pair(cell: Cell) -> bool:
    """Whether a cell's samples are recorded pair by pair (``extra.pairs``, the capacity model's
    input): N pairs at once, or a paced profile (each pair's target and what it achieved)."""
    return cell.pairs > 1 or cell.profile.paced


def label(recorded_by_pair: bool, i: int) -> str:
    """What a reason about path ``i`` starts with: ``pair 2: `` for a cell recorded by pair."""
    return f"pair {i + 1}: " if recorded_by_pair else ""


def pair_record(profile: Profile, res: ToolResult, cores: float | None) -> dict:
    """One pair's entry of extra.pairs, in the metric's own unit (Mbit/s or tps)."""
    metric = profile.pattern.primary_metric
    rec: dict = {metric: res.metrics.get(metric), "latency_p99_us": res.metrics.get("latency_p99_us"),
                 "cpu_cores": None if cores is None else round(cores, 4)}
    # what an SLO may bound (testbed.analysis.slo): the pair's loss, its chosen percentiles that have
    # enough transactions behind them (testbed.records.percentiles), its mean latency
    if "loss_pct" in res.metrics:
        rec["loss_pct"] = res.metrics["loss_pct"]
    if profile.pattern.is_transactional and res.ok:
        from testbed.records import percentiles
        chosen = percentiles.choose(profile.percentiles or percentiles.DEFAULT, res.metrics,
                                    tool=profile.tool.value)
        rec.update(percentiles.apply({}, chosen))
        rec["latency_p99_us"] = rec.get("latency_p99_us")
        if "latency_mean_us" in res.metrics:
            rec["latency_mean_us"] = res.metrics["latency_mean_us"]
    if profile.paced:
        target = profile.rate_tps if profile.rate_tps is not None else (profile.rate_bps or 0) / 1e6
        rec["target"] = target
        rec["achieved"] = res.metrics.get(metric)
        rec["short"] = pacing.shortfall(target, rec["achieved"])
    return rec


def pair_cores(per_guest: Mapping[str, Mapping[str, float]], names: Sequence[str]) -> float | None:
    """A pair's own QEMU + vhost cores: its guests' totals (None when either is unmeasured)."""
    vals = [per_guest.get(n, {}).get("total") for n in names]
    return None if any(v is None for v in vals) else sum(vals)  # type: ignore[arg-type]


def combine(profile: Profile, per_pair: Sequence[ToolResult], driver) -> tuple[ToolResult, str | None]:
    """The aggregate over the pairs (rates summed, latency percentiles the largest), or a
    failed result naming the first pair that failed; never a partial sum."""
    bad = [f"pair {i} failed: {r.reason}" for i, r in enumerate(per_pair, 1) if not r.ok]
    if bad:
        return ToolResult.failed("; ".join(bad)), "; ".join(bad)
    return driver.aggregate(list(per_pair)), None


def pairs_extra(profile: Profile, per_pair: Sequence[ToolResult], per_guest: Mapping[str, Mapping[str, float]],
                names: Sequence[Sequence[str]]) -> dict:
    """A sample's per-pair keys: each pair's record (``names``: each pair's two guests, whose
    QEMU + vhost cores are the pair's), which pairs fell short of a paced target."""
    recs = [pair_record(profile, r, pair_cores(per_guest, n)) for r, n in zip(per_pair, names)]
    short = [i + 1 for i, r in enumerate(recs) if r.get("short")]
    out = {"pairs": recs, "saturated": bool(short), "short_pairs": short}
    if profile.paced and profile.pattern.is_transactional:
        out["latency_loop"] = pacing.loop_label(get_tool(profile.tool))
    return out


def wire_record(checks: Sequence[crosscheck.Check]) -> dict:
    """The sample's cross-check record over the pairs: each pair's, and whether any failed."""
    return {"pairs": [c.as_dict() for c in checks],
            "verdict": "fail" if any(c.verdict == "fail" for c in checks) else "pass"}


def require_pacing(t: Topology, cells: Sequence[Cell], detector: pacing.Detector, where: str,
                   run: Callable[[list[str]], tuple[str, str, int]], *,
                   write: Callable[[str, str], None] | None = None) -> None:
    """Exit 3 (CapabilityError naming matrix.profiles[i].rate) when the installed tool cannot
    pace a paced profile of the plan; found by trying the binary where it runs."""
    from testbed.errors import CapabilityError
    for i, p in enumerate(t.matrix.profiles):
        if not p.paced or not any(c.profile.name == p.name for c in cells):
            continue
        why = detector.reason(where, get_tool(p.tool), run, write)
        if why:
            raise CapabilityError(f"{t.source}: matrix.profiles[{i}].rate: profile {p.name} asks for "
                                  f"{p.rate} per pair, but no installed tool can pace it ({where}): {why}")
