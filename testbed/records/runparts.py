"""Run-level facts as typed parts of run.json: what a run learns about itself as it goes
(its guests, idle readings, the noise guard it applied, the collector's cost, faults from
outside, its timing), each a frozen record with the run.json key it is written under.

``RunWriter.put(part)`` sets a part's key; ``RunWriter.append(entry)`` adds one entry to a
list kept under its key (a host fault, a guest brought back). Their JSON is what run.json
has always held under these keys, so readers are unchanged.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar


@dataclass(frozen=True)
class Part:
    """A run-level part: its fields are the JSON object written under :attr:`key`."""

    key: ClassVar[str] = ""

    def to_json(self) -> Any:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclass(frozen=True)
class Entry(Part):
    """One entry of a list kept under :attr:`key` (RunWriter.append)."""


@dataclass(frozen=True)
class Whole(Part):
    """A part whose whole value is one mapping or list (``value``), written as it is."""

    value: Any = None

    def to_json(self) -> Any:
        return self.value


@dataclass(frozen=True)
class NoiseGuard(Part):
    """The noise guard the run applied (testbed.measure.window), the quiet start it waited
    for, and the CPUs its harness was kept on."""

    key: ClassVar[str] = "noise_guard"
    threshold_cores: float
    run_queue: float | None
    action: str
    max_retries: int
    quiet_start: Mapping[str, Any] | None = None
    harness_cpus: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Collector(Part):
    """What the host-side CPU collector costs, so its share of a window can be judged."""

    key: ClassVar[str] = "collector"
    cpu_seconds_per_reading: float
    readings_per_sample: int = 2
    fraction_of_one_core_per_10s_window: float = 0.0

    @classmethod
    def of(cls, cost_s: float) -> Collector:
        return cls(round(cost_s, 6), 2, round(2 * cost_s / 10, 6))


@dataclass(frozen=True)
class Timing(Part):
    key: ClassVar[str] = "timing"
    measure_wall_s: float
    sum_of_windows_s: float


@dataclass(frozen=True)
class Guests(Whole):
    """Guest name -> its boot record (virt.Guest.record, and its variant if any)."""

    key: ClassVar[str] = "guests"


@dataclass(frozen=True)
class Idle(Whole):
    """Idle readings (testbed.measure.pairs.idle_reading), one pair and all pairs."""

    key: ClassVar[str] = "idle"


@dataclass(frozen=True)
class PlacementApplied(Whole):
    key: ClassVar[str] = "placement_applied"


@dataclass(frozen=True)
class HostCpuNotMeasured(Whole):
    """Guests whose host-side CPU this run cannot read (on a remote host), and why."""

    key: ClassVar[str] = "host_cpu_not_measured"


@dataclass(frozen=True)
class Hosts(Whole):
    """Each host's environment fingerprint (a run over two hosts)."""

    key: ClassVar[str] = "hosts"


@dataclass(frozen=True)
class Variants(Whole):
    """Per variant: its settings and its emulator's version line."""

    key: ClassVar[str] = "variants"


@dataclass(frozen=True)
class HostFault(Entry):
    """A fault from outside (a daemon restarted, an object removed) and what the run did."""

    key: ClassVar[str] = "host_faults"
    at: str
    fault: str | None
    action: str
    daemons: Mapping[str, int | None] = field(default_factory=dict)


@dataclass(frozen=True)
class GuestLoss(Entry):
    """A guest lost during the run (crashed, destroyed from outside) and brought back."""

    key: ClassVar[str] = "guest_losses"
    guest: str
    at: str
    reason: str


@dataclass(frozen=True)
class Outcome:
    """How a run ended: its folder, status (run.json's: ``complete``,
    ``complete-with-failures``, ``failed``, ``interrupted``), samples and failed samples."""

    run_dir: Path
    status: str
    samples: int
    failed: int


def entries(record: Mapping[str, Any], kind: type[Entry]) -> Sequence[Any]:
    """The entries of ``kind`` run.json holds so far."""
    return list(record.get(kind.key) or [])


__all__ = ["Collector", "Entry", "GuestLoss", "Guests", "HostCpuNotMeasured", "HostFault", "Hosts", "Idle",
           "NoiseGuard", "Outcome", "Part", "PlacementApplied", "Timing", "Variants", "Whole", "entries"]
