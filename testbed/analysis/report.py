"""`testbed report`: one self-contained HTML page (and a CSV of every sample) for some runs.

The page needs no network to open: CSS is inline and plots are Plotly figures
(testbed.analysis.figures) with plotly.js inlined once. Building the model and rendering HTML are pure; only ``write_*`` touch files.
"""
from __future__ import annotations

import csv
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields
from typing import Any, TextIO

import jinja2

from testbed.analysis import figures, stats
from testbed.analysis.compare import RunComparison, compare_runs, measured
from testbed.analysis.figures import Panel, Plot
from testbed.host import paths
from testbed.records import study_result
from testbed.records.records import RunRecord, SampleRecord
from testbed.records.store.schema import MAIN_METRICS, SampleRow, rows_for_run

TCG_BANNER = "TCG: functional check only; not comparable with KVM"


# --------------------------------------------------------------------------- model

@dataclass(frozen=True)
class CellStats:
    run_id: str
    cell_id: str
    mode: str                           # attachment/backend
    mtu: int
    connections: int
    profile: str
    transactional: bool
    n_ok: int
    n_failed: int
    #: measured again because the host was busy with other work (status noisy): not failures,
    #: and left out of every statistic
    n_retried: int
    throughput: stats.Summary | None    # Mbit/s
    tps: stats.Summary | None
    p50: float | None                   # mean over samples, µs
    p90: float | None
    p99: float | None
    host_cores: float | None
    guest_cores: float | None
    qemu_cores: float | None
    #: the wire cross-check, means over the ok samples: payload / wire bytes, and expected
    wire_ratio: float | None = None
    wire_expected: float | None = None
    #: ok samples kept although the host was busy (retries ran out, or a shared host):
    #: counted in the statistics, and marked
    n_kept_noisy: int = 0

    @property
    def gbit_per_host_core(self) -> float | None:
        return stats.gbit_per_core(self.throughput.mean if self.throughput else None, self.host_cores)

    @property
    def gbit_per_guest_core(self) -> float | None:
        return stats.gbit_per_core(self.throughput.mean if self.throughput else None, self.guest_cores)

    @property
    def host_us_per_tx(self) -> float | None:
        return stats.cpu_us_per_transaction(self.host_cores, self.tps.mean if self.tps else None)

    @property
    def guest_us_per_tx(self) -> float | None:
        return stats.cpu_us_per_transaction(self.guest_cores, self.tps.mean if self.tps else None)


@dataclass(frozen=True)
class RunView:
    run_id: str
    dir: str
    status: str
    tcg: bool
    environment: tuple[tuple[str, str], ...]
    cells: tuple[CellStats, ...]
    failures: tuple[str, ...]
    #: samples measured again because the host was busy, each with why
    retried: tuple[str, ...] = ()
    #: samples kept although the host was busy, each with why
    kept_noisy: tuple[str, ...] = ()
    #: the line `testbed run` ends its progress with (status_line)
    summary: str = ""
    #: the noise guard's settings, as the run recorded them
    noise_guard: str = ""
    #: what the user should know and do when samples were retried or kept noisy (noise_advice)
    noise_advice: str | None = None
    #: a scenario run's study.json (testbed.records.study_result): its study-shaped tables
    study: study_result.StudyReport | None = None

    def env(self, key: str) -> str:
        return next((v for k, v in self.environment if k == key), "-")


def _mean(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def _summary(samples: Sequence[SampleRecord], metric: str) -> stats.Summary | None:
    vals = [float(s.metrics[metric]) for s in samples
            if isinstance(s.metrics.get(metric), (int, float))]
    return stats.summarize(vals) if vals else None


def _metric_mean(samples: Sequence[SampleRecord], metric: str) -> float | None:
    return _mean(s.metrics.get(metric) for s in samples)


def cell_stats(rec: RunRecord) -> tuple[CellStats, ...]:
    out = []
    run_id = rec.run_id
    for cid, samples in sorted(measured(rec).items()):
        cell = samples[0].cell
        ok = [s for s in samples if s.ok]
        noisy = [s for s in samples if s.status == "noisy"]
        cores = [s.cpu.cores() for s in ok]
        out.append(CellStats(
            run_id=run_id, cell_id=cid, mode=cell.mode,
            mtu=int(cell.mtu or 0), connections=int(cell.connections or 0),
            profile=str(cell.profile),
            transactional=rec.is_transactional(str(cell.profile)),
            n_ok=len(ok), n_failed=len(samples) - len(ok) - len(noisy), n_retried=len(noisy),
            n_kept_noisy=sum(1 for s in ok if s.noisy),
            throughput=_summary(ok, "throughput_mbps"), tps=_summary(ok, "transactions_per_s"),
            p50=_metric_mean(ok, "latency_p50_us"), p90=_metric_mean(ok, "latency_p90_us"),
            p99=_metric_mean(ok, "latency_p99_us"),
            host_cores=_mean(c.host for c in cores), guest_cores=_mean(c.guest for c in cores),
            qemu_cores=_mean(c.qemu for c in cores),
            wire_ratio=_mean(s.crosscheck.ratio for s in ok),
            wire_expected=_mean(s.crosscheck.expected_ratio for s in ok)))
    return tuple(out)


def _environment_rows(rec: RunRecord) -> tuple[tuple[str, str], ...]:
    env, counts = rec.environment, rec.counts
    image = env.image
    mem = env.memory_bytes
    rows = [("status", rec.status), ("started", rec.started), ("ended", rec.ended),
            ("accelerator", env.accelerator), ("comparable class", env.comparable_class),
            ("CPU model", env.cpu_model), ("CPU MHz", env.cpu_mhz),
            ("CPUs", env.cpus),
            ("memory", f"{mem / 2**30:.1f} GiB" if isinstance(mem, (int, float)) else None),
            ("host", env.host), ("host kernel", env.kernel),
            *((k, v) for k, v in sorted((env.versions or {}).items())),
            ("vhost-net", env.vhost_net),
            ("guest image", " ".join(str(v) for v in ((image.name, image.kernel, image.digest)
                                                      if image else ()) if v)),
            ("attachments", ", ".join(rec.attachments())),
            ("samples", sample_counts(rec)),
            ("testbed", " ".join(str(v) for v in (env.testbed, env.testbed_commit) if v))]
    return tuple((k, "-" if v in (None, "") else str(v)) for k, v in rows)


def _sample_line(s: SampleRecord, why: str | None) -> str:
    return f"{s.cell.id} rep {s.rep}{' (warmup)' if s.warmup else ''}: {why or 'failed'}"


def sample_counts(rec: RunRecord) -> str:
    """How many samples a run took and what became of them, in the words stderr and the
    report both use: "22 samples: 6 ok, 0 failed, 16 retried (host busy)". A retried sample
    was measured while the host was busy with other work and measured again; it is neither
    ok nor failed."""
    n = len(rec.samples)
    failed = sum(1 for s in rec.samples if s.status == "failed")
    retried = sum(1 for s in rec.samples if s.status == "noisy")
    kept = sum(1 for s in rec.samples if s.ok and s.noisy)
    text = f"{n} sample{'s' if n != 1 else ''}: {n - failed - retried} ok, {failed} failed"
    if retried:
        text += f", {retried} retried (host busy)"
    if kept:
        text += f", {kept} kept noisy"
    return text


def status_line(rec: RunRecord) -> str:
    """The line `testbed run` ends its progress with, and the report's summary."""
    return f"status: {rec.status}, {sample_counts(rec)}"


def noise_advice(rec: RunRecord) -> str | None:
    """What to tell the user when the noise guard retried or kept samples, or None."""
    retried = sum(1 for s in rec.samples if s.status == "noisy")
    kept = sum(1 for s in rec.samples if s.ok and s.noisy)
    if not retried and not kept:
        return None
    g = rec.extra.get("noise_guard") or {}
    bound = g.get("threshold_cores")
    what = (f"other work on the host used more than {bound:g} cores" if isinstance(bound, (int, float))
            else "other work on the host used CPU") + " during their window"
    parts = []
    if retried:
        parts.append(f"{retried} sample{'s were' if retried != 1 else ' was'} measured again because {what}; "
                     "they are not failures and no statistic uses them")
    if kept:
        parts.append(f"{kept} sample{'s were' if kept != 1 else ' was'} kept although {what} "
                     "(retries ran out, or the run shared the host): their figures are in the "
                     "statistics and marked noisy")
    return ("; ".join(parts) + ". For figures you can defend, stop what else runs on the host, "
            "or give the testbed cores of its own (the topology's placement), and run again.")


def run_view(rec: RunRecord, study: study_result.StudyReport | None = None) -> RunView:
    """A run's view; ``study`` is a scenario run's typed study result (read from the run
    directory's study.json when not given)."""
    def noise(s: SampleRecord) -> str:
        n = s.noise
        if s.reason:
            why = s.reason.removeprefix("noisy: ")
        elif isinstance(n.get("other_cores"), (int, float)):
            why = f"{n['other_cores']:.2f} cores used by other work (threshold {n.get('threshold_cores', '?')})"
        else:
            why = "noisy"
        return why + (f", attempt {n['attempt'] + 1}" if isinstance(n.get("attempt"), int) else "")
    g = rec.extra.get("noise_guard") or {}
    guard = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in g.items()
                      if k in ("threshold_cores", "action", "max_retries") and v is not None)
    return RunView(run_id=rec.run_id, dir=str(rec.dir), status=rec.status,
                   tcg=rec.environment.tcg,
                   environment=_environment_rows(rec), cells=cell_stats(rec),
                   failures=tuple(_sample_line(s, s.reason) for s in rec.samples if s.status == "failed"),
                   retried=tuple(_sample_line(s, noise(s)) for s in rec.samples if s.status == "noisy"),
                   kept_noisy=tuple(_sample_line(s, noise(s)) for s in rec.samples if s.ok and s.noisy),
                   summary=status_line(rec), noise_guard=guard, noise_advice=noise_advice(rec),
                   study=study if study is not None else study_result.load(rec.dir))


# --------------------------------------------------------------------------- plots
# One convention in every plot: colour = the series (mode, MTU or profile), line style = the
# run; each point's hover gives its mean, its 95 % interval where it has one, and n.

@dataclass(frozen=True)
class Point:
    series: str
    run_id: str
    x: float
    y: float
    err: tuple[float, float] | None = None      # below, above
    n: int | None = None                        # samples behind the point
    noisy: int = 0                              # of those, kept although the host was busy


def _points(cells: Iterable[CellStats], series: Callable[[CellStats], str],
            x: Callable[[CellStats], float], y: Callable[[CellStats], float | None]) -> list[Point]:
    return [Point(series(c), c.run_id, x(c), v, n=c.n_ok, noisy=c.n_kept_noisy) for c in cells
            if (v := y(c)) is not None]


def _hover(unit: str, xname: str = "") -> str:
    return ("%{fullData.name}<br>" + (f"{xname} %{{x}}: " if xname else "")
            + "%{y:.4g} " + unit + "%{customdata}<extra></extra>")


def _extra(p: Point) -> str:
    ci = f" (95 % CI {p.y - p.err[0]:.4g} to {p.y + p.err[1]:.4g})" if p.err else ""
    return ci + (f", n={p.n}" if p.n is not None else "") + (f", {p.noisy} kept noisy" if p.noisy else "")


def _label(p: Point) -> str:
    """What a bar says on itself: n, and that some of its samples are noisy."""
    return (f"n={p.n}" if p.n is not None else "") + (" (noisy)" if p.noisy else "")


def _error(pts: Sequence[Point]) -> dict | None:
    if not any(p.err for p in pts):
        return None
    return {"type": "data", "symmetric": False, "array": [(p.err or (0, 0))[1] for p in pts],
            "arrayminus": [(p.err or (0, 0))[0] for p in pts], "thickness": 1.2, "width": 4}


def _line_panel(title: str, points: Sequence[Point], xlabel: str, ylabel: str,
                runs: Sequence[str]) -> Panel:
    """Lines of y against x, one per (series, run)."""
    import plotly.graph_objects as go
    groups: dict[tuple[str, str], list[Point]] = defaultdict(list)
    for p in points:
        groups[(p.series, p.run_id)].append(p)
    names = sorted({s for s, _ in groups})
    traces = []
    for (name, run_id), pts in sorted(groups.items()):
        pts.sort(key=lambda p: p.x)
        i, r = names.index(name), runs.index(run_id)
        label = name if len(runs) == 1 else f"{name} [{run_id}]"
        traces.append(go.Scatter(
            x=[p.x for p in pts], y=[p.y for p in pts], name=label, mode="lines+markers",
            line={"color": figures.colour(i), "dash": figures.RUN_DASHES[r % len(figures.RUN_DASHES)]},
            marker={"symbol": figures.MARKERS[i % len(figures.MARKERS)], "size": 7},
            error_y=_error(pts), customdata=[_extra(p) for p in pts],
            hovertemplate=_hover(ylabel, xlabel)))
    return Panel(title, xlabel, ylabel, tuple(traces), log_x=xlabel == "connections")


def _varies(cells: Iterable[CellStats], attr: str) -> bool:
    """An axis is worth a line only when it has more than one value."""
    return len({getattr(c, attr) for c in cells}) > 1


def _bar_panel(title: str, bars: Sequence[Point], ylabel: str, runs: Sequence[str]) -> Panel:
    """Bars side by side: one group per series label (mode), one bar per run, with error
    bars where a point has an interval and n= on each bar."""
    import plotly.graph_objects as go
    labels = sorted({p.series for p in bars})
    traces = []
    for r, run_id in enumerate(runs):
        pts = sorted((p for p in bars if p.run_id == run_id), key=lambda p: labels.index(p.series))
        if not pts:
            continue
        traces.append(go.Bar(
            x=[p.series for p in pts], y=[p.y for p in pts], name=f"run {run_id}",
            marker={"color": figures.colour(r)}, error_y=_error(pts),
            text=[_label(p) for p in pts], textposition="inside",
            insidetextanchor="start", customdata=[_extra(p) for p in pts],
            showlegend=len(runs) > 1, hovertemplate="%{x}: %{y:.4g} " + ylabel + "%{customdata}<extra></extra>"))
    return Panel(title, "mode", ylabel, tuple(traces), categories=tuple(labels))


def _err(t: stats.Summary, scale: float = 1.0) -> tuple[float, float] | None:
    if t.ci_low is None or t.ci_high is None:
        return None
    return (t.mean - t.ci_low) / scale, (t.ci_high - t.mean) / scale


#: what every rate plot's caption says about its intervals
INTERVALS = ("Error bars are the 95 % confidence interval of the mean where a cell has 2 or more "
             "samples; n= is the number of successful samples behind each figure (a cell with "
             "n=1 has no interval), and (noisy) marks one with samples kept although the host was "
             "busy. Hover over a point for its values.")


def bars_plot(cells: Sequence[CellStats], runs: Sequence[str]) -> Plot | None:
    """One point per mode (no axis varies): throughput or transactions/s with their 95 %
    intervals, and host CPU per unit of traffic, as bars side by side per mode."""
    panels = []
    for profile in sorted({c.profile for c in cells}):
        these = [c for c in cells if c.profile == profile]
        rr = these[0].transactional
        label = lambda c: c.mode + (f" mtu{c.mtu}" if _varies(these, "mtu") else "")  # noqa: E731
        if rr:
            pts = [Point(label(c), c.run_id, 0, c.tps.mean, _err(c.tps), c.n_ok, c.n_kept_noisy)
                   for c in these if c.tps]
            cost = [Point(label(c), c.run_id, 0, v, n=c.n_ok, noisy=c.n_kept_noisy) for c in these
                    if (v := c.host_us_per_tx) is not None]
            panels += [_bar_panel(f"{profile}: transactions/s", pts, "transactions/s", runs),
                       _bar_panel(f"{profile}: host CPU per transaction", cost,
                                  "host CPU µs per transaction", runs)]
        else:
            pts = [Point(label(c), c.run_id, 0, c.throughput.mean / 1000, _err(c.throughput, 1000), c.n_ok,
                         c.n_kept_noisy) for c in these if c.throughput]
            cost = [Point(label(c), c.run_id, 0, 1 / v, n=c.n_ok, noisy=c.n_kept_noisy) for c in these
                    if (v := c.gbit_per_host_core)]
            panels += [_bar_panel(f"{profile}: throughput", pts, "Gbit/s", runs),
                       _bar_panel(f"{profile}: host CPU per Gbit/s", cost,
                                  "host cores per Gbit/s", runs)]
    if not panels:
        return None
    return figures.figure(panels, "Per mode: rate and CPU per unit of traffic",
                          "One point per mode, so bars, not lines. " + INTERVALS + " CPU per unit "
                          "of traffic uses host busy cores (lower is better).", runs)


def _axis(cells: Sequence[CellStats]) -> str | None:
    """The x axis for lines: connections if they vary, else MTU if it varies, else none."""
    return next((a for a in ("connections", "mtu") if _varies(cells, a)), None)


def _other(axis: str) -> Callable[[CellStats], str]:
    return (lambda c: f"{c.mode} mtu{c.mtu}") if axis == "connections" else \
        (lambda c: f"{c.mode} conn{c.connections}")


def throughput_plot(cells: Sequence[CellStats], runs: Sequence[str]) -> Plot | None:
    stream = [c for c in cells if not c.transactional and c.throughput]
    axis = _axis(stream)
    if not stream or axis is None:
        return None
    panels = []
    for profile in sorted({c.profile for c in stream}):
        pts = [Point(_other(axis)(c), c.run_id, getattr(c, axis), c.throughput.mean / 1000,
                     _err(c.throughput, 1000), c.n_ok, c.n_kept_noisy)
               for c in stream if c.profile == profile and c.throughput is not None]
        panels.append(_line_panel(profile, pts, axis if axis == "connections" else "MTU",
                                  "Gbit/s", runs))
    return figures.figure(panels, f"Throughput against {axis if axis == 'connections' else 'MTU'}",
                          "Mean per cell. " + INTERVALS, runs)


def latency_plot(cells: Sequence[CellStats], runs: Sequence[str]) -> Plot | None:
    rr = [c for c in cells if c.transactional and c.p50 is not None]
    if not rr or not _varies(rr, "mtu"):
        return None
    panels = []
    for profile, mode in sorted({(c.profile, c.mode) for c in rr}):
        these = [c for c in rr if (c.profile, c.mode) == (profile, mode)]
        conn = min(c.connections for c in these)
        at = [c for c in these if c.connections == conn]
        pts = [p for key in ("p50", "p90", "p99")
               for p in _points(at, lambda c, k=key: k, lambda c: c.mtu,
                                lambda c, k=key: getattr(c, k))]
        panels.append(_line_panel(f"{profile} {mode}", pts,
                                  f"MTU (at {conn} connection{'s' if conn != 1 else ''})",
                                  "latency, µs", runs))
    return figures.figure(panels, "Latency percentiles against MTU",
                          "Request/response cells; each point is the mean of the samples' percentile, "
                          "at the fewest connections measured; n= samples behind it.", runs)


def cpu_plot(cells: Sequence[CellStats], runs: Sequence[str]) -> Plot | None:
    have = [c for c in cells if c.host_cores is not None or c.guest_cores is not None]
    axis = _axis(have)
    if not have or axis is None:
        return None
    conns = lambda c: getattr(c, axis)  # noqa: E731
    xlabel = axis if axis == "connections" else "MTU"
    panels = []
    for mode in sorted({c.mode for c in have}):
        these = [c for c in have if c.mode == mode]
        for what in ("host", "guest"):
            pts = _points(these, lambda c: f"{c.profile} " + _other(axis)(c).split(" ", 1)[1],
                          conns, lambda c, w=what: getattr(c, f"{w}_cores"))
            panels.append(_line_panel(f"{mode}: {what} CPU", pts, xlabel,
                                      f"{what} cores busy", runs))
    for profile in sorted({c.profile for c in have}):
        these = [c for c in have if c.profile == profile]
        rr = these[0].transactional
        pts = _points(these, _other(axis), conns,
                      (lambda c: c.host_us_per_tx) if rr else (lambda c: c.gbit_per_host_core))
        panels.append(_line_panel(f"{profile}: efficiency", pts, xlabel,
                                  "host CPU µs per transaction" if rr else "Gbit/s per host core",
                                  runs))
    return figures.figure(panels, "CPU cost and efficiency per mode",
                          "Cores = CPU-seconds per second over each sample's window, averaged over the "
                          "samples (n= in the hover). Efficiency uses host busy cores: Gbit/s per core "
                          "(higher is better), CPU µs per transaction (lower is better).", runs)


# --------------------------------------------------------------------------- page

@dataclass(frozen=True)
class Report:
    title: str
    generated: str
    runs: tuple[RunView, ...]
    baseline: str | None
    comparisons: tuple[RunComparison, ...]
    plots: tuple[Plot, ...]
    capacity: tuple[Any, ...] = ()          # report_capacity.CapacityRow
    capacity_profile: str | None = None
    #: `testbed history` series (testbed.analysis.history.Series) shown with their change points
    history: tuple[Any, ...] = ()
    #: Plotly plots (report_interactive.Interactive): CDFs, latency against load, rate-search
    #: trials, a service level against N
    interactive: tuple[Any, ...] = ()

    @property
    def any_noisy(self) -> bool:
        return any(r.retried or r.kept_noisy for r in self.runs)

    @property
    def any_tcg(self) -> bool:
        return any(r.tcg for r in self.runs)

    @property
    def environment_keys(self) -> tuple[str, ...]:
        """Every run's environment rows, in order; runs may record different tool versions."""
        return tuple(dict.fromkeys(k for r in self.runs for k, _ in r.environment))


def history_plot(series: Sequence[Any]) -> Plot | None:
    """Each history series against run order, its change points marked and named."""
    import plotly.graph_objects as go
    if not series:
        return None
    panels = []
    for s in series:
        xs = [p.run_id for p in s.points]
        rules = tuple(figures.Rule("x", c.index - 0.5, f"{c.delta_pct:+.1f}% at {c.run_id}",
                                   colour="#d62728" if c.regression else "#2ca02c")
                      for c in s.change_points)
        title = (f"the nights' shift shared by {len(s.cells)} cells, {s.environment}" if s.cells
                 else f"{s.cell_id} [{s.hash}] {s.environment}")
        panels.append(Panel(title, "run", s.metric,
                            (go.Scatter(x=xs, y=[p.value for p in s.points], mode="lines+markers",
                                        name=s.metric, line={"color": figures.colour(0)},
                                        hovertemplate="run %{x}: %{y:.4g}<extra></extra>"),),
                            rules=rules, categories=tuple(xs)))
    cps = "; ".join(f"{s.cell_id} {s.metric}: {c.delta_pct:+.1f}% at run {c.run_id}"
                    + (" (regression)" if c.regression else "")
                    for s in series for c in s.change_points)
    return figures.figure(panels, "History and change points",
                          "Mean of each run's ok samples, in run order, divided by the night's shift "
                          "shared by the host's cells where one was taken out (a 'shared' panel shows "
                          "those shifts); dashed lines mark change points "
                          "(ruptures PELT, beyond the threshold). Change points: " + (cps or "none") + ".")


def build(records: Sequence[RunRecord], *, generated: str, baseline: RunRecord | None = None,
          threshold: float = 0.05, test: str = "auto", history: Sequence[Any] = (),
          capacity_profile: str | None = None, slo_answers: Sequence[Any] = ()) -> Report:
    from testbed.analysis import report_capacity, report_cost, report_interactive
    views = tuple(run_view(r) for r in records)
    cells = [c for v in views for c in v.cells]
    runs = [v.run_id for v in views]
    flat = cells and not any(_varies(cells, a) for a in ("connections", "mtu"))
    plots = tuple(p for p in ((bars_plot(cells, runs),) if flat else
                              (throughput_plot(cells, runs), latency_plot(cells, runs),
                               cpu_plot(cells, runs))) + (history_plot(history),)
                  if p is not None)
    plots += report_capacity.plots(records)
    comparisons = ()
    if baseline is not None:
        comparisons = tuple(compare_runs(baseline, r, threshold=threshold, test=test)
                            for r in records if r.run_id != baseline.run_id)
    return Report(title="Network testbed report: " + (", ".join(v.run_id for v in views)
                                                      or "history"),
                  generated=generated, runs=views,
                  baseline=None if baseline is None else baseline.run_id,
                  comparisons=comparisons, plots=plots, history=tuple(history),
                  capacity=report_capacity.table(records, capacity_profile),
                  capacity_profile=capacity_profile,
                  interactive=report_interactive.plots(records, slo_answers) + report_cost.plots(records))


def write_run_report(rec: RunRecord, generated: str) -> Any:
    """`testbed run`'s report.html in the run directory; returns its path."""
    from testbed.records.results import atomic_write
    path = rec.dir / "report.html"
    atomic_write(path, render(build([rec], generated=generated)))
    path.chmod(0o644)
    return path


def _num(v: float | None, digits: int = 4) -> str:
    if v is None:
        return "-"
    return f"{v:.{digits}g}" if abs(v) < 10 ** digits else f"{v:.0f}"


def render(report: Report) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(paths.templates_dir() / "report"),
                             autoescape=True, undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True)
    env.filters["num"] = _num
    env.filters["pct"] = lambda v: "-" if v is None else f"{v:+.1f}%"
    js = ""
    if report.plots or report.interactive:
        # inlined once: the page must open with no network; "</script" cannot occur in it
        js = figures.plotly_js().replace("</script", "<\\/script")
    return env.get_template("report.html.j2").render(r=report, tcg_banner=TCG_BANNER, plotly_js=js)


# --------------------------------------------------------------------------- CSV

_CSV_FIXED = tuple(f.name for f in fields(SampleRow)
                   if f.name not in ("metrics", "cpu", *MAIN_METRICS,
                                     "host_cores", "guest_cores", "qemu_cores"))


def write_csv(records: Sequence[RunRecord], out: TextIO) -> int:
    """Every sample of every run, one row each, failed and warmup ones included (with their
    status and reason). Columns: identity, then every metric seen, then CPU cores."""
    rows = [row for rec in records for row in rows_for_run(rec).samples]
    metric_keys = sorted({k for r in rows for k in r.metric_dict()},
                         key=lambda k: (k not in MAIN_METRICS, MAIN_METRICS.index(k)
                                        if k in MAIN_METRICS else 0, k))
    w = csv.writer(out, lineterminator="\n")
    w.writerow([*_CSV_FIXED, *metric_keys, "host_cores", "guest_cores", "qemu_cores"])
    for r in rows:
        m = r.metric_dict()
        w.writerow([*(getattr(r, k) for k in _CSV_FIXED), *(m.get(k, "") for k in metric_keys),
                    *("" if v is None else v for v in (r.host_cores, r.guest_cores, r.qemu_cores))])
    return len(rows)
