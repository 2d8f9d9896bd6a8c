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
from testbed.records.records import CellRecord, Cores, Cpu, RunRecord

#: metrics copied out of the metrics JSON into columns of their own, for plain SQL queries
MAIN_METRICS = ("throughput_mbps", "transactions_per_s", "latency_mean_us",
                "latency_p50_us", "latency_p90_us", "latency_p99_us")



class StoreError(TestbedError):
    """The results index cannot be opened, migrated or written; says which database. The
    store is something the user names (--db), so it is bad input: exit status 2."""

    exit_status = 2


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
# Cores and how a sample's CPU readings add up to them are the record's (records.Cpu.cores).

def sample_cores(cpu: Cpu | Mapping[str, Any] | None) -> Cores:
    return (cpu if isinstance(cpu, Cpu) else Cpu.from_dict(cpu)).cores()


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


def _cell_fields(cell: CellRecord) -> dict[str, Any]:
    return {"cell_id": str(cell.id), "attachment": str(cell.attachment),
            "backend": str(cell.backend), "mtu": int(cell.mtu or 0),
            "connections": int(cell.connections or 0), "profile": str(cell.profile),
            "tool": cell.tool}


def rows_for_run(rec: RunRecord) -> IndexedRun:
    """Pure: one run directory's record -> the rows that index it."""
    env = rec.environment
    run_id = str(rec.run_id)
    run = RunRow(run_id=run_id, dir=str(rec.dir), format_version=int(rec.format_version or 0),
                 status=str(rec.status), started=rec.started,
                 ended=rec.ended, accelerator=env.accelerator,
                 comparable_class=env.comparable_class, cpu_model=env.cpu_model,
                 cpu_mhz=_num(env.cpu_mhz), cpus=_int(env.cpus),
                 host=env.host, kernel=env.kernel, environment=_json(env.to_dict()),
                 topology=_json(rec.topology), counts=_json(rec.counts.to_dict()))
    cells = tuple(
        CellRow(run_id=run_id, **_cell_fields(c.cell), status=str(c.status),
                reason=c.reason,
                converged=None if c.converged is None else int(bool(c.converged)),
                summary=_json(c.summary_dict()))
        for c in rec.cells)
    samples = []
    for seq, s in enumerate(rec.samples):
        m, cores = s.metrics, s.cpu.cores()
        samples.append(SampleRow(
            run_id=run_id, seq=seq, **_cell_fields(s.cell),
            rep=int(s.rep or 0), warmup=int(bool(s.warmup)),
            status=str(s.status), reason=s.reason,
            started=s.started, ended=s.ended,
            **{k: _num(m.get(k)) for k in MAIN_METRICS},
            host_cores=cores.host, guest_cores=cores.guest, qemu_cores=cores.qemu,
            metrics=_json(m), cpu=_json(s.cpu.to_dict())))
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
    """Every migration shipped in testbed/records/store/migrations, in version order; the numbers
    must run 1, 2, 3... without gaps so that no half-renamed file is ever skipped."""
    found = []
    for entry in resources.files("testbed.records.store").joinpath("migrations").iterdir():
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


def metric_columns() -> tuple[str, ...]:
    """The per-sample figures the store keeps as columns: what `history --metric` accepts."""
    import dataclasses
    return tuple(f.name for f in dataclasses.fields(SampleRow) if "float" in str(f.type))
