"""What tracing cost: each traced sample beside the untraced sample of the same round. Pure.

The traced cell and its untraced self are measured interleaved, in A B B A rounds on one
path (testbed.measure.hops.interleave), so the machine's drift falls on both alike. Per
round, the cost is the untraced sample's transactions per second less the traced one's
(as a share of the untraced), and likewise its median latency and host CPU; the cell's
cost is the median over its rounds, judged against the topology's bound
(``hops.overhead_bound_pct``, 5 % by default). A cost beyond the bound is said in run.json
and on the run's progress, never hidden.
"""
from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from testbed.records.records import SampleRecord
from testbed.records.runparts import Whole


@dataclass(frozen=True)
class Costs(Whole):
    """run.json's ``hops``: per traced cell (by id), its untraced twin and what tracing cost."""

    key: ClassVar[str] = "hops"


def _num(v: object) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def pair(rnd: int, plain: SampleRecord, traced: SampleRecord) -> dict:
    """One round's cost of tracing."""
    tp, tt = _num(plain.metrics.get("transactions_per_s")), _num(traced.metrics.get("transactions_per_s"))
    lp, lt = _num(plain.metrics.get("latency_p50_us")), _num(traced.metrics.get("latency_p50_us"))
    hp, ht = plain.cpu.host_busy, traced.cpu.host_busy
    bpf = ((traced.data.get("hops") or {}).get("tracers") or {}).get("host", {}).get("bpf") or {}
    out: dict = {"round": rnd, "untraced_rep": plain.rep, "traced_rep": traced.rep,
                 "untraced_tps": tp, "traced_tps": tt,
                 "tps_cost_pct": round((tp - tt) / tp * 100, 2) if tp and tt is not None else None,
                 "untraced_p50_us": lp, "traced_p50_us": lt,
                 "p50_added_us": round(lt - lp, 3) if lp is not None and lt is not None else None,
                 "host_cores_added": round(ht - hp, 4) if ht is not None and hp is not None else None,
                 "untraced_host_busy": hp, "traced_host_busy": ht}
    out["bpf_counted"] = "not_counted" not in bpf
    if isinstance(bpf.get("cores"), (int, float)):
        out["bpf_cores"] = bpf["cores"]
        out["bpf_ns_per_run"] = bpf.get("ns_per_run")
    return out


def rounds(plain: Sequence[SampleRecord], traced: Sequence[SampleRecord]) -> list[dict]:
    """Each round's cost, from the two cells' counted samples as the cell loop returns them:
    the samples of one repetition were taken in the same round (A B, then B A), so they
    are paired by it; a round where either failed has no pair."""
    by_rep = {s.rep: s for s in plain if s.ok}
    return [pair(t.rep, by_rep[t.rep], t) for t in traced if t.ok and t.rep in by_rep]


def saturated(pairs: Sequence[Mapping], cores: int) -> int:
    """How many rounds ran on a host with no idle CPU (either sample busy within 5 % of all
    ``cores``): there the tool and the tracer queue behind other load, and the cost is not
    the tracer's alone (host CPU added reads as nothing, since there was none to add)."""
    return sum(1 for p in pairs if any(isinstance(p.get(k), (int, float)) and p[k] >= 0.95 * cores
                                       for k in ("untraced_host_busy", "traced_host_busy")))


def summary(pairs: Sequence[Mapping], bound: float, cores: int | None = None) -> dict:
    """The cell's cost over its rounds, and whether it is within ``bound`` (a fraction);
    ``cores``: the host's, to say when its CPUs were saturated."""
    # Rounds whose traced sample counted BPF's run time carry that counting's cost too (a
    # clock read at each program's start and end): the cell's cost is judged without them
    # when there are others
    plain = [p for p in pairs if p.get("bpf_counted") is False]
    judged = plain or list(pairs)
    costs = [p["tps_cost_pct"] for p in judged if isinstance(p.get("tps_cost_pct"), (int, float))]
    out: dict = {"rounds": len(pairs), "bound_pct": round(bound * 100, 3), "pairs": list(pairs)}
    if not costs:
        out.update(tps_cost_pct=None, within_bound=None, note="no round with both samples ok: cost not measured")
        return out
    med = round(statistics.median(costs), 2)
    for key in ("p50_added_us", "host_cores_added", "bpf_cores", "bpf_ns_per_run"):
        vals = [p[key] for p in (pairs if key.startswith("bpf") else judged) if isinstance(p.get(key), (int, float))]
        if vals:
            out[key] = round(statistics.median(vals), 4)
    out.update(tps_cost_pct=med, within_bound=med <= bound * 100,
               note=(f"tracing cost {med:g} % of transactions/s (median of {len(costs)} interleaved rounds"
                     + (" whose samples did not count BPF's run time" if plain else "") + "), "
                     + ("within" if med <= bound * 100 else "beyond") + f" the {bound:.0%} bound"))
    busy = saturated(pairs, cores) if cores else 0
    if busy:
        out["saturated_rounds"] = busy
        out["note"] += (f"; the host's {cores} CPUs were saturated in {busy} of {len(pairs)} rounds "
                        "(the cost then includes queueing behind other load)")
    return out


__all__ = ["Costs", "pair", "rounds", "saturated", "summary"]
