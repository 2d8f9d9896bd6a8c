"""The report's per-hop waterfall, one per attachment mode: each traced cell's hops in the
order a transaction crosses them (request, the server's turnaround, response, the client's
loop), each bar the median over the cell's samples of the hop's p50, then the unexplained
part and the tool's median round trip as the total. Hops not observed are listed with why;
the closure and what tracing cost (testbed.measure.hops.overhead) are beside it.

Pure: records in, Plotly figures out (report_interactive puts them on the page, which
inlines plotly.js once: no CDN).
"""
from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence

from testbed.records.records import RunRecord, SampleRecord


def _hops_of(samples: Sequence[SampleRecord]) -> tuple[list[dict], dict[str, list[float]], dict[str, list[float]]]:
    """The hop rows of the first traced sample (their order and labels), and per hop id the
    samples' p50s and p99s."""
    order: list[dict] = []
    p50: dict[str, list[float]] = defaultdict(list)
    p99: dict[str, list[float]] = defaultdict(list)
    for s in samples:
        rec = s.data.get("hops")
        if not isinstance(rec, Mapping):
            continue
        if not order:
            order = [dict(r) for r in rec.get("hops") or () if isinstance(r, Mapping)]
        for r in rec.get("hops") or ():
            if isinstance(r, Mapping) and isinstance(r.get("p50_us"), (int, float)):
                p50[r["id"]].append(float(r["p50_us"]))
                if isinstance(r.get("p99_us"), (int, float)):
                    p99[r["id"]].append(float(r["p99_us"]))
    return order, p50, p99


def waterfall_data(rec: RunRecord) -> dict[str, list[dict]]:
    """Per attachment mode, per traced cell: its bars (hop id, label, median p50, median p99,
    or why not observed), the tool's median, closure and cost lines."""
    by_cell: dict[str, list[SampleRecord]] = defaultdict(list)
    for s in rec.samples:
        if s.measured and isinstance(s.data.get("hops"), Mapping):
            by_cell[s.cell.id].append(s)
    costs = rec.value_of("hops") or {}
    out: dict[str, list[dict]] = defaultdict(list)
    for cid, samples in sorted(by_cell.items()):
        order, p50, p99 = _hops_of(samples)
        bars = []
        for r in order:
            if r.get("outside_round_trip"):
                continue            # the client's own loop: not in the tool's round trip
            hid = r.get("id", "?")
            bar = {"id": hid, "label": r.get("label", ""), "leg": r.get("leg", "")}
            if p50.get(hid):
                bar["p50_us"] = round(statistics.median(p50[hid]), 3)
                bar["samples"] = len(p50[hid])
                if p99.get(hid):
                    bar["p99_us"] = round(statistics.median(p99[hid]), 3)
            else:
                bar["not_observed"] = r.get("not_observed") or "no figure in any sample"
            bars.append(bar)
        tool = [float(v) for s in samples if isinstance(v := s.metrics.get("latency_p50_us"), (int, float))]
        cost = costs.get(cid) if isinstance(costs, Mapping) else None
        out[str(samples[0].cell.attachment)].append({
            "cell": cid, "run": rec.run_id, "bars": bars,
            "tool_p50_us": round(statistics.median(tool), 3) if tool else None,
            "closure": [str((s.data["hops"].get("closure") or {}).get("note") or "") for s in samples][-1],
            "cost": cost.get("note") if isinstance(cost, Mapping) else None})
    return dict(out)


def waterfalls(records: Sequence[RunRecord]) -> list[tuple[str, str, object]]:
    """One interactive waterfall per attachment mode with traced cells: (title, caption,
    Plotly figure)."""
    import plotly.graph_objects as go
    found: dict[str, list[dict]] = defaultdict(list)
    for rec in records:
        for mode, cells in waterfall_data(rec).items():
            found[mode].extend(cells)
    out = []
    for mode, cells in sorted(found.items()):
        traces, notes = [], []
        for c in cells:
            shown = [b for b in c["bars"] if "p50_us" in b]
            if not shown:
                continue
            name = f"{c['run']} {c['cell']}" if len(records) > 1 else c["cell"]
            ys = [f"{b['id']}" for b in shown] + ["tool median"]
            xs = [b["p50_us"] for b in shown] + [0]
            hover = [f"{b['label']}<br>p50 {b['p50_us']:g} us" + (f", p99 {b['p99_us']:g} us" if "p99_us" in b else "")
                     + f" ({b.get('samples', 0)} samples)" for b in shown] + \
                    [f"the tool's median round trip: {c['tool_p50_us']} us"]
            traces.append(go.Waterfall(orientation="h", y=ys, x=xs, name=name,
                                       measure=["relative"] * len(shown) + ["total"],
                                       hovertext=hover, hoverinfo="text+name",
                                       text=[f"{v:.3g}" for v in xs[:-1]] + [f"{c['tool_p50_us']}"],
                                       textposition="auto"))
            missing = [f"{b['id']} ({b['not_observed']})" for b in c["bars"] if "not_observed" in b]
            notes.append(f"{name}: {c['closure'] or 'no closure'}"
                         + (f"; {c['cost']}" if c["cost"] else "; tracing cost not measured")
                         + (f"; not observed: {', '.join(missing)}" if missing else ""))
        if not traces:
            continue
        fig = go.Figure(traces)
        fig.update_layout(template="plotly_white", hovermode="closest", waterfallgroupgap=0.3,
                          height=max(420, 26 * max(len(t.y) for t in traces) + 120),
                          margin={"l": 140, "r": 20, "t": 30, "b": 50}, legend={"font": {"size": 10}})
        fig.update_xaxes(title="microseconds (each hop's median p50 over the samples)")
        fig.update_yaxes(autorange="reversed", type="category")
        out.append((
            f"Where the microseconds go: {mode}",
            "Each hop of a request/response transaction in the order it is crossed (req: the request's "
            "way, resp: the response's; *_app: the applications' turnarounds), then what the hops leave "
            "unexplained of the tool's median round trip (the last bar). " + " ".join(notes), fig))
    return out


__all__ = ["waterfall_data", "waterfalls"]
