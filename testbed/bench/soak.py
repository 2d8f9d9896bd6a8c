"""`testbed bench soak`: does a long run leak? A few hundred namespace cells measured the way
a run measures them (MTU set and checked, a tool server, the CPU collectors, the noise watch
and the host watch threads, a sample and a cell written each time), with the harness's own
file descriptors, threads, child processes and resident memory read at checkpoints.

Growth is judged after a warm-up (the first ``WARMUP_CELLS`` cells fill caches and import
modules once): the figure printed is the growth per hundred cells from there to the end.
Flat means no leak; a descriptor or a thread per cell shows as 100 per hundred.
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

WARMUP_CELLS = 10
CHECKPOINTS = 5


@dataclass(frozen=True)
class Reading:
    cells: int
    fds: int
    threads: int
    children: int
    rss_bytes: int
    at_s: float
    #: the run's record, which a run holds in memory as it writes it (it grows with the
    #: cells by design: the reference for the RSS growth)
    run_json_bytes: int = 0


def reading(cells: int, t0: float, run_json: Path | None = None) -> Reading:
    me = psutil.Process()
    size = run_json.stat().st_size if run_json is not None and run_json.exists() else 0
    return Reading(cells, len(os.listdir("/proc/self/fd")), threading.active_count(),
                   len(me.children(recursive=True)), me.memory_info().rss, round(time.monotonic() - t0, 1),
                   size)


def growth_per_100(a: Reading, b: Reading) -> dict[str, float]:
    """Pure: growth of each figure per hundred cells from ``a`` to ``b``."""
    n = b.cells - a.cells
    if n <= 0:
        return {}
    return {k: round((getattr(b, k) - getattr(a, k)) * 100 / n, 2)
            for k in ("fds", "threads", "children", "rss_bytes", "run_json_bytes")}


def soak(cells: int, duration_s: int = 1, progress: Callable[[str], None] = lambda s: None) -> dict:
    """``cells`` cells of one TCP stream sample each on a namespace veth pair."""
    from testbed.analysis import stats
    from testbed.bench.netns import netns_bench
    from testbed.measure import sampling as measure
    from testbed.measure import window
    from testbed.topology.model import Attachment, Backend, Cell, NoiseAction, NoiseSpec, Profile, Repetitions
    t0 = time.monotonic()
    readings = [reading(0, t0)]
    every = max(1, (cells - WARMUP_CELLS) // CHECKPOINTS)
    failed: list[str] = []
    rule = stats.StoppingRule(Repetitions(0, 1, 1, 0.0))
    watch = window.Watch(NoiseSpec(action=NoiseAction.KEEP))
    profile = Profile("tcp_stream", message_size=16384, duration_s=duration_s)
    with netns_bench(Attachment("netns-veth")) as (_, writer, path):
        for i in range(cells):
            mtu = (1500, 9000)[i % 2]         # the MTU changes every cell, as in a matrix
            cell = Cell(Attachment("netns-veth"), Backend.QEMU, mtu, 1, profile)
            (s, *_) = measure.measure_cell(cell, path, writer, rule, 0, {}, {}, None, watch)
            if s.status == "failed":
                failed.append(f"cell {i + 1}: {s.reason}")
            done = i + 1
            if done == WARMUP_CELLS or (done > WARMUP_CELLS and (done - WARMUP_CELLS) % every == 0) \
                    or done == cells:
                if readings[-1].cells != done:
                    readings.append(reading(done, t0, writer.dir / "run.json"))
                    r = readings[-1]
                    progress(f"{done:>5} cells  fds {r.fds}  threads {r.threads}  children {r.children}  "
                             f"rss {r.rss_bytes / 2**20:.1f} MiB")
    base = next((r for r in readings if r.cells >= WARMUP_CELLS), readings[0])
    return {"cells": cells, "duration_s": duration_s, "readings": readings, "baseline_cells": base.cells,
            "growth_per_100": growth_per_100(base, readings[-1]), "failed": failed,
            "wall_s": round(time.monotonic() - t0, 1)}


def main(cells: int) -> int:
    r = soak(cells, progress=lambda s: print(s, flush=True))
    first, last = r["readings"][0], r["readings"][-1]
    print(f"soak: {r['cells']} namespace cells (one {r['duration_s']} s TCP stream sample each, "
          f"veth pair), {r['wall_s']:.0f} s")
    print(f"{'':>22}{'start':>10}{'end':>10}{'per 100 cells':>16}  (growth after the first "
          f"{r['baseline_cells']} cells)")
    g = r["growth_per_100"]
    for label, key, scale in (("file descriptors", "fds", 1), ("threads", "threads", 1),
                              ("child processes", "children", 1), ("RSS (MiB)", "rss_bytes", 2**20),
                              ("run.json (MiB)", "run_json_bytes", 2**20)):
        print(f"{label:<22}{getattr(first, key) / scale:>10.1f}{getattr(last, key) / scale:>10.1f}"
              f"{g.get(key, 0) / scale:>16.2f}")
    print("(a run holds its record in memory as it writes run.json: RSS grows with it by design;"
          " descriptors, threads and child processes should not grow at all)")
    for f in r["failed"][:10]:
        print(f"failed: {f}")
    if len(r["failed"]) > 10:
        print(f"failed: ... {len(r['failed']) - 10} more")
    return 0 if not r["failed"] else 1


__all__ = ["Reading", "growth_per_100", "main", "reading", "soak"]
