"""The report's interactive plots (zoom, hover values), drawn with Plotly: the latency CDF of
cells whose samples kept a histogram, latency against offered load of paced request/response
cells, the rate search's trials, and a service level's figure against N pairs with the SLO
line. The page stays self-contained: plotly.js is inlined once (``plotly_js``), no CDN.

Pure: records in, ``Interactive`` (a title, a caption and the figure's HTML) out.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from testbed.analysis.figures import plotly_js  # noqa: F401  (one copy per page, inlined by the template)
from testbed.records import percentiles
from testbed.records.records import RunRecord


@dataclass(frozen=True)
class Interactive:
    title: str
    caption: str
    html: str            # a <div> and the script that draws into it; plotly.js not included


def _div(fig: Any, div_id: str) -> str:
    import plotly.io as pio
    return pio.to_html(fig, include_plotlyjs=False, full_html=False, div_id=div_id,
                       config={"displaylogo": False, "responsive": True})


def _figure(traces: list[Any], xtitle: str, ytitle: str, *, log_x: bool = False, log_y: bool = False) -> Any:
    import plotly.graph_objects as go
    fig = go.Figure(traces)
    fig.update_layout(template="plotly_white", hovermode="closest", height=420,
                      margin={"l": 60, "r": 20, "t": 30, "b": 50}, legend={"font": {"size": 10}})
    fig.update_xaxes(title=xtitle, type="log" if log_x else "linear")
    fig.update_yaxes(title=ytitle, type="log" if log_y else "linear")
    return fig


def cdf_plot(records: Sequence[RunRecord]) -> Interactive | None:
    """Per cell, its samples' histograms added up, as a CDF; the sufficient percentiles
    as points on it."""
    import plotly.graph_objects as go
    hists: dict[str, list] = defaultdict(list)
    pct: dict[str, list] = defaultdict(list)
    for rec in records:
        for s in rec.samples:
            if not s.measured or not s.ok:
                continue
            h = s.data.get("histogram")
            key = f"{rec.run_id} {s.cell.id}"
            if h:
                hists[key].append([tuple(b) for b in h])
            pct[key].extend(p for p in s.data.get("percentiles") or () if p.get("sufficient"))
    if not hists:
        return None
    traces = []
    for key, hs in sorted(hists.items()):
        pts = percentiles.cdf(percentiles.merge(hs))
        traces.append(go.Scatter(x=[x for x, _ in pts], y=[y for _, y in pts], mode="lines+markers", name=key,
                                 line={"shape": "hv"},
                                 hovertemplate="%{x:.4g} us: %{y:.4%} of transactions<extra>" + key + "</extra>"))
        marks = sorted({(p["p"], p["value_us"]) for p in pct[key] if p.get("source") == "histogram"})
        if marks:
            traces.append(go.Scatter(x=[v for _, v in marks], y=[p / 100 for p, _ in marks], mode="markers",
                                     name=f"{key} percentiles", marker={"symbol": "diamond", "size": 9},
                                     hovertemplate="p%{customdata}: %{x:.4g} us<extra></extra>",
                                     customdata=[f"{p:g}" for p, _ in marks]))
    return Interactive("Latency CDF", "Share of transactions at or below each latency (all samples' "
                       "histograms added up); diamonds: the chosen percentiles with enough transactions "
                       "behind them.", _div(_figure(traces, "latency (us)", "share of transactions", log_x=True),
                                            "tb-cdf"))


def load_curve_plot(records: Sequence[RunRecord]) -> Interactive | None:
    """Paced request/response cells of one series at several loads: each sufficient
    percentile against the achieved rate; closed-loop tools say so in the legend."""
    import plotly.graph_objects as go
    series: dict[tuple[str, str], list] = defaultdict(list)
    loops: dict[tuple[str, str], str] = {}
    for rec in records:
        for s in rec.samples:
            if not (s.measured and s.ok and s.cell.rate and rec.is_transactional(str(s.cell.profile))):
                continue
            tps = s.metric("transactions_per_s")
            if tps is None:
                continue
            # the profiles `rates:` made (tcp_rr_1000tps, tcp_rr_4000tps) are one curve
            c = s.cell
            base = str(c.profile).removesuffix("_" + str(c.rate).replace(".", "_"))
            # open- and closed-loop samples are never one curve: queueing shows in only one
            loop = str(s.data.get("latency_loop") or "")
            key = (rec.run_id, f"{c.mode} mtu{c.mtu}-conn{c.connections}-q{c.queues or 1}-{base}"
                               + (f"-p{c.pairs}" if (c.pairs or 1) > 1 else "") + f" {loop.split(' ')[0]}")
            loops[key] = loop
            for name, v in s.metrics.items():
                p = percentiles.from_metric(name)
                if p is not None and v is not None:
                    series[key].append((p, float(tps) / max(1, int(s.cell.pairs or 1)), float(v), s.cell.rate))
    loads = {k: {r for *_, r in v} for k, v in series.items()}
    if not any(len(v) > 1 for v in loads.values()):
        return None
    traces = []
    for key, rows in sorted(series.items()):
        if len(loads[key]) < 2:
            continue
        name = key[1].rpartition(" ")[0]
        loop = f" ({loops[key].split(' ')[0]})" if loops[key] else ""
        for p in sorted({r[0] for r in rows}):
            pts = sorted((x, y, rate) for q, x, y, rate in rows if q == p)
            traces.append(go.Scatter(x=[x for x, _, _ in pts], y=[y for _, y, _ in pts], mode="lines+markers",
                                     name=f"{name} p{p:g}{loop} [{key[0]}]", customdata=[r for *_, r in pts],
                                     hovertemplate="target %{customdata}: %{x:.0f} tps per pair, "
                                                   "p" + f"{p:g}" + " %{y:.4g} us<extra></extra>"))
    return Interactive("Latency against load", "Each chosen percentile (enough transactions behind it) "
                       "against the rate each pair achieved at its paced target, labelled open- or "
                       "closed-loop and never joined across the two. Open-loop pacing (sockperf "
                       "under-load) shows queueing delay; closed-loop pacing (uperf, netperf) "
                       "under-reports it: coordinated omission.",
                       _div(_figure(traces, "transactions/s per pair", "latency (us)"), "tb-load"))


def search_plot(records: Sequence[RunRecord]) -> Interactive | None:
    """The rate search's trials: offered rate against loss ratio, in order, with NDR and PDR."""
    import plotly.graph_objects as go
    traces = []
    for rec in records:
        trials: dict[str, list] = defaultdict(list)
        for s in rec.samples:
            t = s.data.get("trial")
            if t:
                trials[s.cell.id].append(t)
        for cid, ts in sorted(trials.items()):
            ok = [t for t in ts if t.get("loss_ratio") is not None]
            traces.append(go.Scatter(
                x=[t["offered_mbps"] for t in ok], y=[t["loss_ratio"] for t in ok], mode="markers",
                name=f"{cid} trials [{rec.run_id}]",
                customdata=[[t["index"], t["intended_duration_s"], (t.get("wire") or {}).get("verdict")] for t in ok],
                hovertemplate="trial %{customdata[0]} (%{customdata[1]:.2f} s): %{x:.4g} Mbit/s offered, "
                              "loss %{y:.3%}, wire %{customdata[2]}<extra></extra>"))
            outcome = next((c for c in rec.cells if c.id == cid), None)
            search = (outcome.cell.extra.get("search") or outcome.extra.get("search")) if outcome else None
            for goal in ("ndr", "pdr"):
                b = (search or {}).get(goal) or {}
                if b.get("lower_mbps"):
                    traces.append(go.Scatter(x=[b["lower_mbps"]] * 2, y=[0, max([t["loss_ratio"] for t in ok] or [0.01])],
                                             mode="lines", line={"dash": "dash"},
                                             name=f"{cid} {goal.upper()} {b['lower_mbps']:.4g} Mbit/s",
                                             hovertemplate=f"{goal.upper()} lower bound %{{x:.4g}} Mbit/s<extra></extra>"))
    if not traces:
        return None
    return Interactive("Rate search trials", "Each trial of the loss-bounded search (MLRsearch): the rate "
                       "offered and the loss the receiver counted; dashed: the NDR and PDR lower bounds.",
                       _div(_figure(traces, "offered payload rate (Mbit/s)", "loss ratio"), "tb-search"))


def slo_plot(answers: Sequence[Any]) -> Interactive | None:
    """A service level's figure (the worst pair) against N pairs, with the SLO line."""
    import plotly.graph_objects as go
    if not answers:
        return None
    traces = []
    for a in answers:
        lv = [x for x in a.levels if x.worst is not None]
        traces.append(go.Scatter(x=[x.pairs for x in lv], y=[x.worst for x in lv], mode="lines+markers",
                                 name=a.series, customdata=["met" if x.met else "BROKEN" for x in lv],
                                 hovertemplate="N=%{x}: worst pair %{y:.4g} " + a.slo.unit
                                               + " (%{customdata})<extra></extra>"))
    a0 = answers[0]
    xs = [x.pairs for a in answers for x in a.levels] or [1]
    traces.append(go.Scatter(x=[min(xs), max(xs)], y=[a0.slo.bound] * 2, mode="lines",
                             line={"dash": "dash", "color": "red"}, name=f"SLO {a0.slo.text}",
                             hovertemplate=f"SLO bound {a0.slo.bound:g} {a0.slo.unit}<extra></extra>"))
    return Interactive(f"Capacity at {a0.slo.text}", "The worst pair's figure at each N measured; dashed "
                       "red: the service level.", _div(_figure(traces, "pairs (N)", f"{a0.slo.figure} ({a0.slo.unit})"),
                                                       "tb-slo"))


def plots(records: Sequence[RunRecord], slo_answers: Sequence[Any] = ()) -> tuple[Interactive, ...]:
    from testbed.analysis import hops_report
    return tuple(p for p in (cdf_plot(records), load_curve_plot(records), search_plot(records),
                             slo_plot(slo_answers),
                             *(Interactive(title, caption, _div(fig, f"tb-hops-{i}"))
                               for i, (title, caption, fig) in enumerate(hops_report.waterfalls(records))))
                 if p is not None)

