"""`testbed fleet run`: the ansible-runner call, its events as per-host progress, the fetched
runs unpacked and indexed.

Ansible does the fan-out (forks, --limit, ssh with host key checking); each host drops out
alone when a task fails or it becomes unreachable (a pair drops out together). What happens
on a target is the role in ansible/roles/testbed_target: prepare (idempotent), run
(detached, waiting for the host lock), fetch (the run directory as one archive).

Ansible reads the inventory the fleet checked (inventory.write_checked), never the user's
files again: what was checked is what runs.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shlex
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from testbed import __version__
from testbed.errors import CommandError, one_line
from testbed.fleet import ansenv, fetched, hostvars, pairs, record
from testbed.fleet import inventory as inv
from testbed.fleet.record import DONE, FAILED, FleetRun, HostOutcome
from testbed.host import proc, safeio
from testbed.host.safeio import UserFileError
from testbed.records import results

#: reproducible wheel bytes: a second fleet run of the same tree copies nothing new
_EPOCH = "315532800"
_PHASES = {"prepare": "preparing", "run": "running", "fetch": "fetching"}
_CELL = re.compile(r"\[(\d+)/(\d+)\]")
#: the ssh options every connection gets, first on its command line so nothing later in an
#: inventory can loosen them: Ansible's defaults plus strict host key checking
SSH_ARGS = "-C -o ControlMaster=auto -o ControlPersist=60s -o StrictHostKeyChecking=yes"
#: where the testbed lives on a target when the inventory does not say (the role's default)
DEFAULT_HOME = "/var/lib/testbed-fleet"
#: a wheel given with --wheel is at most this large
MAX_WHEEL_BYTES = 256 << 20


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


def check_wheel(wheel: str | Path, arg: str = "--wheel") -> Path:
    """A wheel given by the user (or kept in a fleet run): one regular .whl file."""
    p = Path(wheel)
    if not re.fullmatch(r"[A-Za-z0-9_.+-]+\.whl", p.name):
        raise UserFileError(arg, f"{str(wheel)[:80]!r}: not a wheel file name (NAME-VERSION-...whl)")
    safeio.check_regular(p, MAX_WHEEL_BYTES, f"{arg} {wheel}")
    return p


# --------------------------------------------------------------------------- the plan

@dataclass(frozen=True)
class Plan:
    """What a fleet run will do, decided and checked before anything is created."""

    hosts: list[inv.Host]
    data: dict[str, Any]                  # the topology file as data
    pairs: list[pairs.Pair] = field(default_factory=list)
    #: the controller's host keys of each pair's second host (known_hosts key part lines)
    peer_keys: dict[str, list[str]] = field(default_factory=dict)
    ship: bool = False                    # the controller's image goes to the hosts


def _guests(data: dict[str, Any]) -> bool:
    """Whether a topology's matrix (as data; its default: the classic guest modes) has a mode
    with guests."""
    from testbed import attachments
    names = ((data.get("matrix") or {}).get("attachments") if isinstance(data.get("matrix"), dict) else None)
    if not isinstance(names, list):
        return True
    return any(attachments.get(a).guests for a in names if isinstance(a, str) and a in attachments.names())


def plan(inventory: str, topology: str | Path, hosts: list[inv.Host]) -> Plan:
    """Every check that needs the topology and the hosts together: the topology itself, each
    host's (or pair's) topology, the pairs, the peers' host keys, the image shipment."""
    from testbed.topology import config
    from testbed.errors import ConfigError
    try:
        data = inv.topology_data(topology)
    except ConfigError:
        config.load(topology)           # its own words for what is wrong, where it has them
        raise
    two = pairs.two_host(data)
    if not two:
        config.load(topology)           # a pair's topology is validated with the pair's hosts in
    if (where := hostvars.find_template(data)) is not None:
        raise UserFileError(topology, f"{where}: a Jinja2 template; Ansible would render it on the "
                                      f"controller (the fleet takes plain values)")
    found = pairs.find(inventory, hosts, two)
    by = {h.name: h for h in hosts}
    keys: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory(prefix="testbed-pair-") as scratch:
        for p in found:
            pairs.check(topology, data, by[p.first], by[p.second], Path(scratch))
            keys[p.second] = peer_keys(inventory, by[p.second])
    if not found:
        inv.check_topologies(topology, data, hosts)
    want = [h.vars.get("testbed_ship_image") for h in hosts]
    ship = any(w is True for w in want) or (_guests(data) and not all(w is False for w in want))
    return Plan(hosts, data, found, keys, ship)


def peer_keys(inventory: str, host: inv.Host) -> list[str]:
    """The host keys the controller trusts for ``host`` (its testbed_known_hosts, else the
    controller's own known_hosts files), as ``[marker] keytype key`` lines: what the pair's
    first host checks its peer against."""
    name = host.address if host.port == 22 else f"[{host.address}]:{host.port}"
    files = [host.known_hosts] if host.known_hosts else [
        Path(os.path.expanduser("~/.ssh/known_hosts")), Path("/etc/ssh/ssh_known_hosts")]
    out: list[str] = []
    for f in files:
        if f is None or not f.is_file():
            continue
        safeio.check_regular(f, 16 << 20, str(f))
        r = proc.run(["ssh-keygen", "-F", name, "-f", str(f)], timeout=30, check=False)
        for line in r.stdout.splitlines():
            parts = line.split()
            if not parts or parts[0].startswith("#"):
                continue
            # the key reaches the run as a value Ansible renders: a key and nothing else
            if (why := hostvars.host_key_line(line.strip())) is not None:
                raise UserFileError(str(f), f"the host key for {name}: {why}")
            marker = [parts.pop(0)] if parts[0].startswith("@") else []
            if len(parts) >= 3:
                out.append(" ".join([*marker, *parts[1:3]]))
    if not out:
        raise UserFileError(inventory, f"host {host.name}: the controller holds no host key for {name} "
                                       f"(testbed_known_hosts or its known_hosts): a pair's first host "
                                       f"checks its peer's key with the controller's")
    return out


# --------------------------------------------------------------------------- progress

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


# --------------------------------------------------------------------------- one execution

def _common_args(h: inv.Host) -> str | None:
    """The host's ssh arguments as the run gives them: its own (checked), its ssh_config,
    its pinned known_hosts (and no other file of keys)."""
    parts = [h.vars["ansible_ssh_common_args"]] if h.vars.get("ansible_ssh_common_args") else []
    if h.ssh_config:
        parts.append(f"-F {shlex.quote(str(h.ssh_config))}")
    if h.known_hosts:
        parts.append(f"-o UserKnownHostsFile={shlex.quote(str(h.known_hosts))} -o GlobalKnownHostsFile=/dev/null")
    return " ".join(parts) or None


def _keypair(d: Path, fleet_id: str) -> tuple[str, str]:
    key = d / "pair-key"
    proc.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"testbed-{fleet_id}", "-f", str(key)],
             timeout=30)
    return key.read_text(), key.with_suffix(".pub").read_text().strip()


def _host_vars(fleet: FleetRun, p: Plan, names: list[str], attempt: str, private: Path,
               ship: dict | None) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """The fleet's own variables per host (its folder, the topology it runs, the image, its
    pair), and the secrets they hold (for scrubbing)."""
    by = {h.name: h for h in p.hosts}
    out: dict[str, dict[str, Any]] = {}
    secrets: list[str] = []
    for n in names:
        h = by[n]
        home = str(h.vars.get("testbed_home") or DEFAULT_HOME)
        v: dict[str, Any] = {"testbed_folder": h.folder, "testbed_home": home, "testbed_runs": True,
                             "testbed_run_topology": inv.merge(p.data, h.overrides),
                             "testbed_image": ship if ship and h.vars.get("testbed_ship_image") is not False else {},
                             "testbed_pair": {}}
        if (args := _common_args(h)) is not None:
            v["ansible_ssh_common_args"] = args
        out[n] = v
    for pr in p.pairs:
        if pr.first not in out or pr.second not in out:
            continue
        a, b = by[pr.first], by[pr.second]
        key, pub = _keypair(private, fleet.fleet_id)
        secrets.append(key)
        fdir = f"{out[pr.first]['testbed_home']}/fleet/{fleet.fleet_id}/{a.folder}/{attempt}"
        topo = pairs.topology(p.data, a, b, known_hosts=f"{fdir}/pair-known-hosts", key=f"{fdir}/pair-key",
                              overrides=a.overrides)
        peer_name = topo["hosts"][1]["name"]
        addr = b.vars["testbed_data_address"]
        # ssh looks a host up as ADDR on port 22, as [ADDR]:PORT on another
        at = addr if b.port == 22 else f"[{addr}]:{b.port}"
        kh = "".join(f"{k.split(' ', 1)[0]} {at} {k.split(' ', 1)[1]}\n" if k.startswith("@")
                     else f"{at} {k}\n" for k in p.peer_keys[pr.second])
        env = {"TESTBED_PEER": peer_name, "TESTBED_PEER_INVENTORY_HOST": b.name}
        if b.vars.get("testbed_machine_id"):
            env["TESTBED_PEER_MACHINE_ID"] = str(b.vars["testbed_machine_id"])
        if b.host_class:
            env["TESTBED_PEER_HOST_CLASS"] = b.host_class
        out[pr.first].update(testbed_run_topology=topo, testbed_pair={
            "role": "first", "second": b.name, "key": key, "known_hosts": kh, "env": env})
        out[pr.second].update(testbed_runs=False, testbed_pair={
            "role": "second", "first": a.name,
            "authorized": f'from="{a.vars["testbed_data_address"]}",restrict {pub}'})
    return out, secrets


def execute(fleet: FleetRun, p: Plan, names: list[str], *, wheel: Path, say: Callable[[str], None],
            timeout: int | None = None) -> FleetRun:
    """Run the playbook on the hosts ``names`` (and, for pairs, both hosts of each pair),
    then unpack and index what came back. Returns the fleet record with every outcome."""
    import ansible_runner
    for n in names:
        h = fleet.host(n)
        fleet = fleet.with_host(dataclasses.replace(h, status="pending", reason=None,
                                                    attempts=h.attempts + 1, prepare_changed=None))
    fleet.write()
    fetched_dir = fleet.dir / "fetched"
    # ansible-runner finds ansible-playbook on PATH: the one installed beside this Python first
    playbook_bin = Path(inv.ansible_binary("ansible-playbook")).parent
    path = os.pathsep.join([str(playbook_bin), os.environ.get("PATH", "/usr/bin:/bin")])
    attempt = "attempt-" + results.new_run_id()[0]
    ship = None
    if p.ship:
        from testbed.fleet import image
        from testbed.host import paths
        ship = image.prepare(image.controller_image(), paths.cache_dir() / "fleet-chunks").as_var()
    hosts = [h for h in p.hosts if h.name in names]
    with tempfile.TemporaryDirectory(prefix="testbed-fleet-") as pdd:
        os.chmod(pdd, 0o700)
        project = Path(pdd) / "project"
        with resources.as_file(resources.files("testbed.fleet") / "ansible") as src:
            shutil.copytree(src, project)
        extra, secrets = _host_vars(fleet, p, names, attempt, Path(pdd), ship)
        checked = Path(pdd) / "inventory.json"
        inv.write_checked(checked, inv.checked_inventory(hosts, extra))
        progress = Progress(fleet, [*hosts, inv.Host("(pair keys)", secret_values=tuple(secrets))], say)
        r = ansible_runner.run(
            private_data_dir=pdd, playbook="fleet.yml", inventory=str(checked),
            limit=",".join(names), forks=fleet.forks, quiet=True, timeout=timeout,
            extravars={"testbed_wheel": str(wheel), "testbed_version": __version__,
                       "testbed_fleet_id": fleet.fleet_id, "testbed_attempt": attempt,
                       "testbed_controller_dir": str(fetched_dir)},
            envvars={"PATH": path, **ansenv.run_env(SSH_ARGS, project / "roles", Path(pdd) / "tmp")},
            event_handler=progress)
        status = r.status
        tail = ""
        if status != "successful":
            with contextlib.suppress(OSError, AttributeError):
                lines = [ln.strip() for ln in r.stdout.read().splitlines() if ln.strip()]
                tail = inv.scrub(" | ".join(lines[-3:]), hosts) or ""
    fleet = progress.fleet
    runs = {n for n in names if extra[n]["testbed_runs"]}
    for n in sorted(runs):
        h = fleet.host(n)
        if h.status == FAILED:
            continue
        folder = extra[n]["testbed_folder"]
        archive = fetched_dir / folder / "run.tgz"
        if n not in progress.fetched or not archive.is_file():
            why = f"no run fetched (Ansible ended {status}" + (f": {tail}" if tail else "") + ")"
            h = dataclasses.replace(h, status=FAILED, reason=inv.scrub(one_line(why, 800), hosts))
        else:
            try:
                run_dir = fetched.unpack(archive, fleet.dir, folder)
                rec = results.read_run(run_dir)
                h = dataclasses.replace(h, status=DONE, reason=None,
                                        run_dir=str(run_dir.relative_to(fleet.dir)),
                                        run_id=rec.run_id, run_status=rec.status)
            except (UserFileError, OSError) as e:
                h = dataclasses.replace(h, status=FAILED, reason=one_line(f"fetched run unreadable: {e}", 500))
        fleet = fleet.with_host(h)
    fleet = _pair_outcomes(fleet, p, names)
    for n in names:
        h = fleet.host(n)
        if n in progress.failed:
            continue            # said when it failed
        say(f"fleet: {n} done: run {h.run_id} {h.run_status}" if h.status == DONE
            else f"fleet: {n} failed: {h.reason}")
    with contextlib.suppress(OSError):
        shutil.rmtree(fetched_dir)
    fleet = dataclasses.replace(fleet, ended=results.now())
    fleet.write()
    return fleet


def _pair_outcomes(fleet: FleetRun, p: Plan, names: list[str]) -> FleetRun:
    """A pair is done or failed as one: its second host takes its first host's run, and a
    failure of either fails both (each naming why)."""
    for pr in p.pairs:
        if pr.first not in names:
            continue
        a, b = fleet.host(pr.first), fleet.host(pr.second)
        if a.status == DONE and b.status != FAILED:
            b = dataclasses.replace(b, status=DONE, reason=None, run_dir=a.run_dir, run_id=a.run_id,
                                    run_status=a.run_status)
        elif a.status == DONE:
            a = dataclasses.replace(a, status=FAILED, run_dir=None, run_id=None, run_status=None,
                                    reason=f"its pair's second host {b.name} failed: {b.reason}")
        elif b.status != FAILED:
            b = dataclasses.replace(b, status=FAILED, reason=f"its pair's first host {a.name} failed: {a.reason}")
        fleet = fleet.with_host(a).with_host(b)
    return fleet


def index(fleet: FleetRun, db: str | None, root: Path) -> int:
    """Index every done host's run into the store (a pair's run once); returns how many."""
    from testbed.records import store
    n = 0
    dirs = list(dict.fromkeys(h.run_dir for h in fleet.hosts if h.status == DONE and h.run_dir))
    with store.open(db or str(root / "index.sqlite")) as st:
        for d in dirs:
            st.index_run(record.inside(fleet.dir, d))
            n += 1
    return n


def start(inventory: str, topology: str, *, limit: str | None, forks: int, db: str | None,
          root: Path, wheel: str | None, say: Callable[[str], None]) -> FleetRun:
    """A new fleet run: everything checked before the fleet directory is made."""
    from testbed.records import store
    inv.require_ansible()
    hosts = inv.list_hosts(inventory, limit)
    p = plan(inventory, topology, hosts)
    store.check_target(db or str(root / "index.sqlite"))
    w = check_wheel(wheel) if wheel is not None else None
    fid = record.new_id()
    d = root / fid
    d.mkdir(parents=True)
    shutil.copyfile(topology, d / "topology.yaml")
    peer = {x: pr for pr in p.pairs for x in (pr.first, pr.second)}
    fleet = FleetRun(fid, d, str(Path(inventory).absolute()), "topology.yaml", limit, forks, db,
                     results.now(), tuple(HostOutcome(
                         h.name, host_class=h.host_class, overrides=h.overrides, folder=h.folder,
                         peer=(peer[h.name].second if peer[h.name].first == h.name else peer[h.name].first)
                         if h.name in peer else None,
                         role=("first" if peer[h.name].first == h.name else "second") if h.name in peer else None)
                         for h in hosts))
    fleet.write()
    if w is None:
        w = build_wheel(d / "wheel")
    else:
        (d / "wheel").mkdir()
        w = Path(shutil.copy(w, d / "wheel" / w.name))
    say(f"fleet {fid}: {len(hosts)} host(s)" + (f" in {len(p.pairs)} pair(s)" if p.pairs else "")
        + f", forks {forks}, testbed {w.name}")
    return _finish(execute(fleet, p, [h.name for h in hosts], wheel=w, say=say), root, say)


def retry(spec: str, *, forks: int | None, db: str | None, root: Path,
          say: Callable[[str], None]) -> FleetRun:
    """Run the failed hosts of a fleet run again (both hosts of a failed pair), with its
    inventory, topology and wheel, checked again."""
    fleet = record.read(spec, root)
    inv.require_ansible()
    failed = [h.name for h in fleet.failed]
    if not failed:
        say(f"fleet {fleet.fleet_id}: no failed host to retry")
        return fleet
    wheels = sorted((fleet.dir / "wheel").glob("*.whl")) if (fleet.dir / "wheel").is_dir() else []
    if len(wheels) != 1:
        raise UserFileError(fleet.dir / "wheel", f"expected the fleet run's one testbed wheel, found "
                                                 f"{len(wheels)}: this fleet run cannot be retried")
    w = check_wheel(wheels[0], "--retry-failed")
    if forks is not None or db is not None:
        fleet = dataclasses.replace(fleet, forks=forks or fleet.forks, db=db or fleet.db)
    partners = {h.peer for h in fleet.hosts if h.name in failed and h.peer}
    names = sorted(set(failed) | partners, key=[h.name for h in fleet.hosts].index)
    hosts = inv.list_hosts(fleet.inventory, ",".join(names))
    missing = sorted(set(names) - {h.name for h in hosts})
    if missing:
        raise UserFileError(fleet.inventory, f"host {missing[0]} of fleet run {fleet.fleet_id} is no "
                                             f"longer in the inventory")
    p = plan(fleet.inventory, fleet.dir / fleet.topology, hosts)
    say(f"fleet {fleet.fleet_id}: retrying {len(failed)} failed host(s): {', '.join(failed)}"
        + (f" (with their pairs: {', '.join(sorted(partners - set(failed)))})" if partners - set(failed) else ""))
    return _finish(execute(fleet, p, names, wheel=w, say=say), root, say)


def _finish(fleet: FleetRun, root: Path, say: Callable[[str], None]) -> FleetRun:
    n = index(fleet, fleet.db, root)
    done = sum(1 for h in fleet.hosts if h.status == DONE)
    say(f"fleet {fleet.fleet_id}: {done} of {len(fleet.hosts)} host(s) done, {n} run(s) indexed")
    return fleet
