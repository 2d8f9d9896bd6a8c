"""A sample's hops, and whether they add up to what the tool measured. Pure.

Each hop of the plan gets its count and percentiles from the tracer that sees it, or is
named as not observed with the reason (a tracer that could not start, a kernel without the
probes, no packet seen). The hops' medians are added up and compared with the tool's
median round trip; what is left over is its own hop, ``unexplained``, always shown, and
judged against the closure tolerance. A derived hop (a guest's hand-off, from two spans on
two clocks) has a median only: its percentiles above the median are not the difference of
the spans' percentiles, so none are given.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from testbed.measure.hops import parse
from testbed.measure.hops.plan import Plan

#: prefixes of the hop metrics a sample carries (compare and history judge them)
METRIC_PREFIXES = ("hop_p50_us.", "hop_p90_us.", "hop_p99_us.")
UNEXPLAINED = "unexplained"


@dataclass(frozen=True)
class TracerResult:
    """What one tracer gave: its parsed output, or why it gave none."""

    name: str
    output: parse.Output | None
    reason: str | None = None
    #: the stack hops' probes were missing in that kernel (the devices were traced)
    no_stack: str | None = None


def tool_median(metrics: Mapping[str, float]) -> tuple[float | None, str]:
    """The tool's median round trip and where it came from."""
    if isinstance(metrics.get("latency_p50_us"), (int, float)):
        return float(metrics["latency_p50_us"]), "latency_p50_us"
    if isinstance(metrics.get("latency_mean_us"), (int, float)):
        return float(metrics["latency_mean_us"]), "latency_mean_us (the tool gave no median)"
    return None, "the tool gave no latency"


def hops_record(plan: Plan, results: Mapping[str, TracerResult], metrics: Mapping[str, float],
                tolerance: float) -> dict:
    """The sample's ``extra.hops`` record: per hop its figures or why it has none, the
    closure, and the transitions the packets took that no hop names (how they really went)."""
    rows: list[dict] = []
    seen: dict[str, set[tuple[int, int]]] = {}
    for h in plan.hops:
        row = {"id": h.id, "label": h.label, "leg": h.leg, "tracer": h.tracer}
        if h.tracer == "derived":
            parts, why = [], None
            for tracer, span, sign in h.spans:
                r = results.get(tracer)
                if r is None or r.output is None:
                    why = f"{tracer}: {r.reason if r else 'not traced'}"
                    break
                st = parse.stats(r.output.spans.get(span, {}))
                if st is None:
                    why = f"{tracer}: no transaction seen between its span's points"
                    break
                parts.append((sign * st.p50_us, st.n))
            if why:
                row["not_observed"] = why
            else:
                row.update({"n": min(n for _, n in parts), "p50_us": round(sum(v for v, _ in parts), 3),
                            "derived": "difference of two spans' medians (two clocks)"})
            rows.append(row)
            continue
        r = results.get(h.tracer)
        if r is None or r.output is None:
            row["not_observed"] = r.reason if r else f"{h.tracer} not traced"
        elif h.leg in ("server", "client") or "stack" in h.id:
            if r.no_stack:
                row["not_observed"] = r.no_stack
        if "not_observed" not in row:
            seen.setdefault(h.tracer, set()).add((h.start, h.end))
            st = parse.stats(r.output.hops.get((h.start, h.end), {}))     # type: ignore[union-attr]
            if st is None:
                row["not_observed"] = "no packet seen between its points"
            else:
                row.update(st.as_dict())
        rows.append(row)
    median, source = tool_median(metrics)
    for r in rows:
        if r["leg"] == "client":
            # a tool times each transaction from its send to its receive: the client's own
            # loop to the next send is outside the round trip it reports
            r["outside_round_trip"] = True
    observed = [r for r in rows if "p50_us" in r and not r.get("outside_round_trip")]
    total = round(sum(r["p50_us"] for r in observed), 3)
    closure: dict = {"tool_p50_us": median, "tool_source": source, "sum_p50_us": total,
                     "tolerance_pct": round(tolerance * 100, 3), "hops_observed": len(observed),
                     "hops_planned": len(rows)}
    if median:
        gap = round(median - total, 3)
        closure.update(unexplained_us=gap, unexplained_pct=round(gap / median * 100, 2),
                       within=abs(gap) <= tolerance * median)
        closure["note"] = (f"the hops add up to {total:g} us of the tool's median {median:g} us "
                           f"({total / median:.0%}); " +
                           (f"{gap:g} us unexplained" if gap >= 0 else f"{-gap:g} us more than the tool measured") +
                           (", within" if closure["within"] else ", beyond") + f" the {tolerance:.0%} tolerance")
        rows.append({"id": UNEXPLAINED, "label": "the tool's median round trip less the hops' medians",
                     "leg": "closure", "tracer": "closure", "p50_us": gap})
    unplanned = []
    for name, r in results.items():
        if r.output is None:
            continue
        names = plan.tracer(name).point_names() if any(t.name == name for t in plan.tracers) else {}
        for (a, b), buckets in sorted(r.output.hops.items()):
            if (a, b) not in seen.get(name, set()):
                unplanned.append({"tracer": name, "from": names.get(a, str(a)), "to": names.get(b, str(b)),
                                  "n": sum(buckets.values())})
    return {"hops": rows, "closure": closure,
            "not_observed": [{"hop": r["id"], "label": r["label"], "reason": r["not_observed"]}
                             for r in rows if "not_observed" in r],
            **({"unplanned": unplanned} if unplanned else {})}


def hop_metrics(record: Mapping) -> dict[str, float]:
    """The figures of a sample's hops that go into its metrics, by stable hop id."""
    out: dict[str, float] = {}
    for r in record.get("hops", ()):
        for q, prefix in (("p50_us", "hop_p50_us."), ("p90_us", "hop_p90_us."), ("p99_us", "hop_p99_us.")):
            if isinstance(r.get(q), (int, float)):
                out[prefix + r["id"]] = float(r[q])
    return out


def is_hop_metric(name: str) -> bool:
    return name.startswith(METRIC_PREFIXES)


__all__ = ["METRIC_PREFIXES", "TracerResult", "UNEXPLAINED", "hop_metrics", "hops_record", "is_hop_metric",
           "tool_median"]
