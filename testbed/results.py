"""Run records on disk: results/<run-id>/{run.json, samples.jsonl, raw/}.

The records are typed (testbed.records); this module writes and reads them.

Results are added, never edited: samples are appended one JSON line at a time and
fsynced, and run.json is replaced atomically (write a temp file, rename), so an
interrupted run keeps every completed sample readable and says it is incomplete.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import os
import secrets
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from testbed import records
from testbed.model import Cell, Topology
from testbed.records import (FORMAT_VERSION, CellOutcome, Counts, RunRecord, SampleRecord,
                             cell_hash)


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

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["metrics"], d["cpu"], d["cell"] = dict(self.metrics), dict(self.cpu), dict(self.cell)
        d["crosscheck"] = dict(self.crosscheck)
        d["raw"] = list(self.raw)
        return d

    def record(self) -> SampleRecord:
        """The typed record this sample is written as."""
        return SampleRecord.from_dict(json.loads(json.dumps(self.as_dict(), default=str)))

    def to_json(self) -> str:
        return json.dumps(self.record().to_dict(), sort_keys=True)


def topology_dict(t: Topology) -> dict:
    return json.loads(json.dumps(asdict(t), default=str))


class RunWriter:
    """Owns one run directory. Use as a context manager: on exit run.json says how it ended.

    The run is held as a typed :class:`records.RunRecord` (``run``); every change builds a new
    one and rewrites run.json. ``record`` is its dict form, for writers that read it back."""

    def __init__(self, root: Path, run_id: str, topology: Topology, environment: Mapping[str, Any]) -> None:
        self.run_id = run_id
        self.dir = root / run_id
        self.raw_dir = self.dir / "raw"
        self.raw_dir.mkdir(parents=True, exist_ok=False)
        self.run: RunRecord = RunRecord.from_dict({
            "format_version": FORMAT_VERSION, "run_id": run_id, "status": "running",
            "started": now(), "ended": None, "topology": topology_dict(topology),
            "environment": json.loads(json.dumps(dict(environment), default=str)),
            "counts": {"samples": 0, "failed": 0, "boots": 0}, "cells": [], "notes": [],
        }, dir=self.dir)
        self._samples = open(self.dir / "samples.jsonl", "a")
        self._flush()

    @property
    def record(self) -> dict[str, Any]:
        """run.json as it stands (a copy: change it through update, note, count, add_*)."""
        return self.run.to_dict()

    @property
    def cells(self) -> tuple[CellOutcome, ...]:
        return self.run.cells

    @property
    def counts(self) -> Counts:
        return self.run.counts

    def __enter__(self) -> RunWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            status = "complete" if self.run.counts.failed == 0 else "complete-with-failures"
        elif issubclass(exc_type, (KeyboardInterrupt, SystemExit)) or exc_type.__name__ == "Interrupted":
            status = "interrupted"
        else:
            status = "failed"
            self._set(error=str(exc))
        self.finish(status)

    def _set(self, **changes: Any) -> None:
        self.run = dataclasses.replace(self.run, **changes)

    def update(self, **fields: Any) -> None:
        """Set run-level keys: known ones (``idle``, ``environment``...) are typed, others are
        kept as they are (``guests``, ``timing``...)."""
        d = {**self.run.to_dict(), **json.loads(json.dumps(fields, default=str))}
        self.run = RunRecord.from_dict(d, dir=self.dir)
        self._flush()

    def note(self, text: str) -> None:
        self._set(notes=(*self.run.notes, text))
        self._flush()

    def count(self, key: str, by: int = 1) -> None:
        c = self.run.counts.to_dict()
        c[key] = c.get(key, 0) + by
        self._set(counts=Counts.from_dict(c))
        self._flush()

    def add_cell(self, cell: Cell, status: str, reason: str | None, converged: bool | None,
                 summary: Mapping[str, Any], extra: Mapping[str, Any] | None = None) -> None:
        """``extra``: keys a kind of cell adds to its entry (a rate search's ``search``)."""
        out = CellOutcome.from_dict(json.loads(json.dumps(
            {**cell.as_dict(), **(extra or {}), "status": status, "reason": reason, "converged": converged,
             "summary": dict(summary)}, default=str)))
        self.add_outcome(out)

    def add_outcome(self, out: CellOutcome) -> None:
        """The typed form of add_cell."""
        self._set(cells=(*self.run.cells, out))
        self._flush()

    def add_sample(self, s: Sample | SampleRecord) -> None:
        rec = s if isinstance(s, SampleRecord) else s.record()
        rec.validate()
        self._samples.write(json.dumps(rec.to_dict(), sort_keys=True) + "\n")
        self._samples.flush()
        os.fsync(self._samples.fileno())
        c = self.run.counts
        self._set(counts=dataclasses.replace(c, samples=c.samples + 1,
                                             failed=c.failed + (0 if rec.ok else 1)))
        self._flush()

    def raw_path(self, cell_id: str, name: str) -> Path:
        d = self.raw_dir / cell_id
        d.mkdir(parents=True, exist_ok=True)
        return d / name

    def finish(self, status: str) -> None:
        self._set(status=status, ended=now())
        self._flush()
        self._samples.close()

    def _flush(self) -> None:
        atomic_write(self.dir / "run.json",
                     json.dumps(self.run.to_dict(), indent=2, sort_keys=True, default=str))


def read_run(path: Path) -> RunRecord:
    """A run directory as a typed record, upgraded to the current format in memory."""
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
    return RunRecord.read(path, run, samples)


def iter_runs(root: Path) -> Iterator[Path]:
    for p in sorted(root.iterdir()) if root.is_dir() else ():
        if (p / "run.json").is_file():
            yield p


#: the typed records, re-exported for the writers and readers that import them from here
__all__ = ["FORMAT_VERSION", "CellOutcome", "Counts", "RunRecord", "RunWriter", "Sample",
           "SampleRecord", "atomic_write", "cell_hash", "iter_runs", "new_run_id", "now",
           "read_run", "records", "topology_dict"]
