"""Static figures for the HTML reports: panels drawn by matplotlib's Agg canvas into a PNG,
inlined as base64. Built on ``matplotlib.figure.Figure`` directly, never through pyplot, so
nothing here touches the process-wide backend or needs a display. Every report (runs,
capacity, history) draws through this one place, with one convention: colour = the series,
line style = the run."""
from __future__ import annotations

import base64
import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Plot:
    title: str
    caption: str
    png_base64: str


RUN_STYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v", "P")


def label(text: str) -> str:
    return text.replace("$", r"\$")     # a $ would start matplotlib mathtext


@dataclass(frozen=True)
class Panel:
    title: str
    xlabel: str
    ylabel: str
    draw: Callable[[Any], None]
    log_x: bool = False


def figure(panels: Sequence[Panel], title: str, caption: str,
            runs: Sequence[str] = ()) -> Plot:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    cols = 1 if len(panels) == 1 else 2
    rows = (len(panels) + cols - 1) // cols
    fig = Figure(figsize=(11.0 if cols == 1 else 5.6 * cols, 4.3 * rows), dpi=100,
                 layout="constrained")
    FigureCanvasAgg(fig)
    for i, p in enumerate(panels):
        ax = fig.add_subplot(rows, cols, i + 1)
        ax.set_title(label(p.title), fontsize=10)
        ax.set_xlabel(label(p.xlabel))
        ax.set_ylabel(label(p.ylabel))
        ax.grid(True, alpha=0.3)
        p.draw(ax)
        ax.set_ylim(bottom=0)
        if p.log_x:
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter("{x:g}")
        handles, labels = ax.get_legend_handles_labels()
        if handles:
            ax.legend(handles, labels, fontsize=7, loc="upper center", ncol=2,
                      bbox_to_anchor=(0.5, -0.2), frameon=False)
    if len(runs) > 1:
        from matplotlib.lines import Line2D
        fig.legend(handles=[Line2D([], [], color="#444", linestyle=RUN_STYLES[i % len(RUN_STYLES)],
                                   label=label(f"run {r}")) for i, r in enumerate(runs)],
                   loc="outside upper center", ncol=min(4, len(runs)), fontsize=8, frameon=False)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return Plot(title, caption, base64.b64encode(buf.getvalue()).decode("ascii"))
