"""Run records on disk: results/<run-id>/{run.json, samples.jsonl, raw/}.

The records are typed (testbed.records.records); this module writes and reads them.

Results are added, never edited: samples are appended one JSON line at a time and
fsynced, and run.json is replaced atomically (write a temp file, rename), so an
interrupted run keeps every completed sample readable and says it is incomplete.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import functools
import json
import os
import secrets
from collections.abc import Iterator, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from testbed.errors import one_line
from testbed.host import diskspace, safeio
from testbed.records import records, runparts
from testbed.records.records import FORMAT_VERSION, CellOutcome, Counts, RunRecord, SampleRecord, cell_hash
from testbed.topology.model import Cell, Topology


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")


def new_run_id() -> tuple[str, str]:
    """(run id, short tag). The tag goes into every host object name: tb-<tag>-..."""
    tag = secrets.token_hex(2)
    return dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ") + f"-{tag}", tag


def atomic_write(path: Path, text: str) -> None:
    """``text`` into ``path`` completely or not at all (diskspace.write_file)."""
    diskspace.write_file(path, text)


def _comparable(topology: Mapping[str, Any]) -> dict:
    """A recorded topology less what does not change the matrix (where the file was)."""
    return {k: v for k, v in topology.items() if k not in ("source", "base")}


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
        self._samples = self._open_samples()
        self._flush()

    def _open_samples(self) -> int:
        # A raw descriptor: each line goes out in one write that is cut back when it fails
        # (a full disk), never through a buffer that could leave half of it.
        return os.open(self.dir / "samples.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)

    @classmethod
    def reopen(cls, run_dir: Path, topology: Topology, environment: Mapping[str, Any]) -> RunWriter:
        """An interrupted run's directory, made ready to go on (`testbed run --resume`).

        - The topology must be the one the run was planned from (its recorded form, less the
          file it was read from): another is refused, since its cells would not be the run's.
        - A torn last line of samples.jsonl (a writer killed mid-write) is set aside in
          samples.jsonl.torn; samples of cells that never finished (no outcome in run.json)
          are set aside in samples.jsonl.unfinished. Those cells are measured again, so no
          sample counts twice, and nothing is thrown away.
        - run.json records the resume: when, on which environment, and which cells were left."""
        run_dir = Path(run_dir)
        rec = read_run(run_dir)             # the one validating reader: a bad run is exit 2
        want, have = _comparable(topology_dict(topology)), _comparable(rec.topology)
        if want != have:
            keys = sorted(k for k in set(want) | set(have) if want.get(k) != have.get(k))
            raise safeio.UserFileError(run_dir / "run.json", f"the topology differs from the one "
                                       f"this run was planned from ({', '.join(keys)}); a resumed "
                                       f"run measures the same matrix")
        samples_file = run_dir / "samples.jsonl"
        data = samples_file.read_bytes()
        if data and not data.endswith(b"\n"):
            cut = data.rfind(b"\n") + 1
            with open(run_dir / "samples.jsonl.torn", "ab") as f:
                f.write(data[cut:] + b"\n")
            data = data[:cut]
        finished = {c.cell.id for c in rec.cells}
        keep, unfinished = [], []
        for line in data.splitlines(keepends=True):
            if not line.strip():
                continue
            cell_id = (json.loads(line).get("cell") or {}).get("id")
            (keep if cell_id in finished else unfinished).append(line)
        if unfinished:
            with open(run_dir / "samples.jsonl.unfinished", "ab") as f:
                f.writelines(unfinished)
        diskspace.write_file(samples_file, b"".join(keep))
        self = cls.__new__(cls)
        self.run_id, self.dir, self.raw_dir = rec.run_id, run_dir, run_dir / "raw"
        kept = [SampleRecord.from_dict(json.loads(x)) for x in keep]
        counts = {**rec.counts.to_dict(), "samples": len(kept),
                  "failed": sum(1 for x in kept if x.status == "failed")}
        if "noisy" in Counts._known():
            counts["noisy"] = sum(1 for x in kept if x.status == "noisy")
        resumes = list(rec.extra.get("resumes") or [])
        resumes.append({"at": now(), "finished_cells": len(finished),
                        "set_aside_samples": len(unfinished),
                        "torn_line": (run_dir / "samples.jsonl.torn").exists(),
                        "environment": json.loads(json.dumps(dict(environment), default=str))})
        self.run = dataclasses.replace(rec, status="running", ended=None, samples=(),
                                       counts=Counts.from_dict(counts))
        self.run = RunRecord.from_dict({**self.run.to_dict(), "resumes": resumes}, dir=run_dir)
        self._samples = self._open_samples()
        self._flush()
        return self

    def note_resume(self, cells_left: list[str]) -> None:
        """Which cells the resume measures, in its entry of ``resumes``."""
        resumes = list(self.run.extra.get("resumes") or [])
        if resumes:
            resumes[-1] = {**resumes[-1], "cells_left": cells_left}
            self.update(resumes=resumes)

    def measure_again(self, cell_ids: set[str], **fields: Any) -> None:
        """Forget the outcomes of ``cell_ids`` (they are measured again and get a new one;
        their samples stay in samples.jsonl) and set ``fields``, in one flush."""
        self._set(cells=tuple(o for o in self.run.cells if o.cell.id not in cell_ids))
        self.update(**fields)

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
        """Set run-level keys as they are. The run's own facts go through :meth:`put` and
        :meth:`append` (typed parts, testbed.records.runparts); this stays for keys a
        caller outside the run adds (a pytest session's ``pytest``)."""
        d = {**self.run.to_dict(), **json.loads(json.dumps(fields, default=str))}
        self.run = RunRecord.from_dict(d, dir=self.dir)
        self._flush()

    def put(self, part: runparts.Part) -> None:
        """A typed run-level part (testbed.records.runparts) under its key of run.json."""
        self.update(**{part.key: part.to_json()})

    def append(self, entry: runparts.Entry) -> None:
        """One entry added to the list kept under its key (a host fault, a guest loss)."""
        self.update(**{entry.key: [*runparts.entries(self.record, type(entry)), entry.to_json()]})

    def note(self, text: str) -> None:
        self._set(notes=(*self.run.notes, text))
        self._flush()

    def count(self, key: str, by: int = 1) -> None:
        c = self.run.counts.to_dict()
        c[key] = c.get(key, 0) + by
        self._set(counts=Counts.from_dict(c))
        self._flush()

    def add_cell(self, cell: Cell, status: str, reason: str | None, converged: bool | None,
                 summary: Mapping[str, Any], *, extra: Mapping[str, Any] | None = None) -> None:
        """``extra``: keys a kind of cell adds to its entry (a rate search's ``search``)."""
        out = CellOutcome.from_dict(json.loads(json.dumps(
            {**cell.as_dict(), **(extra or {}), "status": status, "reason": reason, "converged": converged,
             "summary": dict(summary)}, default=str)))
        self.add_outcome(out)

    def add_outcome(self, out: CellOutcome) -> None:
        """The typed form of add_cell."""
        self._set(cells=(*self.run.cells, out))
        self._flush()

    def add_sample(self, rec: SampleRecord) -> None:
        """One sample appended to samples.jsonl, as built (SampleRecord.new): validated, then
        serialised once."""
        rec.validate()
        diskspace.append_line(self._samples, self.dir / "samples.jsonl", rec.to_json() + "\n", self.dir)
        c = self.run.counts
        # A noisy sample is neither ok nor failed: it is measured again (testbed.measure.window).
        self._set(counts=dataclasses.replace(c, samples=c.samples + 1,
                                             failed=c.failed + (1 if rec.status == "failed" else 0),
                                             noisy=c.noisy + (1 if rec.status == "noisy" else 0)))
        self._flush()

    def raw_path(self, cell_id: str, name: str) -> Path:
        d = self.raw_dir / cell_id
        with diskspace.mapped(d, 4096, self.dir):
            d.mkdir(parents=True, exist_ok=True)
        return d / name

    def write_raw(self, cell_id: str, name: str, text: str) -> Path:
        """A tool's raw output, complete or not at all (a full disk leaves no truncated
        file); returns its path. A name already written in this run gets ``.2``, ``.3``...
        before its extension: a sample measured again under the same repetition number (a
        noise-guard retry, the gate's second stage) must not overwrite the output an earlier
        sample's record names (a client's .out and .err collide alike, so they stay a pair)."""
        p = self.raw_path(cell_id, name)
        stem, dot, ext = name.rpartition(".") if "." in name else (name, "", "")
        n = 1
        while p.exists():
            n += 1
            p = p.with_name(f"{stem}.{n}{dot}{ext}")
        diskspace.write_file(p, text, self.dir)
        return p

    def finish(self, status: str) -> None:
        self._set(status=status, ended=now())
        try:
            self._flush()
        except diskspace.DiskFull:
            # The disk that stopped the run cannot take its last words: run.json stays the
            # last complete version (status running, read as interrupted by --resume).
            pass
        finally:
            with contextlib.suppress(OSError):
                os.close(self._samples)

    def _flush(self) -> None:
        text = json.dumps(self.run.to_dict(), indent=2, sort_keys=True, default=str)
        diskspace.write_file(self.dir / "run.json", text, self.dir)


#: caps on what a run directory may hold: far above any real run, far below a machine's memory
MAX_RUN_JSON = 64 * 2**20
MAX_SAMPLES_JSONL = 2 * 2**30


@functools.cache
def _json_kinds(annotation: str) -> tuple[type, ...] | None:
    """The JSON types a record field of this annotation may hold (None: anything)."""
    a = annotation.replace(" ", "")
    if a.startswith(("Any", "Mapping[str,Any]|None", "object")) or a == "Any":
        return None
    kinds: list[type] = []
    for part in a.split("|"):
        if part.startswith(("Mapping", "dict")):
            kinds.append(dict)
        elif part.startswith(("tuple", "list", "Sequence")):
            kinds.append(list)
        elif part == "str":
            kinds.append(str)
        elif part == "bool":
            kinds.append(bool)
        elif part == "int":
            kinds.append(int)
        elif part == "float":
            kinds += [int, float]
        elif part == "None":
            kinds.append(type(None))
        elif part == "Any":
            return None
        else:
            kinds.append(dict)          # a nested Part
    return tuple(kinds)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return {f.name: f.type for f in dataclasses.fields(cls)}


#: the range of a sample's metric that is not 0, either side of it: no recorded figure
#: (bytes, Mbit/s, transactions/s, microseconds, cores, percent, or a difference of them:
#: a hop's unexplained time, a cost against an idle baseline) is smaller or larger
METRIC_RANGE = (1e-12, 1e15)
#: the tools' own figures, never negative (differences the testbed derives may be)
NON_NEGATIVE = frozenset({"throughput_mbps", "transactions_per_s", "bytes", "duration_s", "retransmits",
                          "msgs_sent", "msgs_replied", "udp_sent_msgs", "udp_recv_msgs", "loss_pct",
                          "offered_per_s"})


def check_shape(cls: type, d: Any, where: str, path: str = "") -> None:
    """Refuse a record whose known fields hold the wrong JSON types (``metrics`` as a list, a
    count as text), naming the field: the typed records would otherwise carry them into the
    statistics, far from the file."""
    if not isinstance(d, dict):
        raise safeio.UserFileError(where, f"{path or 'the record'}: expected an object, "
                                          f"found {type(d).__name__}")
    hints = _hints(cls)
    for name in cls._known():
        key = "extra" if (cls is SampleRecord and name == "data") else name
        if key not in d or d[key] is None:
            continue
        v, field_path = d[key], f"{path}{key}"
        ann = str(hints.get(name, "Any"))
        kinds = _json_kinds(ann)
        if kinds is not None and (not isinstance(v, kinds) or (
                isinstance(v, bool) and bool not in kinds)):
            want = "/".join(sorted({k.__name__.replace("NoneType", "null") for k in kinds}))
            raise safeio.UserFileError(where, f"{field_path}: expected {want}, "
                                              f"found {type(v).__name__}")
        if name in cls._parts:
            part, many = cls._parts[name]
            for i, x in enumerate(v if many else [v]):
                check_shape(part, x, where, f"{field_path}[{i}]." if many else f"{field_path}.")
    if cls is SampleRecord:
        for k, v in (d.get("metrics") or {}).items():
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
                raise safeio.UserFileError(where, f"metrics.{k}: expected a number, "
                                                  f"found {type(v).__name__}")
            if v is not None and not (v == 0 or METRIC_RANGE[0] <= abs(v) <= METRIC_RANGE[1]):
                # every figure a tool or the testbed records is a count, a rate, a time, a
                # share or a difference of them; one of another size is no measurement, and
                # the statistics would overflow on it
                raise safeio.UserFileError(where, f"metrics.{k}: {v!r} is not a figure a sample "
                                                  f"holds (0, or {METRIC_RANGE[0]:g} to {METRIC_RANGE[1]:g} "
                                                  f"either side of it)")
            if v is not None and v < 0 and (k in NON_NEGATIVE or k.startswith("latency_")):
                raise safeio.UserFileError(where, f"metrics.{k}: {v!r}: a tool's count, rate or "
                                                  f"time is never negative")
        host = (d.get("cpu") or {}).get("host") if isinstance(d.get("cpu"), dict) else None
        for k, v in (host.items() if isinstance(host, dict) else ()):
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v < 0:
                raise safeio.UserFileError(where, f"cpu.host.{k}: {v!r}: cores are never negative")
    if cls is CellOutcome:
        for k, v in (d.get("summary") or {}).items():
            if not isinstance(v, dict):
                raise safeio.UserFileError(where, f"{path}summary.{k}: expected an object, "
                                                  f"found {type(v).__name__}")


#: the recorded topology's fields that readers walk, and the shape each must have
_TOPOLOGY_LISTS = {"guests": "topology.guests", "hosts": "topology.hosts"}


def check_topology(topo: Any, where: str) -> None:
    """The parts of a recorded topology that readers walk have the shape the writer gives
    them (an object; lists of objects), else the file is refused: run.json is a user's file."""
    if topo is None:
        return
    if not isinstance(topo, Mapping):
        raise safeio.UserFileError(where, f"topology: expected an object, found {type(topo).__name__}")
    lists = [(topo.get(k), name) for k, name in _TOPOLOGY_LISTS.items()]
    m = topo.get("matrix")
    if m is not None:
        if not isinstance(m, Mapping):
            raise safeio.UserFileError(where, f"topology.matrix: expected an object, found {type(m).__name__}")
        lists.append((m.get("profiles"), "topology.matrix.profiles"))
    for v, name in lists:
        if v is not None and (not isinstance(v, list) or not all(isinstance(x, Mapping) for x in v)):
            raise safeio.UserFileError(where, f"{name}: expected a list of objects")


def read_run(path: Path) -> RunRecord:
    """A run directory as a typed record, upgraded to the current format in memory.

    The one reader of run directories (compare, report, index, history, export-csv,
    capacity and the runner itself): regular files only, size-capped, strict JSON (finite
    numbers, bounded integers and depth), a known format version, every line of
    samples.jsonl checked and a bad one refused with its line number; only an unterminated
    last line, the mark of a writer killed mid-write, is left out. Anything else is a
    :class:`safeio.UserFileError` (exit status 2) naming the file and, for a line, its number."""
    path = Path(path)
    run_file, samples_file = path / "run.json", path / "samples.jsonl"
    run = safeio.loads(safeio.read_regular(run_file, MAX_RUN_JSON), str(run_file))
    if not isinstance(run, dict):
        raise safeio.UserFileError(run_file, f"expected a JSON object, found {type(run).__name__}")
    version = run.get("format_version", 1)
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= FORMAT_VERSION:
        raise safeio.UserFileError(run_file, f"format_version {one_line(repr(version), 40)}: "
                                             f"this testbed reads versions 1 to {FORMAT_VERSION}; "
                                             f"a newer testbed wrote it")
    check_shape(RunRecord, run, str(run_file))
    check_topology(run.get("topology"), str(run_file))
    data = safeio.read_regular(samples_file, MAX_SAMPLES_JSONL)
    samples = []
    for n, s in safeio.json_lines(data, str(samples_file)):
        where = f"{samples_file}:{n}"
        check_shape(SampleRecord, s, where)
        try:
            SampleRecord.from_dict(s).validate()
        except ValueError as e:
            raise safeio.UserFileError(where, str(e)) from None
        samples.append(s)
    counts = run.get("counts") if isinstance(run.get("counts"), dict) else {}
    for k, v in counts.items():
        if isinstance(v, int) and not isinstance(v, bool) and v < 0:
            raise safeio.UserFileError(run_file, f"counts.{k}: {v} is negative")
    try:
        return RunRecord.read(path, run, samples)
    except (TypeError, ValueError, AttributeError) as e:
        raise safeio.UserFileError(run_file, f"not a run record this testbed can read: {e}") from None


def iter_runs(root: Path) -> Iterator[Path]:
    for p in sorted(root.iterdir()) if root.is_dir() else ():
        if (p / "run.json").is_file():
            yield p


#: the typed records, re-exported for the writers and readers that import them from here
__all__ = ["FORMAT_VERSION", "CellOutcome", "Counts", "RunRecord", "RunWriter",
           "SampleRecord", "atomic_write", "cell_hash", "iter_runs", "new_run_id", "now",
           "read_run", "records", "topology_dict"]
