"""The report's cost figure: host CPU per packet stacked by role, per cell (mode, MTU,
connections, pairs), beside the throughput or transactions/s it bought. Interactive
(Plotly, drawn into the self-contained page, plotly.js inlined once by the report).

Pure: run records in, a ``report_interactive.Interactive`` out.
"""
from __future__ import annotations

from collections.abc import Sequence

from testbed.analysis import costs
from testbed.analysis.report_interactive import Interactive, _div
from testbed.analysis.sample_cost import OTHER_ROLES, ROLES
from testbed.records.records import RunRecord

#: one colour per role, the same in every figure; rest and gap greyed, they are not the path's
COLOURS = {"vcpu": "#4c78a8", "emulator": "#f58518", "vhost": "#54a24b", "switch": "#b279a2",
           "softirq": "#e45756", "rest": "#bab0ac", "gap": "#7f7f7f"}


def _label(c: costs.CellCost, runs: int) -> str:
    return (f"{c.mode} mtu{c.mtu} conn{c.connections}" + (f" x{c.pairs}" if c.pairs > 1 else "")
            + (f" [{c.run_id}]" if runs > 1 else ""))


def cost_plot(records: Sequence[RunRecord]) -> Interactive | None:
    """Per profile, one row: the cells' cost per packet stacked by role (left) and the rate
    it bought with its 95 % interval (right); hover gives each role's ns and share."""
    from plotly.subplots import make_subplots
    import plotly.graph_objects as go
    cells = [c for rec in records for c in costs.cell_costs(rec)]
    if not cells:
        return None
    profiles = sorted({c.profile for c in cells})
    fig = make_subplots(rows=len(profiles), cols=2, column_widths=[0.65, 0.35], horizontal_spacing=0.08,
                        vertical_spacing=0.12 if len(profiles) > 1 else 0.0,
                        subplot_titles=[t for p in profiles for t in (f"{p}: host CPU per packet by role",
                                                                        f"{p}: what it bought")])
    shown: set[str] = set()
    for row, profile in enumerate(profiles, start=1):
        mine = sorted((c for c in cells if c.profile == profile), key=lambda c: (c.mode, c.mtu, c.connections, c.pairs))
        labels = [_label(c, len(records)) for c in mine]
        for role in (*ROLES, *OTHER_ROLES):
            ys = [dict(c.roles).get(role) for c in mine]
            if all(v is None for v in ys):
                continue
            shares = [(v or 0.0) / c.per_packet.mean if c.per_packet.mean else 0.0 for v, c in zip(ys, mine)]
            fig.add_trace(go.Bar(x=labels, y=[v or 0.0 for v in ys], name=role, legendgroup=role,
                                 showlegend=role not in shown, marker={"color": COLOURS[role]},
                                 opacity=1.0 if role in ROLES else 0.5, customdata=shares,
                                 hovertemplate=f"{role}: " + "%{y:.4g} ns per packet (%{customdata:.0%} of "
                                               "the path)<extra>%{x}</extra>"), row=row, col=1)
            shown.add(role)
        rr = mine[0].transactional
        err = [[c.per_packet.mean - (c.per_packet.ci_low if c.per_packet.ci_low is not None else c.per_packet.mean)
                for c in mine]]
        fig.add_trace(go.Scatter(x=labels, y=[c.per_packet.mean for c in mine], mode="markers", name="path (95 %)",
                                 legendgroup="path", showlegend="path" not in shown,
                                 marker={"symbol": "line-ew-open", "size": 14, "color": "black"},
                                 error_y={"type": "data", "array": err[0], "visible": True},
                                 hovertemplate="path: %{y:.4g} ns per packet<extra>%{x}</extra>"), row=row, col=1)
        shown.add("path")
        fig.add_trace(go.Bar(x=labels, y=[c.traffic for c in mine], name="transactions/s" if rr else "Gbit/s",
                             marker={"color": "#72b7b2"}, showlegend=False,
                             hovertemplate=("%{y:.4g} transactions/s" if rr else "%{y:.4g} Gbit/s")
                                           + "<extra>%{x}</extra>"), row=row, col=2)
        fig.update_yaxes(title_text="ns per packet", row=row, col=1)
        fig.update_yaxes(title_text="transactions/s" if rr else "Gbit/s", row=row, col=2)
    fig.update_layout(barmode="stack", template="plotly_white", height=420 * len(profiles),
                      margin={"l": 60, "r": 20, "t": 40, "b": 80}, legend={"font": {"size": 10}})
    closed = sum(c.closed for c in cells)
    total = sum(c.n for c in cells)
    return Interactive(
        "Cost per packet by role",
        "Host CPU time per packet of the device under test, by role (means over each cell's ok "
        "samples), stacked; the black mark is the path's cost with its 95 % interval. rest (the "
        "host's other processes) and gap (busy time no reading accounts for) are shown faded: "
        f"they are not the path's. {closed} of {total} samples closed against the host's busy "
        "time within the tolerance. Beside it, the rate the cost bought.",
        _div(fig, "tb-cost"))


def plots(records: Sequence[RunRecord]) -> tuple[Interactive, ...]:
    return tuple(p for p in (cost_plot(records),) if p is not None)
