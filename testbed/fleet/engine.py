"""`testbed fleet run`: the ansible-runner call, its events as per-host progress, the fetched
runs unpacked and indexed.

Ansible does the fan-out (forks, --limit, ssh with host key checking); each host drops out
alone when a task fails or it becomes unreachable. What happens on a target is the role in
ansible/roles/testbed_target: prepare (idempotent), run (detached, waiting for the host
lock), fetch (the run directory as one archive).
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shutil
import sys
import tarfile
import tempfile
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

from testbed import __version__
from testbed.errors import CommandError, one_line
from testbed.fleet import inventory as inv
from testbed.fleet import record
from testbed.fleet.record import DONE, FAILED, FleetRun, HostOutcome
from testbed.host import proc
from testbed.host.safeio import UserFileError
from testbed.records import results

#: reproducible wheel bytes: a second fleet run of the same tree copies nothing new
_EPOCH = "315532800"
_PHASES = {"prepare": "preparing", "run": "running", "fetch": "fetching"}
_CELL = re.compile(r"\[(\d+)/(\d+)\]")
#: the ssh options every connection gets, first on its command line so nothing later in an
#: inventory can loosen them: Ansible's defaults plus strict host key checking
SSH_ARGS = "-C -o ControlMaster=auto -o ControlPersist=60s -o StrictHostKeyChecking=yes"


def _source_root() -> Path | None:
    root = Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").is_file() and (root / "testbed").is_dir() else None


def build_wheel(dest: Path) -> Path:
    """The controller's testbed as a wheel (from its source tree, copied aside so the build
    leaves nothing in it). An installed testbed without its source: give --wheel."""
    src = _source_root()
    if src is None:
        raise UserFileError("--wheel", "this testbed is installed without its source tree; "
                                       "give the wheel to deploy with --wheel FILE")
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="testbed-wheel-") as tmp:
        tree = Path(tmp) / "src"
        shutil.copytree(src, tree, symlinks=True, ignore=shutil.ignore_patterns(
            ".git", ".venv", "build", "dist", "results", "*.egg-info", "__pycache__",
            ".hypothesis", ".pytest_cache", ".tox", "site"))
        try:
            proc.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w",
                      str(dest), str(tree)], timeout=900, env={"SOURCE_DATE_EPOCH": _EPOCH})
        except CommandError as e:
            raise inv.FleetError(f"building the testbed wheel failed: {e}") from None
    (wheel,) = dest.glob(f"testbed-{__version__}-*.whl")
    return wheel


def _reason(res: dict[str, Any], unreachable: bool) -> str:
    # a loop's own message is "All items completed": the failing item says why
    items = [x for x in res.get("results") or () if isinstance(x, dict)
             and (x.get("failed") or x.get("unreachable"))]
    if items:
        res = items[0]
    msg = str(res.get("msg") or "").strip()
    tail = [str(res.get(k) or "").strip() for k in ("stderr", "stdout")]
    detail = " | ".join(x for x in [msg, *tail] if x)
    if "Host key verification failed" in detail or "REMOTE HOST IDENTIFICATION HAS CHANGED" in detail:
        return ("host key verification failed: its key does not match the known_hosts entry; "
                "refused, nothing ran there")
    return ("unreachable: " if unreachable else "") + one_line(detail or "failed", 500)


class Progress:
    """Ansible's events as per-host phases, printed on stderr and kept in fleet.json."""

    def __init__(self, fleet: FleetRun, hosts: list[inv.Host],
                 say: Callable[[str], None]) -> None:
        self.fleet, self.hosts, self.say = fleet, hosts, say
        self.shown: dict[str, str] = {}
        self.failed: dict[str, str] = {}
        self.fetched: set[str] = set()
        self.changed: dict[str, int] = {}
        self.phase: dict[str, str] = {}

    def _set(self, host: str, status: str, reason: str | None = None) -> None:
        if host not in {h.name for h in self.fleet.hosts}:
            return
        h = self.fleet.host(host)
        self.fleet = self.fleet.with_host(dataclasses.replace(h, status=status, reason=reason))
        self.fleet.write()

    def _show(self, host: str, text: str) -> None:
        if self.shown.get(host) != text:
            self.shown[host] = text
            self.say(f"fleet: {host} {text}")

    def __call__(self, event: dict[str, Any]) -> bool:
        kind = event.get("event", "")
        data = event.get("event_data") or {}
        host, task = data.get("host"), str(data.get("task") or "")
        if not host or host in self.failed:
            return False
        phase = _PHASES.get(task.split(":", 1)[0])
        res = data.get("res") or {}
        if kind == "runner_on_start" and phase:
            if self.phase.get(host) != phase:
                self.phase[host] = phase
                if phase == "running" and host in self.changed:
                    h = self.fleet.host(host)
                    self.fleet = self.fleet.with_host(dataclasses.replace(
                        h, prepare_changed=self.changed[host]))
                    self._show(host, f"prepared ({self.changed[host]} task(s) changed something)")
                self._set(host, phase)
                self._show(host, phase)
        elif kind == "runner_retry" and task == "run: progress":
            last = (str(res.get("stdout") or "").strip().splitlines() or [""])[-1]
            if m := _CELL.search(last):
                self._show(host, f"running cell {m[1]} of {m[2]}")
            elif "in progress on this host" in last:
                self._show(host, "running: waiting for the host lock")
        elif kind in ("runner_on_failed", "runner_on_unreachable") and not data.get("ignore_errors"):
            why = _reason(res, kind == "runner_on_unreachable")
            where = f"{task}: " if phase and not why.startswith("host key") else ""
            self.failed[host] = inv.scrub(where + why, self.hosts) or "failed"
            self._set(host, FAILED, self.failed[host])
            self._show(host, f"failed: {self.failed[host]}")
        elif kind == "runner_on_ok" and phase == "preparing":
            self.changed[host] = self.changed.get(host, 0) + (1 if res.get("changed") else 0)
        elif kind == "runner_on_ok" and task == "run: testbed run":
            self._show(host, "running: testbed run started")
        elif kind == "runner_on_ok" and task == "fetch: run directory":
            self.fetched.add(host)
        return False        # nothing kept: events may hold host vars


def unpack(archive: Path, dest: Path) -> Path:
    """The fetched run directory, unpacked with tarfile's 'data' filter (no links out, no
    devices, no absolute paths): a target's archive is not trusted further than that."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    with tarfile.open(archive) as t:
        tops = {Path(m.name).parts[0] for m in t.getmembers() if m.name not in (".", "")}
        if len(tops) != 1:
            raise UserFileError(archive, f"expected one run directory, found {sorted(tops)}")
        t.extractall(dest, filter="data")
    archive.unlink()
    return dest / tops.pop()


def execute(fleet: FleetRun, hosts: list[inv.Host], topology: dict[str, Any], *,
            wheel: Path, say: Callable[[str], None], timeout: int | None = None) -> FleetRun:
    """Run the playbook on ``hosts`` (their names as the limit), then unpack and index what
    came back. Returns the fleet record with every host's outcome."""
    import ansible_runner
    names = [h.name for h in hosts]
    for n in names:
        h = fleet.host(n)
        fleet = fleet.with_host(dataclasses.replace(h, status="pending", reason=None,
                                                    attempts=h.attempts + 1, prepare_changed=None))
    fleet.write()
    fetched_dir = fleet.dir / "fetched"
    # ansible-runner finds ansible-playbook on PATH: the one installed beside this Python first
    playbook_bin = Path(inv.ansible_binary("ansible-playbook")).parent
    path = os.pathsep.join([str(playbook_bin), os.environ.get("PATH", "/usr/bin:/bin")])
    progress = Progress(fleet, hosts, say)
    with tempfile.TemporaryDirectory(prefix="testbed-fleet-") as pdd:
        os.chmod(pdd, 0o700)
        project = Path(pdd) / "project"
        with resources.as_file(resources.files("testbed.fleet") / "ansible") as src:
            shutil.copytree(src, project)
        r = ansible_runner.run(
            private_data_dir=pdd, playbook="fleet.yml", inventory=str(Path(fleet.inventory).absolute()),
            limit=",".join(names), forks=fleet.forks, quiet=True, timeout=timeout,
            extravars={"testbed_wheel": str(wheel), "testbed_version": __version__,
                       "testbed_topology": topology, "testbed_fleet_id": fleet.fleet_id,
                       # each attempt its own folder on the target (see the role's defaults)
                       "testbed_attempt": "attempt-" + results.new_run_id()[0],
                       "testbed_controller_dir": str(fetched_dir)},
            envvars={"PATH": path, "ANSIBLE_HOST_KEY_CHECKING": "True", "ANSIBLE_SSH_ARGS": SSH_ARGS,
                     "ANSIBLE_RETRY_FILES_ENABLED": "False", "ANSIBLE_NOCOLOR": "1",
                     # a module runs through the ssh session's stdin instead of being copied
                     # over first: a fleet of three took 65 s and 81 CPU-s, now 51 s and 64
                     # CPU-s. A sudoers with `requiretty` needs ANSIBLE_PIPELINING=False.
                     "ANSIBLE_PIPELINING": os.environ.get("ANSIBLE_PIPELINING", "True"),
                     "ANSIBLE_ROLES_PATH": str(project / "roles"),
                     "ANSIBLE_LOCAL_TEMP": str(Path(pdd) / "tmp")},
            event_handler=progress)
        status = r.status
        tail = ""
        if status != "successful":
            with contextlib.suppress(OSError, AttributeError):
                lines = [ln.strip() for ln in r.stdout.read().splitlines() if ln.strip()]
                tail = " | ".join(lines[-3:])
    fleet = progress.fleet
    for n in names:
        h = fleet.host(n)
        if h.status == FAILED:
            continue
        archive = fetched_dir / n / "run.tgz"
        if n not in progress.fetched or not archive.is_file():
            why = f"no run fetched (Ansible ended {status}" + (f": {tail}" if tail else "") + ")"
            h = dataclasses.replace(h, status=FAILED, reason=inv.scrub(one_line(why, 800), hosts))
        else:
            try:
                run_dir = unpack(archive, fleet.dir / "hosts" / n)
                rec = results.read_run(run_dir)
                h = dataclasses.replace(h, status=DONE, reason=None,
                                        run_dir=str(run_dir.relative_to(fleet.dir)),
                                        run_id=rec.run_id, run_status=rec.status)
            except (UserFileError, OSError, tarfile.TarError) as e:
                h = dataclasses.replace(h, status=FAILED, reason=one_line(f"fetched run unreadable: {e}", 500))
        fleet = fleet.with_host(h)
        say(f"fleet: {n} done: run {h.run_id} {h.run_status}" if h.status == DONE
            else f"fleet: {n} failed: {h.reason}")
    with contextlib.suppress(OSError):
        shutil.rmtree(fetched_dir)
    fleet = dataclasses.replace(fleet, ended=results.now())
    fleet.write()
    return fleet


def index(fleet: FleetRun, db: str | None, root: Path) -> int:
    """Index every done host's run into the store; returns how many."""
    from testbed.records import store
    n = 0
    with store.open(db or str(root / "index.sqlite")) as st:
        for h in fleet.hosts:
            if h.status == DONE and h.run_dir:
                st.index_run(fleet.dir / h.run_dir)
                n += 1
    return n


def start(inventory: str, topology: str, *, limit: str | None, forks: int, db: str | None,
          root: Path, wheel: str | None, say: Callable[[str], None]) -> FleetRun:
    """A new fleet run: everything checked before the fleet directory is made."""
    from testbed.records import store
    inv.require_ansible()
    hosts = inv.list_hosts(inventory, limit)
    inv.check_trust(inventory, hosts)
    inv.check_vars(inventory, hosts)
    data = inv.topology_data(topology)
    inv.check_topologies(topology, data, hosts)
    store.check_target(db or str(root / "index.sqlite"))
    if wheel is not None and not Path(wheel).is_file():
        raise UserFileError("--wheel", f"{wheel}: no such file")
    fid = record.new_id()
    d = root / fid
    d.mkdir(parents=True)
    shutil.copyfile(topology, d / "topology.yaml")
    fleet = FleetRun(fid, d, str(Path(inventory).absolute()), "topology.yaml", limit, forks, db,
                     results.now(), tuple(HostOutcome(h.name, host_class=h.host_class,
                                                      overrides=h.overrides) for h in hosts))
    fleet.write()
    w = Path(wheel) if wheel else build_wheel(d / "wheel")
    if wheel:
        (d / "wheel").mkdir()
        w = Path(shutil.copy(w, d / "wheel" / w.name))
    say(f"fleet {fid}: {len(hosts)} host(s), forks {forks}, testbed {w.name}")
    return _finish(execute(fleet, hosts, data, wheel=w, say=say), root, say)


def retry(spec: str, *, forks: int | None, db: str | None, root: Path,
          say: Callable[[str], None]) -> FleetRun:
    """Run the failed hosts of a fleet run again, with its inventory, topology and wheel."""
    fleet = record.read(spec, root)
    inv.require_ansible()
    failed = [h.name for h in fleet.failed]
    if not failed:
        say(f"fleet {fleet.fleet_id}: no failed host to retry")
        return fleet
    if forks is not None or db is not None:
        fleet = dataclasses.replace(fleet, forks=forks or fleet.forks, db=db or fleet.db)
    hosts = inv.list_hosts(fleet.inventory, ",".join(failed))
    inv.check_trust(fleet.inventory, hosts)
    inv.check_vars(fleet.inventory, hosts)
    data = inv.topology_data(fleet.dir / fleet.topology)
    inv.check_topologies(fleet.dir / fleet.topology, data, hosts)
    (w,) = (fleet.dir / "wheel").glob("*.whl")
    say(f"fleet {fleet.fleet_id}: retrying {len(hosts)} failed host(s): {', '.join(failed)}")
    return _finish(execute(fleet, hosts, data, wheel=w, say=say), root, say)


def _finish(fleet: FleetRun, root: Path, say: Callable[[str], None]) -> FleetRun:
    n = index(fleet, fleet.db, root)
    done = sum(1 for h in fleet.hosts if h.status == DONE)
    say(f"fleet {fleet.fleet_id}: {done} of {len(fleet.hosts)} host(s) done, {n} run(s) indexed")
    return fleet
