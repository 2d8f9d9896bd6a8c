"""Figures for the HTML reports: interactive Plotly panels (zoom, hover values), each figure a
<div> and the script that draws it; plotly.js itself is inlined once per page by the
template (``plotly_js``), so a report opens with no network. Every report (runs, capacity,
history) draws through this one place, with one convention: colour = the series, line
style = the run; a point's hover names its series, its value, its interval and n, the
samples behind it.

Pure: panels in, ``Plot`` (a title, a caption and the figure's HTML) out."""
from __future__ import annotations

import hashlib
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

#: matplotlib's tab10, which Plotly calls D3: the series' colours in order
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf")
RUN_DASHES = ("solid", "dash", "dot", "dashdot")
MARKERS = ("circle", "square", "triangle-up", "diamond", "triangle-down", "cross")


@dataclass(frozen=True)
class Plot:
    title: str
    caption: str
    html: str            # a <div> and the script that draws into it; plotly.js not included
    #: what each panel shows, for tests and text output: panel title -> number of traces
    panels: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class Rule:
    """A horizontal (``axis`` "y") or vertical ("x") line across a panel, with its label."""

    axis: str
    at: float
    label: str
    colour: str = "#d62728"
    dash: str = "dash"


@dataclass(frozen=True)
class Panel:
    title: str
    xlabel: str
    ylabel: str
    traces: tuple[Any, ...]                       # plotly.graph_objects traces
    log_x: bool = False
    rules: tuple[Rule, ...] = ()
    #: category labels on x (bars), in order
    categories: tuple[str, ...] = field(default_factory=tuple)


def plotly_js() -> str:
    """plotly.js itself, to inline once per page."""
    from plotly.offline import get_plotlyjs
    return get_plotlyjs()


def colour(i: int) -> str:
    return COLOURS[i % len(COLOURS)]


def interval_text(mean: float, low: float | None, high: float | None, n: int, unit: str) -> str:
    """The hover line of one point: its mean, its 95 % interval where it has one, and n."""
    ci = f" (95 % CI {low:.4g} to {high:.4g})" if low is not None and high is not None else \
        (" (no interval: one sample)" if n == 1 else "")
    return f"{mean:.4g} {unit}{ci}, n={n}"


def figure(panels: Sequence[Panel], title: str, caption: str, runs: Sequence[str] = ()) -> Plot:
    """Panels side by side, two to a row; one legend, each series named once."""
    import plotly.io as pio
    from plotly.subplots import make_subplots
    cols = 1 if len(panels) == 1 else 2
    rows = (len(panels) + cols - 1) // cols
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[p.title for p in panels],
                        horizontal_spacing=0.12, vertical_spacing=min(0.12, 0.3 / max(1, rows)))
    named: set[str] = set()
    for i, p in enumerate(panels):
        r, c = i // cols + 1, i % cols + 1
        for t in p.traces:
            if t.name in named:
                t.showlegend = False
            named.add(t.name)
            t.legendgroup = t.name
            fig.add_trace(t, row=r, col=c)
        for rule in p.rules:
            add = fig.add_hline if rule.axis == "y" else fig.add_vline
            add(rule.at, row=r, col=c, line={"color": rule.colour, "dash": rule.dash, "width": 1.5},
                annotation_text=rule.label, annotation_font_size=10)
        fig.update_xaxes(title_text=p.xlabel, row=r, col=c, type="log" if p.log_x else None,
                         **({"dtick": 0.30103} if p.log_x else {}))
        fig.update_yaxes(title_text=p.ylabel, row=r, col=c, rangemode="tozero")
        if p.categories:
            fig.update_xaxes(categoryorder="array", categoryarray=list(p.categories), row=r, col=c)
    if len(runs) > 1:
        caption += " Line style: " + ", ".join(f"{d} = run {r}" for d, r in zip(
            itertools.cycle(RUN_DASHES), runs)) + "."
    fig.update_layout(template="plotly_white", hovermode="closest", height=360 * rows + 80,
                      margin={"l": 60, "r": 20, "t": 60, "b": 50}, legend={"font": {"size": 10}},
                      barmode="group", font={"size": 11})
    fig.update_annotations(font_size=12)
    # the same figure gets the same id: a page renders the same every time
    div_id = "tb-fig-" + hashlib.sha1("\n".join([title, *(p.title for p in panels)]).encode()).hexdigest()[:10]
    html = pio.to_html(fig, include_plotlyjs=False, full_html=False, div_id=div_id,
                       config={"displaylogo": False, "responsive": True})
    return Plot(title, caption, html, tuple((p.title, len(p.traces)) for p in panels))
