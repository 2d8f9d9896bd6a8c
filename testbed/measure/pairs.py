"""N client/server pairs measured at once on one datapath, and idle readings.

A cell with ``pairs: N`` runs the first N of the run's test paths (one per pair, all plugged
into the same segment) side by side: every pair's clients are started together, their start
and end skew are checked like connection instances are (measure.measure_once), and each pair
keeps its own result (its rate, p99 latency, its two guests' QEMU + vhost cores, and when
paced its target and achieved rate) next to the aggregate (the sum over the pairs) and the
host totals over the same window. A pair that fails fails the sample with its reason.

The record is the contract of testbed.analysis.capacity_model: ``cell.pairs``, ``cell.rate``,
``extra.pairs[]``; run.json ``idle`` from :func:`idle_reading`.

Takes a list of measure.TestPath, so it does not care how the pairs were plugged.
"""
from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence

from testbed.analysis import stats
from testbed.errors import CommandError, GuestError, TestbedError
from testbed.guests.virt import Guest
from testbed.measure import cpu, window
from testbed.measure import sampling as measure
from testbed.records import results
from testbed.tools import get_tool, pacing
from testbed.tools.base import ToolResult, vet
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

def pair_record(profile: Profile, res: ToolResult, cores: float | None) -> dict:
    """One pair's entry of extra.pairs, in the metric's own unit (Mbit/s or tps)."""
    metric = measure.primary_metric(profile)
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


# --------------------------------------------------------------------------- measuring

def _names(path: measure.TestPath) -> list[str]:
    return [ep.guest.spec.name for ep in (path.client, path.server)]


def measure_once(cell: Cell, paths: Sequence[measure.TestPath], writer: results.RunWriter, rep: int,
                 warmup: bool, qemu_pids: Mapping[str, int], placement: Mapping[str, str],
                 clock_ghz: float | None = None, watch: window.Watch | None = None) -> results.Sample:
    watch = watch or window.Watch()
    profile = cell.profile
    driver = get_tool(profile.tool)
    started = results.now()
    raw: list[str] = []
    tag = f"{'warmup' if warmup else 'rep'}{rep}"
    eps = [ep for p in paths for ep in (p.client, p.server)]
    pids_q = {n: qemu_pids[n] for p in paths for n in _names(p) if n in qemu_pids}
    domains = {ep.guest.spec.name: ep.guest.dom for ep in eps
               if isinstance(ep.guest, Guest) and ep.guest.spec.name in pids_q}

    def failed(reason: str, cpu_info: Mapping | None = None, extra: Mapping | None = None) -> results.Sample:
        return results.Sample(writer.run_id, cell.as_dict(), rep, warmup, "failed", reason, {},
                              cpu_info or {}, started, results.now(), tuple(raw), placement, extra or {})

    port = driver.default_port  # type: ignore[attr-defined]
    servers = [p.servers or measure.Servers(reuse=False) for p in paths]
    server_pids: list[int | None] = [None] * len(paths)
    server_out = [""] * len(paths)
    runs = driver.runs(profile)
    win = contextlib.ExitStack()
    try:
        for i, p in enumerate(paths):
            try:
                server_pids[i] = servers[i].start(p.server.guest, driver, profile, port)
            except (CommandError, GuestError, TestbedError) as e:
                return failed(f"pair {i + 1}: server did not start: {e}")
        plans = [measure.client_plan(driver, cell, p.server.address, port, p.client.guest.agent)
                 for p in paths]
        g_before = {ep.guest.spec.name: cpu.guest_reading(ep.guest.agent) for ep in eps}
        counters_before = [p.counters() for p in paths]
        h_before = cpu.host_reading(pids_q, domains)
        obs = win.enter_context(watch.window(pids_q, cell.id, rep))
        from concurrent.futures import ThreadPoolExecutor
        t0 = time.monotonic()
        # Every pair's clients at once, each pair from its own thread (its own guest agent):
        # spawned pair after pair, the last would start one agent round trip per pair later
        # (about 0.5 s each under TCG), and the pairs would not overlap for the whole test.
        with ThreadPoolExecutor(max_workers=len(paths)) as pool:
            spawned = list(pool.map(lambda pa: [pa[0].client.guest.agent.spawn(pa[1][0]) for _ in range(pa[1][1])],
                                    zip(paths, plans)))
        skew_s = time.monotonic() - t0
        outs: list[list] = [[] for _ in paths]
        ends: list[float] = []

        def wait_pair(i: int) -> list[float]:
            # Each pair's clients are waited for by its own thread (each guest has its own
            # agent): waiting pair after pair would see a later pair end one agent round trip
            # late for every pair before it (seconds under TCG), a skew no client had.
            p, (argv, _), pids = paths[i], plans[i], spawned[i]
            seen = []
            for j, pid in enumerate(pids):
                outs[i].append(p.client.guest.agent.wait(
                    pid, argv, profile.duration_s * runs + measure.SAMPLE_MARGIN_S,
                    expected_s=profile.duration_s * runs if j == 0 else 0.0))
                seen.append(time.monotonic())
            return seen
        with ThreadPoolExecutor(max_workers=len(paths)) as pool:
            futures = [pool.submit(wait_pair, i) for i in range(len(paths))]
            errors = []
            for i, fut in enumerate(futures):
                try:
                    ends.extend(fut.result())
                except CommandError as e:
                    errors.append((i, e))
        if errors:
            for rest_pids, rest_path in zip(spawned, paths):
                for rest in rest_pids:
                    rest_path.client.guest.agent.kill(rest)
            i, e = errors[0]
            return failed(f"pair {i + 1}: client {'timed out' if e.timed_out else 'failed'}: {e}")
        h_after = cpu.host_reading(pids_q, domains)
        win.close()
        counters_after = [p.counters() for p in paths]
        g_after = {ep.guest.spec.name: cpu.guest_reading(ep.guest.agent) for ep in eps}
    except (CommandError, GuestError) as e:
        return failed(f"measurement could not run: {e}")
    finally:
        win.close()
        for i, p in enumerate(paths):
            if server_pids[i] is not None:
                server_out[i] = servers[i].release(p.server.guest, driver, server_pids[i])  # type: ignore[arg-type]
    # the connection-instances check over every client of every pair
    why = measure.end_skew_reason(ends, profile.duration_s, f"{len(paths)} pairs")
    if why:
        return failed(why)
    per_pair: list[ToolResult] = []
    for i, o_list in enumerate(outs):
        parsed = []
        for j, o in enumerate(o_list):
            p_out = writer.write_raw(cell.id, f"{tag}-pair{i + 1}-client{j}.out", o.stdout)
            writer.write_raw(cell.id, f"{tag}-pair{i + 1}-client{j}.err", o.stderr)
            raw.append(str(p_out.relative_to(writer.dir)))
            parsed.append(vet(driver.parse_sample(o.stdout, o.stderr, o.rc, profile=profile,
                                                  server_output=server_out[i]), profile))
        per_pair.append(parsed[0] if len(parsed) == 1 else driver.aggregate(parsed))
    res, bad = combine(profile, per_pair, driver)
    cpu_info, guest_s = measure.cpu_over_window(g_before, g_after, h_before, h_after)
    extra: dict = {"window": measure.window_record(res.metrics.get("duration_s"), profile.duration_s * runs,
                                                   cpu_info["window_s"], guest_s),
                   "kernel": measure._kernel(), "instances": sum(len(s) for s in spawned),
                   "start_skew_s": round(skew_s, 4),
                   "end_skew_s": round(max(ends) - min(ends), 3) if ends else None,
                   "datapath": paths[0].datapath}
    wextra, pin_bad, noisy = watch.verdict(obs, cpu_info, pids_q, domains)
    extra.update(wextra)
    if bad:
        return failed(bad, cpu_info, extra)
    if pin_bad:
        return failed(f"placement did not hold: {pin_bad}", cpu_info, extra)
    checks, pair_recs = [], []
    for i, (p, r) in enumerate(zip(paths, per_pair)):
        deltas = {tap: counters_after[i][tap] - counters_before[i][tap] for tap in counters_before[i]}
        check = measure.wire_check(cell, p, dict(r.metrics), deltas)
        if check.verdict == "fail":
            return failed(f"pair {i + 1}: wire cross-check: {check.reason}", cpu_info, extra)
        checks.append(check.as_dict())
        pair_recs.append(pair_record(profile, r, pair_cores(cpu_info["per_guest"], _names(p))))
    why = measure.invariant_reason(cpu_info)
    if why:
        return failed(why, cpu_info, extra)
    short = [i + 1 for i, r in enumerate(pair_recs) if r.get("short")]
    extra.update({"pairs": pair_recs, "warnings": [*res.warnings, *measure.cpu_warnings(cpu_info)],
                  "saturated": bool(short), "short_pairs": short})
    if profile.paced and profile.pattern.is_transactional:
        extra["latency_loop"] = pacing.loop_label(get_tool(profile.tool))
    metrics = {**res.metrics, **measure.derived(dict(res.metrics), cpu_info, clock_ghz)}
    status, reason = measure.noise_outcome(watch, noisy, warmup, extra)
    if status == "failed":
        return failed(reason, cpu_info, extra)   # type: ignore[arg-type]
    return results.Sample(writer.run_id, cell.as_dict(), rep, warmup, status, reason, metrics, cpu_info,
                          started, results.now(), tuple(raw), placement, extra,
                          {"pairs": checks, "verdict": "pass"})


def measure_cell(cell: Cell, paths: Sequence[measure.TestPath], writer: results.RunWriter,
                 rule: stats.StoppingRule, warmup: int, qemu_pids: Mapping[str, int],
                 placement: Mapping[str, str], clock_ghz: float | None = None,
                 watch: window.Watch | None = None) -> list[results.Sample]:
    """measure.measure_cell for N pairs: MTU set and checked on every pair first; noisy
    samples measured again as there."""
    watch = watch or window.Watch()
    watch.begin_cell()
    paths = list(paths)[:cell.pairs]
    if len(paths) < cell.pairs:
        return measure.fail_cell(cell, writer, f"{cell.pairs} pairs asked, {len(paths)} plugged", placement)
    for i, p in enumerate(paths):
        try:
            measure.set_mtu(p, cell.mtu)
        except (CommandError, GuestError, TestbedError) as e:
            return measure.fail_cell(cell, writer, f"pair {i + 1}: could not set MTU {cell.mtu}: {e}", placement)
        why = measure.check_mtu(p, cell.mtu)
        if why:
            return measure.fail_cell(cell, writer, f"pair {i + 1}: {why}", placement)
    for w in range(warmup):
        writer.add_sample(measure_once(cell, paths, writer, w, True, qemu_pids, placement, clock_ghz, watch))
    samples: list[results.Sample] = []
    metric = measure.primary_metric(cell.profile)
    decision = None
    while True:
        s = measure_once(cell, paths, writer, len(samples), False, qemu_pids, placement, clock_ghz, watch)
        writer.add_sample(s)
        if s.status == "noisy":
            watch.settle(qemu_pids)
            continue
        samples.append(s)
        values = [x.metrics[metric] for x in samples if x.status == "ok" and metric in x.metrics]
        if len(samples) >= rule.repetitions.max_samples:
            break
        decision = rule.decide(values) if values else None
        if decision is not None and not decision.more:
            break
    ok = [x for x in samples if x.status == "ok"]
    status = "ok" if ok and len(ok) == len(samples) else ("partial" if ok else "failed")
    reason = None if status == "ok" else "; ".join(sorted({x.reason or "" for x in samples if x.status != "ok"}))
    # saturation is per sample (extra.saturated, extra.pairs[].short): capacity_model reads it
    writer.add_cell(cell, status, reason, decision.converged if decision else None, measure._summaries(ok))
    return samples


def require_pacing(t: Topology, cells: Sequence[Cell], detector: pacing.Detector, where: str,
                   run: Callable[[list[str]], tuple[str, str, int]],
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
