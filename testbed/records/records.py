"""Typed run records: what results/<run-id>/{run.json, samples.jsonl} hold, read and written.

Every reader (compare, report, capacity, the store, history, the scenarios) takes these
frozen records; only this module knows the JSON shape. Each record is built from its dict
form with ``from_dict`` and gives it back with ``to_dict``:

- keys the record does not know are kept in ``extra`` and written back unchanged, so data a
  tool or a later version adds survives a read and a write by this one;
- a known key is written back when it was present in the source or differs from its
  default, so a read/write round trip returns the same dict.

The files carry ``format_version`` (:data:`FORMAT_VERSION`); :func:`upgrade_dicts` brings an
older file's dicts to the current shape in memory (files are never edited), as flent's
result sets do. Version 1 had no definition hash; version 2 added it (model.Cell.hash). The
typed records did not change the files' shape, so the version stays 2.

Which metric is primary is decided once, by :meth:`testbed.topology.model.Pattern.primary_metric`;
:meth:`RunRecord.primary_metric` finds a profile's pattern in the run's own topology.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, ClassVar

from testbed.topology.model import Pattern, context_of, definition, definition_hash

#: 2: every sample's and cell's ``cell`` carries ``hash``, the definition hash
#: (model.Cell.hash). Version 1 files are upgraded when read (:func:`upgrade_dicts`).
FORMAT_VERSION = 2

TRANSACTIONAL = tuple(p.value for p in Pattern if p.is_transactional)


def _mapping(v: Any) -> Mapping[str, Any]:
    """A nested reading as a mapping; anything else (a hand-edited or damaged record) as none."""
    return v if isinstance(v, Mapping) else {}


def num(v: Any) -> float | None:
    """A finite number, or None (booleans, text, NaN, missing values, and integers too large
    for a float, which JSON allows, are not figures)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        f = float(v)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


# --------------------------------------------------------------------------- the machinery

@dataclass(frozen=True)
class Part:
    """A typed view of one JSON object. Subclasses declare their known keys as fields (every
    field has a default: old files may lack any of them); ``_parts`` names the fields that
    hold nested parts (``(cls, many)``) and ``_tuples`` those that hold lists of plain
    values."""

    extra: Mapping[str, Any] = field(default_factory=dict, kw_only=True)
    present: frozenset[str] = field(default=frozenset(), kw_only=True, compare=False, repr=False)

    _parts: ClassVar[Mapping[str, tuple[type, bool]]] = {}
    _tuples: ClassVar[tuple[str, ...]] = ()
    #: fields not stored in the object's own dict (the run directory, the samples)
    _outside: ClassVar[tuple[str, ...]] = ()

    # Both per class, once: a run's samples are read record by record (thousands for
    # `testbed compare`), and dataclasses.fields() was about 40 % of the time of reading one.
    @classmethod
    @functools.cache
    def _known(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls)
                     if f.name not in ("extra", "present") and f.name not in cls._outside)

    @classmethod
    @functools.cache
    def _mappings(cls) -> frozenset[str]:
        return frozenset(f.name for f in fields(cls) if f.default_factory is dict)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None, **outside: Any):  # noqa: ANN206
        d = dict(d or {})
        known = cls._known()
        kw: dict[str, Any] = {}
        for k in known:
            if k not in d:
                continue
            v = d[k]
            if k in cls._parts:
                part, many = cls._parts[k]
                v = tuple(part.from_dict(x) for x in (v or ()) if isinstance(x, Mapping)) \
                    if many else part.from_dict(v if isinstance(v, Mapping) else {})
            elif k in cls._tuples:
                v = tuple(v or ())
            elif isinstance(v, Mapping):
                v = dict(v)
            elif v is None and k in cls._mappings():
                # a mapping written as null ("not recorded") reads as an empty one, so readers
                # that iterate it need no guard of their own
                continue
            kw[k] = v
        return cls(**kw, **outside, extra={k: v for k, v in d.items() if k not in known},
                   present=frozenset(k for k in known if k in d))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name in ("extra", "present") or f.name in self._outside:
                continue
            v = getattr(self, f.name)
            default = f.default if f.default is not MISSING else (
                f.default_factory() if f.default_factory is not MISSING else MISSING)  # type: ignore[misc]
            if f.name not in self.present and _same(v, default):
                continue
            if f.name in self._parts:
                v = [x.to_dict() for x in v] if self._parts[f.name][1] else v.to_dict()
            elif f.name in self._tuples:
                v = list(v)
            elif isinstance(v, Mapping):
                v = dict(v)
            out[f.name] = v
        out.update(self.extra)
        return out


def _same(v: Any, default: Any) -> bool:
    if default is MISSING:
        return False
    if isinstance(v, Part) and isinstance(default, Part):
        return not v.to_dict()
    return v == default or (v == () and default in ((), [])) or (v == {} and default == {})


# --------------------------------------------------------------------------- small parts

@dataclass(frozen=True)
class Image(Part):
    name: str | None = None
    digest: str | None = None
    kernel: str | None = None


@dataclass(frozen=True)
class Environment(Part):
    """The run's environment fingerprint (testbed.host.environment)."""

    accelerator: str | None = None
    comparable_class: str | None = None
    cpu_model: str | None = None
    cpu_mhz: float | None = None
    cpus: int | None = None
    memory_bytes: int | None = None
    host: str | None = None
    kernel: str | None = None
    versions: Mapping[str, Any] = field(default_factory=dict)
    image: Image | None = None
    vhost_net: Any = None
    testbed: str | None = None
    testbed_commit: str | None = None
    #: the uplink's measured capacity, Gbit/s, when the run measured it
    link_gbit: float | None = None
    #: host settings that move figures (testbed.host.tuning): governor, turbo, C-states, SMT,
    #: NUMA, IRQ affinity of the NICs under test, kernel command line, THP; None unreadable
    tuning: Mapping[str, Any] = field(default_factory=dict)
    #: which host measured (testbed.host.hostid): /etc/machine-id (or the TESTBED_MACHINE_ID
    #: override, named in machine_id_source), the inventory's host class and host name
    machine_id: str | None = None
    machine_id_source: str | None = None
    host_class: str | None = None
    inventory_host: str | None = None

    _parts: ClassVar = {}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None, **outside: Any) -> Environment:
        e = super().from_dict(d, **outside)
        if isinstance(e.image, Mapping):
            return replace(e, image=Image.from_dict(e.image))
        return e

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        if isinstance(self.image, Image):
            d["image"] = self.image.to_dict()
        return d

    @property
    def tcg(self) -> bool:
        return self.accelerator == "tcg"


@dataclass(frozen=True)
class Counts(Part):
    samples: int = 0
    failed: int = 0
    boots: int = 0
    #: samples the noise guard set aside to be measured again (status noisy)
    noisy: int = 0


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


@dataclass(frozen=True)
class Cpu(Part):
    """A sample's CPU readings (testbed.measure.cpu): host totals, per-guest attribution, the guests'
    own view, all over the sample's window."""

    window_s: float | None = None
    host: Mapping[str, Any] = field(default_factory=dict)
    guest: Mapping[str, Any] = field(default_factory=dict)
    per_guest: Mapping[str, Any] = field(default_factory=dict)
    named: Mapping[str, Any] = field(default_factory=dict)
    #: every other process of the host over the window (testbed.measure.cpu.others_delta):
    #: ``cores`` and the number of ``processes``; empty when not recorded
    others: Mapping[str, Any] = field(default_factory=dict)

    @property
    def host_busy(self) -> float | None:
        return num(self.host.get("busy"))

    @property
    def host_softirq(self) -> float | None:
        return num(self.host.get("softirq"))

    def guest_busy(self, name: str) -> float | None:
        return num(_mapping(self.guest.get(name)).get("busy"))

    def cores(self) -> Cores:
        guests = [num(_mapping(g).get("busy")) for g in self.guest.values()]
        guest = sum(v for v in guests if v is not None) if any(v is not None for v in guests) else None
        totals = [num(_mapping(g).get("total")) for g in self.per_guest.values()]
        qemu = None
        if any(v is not None for v in totals):
            qemu = sum(v for v in totals if v is not None)
            qemu += num(self.named.get("ovs-vswitchd")) or 0.0
        # Rounded: sums of 4-decimal readings should read 1.4816, not 1.4815999999999998.
        return Cores(host=self.host_busy, guest=None if guest is None else round(guest, 6),
                     qemu=None if qemu is None else round(qemu, 6))


@dataclass(frozen=True)
class Window(Part):
    """The sample's intervals (measure.window_record): the tool's, the collectors', coverage."""

    tool_s: float | None = None
    requested_s: float | None = None
    host_s: float | None = None
    guest_s: Mapping[str, float] = field(default_factory=dict)
    coverage: Mapping[str, Any] = field(default_factory=dict)
    excess_s: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PairResult(Part):
    """One guest pair's own figures in an N-pair cell (``extra.pairs``): the rate
    in the metric's unit, its p99, its own QEMU + vhost cores, and when paced its target and
    what it achieved in the same unit."""

    throughput_mbps: float | None = None
    transactions_per_s: float | None = None
    latency_p99_us: float | None = None
    cpu_cores: float | None = None
    target: float | None = None
    achieved: float | None = None

    def value(self, metric: str) -> float | None:
        return num(getattr(self, metric, None) if metric in self._known() else self.extra.get(metric))


@dataclass(frozen=True)
class IdleReading(Part):
    """N booted guests with no traffic, averaged over a window (run-level ``idle``)."""

    guests: int | None = None
    window_s: float | None = None
    host_busy_cores: float | None = None
    host_memory_used_mib: float | None = None
    qemu_rss_mib: Mapping[str, float] = field(default_factory=dict)
    memory_mib: int | None = None
    attachment: str | None = None


@dataclass(frozen=True)
class Crosscheck(Part):
    """The wire cross-check of a sample (testbed.measure.crosscheck.Check.as_dict)."""

    ratio: float | None = None
    expected_ratio: float | None = None
    verdict: str | None = None
    tool_bytes: int | None = None
    wire_bytes: int | None = None
    wire_packets: int | None = None
    device: str | None = None
    direction: str | None = None
    #: an N-pair cell's: one check per pair (testbed.measure.pairs.wire_record)
    pairs: tuple[Any, ...] = ()

    _tuples: ClassVar = ("pairs",)

    def packets_and_bytes(self) -> tuple[int, int] | None:
        """(wire packets, tool payload bytes) of the device(s) under test, added up over the
        pairs of an N-pair cell; None when the sample has no such figures."""
        checks = [c for c in self.pairs if isinstance(c, Mapping)] or [self.to_dict()]
        pk = [c.get("wire_packets") for c in checks]
        by = [c.get("tool_bytes") for c in checks]
        if any(isinstance(v, bool) or not isinstance(v, int) for v in (*pk, *by)):
            return None
        return sum(pk), sum(by)


@dataclass(frozen=True)
class Cost(Part):
    """A sample's host CPU cost per unit of traffic, by role (testbed.analysis.sample_cost): the
    roles' cores over the window, and per packet, per Gbit/s and per 1,000 transactions;
    how the roles close against the host's busy time; the cost's own cross-check."""

    #: packets of the device(s) under test over the window, and which counter
    packets: int | None = None
    packets_source: str | None = None
    #: role -> host cores over the window (testbed.analysis.sample_cost.ROLES, "rest", "gap")
    cores: Mapping[str, float] = field(default_factory=dict)
    #: role -> host CPU nanoseconds per packet; "path" is the path's roles added up, "host"
    #: those of the host's side (all but the guests' vCPUs)
    ns_per_packet: Mapping[str, float] = field(default_factory=dict)
    #: role -> host cores per Gbit/s of payload (stream), per 1,000 transactions/s (rr)
    cores_per_gbit: Mapping[str, float] = field(default_factory=dict)
    cores_per_ktps: Mapping[str, float] = field(default_factory=dict)
    #: role -> cycles per packet, with how they were had (time x a steady frequency, or
    #: the host's performance counters); empty with ``cycles_source`` saying why
    cycles_per_packet: Mapping[str, float] = field(default_factory=dict)
    cycles_source: str | None = None
    #: what the switch role counts on this path
    switch: str | None = None
    #: busy, roles' sum, gap, tolerance, within, accounting (testbed.analysis.sample_cost.closure)
    closure: Mapping[str, Any] = field(default_factory=dict)
    #: the cost's own cross-check: verdict (ok, fail, unchecked), reason, figures
    check: Mapping[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    #: what the cost was computed from beyond the sample's own record (the CPU's clock at
    #: both ends, the host's packets, perf's cycles): testbed.analysis.sample_cost.Inputs.recorded
    inputs: Mapping[str, Any] = field(default_factory=dict)

    _tuples: ClassVar = ("notes",)

    def per_packet(self, role: str = "path") -> float | None:
        return num(self.ns_per_packet.get(role))


# --------------------------------------------------------------------------- cells, samples

@dataclass(frozen=True)
class CellRecord(Part):
    """A cell as recorded (model.Cell.as_dict), with the capacity axes: ``pairs`` (N guest
    pairs at once, 1 when absent) and ``rate`` (the paced target's text, absent unpaced)."""

    id: str = ""
    attachment: str = ""
    backend: str = ""
    queues: int = 1
    mtu: int = 0
    connections: int = 0
    profile: str = ""
    tool: str | None = None
    context: Mapping[str, Any] = field(default_factory=dict)
    hash: str | None = None
    hash_without_variant: str | None = None
    pairs: int = 1
    rate: str | None = None

    @property
    def mode(self) -> str:
        return f"{self.attachment}/{self.backend}"

    @property
    def variant(self) -> str | None:
        v = self.context.get("variant")
        return None if v is None else str(v)

    @property
    def plain_id(self) -> str:
        """The id without its variant's suffix (``-v<name>``): the cell both variants share."""
        return self.id.removesuffix(f"-v{self.variant}") if self.variant else self.id

    def without_variant(self) -> CellRecord:
        """The cell as if its variant's run were a run of its own: the variant leaves the
        id and the definition, so A's and B's cells hash alike when nothing else differs."""
        ctx = {k: v for k, v in self.context.items() if not k.startswith("variant")}
        return replace(self, id=self.plain_id, context=ctx,
                       hash=str(self.hash_without_variant or self.hash),
                       present=self.present | {"context", "hash"})

    def series(self) -> str:
        """The cell without N: which profile, MTU, connections and queues."""
        return f"mtu{self.mtu}-conn{self.connections}-q{self.queues or 1}-{self.profile}"


@dataclass(frozen=True)
class Summary(Part):
    n: int | None = None
    mean: float | None = None
    median: float | None = None
    stddev: float | None = None
    ci95: tuple[Any, ...] = ()

    _tuples: ClassVar = ("ci95",)


@dataclass(frozen=True)
class CellOutcome(Part):
    """A cell's entry in run.json: the cell, how it ended, and a summary per metric."""

    cell: CellRecord = field(default_factory=CellRecord)
    status: str = "unknown"
    reason: str | None = None
    converged: bool | None = None
    summary: Mapping[str, Summary] = field(default_factory=dict)

    _OWN: ClassVar = ("status", "reason", "converged", "summary")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None, **outside: Any) -> CellOutcome:
        d = dict(d or {})
        own = {k: d.pop(k) for k in cls._OWN if k in d}
        summary = {k: Summary.from_dict(v) if isinstance(v, Mapping) else v
                   for k, v in (own.get("summary") or {}).items()}
        return cls(cell=CellRecord.from_dict(d), status=own.get("status", "unknown"),
                   reason=own.get("reason"), converged=own.get("converged"), summary=summary,
                   present=frozenset(own))

    def summary_dict(self) -> dict[str, Any]:
        """The summary as written: metric -> {n, mean, median, stddev, ci95}."""
        return {k: v.to_dict() if isinstance(v, Summary) else v for k, v in self.summary.items()}

    def to_dict(self) -> dict[str, Any]:
        d = self.cell.to_dict()
        own = {"status": self.status, "reason": self.reason, "converged": self.converged,
               "summary": self.summary_dict()}
        d.update({k: v for k, v in own.items()
                  if k in self.present or k == "status" or v not in (None, {})})
        d.update(self.extra)
        return d

    @property
    def id(self) -> str:
        return self.cell.id

    @property
    def failed(self) -> bool:
        return self.status == "failed"

    def summary_mean(self, metric: str) -> float | None:
        """The cell's measured mean of one metric; None when the cell failed (never 0)."""
        if self.failed:
            return None
        s = self.summary.get(metric)
        return s.mean if isinstance(s, Summary) else None


@dataclass(frozen=True)
class SampleRecord(Part):
    """One measured repetition of a cell (one line of samples.jsonl)."""

    run_id: str = ""
    cell: CellRecord = field(default_factory=CellRecord)
    rep: int = 0
    warmup: bool = False
    status: str = "unknown"
    reason: str | None = None
    metrics: Mapping[str, Any] = field(default_factory=dict)
    cpu: Cpu = field(default_factory=Cpu)
    started: str | None = None
    ended: str | None = None
    raw: tuple[str, ...] = ()
    placement: Mapping[str, str] = field(default_factory=dict)
    #: tool- and scenario-specific data: ``window``, ``pairs`` (see :attr:`pairs`), warnings...
    data: Mapping[str, Any] = field(default_factory=dict)
    crosscheck: Crosscheck = field(default_factory=Crosscheck)

    _parts: ClassVar = {"cell": (CellRecord, False), "cpu": (Cpu, False),
                        "crosscheck": (Crosscheck, False)}
    _tuples: ClassVar = ("raw",)

    # ``extra`` is the file's key for tool data; the Part machinery's own ``extra`` keeps
    # unknown keys, so the file's ``extra`` is read into ``data``.
    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None, **outside: Any) -> SampleRecord:
        d = dict(d or {})
        had = "extra" in d
        data = d.pop("extra", None) or {}
        s = super().from_dict(d, **outside)
        return replace(s, data=dict(data), present=s.present | ({"data"} if had else set()))

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        data = d.pop("data", None)
        if data is not None or "data" in self.present:
            d["extra"] = dict(data or {})
        return d

    @classmethod
    def new(cls, run_id: str, cell: CellRecord | Mapping[str, Any], rep: int, warmup: bool, status: str,
            reason: str | None, metrics: Mapping[str, float], cpu: Cpu | Mapping[str, Any], started: str,
            ended: str, raw: Iterable[str] = (), placement: Mapping[str, str] | None = None,
            extra: Mapping[str, Any] | None = None,
            crosscheck: Crosscheck | Mapping[str, Any] | None = None) -> SampleRecord:
        """A sample as a writer builds it (the sampling loop, a scenario, a test): every field
        is written, as samples.jsonl lines have always carried them all. ``cell`` is a
        model.Cell's as_dict, ``extra`` the file's tool and scenario data (``data`` here)."""
        return cls(run_id=run_id, cell=cell if isinstance(cell, CellRecord) else CellRecord.from_dict(cell),
                   rep=rep, warmup=warmup, status=status, reason=reason, metrics=dict(metrics),
                   cpu=cpu if isinstance(cpu, Cpu) else Cpu.from_dict(cpu), started=started, ended=ended,
                   raw=tuple(raw), placement=dict(placement or {}), data=dict(extra or {}),
                   crosscheck=crosscheck if isinstance(crosscheck, Crosscheck)
                   else Crosscheck.from_dict(crosscheck or {}),
                   present=frozenset(cls._known()))

    def to_json(self) -> str:
        """The sample's line of samples.jsonl (without its newline): the one serialisation."""
        import json
        return json.dumps(self.to_dict(), sort_keys=True, default=str)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def measured(self) -> bool:
        """Ok and not a warm-up: the samples statistics are made of."""
        return self.ok and not self.warmup

    def metric(self, name: str) -> float | None:
        return num(self.metrics.get(name))

    @property
    def window(self) -> Window | None:
        w = self.data.get("window")
        return Window.from_dict(w) if isinstance(w, Mapping) else None

    @property
    def cost(self) -> Cost:
        """Host CPU per packet by role (testbed.analysis.sample_cost, ``extra.cost``); empty when the
        sample was recorded without one."""
        c = self.data.get("cost")
        return Cost.from_dict(c) if isinstance(c, Mapping) else Cost()

    @property
    def pairs(self) -> tuple[PairResult, ...]:
        """Per-pair results of an N-pair cell (``extra.pairs``); empty when not recorded."""
        got = self.data.get("pairs")
        if not isinstance(got, (list, tuple)):
            return ()           # absent, or not a list (a hand-edited or damaged record)
        return tuple(PairResult.from_dict(p) for p in got if isinstance(p, Mapping))

    @property
    def noise(self) -> Mapping[str, Any]:
        """The noise guard's record of the window (testbed.measure.window): other_cores, run queue,
        threshold, noisy, action (retried, kept, failed); empty when not recorded."""
        n = self.data.get("noise")
        return n if isinstance(n, Mapping) else {}

    @property
    def noisy(self) -> bool:
        """Measured while the host was busy with other work: set aside to be measured
        again (status noisy), or kept, marked (ok with extra.noise.noisy)."""
        return self.status == "noisy" or bool(self.noise.get("noisy"))

    def validate(self) -> None:
        """What a writer must not record: raises ValueError naming the field."""
        if self.status not in ("ok", "failed", "noisy"):
            raise ValueError(f"sample status {self.status!r}: expected ok, failed or noisy")
        if self.status in ("failed", "noisy") and not self.reason:
            raise ValueError(f"a {self.status} sample needs a reason")
        if not self.cell.id:
            raise ValueError("sample cell has no id")
        if isinstance(self.rep, bool) or not isinstance(self.rep, int) or self.rep < 0:
            raise ValueError(f"sample rep {self.rep!r}: expected an int >= 0")
        if not isinstance(self.metrics, Mapping):
            raise ValueError(f"sample metrics: expected an object, found {type(self.metrics).__name__}")
        bad = [k for k, v in self.metrics.items()
               if isinstance(v, bool) or not isinstance(v, (int, float))]
        if bad:
            raise ValueError(f"sample metrics {', '.join(sorted(bad))}: not numbers")


# --------------------------------------------------------------------------- topology parts

@dataclass(frozen=True)
class ProfileEntry(Part):
    """A profile as the run's topology recorded it (model.Profile, as a dict)."""

    name: str | None = None
    tool: str | None = None
    protocol: str | None = None
    pattern: str | None = None
    message_size: int | None = None
    response_size: int | None = None
    duration_s: int | None = None


@dataclass(frozen=True)
class GuestEntry(Part):
    name: str | None = None
    memory_mib: int | None = None
    vcpus: int | None = None


# --------------------------------------------------------------------------- the run

@dataclass(frozen=True)
class RunRecord(Part):
    """A run: run.json's fields, its directory and its samples (samples.jsonl)."""

    dir: Path = Path(".")
    format_version: int = FORMAT_VERSION
    run_id: str = ""
    status: str = "unknown"
    started: str | None = None
    ended: str | None = None
    topology: Mapping[str, Any] = field(default_factory=dict)
    environment: Environment = field(default_factory=Environment)
    counts: Counts = field(default_factory=Counts)
    cells: tuple[CellOutcome, ...] = ()
    notes: tuple[str, ...] = ()
    #: idle readings of N booted guests with no traffic
    idle: tuple[IdleReading, ...] = ()
    error: str | None = None
    upgraded_from: int | None = None
    samples: tuple[SampleRecord, ...] = ()

    _parts: ClassVar = {"environment": (Environment, False), "counts": (Counts, False),
                        "cells": (CellOutcome, True), "idle": (IdleReading, True)}
    _tuples: ClassVar = ("notes",)
    _outside: ClassVar = ("dir", "samples")

    @classmethod
    def read(cls, path: Path, run: Mapping[str, Any], samples: Iterable[Mapping[str, Any]]) -> RunRecord:
        run, samples = upgrade_dicts(run, list(samples))
        return cls.from_dict(run, dir=Path(path),
                             samples=tuple(SampleRecord.from_dict(s) for s in samples))

    # ---- the topology, read for the readers

    @property
    def _matrix(self) -> Mapping[str, Any]:
        return recorded_matrix(self.topology)

    def profile_entry(self, name: str) -> ProfileEntry:
        for p in recorded_profiles(self.topology):
            if p.get("name") == name:
                return ProfileEntry.from_dict(p)
        return ProfileEntry(name=name)

    def profile_entries(self) -> dict[str, ProfileEntry]:
        return {str(p.get("name")): ProfileEntry.from_dict(p) for p in recorded_profiles(self.topology)}

    def pattern_of(self, profile: str) -> str | None:
        """The profile's pattern as recorded, else guessed from a name ending in _rr/_crr."""
        p = self.profile_entry(profile)
        if p.pattern:
            return str(p.pattern)
        return pattern_from_name(profile)

    def is_transactional(self, profile: str) -> bool:
        return self.pattern_of(profile) in TRANSACTIONAL

    def primary_metric(self, profile: str) -> str:
        return primary_metric(self.pattern_of(profile))

    @property
    def guests(self) -> tuple[GuestEntry, ...]:
        # run.json is a user's file: a guests field that is not a list of objects reads as none
        gs = self.topology.get("guests")
        return tuple(GuestEntry.from_dict(g) for g in gs if isinstance(g, Mapping)) if isinstance(gs, list) else ()

    @property
    def client(self) -> str | None:
        """The guest the topology names as the traffic's client."""
        v = self.topology.get("client")
        return None if v is None else str(v)

    @property
    def server(self) -> str | None:
        v = self.topology.get("server")
        return None if v is None else str(v)

    def attachments(self) -> tuple[str, ...]:
        """The attachment modes the run set out to measure (its matrix), else its cells'."""
        found = self._matrix.get("attachments") or [c.cell.attachment for c in self.cells]
        return tuple(sorted({str(a) for a in found if a}))

    def definition_differences(self, new: RunRecord) -> list[tuple[str, str, str]]:
        """(what, base, new) for the topology and profile settings that differ: the run-wide
        half of a cell's definition."""
        import json
        tb, tn = self.topology, new.topology
        out: list[tuple[str, str, str]] = []
        pb = {p.get("name"): p for p in recorded_profiles(tb)}
        pn = {p.get("name"): p for p in recorded_profiles(tn)}
        for name in sorted(set(pb) & set(pn)):
            for k in sorted(set(pb[name]) | set(pn[name])):
                if pb[name].get(k) != pn[name].get(k):
                    out.append((f"profile {name}.{k}", str(pb[name].get(k)), str(pn[name].get(k))))
        for k in ("offloads", "guests", "accelerator"):
            if tb.get(k) != tn.get(k):
                out.append((f"topology.{k}", json.dumps(tb.get(k), sort_keys=True),
                            json.dumps(tn.get(k), sort_keys=True)))
        rb = recorded_matrix(tb).get("repetitions")
        rn = recorded_matrix(tn).get("repetitions")
        if rb != rn:
            out.append(("matrix.repetitions", json.dumps(rb, sort_keys=True),
                        json.dumps(rn, sort_keys=True)))
        return out

    def cell_hash(self, cell: CellRecord) -> str:
        return cell_hash(cell.to_dict(), self.topology)

    @property
    def complete(self) -> bool:
        return self.status in ("complete", "complete-with-failures")

    @property
    def run(self) -> dict[str, Any]:
        """run.json as a dict: a thin wrapper kept for writers outside the readers (the
        runner's and the benchmarks' own bookkeeping); readers use the typed fields."""
        return self.to_dict()

    def value_of(self, key: str) -> Any:
        """One run.json key a writer added through RunWriter.update (``scenario``, ``guests``,
        ``timing``...): kept in ``extra``."""
        return self.to_dict().get(key)


def as_environment(env: Environment | Mapping[str, Any] | None) -> Environment:
    """An environment as the typed record (a fingerprint dict is read as run.json would be)."""
    return env if isinstance(env, Environment) else Environment.from_dict(env or {})


def as_outcome(cell: CellOutcome | Mapping[str, Any] | None) -> CellOutcome | None:
    """A cell's outcome as the typed record; None stays None (a cell not run)."""
    if cell is None or isinstance(cell, CellOutcome):
        return cell
    return CellOutcome.from_dict(cell)


# --------------------------------------------------------------------------- primary metric

def pattern_from_name(profile: str) -> str | None:
    """A profile's pattern guessed from a name ending in _rr or _crr (None: a stream), for
    profiles no topology recorded."""
    return next((t for t in TRANSACTIONAL if profile.lower().endswith(f"_{t}")), None)


def primary_metric(pattern: str | Pattern | None) -> str:
    """The metric a cell of this pattern is judged by; unknown patterns count as streams."""
    try:
        return Pattern(str(pattern)).primary_metric
    except ValueError:
        return Pattern.STREAM.primary_metric


# --------------------------------------------------------------------------- upgrade

def recorded_matrix(topology: Mapping[str, Any]) -> Mapping[str, Any]:
    """The matrix a run.json's topology records; run.json is a user's file, so a matrix of
    another shape reads as none rather than ending a reader."""
    m = topology.get("matrix")
    return m if isinstance(m, Mapping) else {}


def recorded_profiles(topology: Mapping[str, Any]) -> tuple[Mapping[str, Any], ...]:
    """The profiles of :func:`recorded_matrix`; a list of another shape reads as none."""
    ps = recorded_matrix(topology).get("profiles")
    return tuple(p for p in ps if isinstance(p, Mapping)) if isinstance(ps, list) else ()


def cell_hash(cell: Mapping[str, Any], topology: Mapping[str, Any]) -> str:
    profiles = {p.get("name"): p for p in recorded_profiles(topology)}
    return definition_hash(definition(cell, profiles.get(cell.get("profile")) or
                                      {"name": cell.get("profile"), "tool": cell.get("tool")},
                                      dict(context_of(topology))))


def upgrade_dicts(run: Mapping[str, Any], samples: list[Mapping[str, Any]]
                  ) -> tuple[Mapping[str, Any], list[Mapping[str, Any]]]:
    """An older run's dicts in the current format, in memory (the files are never edited).

    Version 1 had no definition hash: it is computed from the run's own topology (profile
    entry, offloads, guests) the way model.Cell.hash computes it, so an unchanged cell
    measured before and after the upgrade still matches. ``upgraded_from`` says it happened.
    """
    version = int(run.get("format_version") or 1)
    if version >= FORMAT_VERSION:
        return run, samples
    topo = run.get("topology") or {}

    def cell(c: Mapping[str, Any]) -> dict:
        return {**c, "hash": c.get("hash") or cell_hash(c, topo)}

    run = {**run, "format_version": FORMAT_VERSION, "upgraded_from": version,
           "cells": [cell(c) for c in run.get("cells") or ()]}
    return run, [{**s, "cell": cell(s.get("cell") or {})} for s in samples]
