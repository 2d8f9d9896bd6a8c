"""Open vSwitch daemons: the host's pair, started when nothing runs them, and private pairs.

Hosts without systemd (this CI machine, containers) have the OVS packages but nothing that
starts ovsdb-server and ovs-vswitchd. ``ensure_running()`` does what Debian's ovs-ctl would
(same paths and logging), and only when no daemon already serves the default database, so a
host where OVS is managed by someone else is left exactly as it is. Daemons it starts are
left running afterwards: other tenants of the host (libvirt's openvswitch virtualport) expect
them, and stopping a switch that may carry someone's bridges is not ours to decide.

``private()`` runs a second, independent pair inside a network namespace with its own DB and
run directory, for emulating two hosts on one machine. Everything it uses lives in the given
directory (OVS_RUNDIR/OVS_DBDIR/OVS_LOGDIR point there, so not even a default unixctl socket
or pidfile lands in /run/openvswitch), and both daemons are stopped on exit.
"""
from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from testbed import PREFIX
from testbed.errors import CapabilityError, CommandError, TestbedError
from testbed.host import proc

log = logging.getLogger(__name__)

# Debian's defaults (ovs-lib): what ovs-ctl, libvirt and a bare `ovs-vsctl` all assume.
RUNDIR = Path("/var/run/openvswitch")
DBDIR = Path("/etc/openvswitch")
LOGDIR = Path("/var/log/openvswitch")
SCHEMA = Path("/usr/share/openvswitch/vswitch.ovsschema")
TSO_KEY = "userspace-tso-enable"
START_TIMEOUT_S = 30.0

# A unix socket path must fit sockaddr_un.sun_path (108 bytes with the NUL).
_SUN_PATH_MAX = 107


@dataclass(frozen=True)
class Ovs:
    """A reachable ovsdb-server with an ovs-vswitchd serving it."""

    db: str                          # ovs-vsctl --db value, "unix:/path/db.sock"
    rundir: str
    netns: str | None = None         # where ovs-vswitchd runs (None: the root namespace)
    #: daemons this process started ("ovsdb-server", "ovs-vswitchd"); empty if they already ran
    started: tuple[str, ...] = field(default=())

    def vsctl(self, *args: str, wait: bool = True, timeout_s: int = 20) -> str:
        """Run ovs-vsctl against this instance; ``wait`` waits for ovs-vswitchd to apply it."""
        return vsctl(*args, db=self.db, wait=wait, timeout_s=timeout_s)


def vsctl(*args: str, db: str | None = None, wait: bool = True, timeout_s: int = 20) -> str:
    argv = ["ovs-vsctl", *([f"--db={db}"] if db else []), f"--timeout={timeout_s}",
            *([] if wait else ["--no-wait"]), *args]
    return proc.run(argv, timeout=timeout_s + 10).stdout


def datapath() -> str:
    """``system`` when the openvswitch kernel module is loaded, else ``netdev`` (userspace).

    Only a loaded module counts: loading one is a change to a production host that the
    testbed would not undo, so it is left to the operator (``modprobe openvswitch``)."""
    return "system" if Path("/sys/module/openvswitch").is_dir() else "netdev"


def default_db() -> str:
    return f"unix:{RUNDIR / 'db.sock'}"


def _answers(db: str, timeout_s: int = 2) -> bool:
    """Does an ovsdb-server answer on ``db``? (Whatever the database holds so far.)"""
    return proc.ok(["ovsdb-client", f"--timeout={timeout_s}", "list-dbs", db], timeout=timeout_s + 5)


def _vswitchd_alive(db: str, rundir: Path) -> bool:
    """Does an ovs-vswitchd serve ``db``? The pidfile finds ours and ovs-ctl's; the process
    table finds one started without a pidfile, so we never start a second switch on a DB."""
    try:
        pid = int((rundir / "ovs-vswitchd.pid").read_text().strip())
    except (OSError, ValueError):
        pid = None
    if pid and proc.ok(["ovs-appctl", "-t", str(rundir / f"ovs-vswitchd.{pid}.ctl"),
                        "--timeout=2", "version"], timeout=7):
        return True
    return bool(vswitchd_pids(db))


def vswitchd_pids(db: str) -> list[int]:
    """ovs-vswitchd processes whose database is ``db`` (no DB argument means the default)."""
    want = os.path.realpath(db.removeprefix("unix:"))
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        except OSError:
            continue
        if not argv or os.path.basename(argv[0]) != "ovs-vswitchd":
            continue
        remote = next((a for a in argv[1:] if not a.startswith("-")), default_db())
        if remote.startswith("unix:") and os.path.realpath(remote[5:]) == want:
            found.append(int(entry.name))
    return found


@contextlib.contextmanager
def _dir_lock(path: Path) -> Iterator[None]:
    """Serialise concurrent ensure_running() calls (setup script, CI, tests) on this host.
    The run directory itself is locked, so no lock file is left behind."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _mkdir(path: Path, mode: int) -> None:
    if not path.is_dir():
        path.mkdir(parents=True, mode=mode, exist_ok=True)


def require_binaries() -> None:
    missing = [b for b in ("ovsdb-tool", "ovsdb-server", "ovsdb-client", "ovs-vswitchd",
                           "ovs-vsctl", "ovs-appctl") if not shutil.which(b)]
    if missing:
        raise CapabilityError(f"Open vSwitch is not installed ({', '.join(missing)} not found): "
                              "install openvswitch-switch")
    if not SCHEMA.is_file():
        raise CapabilityError(f"OVS schema {SCHEMA} not found: install openvswitch-common")


def _create_db(db_file: Path) -> None:
    # exists() follows symlinks: Debian ships /etc/openvswitch/conf.db as a link into
    # /var/lib/openvswitch, dangling until the first start, and ovsdb-tool creates through it.
    if db_file.exists():
        return
    target = db_file.resolve()
    _mkdir(target.parent, 0o755)
    log.info("creating OVS database %s", db_file)
    proc.run(["ovsdb-tool", "create", str(db_file), str(SCHEMA)], timeout=30)


def ensure_running(*, userspace_tso: bool = True, timeout_s: float = START_TIMEOUT_S) -> Ovs:
    """The host's ovsdb-server and ovs-vswitchd on the default paths, started if needed.

    When it starts ovs-vswitchd itself on a host without the kernel datapath, it first sets
    ``other_config:userspace-tso-enable=true`` unless the database already has the key (an
    operator's choice is kept): the key only works when set before the daemon starts, and
    without it TCP through the userspace datapath needs tx checksumming off at every sender
    (host/net/ovs.py has the measurements). A daemon that already runs is never touched.

    Idempotent and safe to call concurrently. Raises CapabilityError when OVS is missing and
    TestbedError (with the daemon's log tail) when a daemon does not come up."""
    require_binaries()
    db = default_db()
    if _answers(db) and _vswitchd_alive(db, RUNDIR):
        return Ovs(db=db, rundir=str(RUNDIR))
    _mkdir(RUNDIR, 0o755)
    _mkdir(LOGDIR, 0o750)
    started: list[str] = []
    with _dir_lock(RUNDIR):
        if not _answers(db):
            _create_db(DBDIR / "conf.db")
            # The same argv as ovs-ctl, so a host's configured managers and SSL keep working.
            _start_detached("ovsdb-server", [
                str(DBDIR / "conf.db"), "-vconsole:emer", "-vsyslog:err", "-vfile:info",
                f"--remote=punix:{RUNDIR / 'db.sock'}",
                "--remote=db:Open_vSwitch,Open_vSwitch,manager_options",
                "--private-key=db:Open_vSwitch,SSL,private_key",
                "--certificate=db:Open_vSwitch,SSL,certificate",
                "--bootstrap-ca-cert=db:Open_vSwitch,SSL,ca_cert"], timeout_s)
            started.append("ovsdb-server")
            _wait(lambda: _answers(db, 1), timeout_s, "ovsdb-server", LOGDIR / "ovsdb-server.log")
        if not _vswitchd_alive(db, RUNDIR):
            # `init` only adds the Open_vSwitch row if the database has none yet
            proc.run(["ovs-vsctl", f"--db={db}", "--timeout=10", "--no-wait", "init"], timeout=20)
            if userspace_tso and datapath() == "netdev":
                _default_other_config(db, TSO_KEY, "true")
            _start_detached("ovs-vswitchd", [db, "-vconsole:emer", "-vsyslog:err", "-vfile:info"],
                            timeout_s)
            started.append("ovs-vswitchd")
            _wait(lambda: _vswitchd_alive(db, RUNDIR), timeout_s, "ovs-vswitchd",
                  LOGDIR / "ovs-vswitchd.log")
    if started:
        log.info("started %s (left running)", " and ".join(started))
    return Ovs(db=db, rundir=str(RUNDIR), started=tuple(started))


def _default_other_config(db: str, key: str, value: str) -> None:
    """Set a global other_config key only if the database does not have it yet."""
    base = ["ovs-vsctl", f"--db={db}", "--timeout=10", "--no-wait"]
    have = proc.run([*base, "--if-exists", "get", "Open_vSwitch", ".", f"other_config:{key}"],
                    timeout=20).stdout.strip()
    if not have:
        log.info("setting other_config:%s=%s before starting ovs-vswitchd", key, value)
        proc.run([*base, "set", "Open_vSwitch", ".", f"other_config:{key}={value}"], timeout=20)


def _start_detached(daemon: str, args: Sequence[str], timeout_s: float) -> None:
    argv = [daemon, *args, "--no-chdir", f"--log-file={LOGDIR / (daemon + '.log')}",
            f"--pidfile={RUNDIR / (daemon + '.pid')}", "--detach"]
    try:
        # --detach returns once the daemon is initialised; it closes the inherited pipes.
        # The environment makes the paths above the daemon's defaults too (unixctl socket).
        proc.run(argv, timeout=timeout_s, env={"OVS_RUNDIR": str(RUNDIR), "OVS_DBDIR": str(DBDIR),
                                               "OVS_LOGDIR": str(LOGDIR)})
    except CommandError as e:
        log_tail = _tail(LOGDIR / f"{daemon}.log")
        raise TestbedError(f"cannot start {daemon}: {e}; log: {log_tail}") from None


def _tail(path: Path, lines: int = 5) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:]) or "(empty)"
    except OSError:
        return f"({path} unreadable)"


def _wait(ready: Callable[[], bool], timeout_s: float, what: str, log_file: Path,
          stderr: Callable[[], str] | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            extra = f"; stderr: {stderr()[-400:]}" if stderr else ""
            raise TestbedError(f"{what} not ready after {timeout_s:.0f} s; log: {_tail(log_file)}{extra}")
        time.sleep(0.1)


# -- a private pair in a namespace ---------------------------------------------------------

@contextlib.contextmanager
def private(netns: str, workdir: str | os.PathLike, *, userspace_tso: bool = True,
            other_config: dict[str, str] | None = None,
            timeout_s: float = START_TIMEOUT_S) -> Iterator[Ovs]:
    """ovsdb-server + ovs-vswitchd inside ``netns`` with their own DB and run directory.

    ``ovs-vsctl --db=<Ovs.db>`` reaches it from anywhere (a unix socket is a file, not bound
    to a namespace). Ports added to its bridges are looked up in ``netns``; it always uses
    the userspace datapath (a kernel datapath would be shared with the host's switch).
    ``userspace_tso`` and ``other_config`` are written before ovs-vswitchd starts, the only
    time ``userspace-tso-enable`` can be set safely (host/net/ovs.py). Both daemons are
    stopped on exit, which removes their datapath and internal ports; ``workdir`` (created
    if missing) keeps the database and logs for a post-mortem."""
    if not netns.startswith(PREFIX):
        raise TestbedError(f"refusing to run a private OVS in {netns!r}: not a {PREFIX} namespace")
    require_binaries()
    work = Path(workdir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    sock = work / "db.sock"
    if len(str(sock)) > _SUN_PATH_MAX:
        raise TestbedError(f"{sock} is too long for a unix socket; use a shorter workdir")
    db_file = work / "conf.db"
    if not db_file.exists():
        proc.run(["ovsdb-tool", "create", str(db_file), str(SCHEMA)], timeout=30)
    env = {"OVS_RUNDIR": str(work), "OVS_DBDIR": str(work), "OVS_LOGDIR": str(work)}
    db = f"unix:{sock}"
    # pidfiles in the private run folder, where a host guard reading $OVS_RUNDIR finds them
    common = ["-vconsole:off", "-vsyslog:off", "-vfile:info", "--no-chdir", "--pidfile"]
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(proc.background(
            ["ovsdb-server", str(db_file), f"--remote=punix:{sock}",
             f"--unixctl={work / 'ovsdb-server.ctl'}", f"--log-file={work / 'ovsdb-server.log'}",
             *common], out_dir=str(work), name="ovsdb-server", netns=netns, env=env))
        _wait(lambda: server.popen.poll() is None and _answers(db, 1), timeout_s,
              f"private ovsdb-server in {netns}", work / "ovsdb-server.log", server.stderr)
        config = {TSO_KEY: "true"} if userspace_tso else {}
        config.update(other_config or {})
        settings = [f"other_config:{k}={v}" for k, v in config.items()]
        proc.run(["ovs-vsctl", f"--db={db}", "--timeout=10", "--no-wait", "init",
                  *(["--", "set", "Open_vSwitch", ".", *settings] if settings else [])], timeout=20)
        switch = stack.enter_context(proc.background(
            ["ovs-vswitchd", db, f"--unixctl={work / 'ovs-vswitchd.ctl'}",
             f"--log-file={work / 'ovs-vswitchd.log'}", *common],
            out_dir=str(work), name="ovs-vswitchd", netns=netns, env=env))
        _wait(lambda: switch.popen.poll() is None and proc.ok(
            ["ovs-appctl", "-t", str(work / "ovs-vswitchd.ctl"), "--timeout=2", "version"],
            timeout=7), timeout_s,
            f"private ovs-vswitchd in {netns}", work / "ovs-vswitchd.log", switch.stderr)
        yield Ovs(db=db, rundir=str(work), netns=netns, started=("ovsdb-server", "ovs-vswitchd"))
        # ExitStack stops ovs-vswitchd first, then ovsdb-server (reverse order of start).
