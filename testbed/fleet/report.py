"""`testbed fleet report`: a fleet run's hosts side by side.

Environment first (kernel, QEMU, OVS, CPU, class, machine id), then each cell's figure (the
mean of its primary metric) per host. Within a host class, a host whose figure lies far from
the class median is flagged: the robust z-score 0.6745 (x - median) / MAD (Iglewicz and
Hoaglin), beyond 3.5 by default. It needs three hosts in the class, and a MAD above zero.
With a traffic profile, the capacity plan (testbed.analysis.capacity) per host and per class: a
class plans by its weakest host.
"""
from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from testbed.fleet import record
from testbed.fleet.record import DONE, FleetRun
from testbed.host.safeio import UserFileError
from testbed.records import results

#: below this many hosts a class's spread says nothing
MIN_CLASS = 3


@dataclass(frozen=True)
class HostColumn:
    name: str
    status: str
    reason: str | None
    host_class: str | None
    environment: dict[str, Any] = field(default_factory=dict)
    #: cell id -> (metric, mean)
    figures: dict[str, tuple[str, float | None]] = field(default_factory=dict)


@dataclass(frozen=True)
class Outlier:
    host: str
    host_class: str
    cell_id: str
    metric: str
    value: float
    median: float
    z: float


@dataclass(frozen=True)
class ClassCapacity:
    host_class: str
    mode: str
    vms_by_host: dict[str, int]

    @property
    def vms(self) -> int:
        return min(self.vms_by_host.values())


@dataclass(frozen=True)
class FleetReport:
    fleet_id: str
    hosts: tuple[HostColumn, ...]
    cells: tuple[str, ...]
    outliers: tuple[Outlier, ...]
    z_limit: float
    capacity: tuple[ClassCapacity, ...] = ()
    notes: tuple[str, ...] = ()


def _env(rec: results.RunRecord) -> dict[str, Any]:
    e = rec.environment
    v = e.versions or {}
    return {"kernel": e.kernel, "qemu": v.get("qemu"), "ovs": v.get("ovs"),
            "libvirt": v.get("libvirt"), "cpu_model": e.cpu_model, "cpus": e.cpus,
            "host_class": e.host_class, "machine_id": e.machine_id,
            "machine_id_source": e.machine_id_source, "hostname": e.host,
            "accelerator": e.accelerator, "run_id": rec.run_id, "run_status": rec.status}


def robust_z(x: float, values: list[float]) -> float | None:
    med = statistics.median(values)
    mad = statistics.median(abs(v - med) for v in values)
    return None if mad == 0 else 0.6745 * (x - med) / mad


def _far_env(rec: results.RunRecord, inventory_name: str) -> dict[str, Any]:
    """A pair's second host as its run's ``hosts`` entry records it (read over ssh)."""
    far = next((v for v in (rec.value_of("hosts") or {}).values()
                if isinstance(v, dict) and v.get("inventory_host") == inventory_name), {})
    v = far.get("versions") or {}
    return {"kernel": far.get("kernel"), "qemu": v.get("qemu"), "ovs": v.get("ovs"), "libvirt": v.get("libvirt"),
            "cpu_model": far.get("cpu_model"), "cpus": far.get("cpus"), "host_class": far.get("host_class"),
            "machine_id": far.get("machine_id"), "machine_id_source": far.get("machine_id_source"),
            "hostname": far.get("host"), "accelerator": far.get("accelerator"), "run_id": rec.run_id,
            "run_status": rec.status}


def build(fleet: FleetRun, *, z_limit: float = 3.5, demand: Any = None) -> FleetReport:
    cols, runs = [], {}
    notes: list[str] = []
    for h in fleet.hosts:
        env: dict[str, Any] = {}
        figures: dict[str, tuple[str, float | None]] = {}
        if h.status == DONE and h.run_dir and h.role == "second":
            # a pair's second host: its identity as the pair's run read it there; the
            # pair's figures are under its first host (counted once)
            rec = results.read_run(record.inside(fleet.dir, h.run_dir))
            env = _far_env(rec, h.name)
            notes.append(f"{h.name}: second host of the pair with {h.peer}; the pair's figures are under {h.peer}")
        elif h.status == DONE and h.run_dir:
            rec = results.read_run(record.inside(fleet.dir, h.run_dir))
            runs[h.name] = rec
            env = _env(rec)
            for c in rec.cells:
                m = rec.primary_metric(str(c.cell.profile))
                s = c.summary_dict().get(m) or {}
                mean = s.get("mean") if c.status == "ok" else None
                figures[str(c.cell.id)] = (m, float(mean) if isinstance(mean, (int, float)) else None)
        cols.append(HostColumn(h.name, h.status, h.reason, env.get("host_class") or h.host_class,
                               env, figures))
    cells = tuple(sorted({c for col in cols for c in col.figures}))
    outliers = []
    classes: dict[str, list[HostColumn]] = {}
    for col in cols:
        if col.status == DONE and col.name in runs:
            classes.setdefault(col.host_class or "(no class)", []).append(col)
    for cls, members in sorted(classes.items()):
        for cell in cells:
            pts = [(m.name, m.figures[cell]) for m in members
                   if cell in m.figures and m.figures[cell][1] is not None]
            if len(pts) < MIN_CLASS:
                continue
            vals = [v for _, (_, v) in pts]
            for name, (metric, v) in pts:
                z = robust_z(v, vals)
                if z is not None and abs(z) > z_limit:
                    outliers.append(Outlier(name, cls, cell, metric, v, statistics.median(vals),
                                            round(z, 2)))
        if len(members) < MIN_CLASS:
            notes.append(f"class {cls}: {len(members)} host(s) done; outliers need {MIN_CLASS}")
    capacity = []
    if demand is not None:
        from testbed.analysis import capacity as cap
        for cls, members in sorted(classes.items()):
            by_mode: dict[str, dict[str, int]] = {}
            for m in members:
                try:
                    p = cap.plan(runs[m.name], demand)
                except cap.CapacityError as e:
                    notes.append(f"capacity of {m.name}: {e}")
                    continue
                for f in p.fits:
                    by_mode.setdefault(f.mode, {})[m.name] = f.vms
            capacity += [ClassCapacity(cls, mode, hosts) for mode, hosts in sorted(by_mode.items())]
    return FleetReport(fleet.fleet_id, tuple(cols), cells, tuple(outliers), z_limit,
                       tuple(capacity), tuple(notes))


ENV_ROWS = ("host_class", "hostname", "machine_id", "kernel", "qemu", "ovs", "libvirt",
            "cpu_model", "cpus", "accelerator", "run_id", "run_status")


def _g(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def render_text(r: FleetReport) -> str:
    names = [c.name for c in r.hosts]
    rows: list[list[str]] = [["", *names], ["status", *(c.status for c in r.hosts)]]
    rows += [[k, *(_g(c.environment.get(k) if k != "host_class" else c.host_class)
                   for c in r.hosts)] for k in ENV_ROWS]
    flagged = {(o.host, o.cell_id) for o in r.outliers}
    for cell in r.cells:
        metric = next((c.figures[cell][0] for c in r.hosts if cell in c.figures), "")
        rows.append([f"{cell} {metric}", *(
            (_g(c.figures[cell][1]) + (" !" if (c.name, cell) in flagged else ""))
            if cell in c.figures else "-" for c in r.hosts)])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [f"FLEET {r.fleet_id}: {len(names)} host(s)"]
    lines += ["  ".join(x.ljust(w) for x, w in zip(row, widths)).rstrip() for row in rows]
    for c in r.hosts:
        if c.reason:
            lines.append(f"FAILED {c.name}: {c.reason}")
    for o in r.outliers:
        lines.append(f"OUTLIER {o.host} (class {o.host_class}) {o.cell_id} {o.metric} "
                     f"{o.value:.4g} vs class median {o.median:.4g}, robust z {o.z:+.2f} "
                     f"(limit {r.z_limit:g}): check this host before a rollout decision")
    for cc in r.capacity:
        per = ", ".join(f"{h} {n}" for h, n in sorted(cc.vms_by_host.items()))
        lines.append(f"CAPACITY class {cc.host_class} {cc.mode}: {cc.vms} VMs per host "
                     f"(its weakest host; {per})")
    lines += [f"note: {n}" for n in r.notes]
    return "\n".join(lines) + "\n"


def render_json(r: FleetReport) -> str:
    d = asdict(r)
    for cc, raw in zip(r.capacity, d["capacity"]):
        raw["vms"] = cc.vms
    return json.dumps(d, indent=2, default=str) + "\n"


def check_z(z: float) -> float:
    import math
    if not (math.isfinite(z) and z > 0):
        raise UserFileError("--z", f"{z}: expected a finite positive number")
    return z
