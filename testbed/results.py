"""Run records on disk: results/<run-id>/{run.json, samples.jsonl, raw/}.

Results are added, never edited: samples are appended one JSON line at a time and
fsynced, and run.json is replaced atomically (write a temp file, rename), so an
interrupted run keeps every completed sample readable and says it is incomplete.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import secrets
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from testbed.model import Cell, Topology, context_of, definition, definition_hash

#: 2: every sample's and cell's ``cell`` carries ``hash``, the definition hash
#: (model.Cell.hash). Version 1 files are upgraded when read (:func:`upgrade`).
FORMAT_VERSION = 2


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")


def new_run_id() -> tuple[str, str]:
    """(run id, short tag). The tag goes into every host object name: tb-<tag>-..."""
    tag = secrets.token_hex(2)
    return dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ") + f"-{tag}", tag


def atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@dataclass(frozen=True)
class Sample:
    """One measured repetition of a cell. `status` is ok or failed; failed has a reason."""

    run_id: str
    cell: Mapping[str, Any]
    rep: int
    warmup: bool
    status: str
    reason: str | None
    metrics: Mapping[str, float]
    cpu: Mapping[str, Any]
    started: str
    ended: str
    raw: tuple[str, ...] = ()
    placement: Mapping[str, str] = field(default_factory=dict)   # guest -> host
    extra: Mapping[str, Any] = field(default_factory=dict)
    #: the wire cross-check (testbed.crosscheck): tool_bytes, wire_bytes, wire_packets,
    #: expected_ratio, ratio, verdict, and the device and direction counted
    crosscheck: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        d = asdict(self)
        d["metrics"], d["cpu"], d["cell"] = dict(self.metrics), dict(self.cpu), dict(self.cell)
        d["crosscheck"] = dict(self.crosscheck)
        return json.dumps(d, sort_keys=True)


def topology_dict(t: Topology) -> dict:
    return json.loads(json.dumps(asdict(t), default=str))


class RunWriter:
    """Owns one run directory. Use as a context manager: on exit run.json says how it ended."""

    def __init__(self, root: Path, run_id: str, topology: Topology, environment: Mapping[str, Any]) -> None:
        self.run_id = run_id
        self.dir = root / run_id
        self.raw_dir = self.dir / "raw"
        self.raw_dir.mkdir(parents=True, exist_ok=False)
        self.record: dict[str, Any] = {
            "format_version": FORMAT_VERSION, "run_id": run_id, "status": "running",
            "started": now(), "ended": None, "topology": topology_dict(topology),
            "environment": dict(environment), "counts": {"samples": 0, "failed": 0, "boots": 0},
            "cells": [], "notes": [],
        }
        self._samples = open(self.dir / "samples.jsonl", "a")
        self._flush()

    def __enter__(self) -> RunWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            status = "complete" if self.record["counts"]["failed"] == 0 else "complete-with-failures"
        elif issubclass(exc_type, (KeyboardInterrupt, SystemExit)) or exc_type.__name__ == "Interrupted":
            status = "interrupted"
        else:
            status = "failed"
            self.record["error"] = str(exc)
        self.finish(status)

    def update(self, **fields: Any) -> None:
        self.record.update(fields)
        self._flush()

    def note(self, text: str) -> None:
        self.record["notes"].append(text)
        self._flush()

    def count(self, key: str, by: int = 1) -> None:
        self.record["counts"][key] = self.record["counts"].get(key, 0) + by
        self._flush()

    def add_cell(self, cell: Cell, status: str, reason: str | None, converged: bool | None,
                 summary: Mapping[str, Any]) -> None:
        self.record["cells"].append({**cell.as_dict(), "status": status, "reason": reason,
                                     "converged": converged, "summary": dict(summary)})
        self._flush()

    def add_sample(self, s: Sample) -> None:
        self._samples.write(s.to_json() + "\n")
        self._samples.flush()
        os.fsync(self._samples.fileno())
        self.record["counts"]["samples"] += 1
        if s.status != "ok":
            self.record["counts"]["failed"] += 1
        self._flush()

    def raw_path(self, cell_id: str, name: str) -> Path:
        d = self.raw_dir / cell_id
        d.mkdir(parents=True, exist_ok=True)
        return d / name

    def finish(self, status: str) -> None:
        self.record.update(status=status, ended=now())
        self._flush()
        self._samples.close()

    def _flush(self) -> None:
        atomic_write(self.dir / "run.json", json.dumps(self.record, indent=2, sort_keys=True, default=str))


@dataclass(frozen=True)
class RunRecord:
    dir: Path
    run: Mapping[str, Any]
    samples: tuple[Mapping[str, Any], ...]


def read_run(path: Path) -> RunRecord:
    run = json.loads((path / "run.json").read_text())
    samples = []
    with open(path / "samples.jsonl") as f:
        for line in f:
            line = line.strip()
            if line:
                # A run killed mid-write can leave one partial last line; skip it, keep the rest.
                try:
                    samples.append(json.loads(line))
                except json.JSONDecodeError:
                    break
    return upgrade(RunRecord(path, run, tuple(samples)))


def cell_hash(cell: Mapping[str, Any], topology: Mapping[str, Any]) -> str:
    profiles = {p.get("name"): p for p in (topology.get("matrix") or {}).get("profiles") or ()}
    return definition_hash(definition(cell, profiles.get(cell.get("profile")) or
                                      {"name": cell.get("profile"), "tool": cell.get("tool")},
                                      dict(context_of(topology))))


def upgrade(rec: RunRecord) -> RunRecord:
    """An older run record in the current format, in memory (the files are never edited).

    Version 1 had no definition hash: it is computed from the run's own topology (profile
    entry, offloads, guests) the way model.Cell.hash computes it, so an unchanged cell
    measured before and after the upgrade still matches. ``upgraded_from`` says it happened.
    """
    version = int(rec.run.get("format_version") or 1)
    if version >= FORMAT_VERSION:
        return rec
    topo = rec.run.get("topology") or {}

    def cell(c: Mapping[str, Any]) -> dict:
        return {**c, "hash": c.get("hash") or cell_hash(c, topo)}

    run = {**rec.run, "format_version": FORMAT_VERSION, "upgraded_from": version,
           "cells": [cell(c) for c in rec.run.get("cells") or ()]}
    samples = tuple({**s, "cell": cell(s.get("cell") or {})} for s in rec.samples)
    return RunRecord(rec.dir, run, samples)


def iter_runs(root: Path) -> Iterator[Path]:
    for p in sorted(root.iterdir()) if root.is_dir() else ():
        if (p / "run.json").is_file():
            yield p
