"""The one cell loop and the one sample.

Every schedule of a run goes through :func:`measure` (the cells of one step, each an
:class:`~testbed.measure.context.Arm`: a cell on its test paths) and every sample through
:func:`sample`, with the run's :class:`~testbed.measure.context.Context`: sequential cells
(one arm), interleaved variants (one arm per variant, A B B A), N pairs at once (one arm over
N paths), the gate's re-measured cells (a rule of exactly N samples) and a rate search's
trials (testbed.measure.ratesearch_cell, through :func:`settled`). So the noise guard (a
noisy sample written, the host left to settle, the sample measured again), the host guard
(daemons, objects, wire gaps: testbed.host.hostwatch, one guard per path), the placement
check, the CPU invariant, the wire cross-check and the run's hooks (testbed.measure.hooks)
apply to each of them the same way.

A tool that failed, timed out or printed nothing gives a failed sample with its reason,
never a zero or a guess. So does one that exited 0 with a zero result or measured over less
than 0.9 of the requested duration (tools.base.vet), a wire cross-check that fails
(testbed.measure.crosscheck), and host CPU that does not add up (attributed above busy).
Each sample states its windows: the tool's own interval, the guest collectors' (the
guest's clock) and the host's (the monotonic clock), and how much of the tool's interval
each covered. What only N pairs record is pure and lives in testbed.measure.pairs; the
other pure parts of a record in testbed.measure.figures; the stopping rule's bookkeeping is
:class:`CellSamples`.

:func:`measure_cell`, :func:`measure_paths`, :func:`measure_once` and :func:`sample_paths`
are the older entry points with positional arguments, kept for callers outside a run
(benchmarks, tests): each builds a Context and calls the loop.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from pyroute2 import NetlinkError

from testbed.analysis import stats
from testbed.errors import CommandError, GuestError, StoppedError, TestbedError
from testbed.guests.virt import Guest
from testbed.host import hostwatch
from testbed.host.nsagent import NsAgent
from testbed.measure import cpu, hooks, pairs, window
from testbed.measure.context import Arm, Context
from testbed.measure.endpoints import Endpoint, Servers, TestPath, check_mtu, client_plan, primary_metric, set_mtu
from testbed.measure.figures import (
    cpu_over_window,
    cpu_warnings,
    derived,
    end_skew_reason,
    proven_skew,
    invariant_reason,
    kernel_once,
    latency_percentiles,
    noise_outcome,
    path_extra,
    summaries,
    window_record,
    wire_check,
)
from testbed.records import results
from testbed.records.records import Cpu, SampleRecord
from testbed.tools import get_tool
from testbed.tools.base import ToolResult, read_sample
from testbed.topology.model import Cell, Pattern

log = logging.getLogger(__name__)
T = TypeVar("T")

SAMPLE_MARGIN_S = 60      # beyond the tool's own duration, before a client counts as hung


# --------------------------------------------------------------------------- the loop

def round_order(items: Sequence[T], rnd: int) -> list[T]:
    """Round ``rnd``'s order: as given on even rounds, reversed on odd ones, so consecutive
    rounds read A B B A (a counterbalanced design: linear drift cancels in the mean)."""
    return list(items) if rnd % 2 == 0 else list(reversed(items))


def measure(ctx: Context, arms: Sequence[Arm]) -> list[list[SampleRecord]]:
    """The one cell loop: the cells of ``arms`` measured together, interleaved when there
    are several (warm-ups first, then one counted sample of each arm per round in A B B A
    order, an arm whose stopping rule is met sitting its turns out). Each arm's MTU is set
    and checked first (a failed check fails that cell). A noisy sample is written and
    measured again once the host settled (:func:`settled`); the retry budget is the step's.
    Returns, per arm, the samples its stopping rule counted."""
    ctx.watch.begin_cell()
    prepared = [prepare(ctx, arm) for arm in arms]
    live = {i: a for i, a in enumerate(prepared) if isinstance(a, Arm)}
    for w in range(ctx.warmup):
        for i in round_order(list(live), w):
            ctx.writer.add_sample(sample(ctx, live[i], w, True))
    counted = {i: CellSamples(a.cell, ctx.rule_for(a.cell)) for i, a in live.items()}
    active, rnd = list(live), 0
    while active:
        for i in round_order(list(active), rnd):
            if not counted[i].add(settled(ctx, live[i], len(counted[i].samples))):
                active.remove(i)
        rnd += 1
    return [counted[i].finish(ctx.writer) if i in counted else p for i, p in enumerate(prepared)]  # type: ignore[misc]


def settled(ctx: Context, arm: Arm, rep: int, *, wire_fails: bool = True,
            finish: Callable[[SampleRecord], SampleRecord] | None = None) -> SampleRecord:
    """One counted sample of ``arm``: measured and written; while the noise guard calls it
    noisy (and the retry budget lasts), the host is left to settle and it is measured again,
    each try written (status ``noisy``, left out of every statistic). ``finish``: what a
    schedule makes of each sample before it is written (a rate search's trial record)."""
    while True:
        s = sample(ctx, arm, rep, False, wire_fails=wire_fails)
        if finish is not None:
            s = finish(s)
        ctx.writer.add_sample(s)
        if s.status != "noisy":
            return s
        ctx.watch.settle(arm.pids(ctx))


def prepare(ctx: Context, arm: Arm) -> Arm | list[SampleRecord]:
    """The arm on the first ``cell.pairs`` of its paths with the cell's MTU set and checked
    on each; when that cannot be done the cell fails with the reason (its failed sample is
    returned instead)."""
    cell = arm.cell
    by_pair = pairs.by_pair(cell) if arm.by_pair is None else arm.by_pair
    paths = list(arm.paths)[:cell.pairs]
    if len(paths) < cell.pairs:
        return fail(ctx, cell, f"{cell.pairs} pairs asked, {len(paths)} plugged")
    for i, p in enumerate(paths):
        try:
            set_mtu(p, cell.mtu)
            why = check_mtu(p, cell.mtu)
        except (CommandError, GuestError, TestbedError) as e:
            why = f"could not set MTU {cell.mtu}: {e}"
        if why:
            # A guest that crashed or was destroyed between two cells fails the MTU step
            # first (its agent stops answering): the loss is the cause, and marking it is
            # what brings the guest back for the next cell, as a sample's failure does.
            cause = gone([q.guard for q in paths if q.guard is not None])
            reason = f"{pairs.label(by_pair, i)}{why}"
            return fail(ctx, cell, f"{cause} (then: {reason})" if cause else reason)
    return dataclasses.replace(arm, paths=tuple(paths), by_pair=by_pair)


def gone(guards: Sequence[hostwatch.Guard]) -> str | None:
    """Objects of the paths missing, or their guests lost, as the guards see them now: the
    cause, with each guard marked faulty so that the runner rebuilds the segment (and
    brings lost guests back); None when nothing is."""
    found: list[str] = []
    for g in guards:
        missing = g.missing()
        if missing:
            g.fault = "; ".join(missing)
            found += [x for x in missing if x not in found]
    return "; ".join(found) or None


def fail(ctx: Context, cell: Cell, reason: str) -> list[SampleRecord]:
    """A cell that could not be measured: one failed sample and its failed outcome."""
    return fail_cell(cell, ctx.writer, reason, ctx.placement)


def fail_cell(cell: Cell, writer: results.RunWriter, reason: str,
              placement: Mapping[str, str]) -> list[SampleRecord]:
    s = SampleRecord.new(writer.run_id, cell.as_dict(), 0, False, "failed", reason, {}, {},
                         results.now(), results.now(), (), placement)
    writer.add_sample(s)
    writer.add_cell(cell, "failed", reason, None, {})
    return [s]


# --------------------------------------------------------------------------- one sample

def sample(ctx: Context, arm: Arm, rep: int, warmup: bool, *, wire_fails: bool = True) -> SampleRecord:
    """One sample of ``arm`` over its paths at once (one path, or one per pair), as the
    typed record it is written as (not written here: the loop writes it). A cell recorded by
    pair (pairs.by_pair: N pairs, or paced) keeps each pair's result in ``extra.pairs`` and
    names the pair in a failure's reason.

    ``wire_fails=False``: the receiving device's byte check is recorded but does not fail
    the sample, for a caller that checks the wire its own way (the rate search's per-trial
    loss check on both devices: a one-second UDP trial in a slow guest has datagrams
    arriving after the receiver stopped counting, several percent of it)."""
    return _Sample(ctx, arm, rep, warmup).take(wire_fails)


@dataclasses.dataclass(frozen=True)
class _Readings:
    """What one sample's window left for its checks."""

    outs: list[list]
    #: each client's end: (earliest, latest) it can have been
    ends: list[tuple[float, float]]
    span: float
    expected_s: float
    instances: int
    skew_s: float
    deltas: list
    obs: window.Observed
    wire_fails: bool


class _Sample:
    """The state of one sample while it is taken: its readings, its window and who judges it."""

    def __init__(self, ctx: Context, arm: Arm, rep: int, warmup: bool) -> None:
        self.ctx, self.arm, self.rep, self.warmup = ctx, arm, rep, warmup
        self.cell, self.paths = arm.cell, list(arm.paths)
        self.by_pair = pairs.by_pair(self.cell) if arm.by_pair is None else arm.by_pair
        self.driver = get_tool(self.cell.profile.tool)
        self.started = results.now()
        self.raw: list[str] = []
        self.tag = f"{'warmup' if warmup else 'rep'}{rep}"
        self.eps = [ep for p in self.paths for ep in (p.client, p.server)]
        pids = arm.pids(ctx)
        # A cell recorded by pair counts its own guests' QEMUs only; one path's CPU record
        # has always named every QEMU it was given.
        self.pids = dict(pids) if not self.by_pair else \
            {ep.guest.spec.name: pids[ep.guest.spec.name] for ep in self.eps if ep.guest.spec.name in pids}
        self.domains = {ep.guest.spec.name: ep.guest.dom for ep in self.eps
                        if isinstance(ep.guest, Guest) and ep.guest.spec.name in self.pids}
        # This host's namespace endpoints: their tools' CPUs are recorded, and verified
        # where placement.endpoints pinned them.
        self.ns_ends = {ep.guest.agent.netns: window.NsEndpoint(ep.guest.agent.netns, role, ep.guest.agent.cpus)
                        for p in self.paths for role, ep in (("client", p.client), ("server", p.server))
                        if isinstance(ep.guest.agent, NsAgent)}
        # The host guard (daemons, objects, wire gaps: hostwatch), one per path: N pairs
        # are watched like one path is.
        self.guards = [p.guard for p in self.paths if p.guard is not None]
        self.watches: dict[int, hostwatch.SampleWatch] = {}     # path index -> its guard's watch
        self.hook_window = hooks.SampleWindow(self.cell, rep, warmup, tuple(self.paths), dict(self.pids),
                                              ctx.watch.attempt)
        self.hooks = [h for h in ctx.hooks if h.applies(self.hook_window)]

    # -- failure with its cause ---------------------------------------------------------

    def _host_reason(self) -> str | None:
        found: list[str] = []
        for w in self.watches.values():
            if w.finish() and w.reason not in found:
                found.append(w.reason)      # type: ignore[arg-type]
        return "; ".join(found) or None

    def _gone(self) -> str | None:
        """Objects missing before the window opened: the guard's fault, the segment to be rebuilt."""
        return gone(self.guards)

    def failed(self, reason: str, cpu_info: Mapping | None = None, extra: Mapping | None = None,
               check: Mapping | None = None) -> SampleRecord:
        # What the host did (a daemon restarted, an object removed) is the cause; the
        # tool's complaint is its symptom.
        cause = self._host_reason() if self.watches else self._gone()
        if cause and cause not in reason:
            reason = f"{cause} (then: {reason})"
        return SampleRecord.new(self.ctx.writer.run_id, self.cell.as_dict(), self.rep, self.warmup, "failed",
                                reason, {}, cpu_info or {}, self.started, results.now(), self.raw,
                                self.ctx.placement, extra, check)

    # -- the window -----------------------------------------------------------------------

    def take(self, wire_fails: bool) -> SampleRecord:
        gone = self._gone()
        if gone:
            return self.failed(gone)
        profile, driver, paths = self.cell.profile, self.driver, self.paths
        port = driver.default_port
        servers = [p.servers or Servers(reuse=False) for p in paths]
        server_pids: list[int | None] = [None] * len(paths)
        server_out = [""] * len(paths)
        runs = driver.runs(profile)
        limit_s, expected_s = profile.duration_s * runs + SAMPLE_MARGIN_S, profile.duration_s * runs
        win = contextlib.ExitStack()
        try:
            for i, p in enumerate(paths):
                try:
                    server_pids[i] = servers[i].start(p.server.guest, driver, profile, port)
                except (CommandError, GuestError, TestbedError) as e:
                    return self.failed(f"{pairs.label(self.by_pair, i)}server did not start: {e}")
            plans = [client_plan(driver, self.cell, p.server.address, port, p.client.guest.agent) for p in paths]
            # the hooks' windows enclose the CPU and counter readings: what a hook costs to
            # start and stop (a tracer's compile and attach) stays outside the measured window
            for h in self.hooks:
                win.enter_context(h.window(self.hook_window))
            g_before = {ep.guest.spec.name: cpu.guest_reading(ep.guest.agent) for ep in self.eps}
            counters_before = [p.counters() for p in paths]
            h_before = cpu.host_reading(self.pids, self.domains)
            obs = win.enter_context(self.ctx.watch.window(self.pids, self.cell.id, self.rep, self.ns_ends))
            # a paced profile idles between bursts by design: no gap check
            gap_check = not (profile.paced or profile.rate_bps or profile.search is not None)
            by_guard: dict[int, hostwatch.SampleWatch] = {}
            for i, p in enumerate(paths):
                if p.guard is not None:
                    if id(p.guard) not in by_guard:
                        by_guard[id(p.guard)] = win.enter_context(p.guard.sample(gap_check=gap_check))
                    self.watches[i] = by_guard[id(p.guard)]
            t0 = time.monotonic()
            for w in self.watches.values():
                w.tools_from = t0
                w.quiet_until = t0 + self.driver.quiet_start_s
            outs, ends, skew_s, error = self._run_clients(plans, limit_s, expected_s, t0)
            if error is not None:
                return self.failed(error)
            span = time.monotonic() - t0
            instances = sum(len(x) for x in outs)
            why = end_skew_reason(ends, profile.duration_s,
                                  f"{len(paths)} pairs" if self.by_pair else f"{instances} instances")
            if why:
                return self.failed(why)
            h_after = cpu.host_reading(self.pids, self.domains)
            win.close()
            counters_after = [p.counters() for p in paths]
            g_after = {ep.guest.spec.name: cpu.guest_reading(ep.guest.agent) for ep in self.eps}
        except (CommandError, GuestError, NetlinkError, FileNotFoundError) as e:
            # NetlinkError, FileNotFoundError: a device read by netlink or in /sys/class/net was
            # removed from outside meanwhile (a guest destroyed takes its tap); the guard names
            # the cause in the reason and the segment is rebuilt
            return self.failed(f"measurement could not run: {e}")
        finally:
            win.close()
            for i, p in enumerate(paths):
                if server_pids[i] is not None:
                    server_out[i] = servers[i].release(p.server.guest, driver, server_pids[i])  # type: ignore[arg-type]
        deltas = [{tap: after[tap] - before[tap] for tap in before}
                  for before, after in zip(counters_before, counters_after)]
        per_path = self._parse(outs, server_out)
        cpu_info, guest_s = cpu_over_window(g_before, g_after, h_before, h_after)
        return self._judge(per_path, cpu_info, guest_s, _Readings(outs, ends, span, expected_s, instances, skew_s,
                                                                  deltas, obs, wire_fails))

    def _run_clients(self, plans: list, limit_s: float, expected_s: float,
                     t0: float) -> tuple[list[list], list[float], float, str | None]:
        """Every path's clients started at once and waited for: (outputs per path, when each
        client was seen to end, the start skew, why they failed or None)."""
        paths = self.paths
        # Every path's clients at once, each path from its own thread (its own guest agent):
        # spawned path after path, the last would start one agent round trip per path later
        # (about 0.5 s each under TCG), and the pairs would not overlap for the whole test.
        spawned = _each(len(paths), lambda i: [paths[i].client.guest.agent.spawn(plans[i][0])
                                               for _ in range(plans[i][1])])
        skew_s = time.monotonic() - t0
        outs: list[list] = [[] for _ in paths]

        def wait_path(i: int) -> list[float]:
            # Each path's clients are waited for by its own thread: waiting path after path
            # would see a later pair end one agent round trip late for every pair before it
            # (seconds under TCG), a skew no client had. The first wait sleeps through the
            # test's own duration: no agent polls inside the guests while they are measured.
            seen = []
            stop = self.watches[i].stop if i in self.watches else None
            for j, pid in enumerate(spawned[i]):
                out = paths[i].client.guest.agent.wait(pid, plans[i][0], limit_s,
                                                       expected_s=expected_s if j == 0 else 0.0, stop=stop)
                outs[i].append(out)
                now = time.monotonic()
                # (earliest, latest) end: a polling agent saw it running until running_at
                seen.append((out.running_at if out.running_at is not None else now, now))
            return seen
        ends: list[tuple[float, float]] = []
        errors: list[tuple[int, CommandError]] = []
        for i, got in enumerate(_each(len(paths), wait_path, catch=CommandError)):
            if isinstance(got, CommandError):
                errors.append((i, got))
            else:
                ends.extend(got)
        if not errors:
            return outs, ends, skew_s, None
        # the clients not yet waited for: a path's waits stop at its failed one, which
        # its wait stopped; a path without a failure was waited for to the end
        failed_paths = {i for i, _ in errors}
        for i, p in enumerate(paths):
            for rest in spawned[i][len(outs[i]) + (i in failed_paths):]:
                p.client.guest.agent.kill(rest)
        i, e = errors[0]
        what = "timed out" if e.timed_out else "stopped" if isinstance(e, StoppedError) else "failed"
        return outs, ends, skew_s, f"{pairs.label(self.by_pair, i)}client {what}: {e}"

    # -- after the window -------------------------------------------------------------------

    def _parse(self, outs: list[list], server_out: list[str]) -> list[ToolResult]:
        """Each path's result from its clients' output (the raw output kept in the run)."""
        writer, cell, driver, profile = self.ctx.writer, self.cell, self.driver, self.cell.profile
        per_path: list[ToolResult] = []
        for i, o_list in enumerate(outs):
            who = f"{self.tag}-pair{i + 1}" if self.by_pair else self.tag
            parsed = []
            for j, o in enumerate(o_list):
                p_out = writer.write_raw(cell.id, f"{who}-client{j}.out", o.stdout)
                writer.write_raw(cell.id, f"{who}-client{j}.err", o.stderr)
                self.raw.append(str(p_out.relative_to(writer.dir)))
                parsed.append(read_sample(driver, o.stdout, o.stderr, o.rc, profile=profile,
                                          server_output=server_out[i]))
            if server_out[i] and not self.by_pair:
                p_srv = writer.write_raw(cell.id, f"{who}-server.out", server_out[i])
                self.raw.append(str(p_srv.relative_to(writer.dir)))
            per_path.append(parsed[0] if len(parsed) == 1 else driver.aggregate(parsed))
        return per_path

    def _judge(self, per_path: list[ToolResult], cpu_info: dict, guest_s: Mapping, w: _Readings) -> SampleRecord:
        """The checks in their one order: the tool, the host guard, placement, the CPU
        invariant, the wire cross-check, the hooks, then the noise guard."""
        outs, deltas, obs = w.outs, w.deltas, w.obs
        ctx, cell, profile, paths = self.ctx, self.cell, self.cell.profile, self.paths
        res = pairs.combine(profile, per_path, self.driver)[0] if self.by_pair else per_path[0]
        cpu_rec = Cpu.from_dict(cpu_info)
        extra = {"window": window_record(res.metrics.get("duration_s"), w.expected_s, cpu_info["window_s"],
                                         guest_s),
                 "kernel": kernel_once(), "instances": w.instances, "start_skew_s": round(w.skew_s, 4),
                 # as seen from the host through the agent's polling (its round trips in it),
                 # and the least the observations prove
                 "end_skew_s": round(max(hi for _, hi in w.ends) - min(hi for _, hi in w.ends), 3),
                 "end_skew_proven_s": round(proven_skew(w.ends), 3),
                 "datapath": paths[0].datapath}
        wextra, pin_bad, noisy = ctx.watch.verdict(obs, cpu_info, self.pids, self.domains, self.ns_ends)
        extra.update(wextra)
        if not res.ok:
            return self.failed(res.reason or "tool failed without a reason", cpu_info, extra)
        host = self._host_reason()
        if host:
            return self.failed(host, cpu_info, extra)
        if pin_bad:
            return self.failed(f"placement did not hold: {pin_bad}", cpu_info, extra)
        checks = [wire_check(cell, p, dict(r.metrics), d) for p, r, d in zip(paths, per_path, deltas)]
        extra["warnings"] = [*res.warnings, *cpu_warnings(cpu_info)]
        if self.by_pair:
            extra.update(pairs.pairs_extra(profile, per_path, cpu_rec.per_guest,
                                           [[ep.guest.spec.name for ep in (p.client, p.server)] for p in paths]))
            check = pairs.wire_record(checks)
        else:
            extra.update(path_extra(paths[0], deltas[0], w.span))
            check = checks[0].as_dict()
        why = invariant_reason(cpu_info)
        if why:
            return self.failed(why, cpu_info, extra, check)
        bad = next(((i, c) for i, c in enumerate(checks) if c.verdict == "fail"), None)
        if bad is not None and w.wire_fails:
            return self.failed(f"{pairs.label(self.by_pair, bad[0])}wire cross-check: {bad[1].reason}",
                               cpu_info, extra, check)
        metrics = {**res.metrics, **derived(dict(res.metrics), cpu_info, ctx.clock_ghz)}
        if profile.pattern.is_transactional:
            # all clients of all pairs: their distributions add up to the sample's (each pair
            # keeps its own percentiles in extra.pairs); insufficient ones leave the metrics
            metrics = latency_percentiles(profile, self.driver, [o.stdout for out in outs for o in out],
                                          metrics, extra)
        if self.hooks:
            why = self._hooks(metrics, cpu_rec, extra, check)
            if why:
                return self.failed(why, cpu_info, extra, check)
        status, reason = noise_outcome(ctx.watch, noisy, self.warmup, extra)
        if status == "failed":
            return self.failed(reason, cpu_info, extra, check)   # type: ignore[arg-type]
        return SampleRecord.new(ctx.writer.run_id, cell.as_dict(), self.rep, self.warmup, status, reason, metrics,
                                cpu_rec, self.started, results.now(), self.raw, ctx.placement, extra, check)

    def _hooks(self, metrics: dict, cpu_rec: Cpu, extra: dict, check: Mapping) -> str | None:
        """The hooks' findings on the sample as it would be written (status ok)."""
        ctx = self.ctx
        provisional = SampleRecord.new(ctx.writer.run_id, self.cell.as_dict(), self.rep, self.warmup, "ok", None,
                                       dict(metrics), cpu_rec, self.started, results.now(), self.raw,
                                       ctx.placement, dict(extra), check)
        return hooks.apply([(h, h.finding(self.hook_window, provisional)) for h in self.hooks], metrics, extra)


def _each(n: int, fn: Callable[[int], Any], catch: type[BaseException] | None = None) -> list[Any]:
    """``fn(i)`` for i in 0..n-1, each in its own thread when there are several (each path's
    guests have their own agents); with ``catch``, such an exception is returned in its
    place after every call has ended."""
    def call(i: int) -> Any:
        try:
            return fn(i)
        except BaseException as e:
            if catch is not None and isinstance(e, catch):
                return e
            raise
    if n == 1:
        return [call(0)]
    with ThreadPoolExecutor(max_workers=n) as pool:
        return list(pool.map(call, range(n)))


class CellSamples:
    """The samples of one cell that its stopping rule counts, and the rule's bookkeeping: the
    one place that decides whether a cell needs another sample and what its outcome is."""

    def __init__(self, cell: Cell, rule: stats.StoppingRule) -> None:
        self.cell, self.rule = cell, rule
        self.metric = primary_metric(cell.profile)
        self.samples: list[SampleRecord] = []
        self.decision: stats.Decision | None = None

    def add(self, s: SampleRecord) -> bool:
        """Count a measured sample (not a noisy one: it is measured again); False once the
        rule is met or max_samples is reached."""
        self.samples.append(s)
        values = [v for x in self.samples if x.ok and (v := x.metrics.get(self.metric)) is not None]
        # the rule's decision over every sample so far: what the cell's ``converged`` reports
        self.decision = self.rule.decide(values) if values else None
        if self.decision is not None and not self.decision.more:
            return False
        return len(self.samples) < self.rule.repetitions.max_samples

    def finish(self, writer: results.RunWriter) -> list[SampleRecord]:
        """The cell's outcome into run.json (ok, partial or failed, with the failures'
        reasons and a summary of the ok samples); returns the counted samples."""
        ok = [x for x in self.samples if x.ok]
        status = "ok" if ok and len(ok) == len(self.samples) else ("partial" if ok else "failed")
        reason = None if status == "ok" else \
            "; ".join(sorted({x.reason or "" for x in self.samples if not x.ok}))
        writer.add_cell(self.cell, status, reason, self.decision.converged if self.decision else None,
                        summaries(ok))
        return self.samples


# --------------------------------------------------------------------------- older entry points

def _context(writer: results.RunWriter, qemu_pids: Mapping[str, int], placement: Mapping[str, str],
             clock_ghz: float | None, watch: window.Watch | None, **more: Any) -> Context:
    return Context(writer, watch or window.Watch(), qemu_pids, placement, clock_ghz, **more)


def measure_once(cell: Cell, path: TestPath, writer: results.RunWriter, rep: int, warmup: bool,
                 qemu_pids: Mapping[str, int], placement: Mapping[str, str],
                 clock_ghz: float | None = None, watch: window.Watch | None = None, *,
                 wire_fails: bool = True) -> SampleRecord:
    """One sample on one path, recorded as one path's sample even for a paced profile (not
    written). Older form of :func:`sample`, for callers outside a run."""
    return sample(_context(writer, qemu_pids, placement, clock_ghz, watch), Arm(cell, (path,), by_pair=False),
                  rep, warmup, wire_fails=wire_fails)


def sample_paths(cell: Cell, paths: Sequence[TestPath], writer: results.RunWriter, rep: int, warmup: bool,
                 qemu_pids: Mapping[str, int], placement: Mapping[str, str],
                 clock_ghz: float | None = None, watch: window.Watch | None = None, *,
                 wire_fails: bool = True, by_pair: bool | None = None) -> SampleRecord:
    """One sample over ``paths`` at once (not written). Older form of :func:`sample`."""
    return sample(_context(writer, qemu_pids, placement, clock_ghz, watch), Arm(cell, tuple(paths), by_pair=by_pair),
                  rep, warmup, wire_fails=wire_fails)


def measure_cell(cell: Cell, path: TestPath, writer: results.RunWriter, rule: stats.StoppingRule,
                 warmup: int, qemu_pids: Mapping[str, int], placement: Mapping[str, str],
                 clock_ghz: float | None = None, watch: window.Watch | None = None) -> list[SampleRecord]:
    """All samples of one cell on one path, recorded as one path's samples even for a paced
    profile. Older form of :func:`measure` with one arm."""
    return measure_paths(cell, [path], writer, rule, warmup, qemu_pids, placement, clock_ghz, watch,
                         by_pair=False)


def measure_paths(cell: Cell, paths: Sequence[TestPath], writer: results.RunWriter, rule: stats.StoppingRule,
                  warmup: int, qemu_pids: Mapping[str, int], placement: Mapping[str, str],
                  clock_ghz: float | None = None, watch: window.Watch | None = None, *,
                  by_pair: bool | None = None) -> list[SampleRecord]:
    """All samples of one cell over the first ``cell.pairs`` of ``paths``. Older form of
    :func:`measure` with one arm."""
    ctx = _context(writer, qemu_pids, placement, clock_ghz, watch, rule=rule, warmup=warmup)
    return measure(ctx, [Arm(cell, tuple(paths), by_pair=by_pair)])[0]


__all__ = ["Arm", "CellSamples", "Context", "Endpoint", "Pattern", "Servers", "TestPath", "check_mtu", "fail",
           "fail_cell", "measure", "measure_cell", "measure_once", "measure_paths", "prepare", "primary_metric",
           "round_order", "sample", "sample_paths", "set_mtu", "settled", "summaries"]
