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
import os
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed.errors import ExitStatus, one_line
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
    #: the host's folder under hosts/ (a sanitised, unique form of its name; never a path)
    folder: str | None = None
    #: a pair's other host, and this host's role in it: "first" (runs the pair's topology,
    #: its run fetched) or "second" (reached by the first)
    peer: str | None = None
    role: str | None = None


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
        try:
            if (cand / "fleet.json").is_file():
                if not (cand / "fleet.json").resolve().is_relative_to(cand.resolve()):
                    raise safeio.UserFileError(cand / "fleet.json", "a link out of the fleet run's folder")
                return cand
        except (OSError, ValueError):
            continue
    raise safeio.UserFileError(spec, "not a fleet run (no fleet.json there or under the results folder)")


def inside(fleet_dir: Path, rel: str) -> Path:
    """``rel`` (a run directory a record names) resolved inside the fleet folder, symbolic
    links followed: a record never leads a report or an index anywhere else."""
    base = Path(fleet_dir).resolve()
    where = Path(fleet_dir) / "fleet.json"
    p = (base / rel).resolve()
    if Path(rel).is_absolute() or not p.is_relative_to(base / "hosts"):
        raise safeio.UserFileError(where, f"run_dir {one_line(rel, 80)!r} leads outside the fleet run's "
                                          f"hosts/ folder")
    if p.is_dir():
        for dirpath, dirs, files in os.walk(p):
            for name in dirs + files:
                f = Path(dirpath) / name
                if f.is_symlink() and not f.resolve().is_relative_to(p):
                    raise safeio.UserFileError(where, f"run_dir {one_line(rel, 80)!r}: {one_line(name, 60)} "
                                                      f"is a link out of the run directory")
    return p


_STATUS = {"pending", "preparing", "running", "fetching", DONE, FAILED}
_TYPES = {"name": str, "status": str, "reason": (str, type(None)), "run_dir": (str, type(None)),
          "run_id": (str, type(None)), "run_status": (str, type(None)), "attempts": int,
          "host_class": (str, type(None)), "overrides": dict, "prepare_changed": (int, type(None)),
          "folder": (str, type(None)), "peer": (str, type(None)), "role": (str, type(None))}


def _host(raw: object, d: Path) -> HostOutcome:
    if not isinstance(raw, dict):
        raise ValueError("a host entry is not an object")
    for k, v in raw.items():
        want = _TYPES.get(k)
        if want is None:
            raise ValueError(f"unknown host field {one_line(str(k), 40)!r}")
        if not isinstance(v, want) or isinstance(v, bool) and want is int:
            raise ValueError(f"host field {k}: {type(v).__name__}")
    h = HostOutcome(**raw)
    if not h.name or not h.name.isprintable() or h.status not in _STATUS:
        raise ValueError(f"host {one_line(h.name, 40)!r}: status {one_line(h.status, 20)!r}")
    if h.folder is not None and (not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.:@+-]{0,127}", h.folder)
                                 or ".." in h.folder):
        raise ValueError(f"host {one_line(h.name, 40)}: folder {one_line(h.folder, 40)!r} is not a plain name")
    if h.run_dir is not None:
        inside(d, h.run_dir)
    return h


def _check_together(hosts: tuple[HostOutcome, ...]) -> None:
    """The hosts as one run: each named once, in a folder of its own, and each pair's two
    hosts naming each other in the two roles (the report shows a pair's figures once, under
    its first host, and a host listed twice would be counted twice in its class)."""
    by = {}
    folders: set[str] = set()
    for h in hosts:
        if h.name in by:
            raise ValueError(f"host {one_line(h.name, 40)!r} is listed twice")
        if h.folder is not None and h.folder in folders:
            raise ValueError(f"host {one_line(h.name, 40)}: folder {h.folder!r} is another host's")
        by[h.name] = h
        folders.add(h.folder or "")
    for h in hosts:
        if (h.peer is None) != (h.role is None) or h.role not in (None, "first", "second"):
            raise ValueError(f"host {one_line(h.name, 40)}: peer {one_line(repr(h.peer), 40)} "
                             f"with role {one_line(repr(h.role), 20)}")
        if h.peer is None:
            continue
        other = by.get(h.peer)
        if other is None or other is h or other.peer != h.name or other.role == h.role:
            raise ValueError(f"host {one_line(h.name, 40)}: its pair's other host "
                             f"{one_line(repr(h.peer), 40)} is not listed as its peer")


def read(spec: str | Path, root: Path) -> FleetRun:
    d = resolve(spec, root)
    where = d / "fleet.json"
    raw = safeio.loads(safeio.read_regular(where, 16 * 2**20), str(where))
    try:
        if not isinstance(raw, dict):
            raise ValueError("not an object")
        if raw.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"format_version {one_line(repr(raw.get('format_version')), 20)}, "
                             f"this testbed reads {FORMAT_VERSION}")
        if not isinstance(raw.get("hosts"), list) or not raw["hosts"]:
            raise ValueError("hosts: expected a list of hosts")
        hosts = tuple(_host(h, d) for h in raw["hosts"])
        _check_together(hosts)
        for k in ("fleet_id", "inventory", "topology", "started"):
            if not isinstance(raw.get(k), str) or not raw[k]:
                raise ValueError(f"{k}: expected text")
        if not isinstance(raw.get("forks"), int) or isinstance(raw["forks"], bool) or not 1 <= raw["forks"] <= 1000:
            raise ValueError("forks: expected a whole number from 1 to 1000")
        for k in ("limit", "db", "ended"):
            if not isinstance(raw.get(k), (str, type(None))):
                raise ValueError(f"{k}: expected text or null")
        if Path(raw["topology"]).name != raw["topology"] or raw["topology"] in (".", ".."):
            raise ValueError("topology: expected a file name inside the fleet run")
        return FleetRun(**{**raw, "dir": d, "hosts": hosts})
    except safeio.UserFileError:
        raise
    except (TypeError, KeyError, ValueError, AttributeError) as e:
        raise safeio.UserFileError(where, f"not a fleet record this testbed can read: {one_line(str(e), 200)}") from None
