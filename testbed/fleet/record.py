"""A fleet run on disk: results/fleet-<id>/fleet.json, and each host's fetched run beside it.

fleet.json is rewritten atomically after every change; it names the inventory file (never
its contents: an inventory may carry credentials), the topology copied beside it, and per
host its status (pending, preparing, running, fetching, done, failed), the reason of a
failure, and the run directory fetched back.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import json
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed.errors import ExitStatus
from testbed.host import safeio
from testbed.records import results

FORMAT_VERSION = 1
#: `testbed fleet run` exit statuses: every host done / some failed / none done
ALL_OK, SOME_FAILED, NONE_OK = ExitStatus.OK, ExitStatus.SOME_HOSTS_FAILED, ExitStatus.NO_HOST_DONE
DONE, FAILED = "done", "failed"


@dataclass(frozen=True)
class HostOutcome:
    name: str
    status: str = "pending"
    reason: str | None = None
    #: the fetched run directory, relative to the fleet directory
    run_dir: str | None = None
    run_id: str | None = None
    run_status: str | None = None
    attempts: int = 0
    #: the inventory's host class (testbed_host_class), for the report
    host_class: str | None = None
    #: the topology values merged in for this host (testbed_topology_overrides)
    overrides: dict[str, Any] = field(default_factory=dict)
    #: tasks of the last preparation that changed something: 0 on a host already prepared
    prepare_changed: int | None = None


@dataclass(frozen=True)
class FleetRun:
    fleet_id: str
    dir: Path
    inventory: str
    topology: str
    limit: str | None
    forks: int
    db: str | None
    started: str
    hosts: tuple[HostOutcome, ...]
    ended: str | None = None
    format_version: int = FORMAT_VERSION

    def host(self, name: str) -> HostOutcome:
        return next(h for h in self.hosts if h.name == name)

    def with_host(self, h: HostOutcome) -> FleetRun:
        return dataclasses.replace(self, hosts=tuple(h if x.name == h.name else x for x in self.hosts))

    @property
    def failed(self) -> tuple[HostOutcome, ...]:
        return tuple(h for h in self.hosts if h.status != DONE)

    @property
    def exit_status(self) -> int:
        done = sum(1 for h in self.hosts if h.status == DONE)
        return ALL_OK if done == len(self.hosts) else NONE_OK if done == 0 else SOME_FAILED

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["dir"] = str(self.dir)
        d["hosts"] = [dataclasses.asdict(h) for h in self.hosts]
        return d

    def write(self) -> None:
        results.atomic_write(self.dir / "fleet.json", json.dumps(self.to_dict(), indent=2, sort_keys=True))


def new_id() -> str:
    return "fleet-" + dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ") + f"-{secrets.token_hex(2)}"


def resolve(spec: str | Path, root: Path) -> Path:
    """A fleet run directory, or a fleet id under the results folder."""
    p = Path(spec)
    for cand in (p, root / p):
        if (cand / "fleet.json").is_file():
            return cand
    raise safeio.UserFileError(spec, "not a fleet run (no fleet.json there or under the results folder)")


def read(spec: str | Path, root: Path) -> FleetRun:
    d = resolve(spec, root)
    where = d / "fleet.json"
    raw = safeio.loads(safeio.read_regular(where, 16 * 2**20), str(where))
    try:
        if raw.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"format_version {raw.get('format_version')!r}, this testbed reads {FORMAT_VERSION}")
        hosts = tuple(HostOutcome(**h) for h in raw["hosts"])
        return FleetRun(**{**raw, "dir": d, "hosts": hosts})
    except (TypeError, KeyError, ValueError, AttributeError) as e:
        raise safeio.UserFileError(where, f"not a fleet record this testbed can read: {e}") from None
