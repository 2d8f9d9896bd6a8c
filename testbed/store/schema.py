"""What the results index holds: row models, how a run directory flattens into rows, migrations.

Pure except for reading the migration files. The tables themselves are defined only by the
SQL in ``migrations/``; the row models below name the same columns in the same order, and a
unit test checks that they agree.
"""
from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from importlib import resources
from typing import Any

from testbed.errors import TestbedError
from testbed.results import RunRecord

#: metrics copied out of the metrics JSON into columns of their own, for plain SQL queries
MAIN_METRICS = ("throughput_mbps", "transactions_per_s", "latency_mean_us",
                "latency_p50_us", "latency_p90_us", "latency_p99_us")



class StoreError(TestbedError):
    """The results index cannot be opened, migrated or written; says which database."""


_MIGRATION_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


def _json(value: Any) -> str:
    # Sorted keys and no whitespace: identical text on every backend and every re-index.
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


# --------------------------------------------------------------------------- CPU per sample

@dataclass(frozen=True)
class Cores:
    """CPU used over a sample's window, in cores (CPU-seconds per second).

    host:  the whole host's busy time (/proc/stat), everything included.
    guest: busy time seen inside the guests, summed over guests.
    qemu:  per-guest QEMU threads (vCPU, emulator, IO threads) and vhost workers, summed over
           guests, plus ovs-vswitchd: the host CPU that the virtual network path costs.
    Each is None when the sample did not record it.
    """

    host: float | None
    guest: float | None
    qemu: float | None


def sample_cores(cpu: Mapping[str, Any] | None) -> Cores:
    cpu = cpu or {}
    host = _num((cpu.get("host") or {}).get("busy"))
    guests = [_num((g or {}).get("busy")) for g in (cpu.get("guest") or {}).values()]
    guest = sum(v for v in guests if v is not None) if any(v is not None for v in guests) else None
    per_guest = cpu.get("per_guest") or {}
    totals = [_num((g or {}).get("total")) for g in per_guest.values()]
    qemu = None
    if any(v is not None for v in totals):
        qemu = sum(v for v in totals if v is not None)
        qemu += _num((cpu.get("named") or {}).get("ovs-vswitchd")) or 0.0
    # Rounded: sums of 4-decimal readings should read 1.4816, not 1.4815999999999998.
    return Cores(host=host, guest=None if guest is None else round(guest, 6),
                 qemu=None if qemu is None else round(qemu, 6))


# --------------------------------------------------------------------------- rows

@dataclass(frozen=True)
class RunRow:
    run_id: str
    dir: str
    format_version: int
    status: str
    started: str | None
    ended: str | None
    accelerator: str | None
    comparable_class: str | None
    cpu_model: str | None
    cpu_mhz: float | None
    cpus: int | None
    host: str | None
    kernel: str | None
    environment: str
    topology: str
    counts: str


@dataclass(frozen=True)
class CellRow:
    run_id: str
    cell_id: str
    attachment: str
    backend: str
    mtu: int
    connections: int
    profile: str
    tool: str | None
    status: str
    reason: str | None
    converged: int | None
    summary: str


@dataclass(frozen=True)
class SampleRow:
    run_id: str
    seq: int
    cell_id: str
    attachment: str
    backend: str
    mtu: int
    connections: int
    profile: str
    tool: str | None
    rep: int
    warmup: int
    status: str
    reason: str | None
    started: str | None
    ended: str | None
    throughput_mbps: float | None
    transactions_per_s: float | None
    latency_mean_us: float | None
    latency_p50_us: float | None
    latency_p90_us: float | None
    latency_p99_us: float | None
    host_cores: float | None
    guest_cores: float | None
    qemu_cores: float | None
    metrics: str
    cpu: str

    @property
    def ok(self) -> bool:
        return self.status == "ok" and not self.warmup

    def metric_dict(self) -> dict[str, float]:
        return json.loads(self.metrics)


#: table name -> (row model, primary key columns), in the order rows are inserted
TABLES: dict[str, tuple[type, tuple[str, ...]]] = {
    "runs": (RunRow, ("run_id",)),
    "cells": (CellRow, ("run_id", "cell_id")),
    "samples": (SampleRow, ("run_id", "seq")),
}


def columns(model: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(model))


@dataclass(frozen=True)
class IndexedRun:
    run: RunRow
    cells: tuple[CellRow, ...]
    samples: tuple[SampleRow, ...]


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _cell_fields(cell: Mapping[str, Any]) -> dict[str, Any]:
    return {"cell_id": str(cell.get("id", "")), "attachment": str(cell.get("attachment", "")),
            "backend": str(cell.get("backend", "")), "mtu": int(cell.get("mtu") or 0),
            "connections": int(cell.get("connections") or 0),
            "profile": str(cell.get("profile", "")), "tool": cell.get("tool")}


def rows_for_run(rec: RunRecord) -> IndexedRun:
    """Pure: one run directory's record -> the rows that index it."""
    r, env = rec.run, rec.run.get("environment") or {}
    run_id = str(r["run_id"])
    run = RunRow(run_id=run_id, dir=str(rec.dir), format_version=int(r.get("format_version", 0)),
                 status=str(r.get("status", "unknown")), started=r.get("started"),
                 ended=r.get("ended"), accelerator=env.get("accelerator"),
                 comparable_class=env.get("comparable_class"), cpu_model=env.get("cpu_model"),
                 cpu_mhz=_num(env.get("cpu_mhz")), cpus=_int(env.get("cpus")),
                 host=env.get("host"), kernel=env.get("kernel"), environment=_json(env),
                 topology=_json(r.get("topology") or {}), counts=_json(r.get("counts") or {}))
    cells = tuple(
        CellRow(run_id=run_id, **_cell_fields(c), status=str(c.get("status", "unknown")),
                reason=c.get("reason"),
                converged=None if c.get("converged") is None else int(bool(c["converged"])),
                summary=_json(c.get("summary") or {}))
        for c in r.get("cells") or ())
    samples = []
    for seq, s in enumerate(rec.samples):
        m, cores = s.get("metrics") or {}, sample_cores(s.get("cpu"))
        samples.append(SampleRow(
            run_id=run_id, seq=seq, **_cell_fields(s.get("cell") or {}),
            rep=int(s.get("rep") or 0), warmup=int(bool(s.get("warmup"))),
            status=str(s.get("status", "unknown")), reason=s.get("reason"),
            started=s.get("started"), ended=s.get("ended"),
            **{k: _num(m.get(k)) for k in MAIN_METRICS},
            host_cores=cores.host, guest_cores=cores.guest, qemu_cores=cores.qemu,
            metrics=_json(m), cpu=_json(s.get("cpu") or {})))
    return IndexedRun(run, cells, tuple(samples))


# --------------------------------------------------------------------------- migrations

@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    def statements(self) -> tuple[str, ...]:
        """The file's statements, line comments dropped, split on semicolons."""
        text = "\n".join(line.split("--", 1)[0] for line in self.sql.splitlines())
        return tuple(s.strip() for s in text.split(";") if s.strip())


def migrations() -> tuple[Migration, ...]:
    """Every migration shipped in testbed/store/migrations, in version order; the numbers
    must run 1, 2, 3... without gaps so that no half-renamed file is ever skipped."""
    found = []
    for entry in resources.files("testbed.store").joinpath("migrations").iterdir():
        m = _MIGRATION_NAME.match(entry.name)
        if m:
            found.append(Migration(int(m.group(1)), m.group(2), entry.read_text()))
    found.sort(key=lambda mg: mg.version)
    for want, mg in enumerate(found, start=1):
        if mg.version != want:
            raise RuntimeError(f"migration numbers must run 1..n without gaps; "
                               f"expected {want:04d}, found {mg.version:04d}_{mg.name}.sql")
    return tuple(found)


def latest_version() -> int:
    return migrations()[-1].version
